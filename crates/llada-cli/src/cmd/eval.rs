//! `llada eval`: which evaluation a model gets (a task model's exact match, a prose model's NLL
//! bound, a draft's agreement with `--target`), run by [`llada_zoo::eval`], and its report.

use crate::cmd::decoding::DiffusionArgs;
use crate::progress::Bar;
use crate::LoadContext;
use anyhow::{bail, Result};
use clap::Args;
use llada_model::{LoadOptions, Model};
use llada_runtime::Lane;
use llada_train::tasks::{Score, MULTI_SUBTASKS, TASKS};
use llada_train::vocab::CharVocab;
use llada_zoo::eval::{
    parse_answer_region, parse_split, AnswerRegion, DraftEval, Split, TaskEvalRequest,
};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Args)]
pub struct EvalArgs {
    /// Model directory: a task model (exact match per task), a prose diffusion model (held-out
    /// NLL bound), or a draft with --target (agreement and accepted length) — a draft model's
    /// directory, or a feature head's .safetensors (`llada train-feature-draft`).
    #[arg(long, short = 'm')]
    model: PathBuf,
    /// Target model for draft evaluation (alias, GGUF or HF dir).
    #[arg(long)]
    target: Option<String>,
    /// Held-out windows for prose / draft evaluation.
    #[arg(long, default_value_t = 24)]
    windows: usize,
    /// Task models: `eval`, the held-out split the reported figures come from, or `tuning`,
    /// training-side prompts (none held out) for choosing decoder settings.
    #[arg(long, default_value = "eval", value_parser = parse_split)]
    split: Split,
    /// Examples per task.
    #[arg(long, default_value_t = 20)]
    per_task: usize,
    /// Only these tasks (comma-separated; default: all); each is scored on the same examples as
    /// in the full split's evaluation.
    #[arg(long, value_delimiter = ',')]
    tasks: Vec<String>,
    /// Scale held-out task lengths down (0 < s ≤ 1), to match `llada train --max-scale`.
    #[arg(long, default_value_t = 1.0)]
    max_scale: f64,
    /// Print the first N wrong answers (to stderr).
    #[arg(long, default_value_t = 0)]
    show: usize,
    /// Answer region each task example decodes into: `auto`, its answer plus one EOS rounded up
    /// to whole blocks (the layout the tiny task models train in: the region's end tells the
    /// model roughly how long the answer is), or a number N, the same N tokens for every example
    /// (rounded up to whole blocks), as a user's `--gen-length` would be: the model has to end
    /// each answer with EOS on its own. N must hold the longest chosen answer plus one EOS.
    #[arg(long, default_value = "auto", value_parser = parse_answer_region)]
    answer_region: AnswerRegion,
    #[command(flatten)]
    diffusion: DiffusionArgs,
    /// Worker threads of the dense lane (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Print a draft evaluation (`--json` or text); `note` qualifies the token count.
fn report_draft_eval(a: &EvalArgs, tpath: &std::path::Path, e: &DraftEval, note: &str) {
    let (top1, total) = (e.top1(), e.total);
    let mal = e.mean_accepted();
    let windows = e.windows;
    if a.json {
        println!(
            "{}",
            serde_json::json!({"model": a.model.display().to_string(), "target": tpath.display().to_string(), "top1_agreement": top1, "mean_accepted_len": mal, "tokens_per_verification": mal + 1.0, "windows": windows})
        );
    } else {
        println!(
            "top-1 agreement with {}: {:.1}% ({total} held-out Austen tokens{note})",
            tpath.display(),
            100.0 * top1,
        );
        println!("greedy chain, 4 drafted: {mal:.2} accepted per verification ({:.2} tokens per target pass)", mal + 1.0);
    }
}

pub fn run(mut a: EvalArgs) -> Result<()> {
    // A shipped model's name or `models/…` path works from any directory.
    a.model = crate::models::resolve(&a.model.to_string_lossy(), true)?;
    if a.per_task == 0 || a.windows == 0 {
        bail!(
            "--per-task and --windows must be at least 1 (an evaluation of nothing scores nothing)"
        );
    }
    let threads = crate::threads(a.threads)?;
    llada_zoo::corpora::check_max_scale(a.max_scale)?;
    // A line at once, whatever stderr is (the bars draw only on a terminal).
    eprintln!("evaluating {}", a.model.display());
    if let (Some(t), Some("safetensors")) =
        (&a.target, a.model.extension().and_then(|e| e.to_str()))
    {
        let lane = Lane::new("dense", threads)?;
        let tpath = crate::models::resolve(t, a.json)?;
        let target = Model::load(&tpath, &LoadOptions::default())?;
        let pb = Bar::new(0);
        let e = llada_zoo::eval::eval_feature_draft(&a.model, &target, &lane, a.windows, &pb)?;
        let note = "; the first of each window counted as a miss";
        report_draft_eval(&a, &tpath, &e, note);
        return Ok(());
    }
    let model = Model::load(&a.model, &LoadOptions::default()).load_context(&a.model)?;
    if let Some(t) = &a.target {
        let lane = Lane::new("dense", threads)?;
        let tpath = crate::models::resolve(t, a.json)?;
        let target = Model::load(&tpath, &LoadOptions::default()).load_context(&tpath)?;
        let pb = Bar::new(0);
        let e = llada_zoo::eval::eval_draft(&a.model, &model, &target, &lane, a.windows, &pb)?;
        report_draft_eval(&a, &tpath, &e, "");
        return Ok(());
    }
    if model.config.mask_id.is_some() && model.config.vocab != CharVocab::size() {
        let lane = Lane::new("dense", threads)?;
        let e = llada_zoo::eval::eval_prose(&model, &lane, a.windows)?;
        let nll = e.nll_bound;
        if a.json {
            println!(
                "{}",
                serde_json::json!({"model": a.model.display().to_string(), "heldout_nll_bound": nll, "windows": e.windows})
            );
        } else {
            println!(
                "held-out masked-diffusion NLL bound: {nll:.3} nats/token ({} windows of 128 tokens)",
                e.windows
            );
        }
        return Ok(());
    }
    if model.config.mask_id.is_none() {
        bail!(
            "{} is not a diffusion model (no mask token)",
            a.model.display()
        );
    }
    let req = TaskEvalRequest {
        split: a.split,
        per_task: a.per_task,
        tasks: a.tasks.clone(),
        max_scale: a.max_scale,
        show: a.show,
        answer_region: a.answer_region,
        strategy: a.diffusion.options(a.diffusion.block_length, 0.0, 0),
        threads,
        sparse_pool: a.diffusion.sparse_pool,
    };
    let r = llada_zoo::eval::eval_tasks(&model, &req, &Bar::new(0))?;
    report_tasks(&a, &r);
    Ok(())
}

/// Print a task evaluation (`--json` or a table).
fn report_tasks(a: &EvalArgs, r: &llada_zoo::eval::TaskEval) {
    let (scores, sub_items) = (&r.scores, &r.multi_items);
    let rate = |s: &Score, f: fn(&Score) -> Option<f64>| f(s).unwrap_or(0.0);
    let tasks: BTreeMap<&str, f64> = scores
        .iter()
        .map(|(k, s)| (*k, rate(s, Score::exact_rate)))
        .collect();
    let char_tasks: BTreeMap<&str, f64> = scores
        .iter()
        .map(|(k, s)| (*k, rate(s, Score::char_rate)))
        .collect();
    let item_tasks: BTreeMap<&str, f64> = scores
        .iter()
        .map(|(k, s)| (*k, rate(s, Score::item_rate)))
        .collect();
    let multi_items: BTreeMap<&str, serde_json::Value> = sub_items
        .iter()
        .map(|(k, (ok, n))| (*k, serde_json::json!({"exact": ok, "total": n})))
        .collect();
    let all = scores.values().fold(Score::default(), |a, s| a.merge(*s));
    let (total, char_total) = (rate(&all, Score::exact_rate), rate(&all, Score::char_rate));
    let region_name = a.answer_region.label(a.diffusion.block_length);
    if a.json {
        println!(
            "{}",
            serde_json::json!({"model": a.model.display().to_string(), "strategy": a.diffusion.name(), "split": a.split.name(), "answer_region": region_name, "examples": r.examples, "tasks": tasks, "accuracy": total, "char_tasks": char_tasks, "char_accuracy": char_total, "item_tasks": item_tasks, "multi_items": multi_items, "decode_s": r.decode_s, "positions": r.positions, "tokens_per_s": r.tokens_per_s(), "forwards": r.forwards})
        );
    } else {
        println!("task     exact   chars");
        for t in TASKS {
            if let (Some(acc), Some(ch)) = (tasks.get(t), char_tasks.get(t)) {
                println!("{t:<8} {:>5.1}%  {:>5.1}%", 100.0 * acc, 100.0 * ch);
            }
        }
        println!(
            "overall  {:>5.1}%  {:>5.1}% ({} examples of the {} split, {} decoding, answer region {region_name}; chars: characters in place)",
            100.0 * total,
            100.0 * char_total,
            r.examples,
            a.split.name(),
            a.diffusion.name()
        );
        println!(
            "decoding: {:.2} s, {:.0} answer positions/s, {:.2} positions per dense pass",
            r.decode_s,
            r.tokens_per_s(),
            r.positions as f64 / r.forwards.max(1) as f64
        );
        if let Some(m) = item_tasks.get("multi") {
            let by_task: Vec<String> = MULTI_SUBTASKS
                .iter()
                .filter_map(|k| sub_items.get(k).map(|(ok, n)| format!("{k} {ok}/{n}")))
                .collect();
            println!(
                "multi: {:.1}% of the sub-answers exact (items between `;`, in place): {}",
                100.0 * m,
                by_task.join(", ")
            );
        }
    }
}
