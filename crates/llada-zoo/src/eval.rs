//! Evaluations of the zoo's models, each returning what it measured: exact match per task for
//! the diffusion task models ([`eval_tasks`]), a Monte-Carlo bound on held-out NLL for prose
//! diffusion models ([`eval_prose`]), and a draft's top-1 agreement with its target and accepted
//! length under greedy chain speculation ([`eval_draft`], [`eval_feature_draft`]).

use crate::corpora::{check_windows, known_names, prose_files};
use crate::error::{bail, Context, Result};
use crate::forward::{argmax_rows, causal_argmax, causal_logits};
use crate::progress::Progress;
use llada_decode::strategy::{DiffusionLanes, StrategyOptions};
use llada_model::Model;
use llada_runtime::Lane;
use llada_train::tasks::{held_out_tasks, item_outcomes, tuning_tasks, Example, Score, TASKS};
use llada_train::vocab::{CharVocab, BOS};
use std::collections::BTreeMap;

/// `llada eval --answer-region`: per example from its answer (`Auto`), or one length for all.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AnswerRegion {
    Auto,
    Fixed(usize),
}

impl AnswerRegion {
    /// Region length for an answer of `answer_len` tokens and blocks of `block`.
    pub fn length(self, answer_len: usize, block: usize) -> usize {
        match self {
            Self::Auto => (answer_len + 1).next_multiple_of(block),
            Self::Fixed(n) => n.next_multiple_of(block),
        }
    }

    /// How reports name it: `auto`, or the fixed length after rounding.
    pub fn label(self, block: usize) -> String {
        match self {
            Self::Auto => "auto".to_string(),
            Self::Fixed(_) => self.length(0, block).to_string(),
        }
    }
}

pub fn parse_answer_region(s: &str) -> Result<AnswerRegion, String> {
    if s == "auto" {
        return Ok(AnswerRegion::Auto);
    }
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(AnswerRegion::Fixed(n)),
        _ => Err(format!("expected `auto` or a token count ≥ 1, got '{s}'")),
    }
}

/// Which examples a task evaluation decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Split {
    /// The held-out split the reported figures come from ([`held_out_tasks`]).
    #[default]
    Eval,
    /// The tuning split for choosing decoder settings ([`tuning_tasks`]): training-side
    /// prompts, none of them held out.
    Tuning,
}

impl Split {
    /// The split's `per_task` examples of each of `tasks` at length scale `scale`.
    pub fn examples(
        self,
        per_task: usize,
        tasks: &[&'static str],
        scale: f64,
    ) -> anyhow::Result<Vec<Example>> {
        match self {
            Self::Eval => held_out_tasks(per_task, tasks, scale),
            Self::Tuning => tuning_tasks(per_task, tasks, scale),
        }
    }
    /// How reports name it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Eval => "eval",
            Self::Tuning => "tuning",
        }
    }
}

pub fn parse_split(s: &str) -> Result<Split, String> {
    match s {
        "eval" => Ok(Split::Eval),
        "tuning" => Ok(Split::Tuning),
        _ => Err(format!("expected `eval` or `tuning`, got '{s}'")),
    }
}

/// A task evaluation's request: the held-out split (`per_task` examples of each task, lengths
/// scaled by `max_scale`), the tasks scored (`tasks`; empty: all), how each example decodes.
#[derive(Clone, Debug)]
pub struct TaskEvalRequest {
    pub split: Split,
    pub per_task: usize,
    pub tasks: Vec<String>,
    pub max_scale: f64,
    /// Wrong answers to report (as notes) as they occur.
    pub show: usize,
    pub answer_region: AnswerRegion,
    /// The decoding strategy; its `gen_length` is set per example from `answer_region`.
    pub strategy: StrategyOptions,
    /// Threads of the dense lane, and whether a concurrent sparse lane gets a pool of its own.
    pub threads: usize,
    pub sparse_pool: bool,
}

/// Scores of a task evaluation.
#[derive(Clone, Debug, Default)]
pub struct TaskEval {
    /// Per task.
    pub scores: BTreeMap<&'static str, Score>,
    /// Multi-question items by sub-task: (exact, total).
    pub multi_items: BTreeMap<&'static str, (usize, usize)>,
    /// Examples decoded.
    pub examples: usize,
    /// Answer positions decoded (the regions' lengths), the seconds the decoder took over
    /// them, and its dense forward passes.
    pub positions: usize,
    pub decode_s: f64,
    pub forwards: usize,
}

impl TaskEval {
    /// Answer positions per second of decoding (the benchmark's tokens per second).
    pub fn tokens_per_s(&self) -> f64 {
        self.positions as f64 / self.decode_s.max(1e-12)
    }
}

/// The request's diffusion decoder configuration for an answer region of `gen` tokens.
fn strategy_config(
    s: &StrategyOptions,
    gen: usize,
) -> Result<llada_decode::diffusion::DiffusionConfig> {
    StrategyOptions {
        gen_length: gen,
        ..s.clone()
    }
    .config()
    .map_err(crate::error::msg)
}

/// Decode every held-out example of the chosen tasks with the request's strategy and score
/// the answers (exact match, characters in place, multi-question items).
pub fn eval_tasks(model: &Model, a: &TaskEvalRequest, progress: &dyn Progress) -> Result<TaskEval> {
    let block = a.strategy.block_length;
    let lanes = DiffusionLanes::new(
        a.threads,
        &strategy_config(&a.strategy, block)?,
        a.sparse_pool,
    )?;
    let tasks = if a.tasks.is_empty() {
        TASKS.to_vec()
    } else {
        known_names(&a.tasks, &TASKS, "task")?
    };
    let split = a
        .split
        .examples(a.per_task, &tasks, a.max_scale)
        .with_context(|| {
            format!(
                "--max-scale {} is too small for the {} split (drawn for every task, \
                 whatever --tasks lists)",
                a.max_scale,
                a.split.name()
            )
        })?;
    if let AnswerRegion::Fixed(n) = a.answer_region {
        if let Some(ex) = split.iter().max_by_key(|ex| ex.answer.len()) {
            let need = ex.answer.len() + 1;
            if need > a.answer_region.length(need, block) {
                bail!(
                    "--answer-region {n} cannot hold the longest {} answer ({} tokens of \
                     task {} plus one EOS): use at least {need}, or fewer --tasks",
                    if a.split == Split::Eval {
                        "held-out"
                    } else {
                        "tuning"
                    },
                    ex.answer.len(),
                    ex.task
                );
            }
        }
    }
    let cfg_for = |gen: usize| strategy_config(&a.strategy, gen);
    let layout = Layout {
        region: a.answer_region,
        block,
    };
    decode_examples(model, &lanes, &split, layout, &cfg_for, a.show, progress)
}

/// How a task example is laid out: its answer region and the block length it rounds to.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub region: AnswerRegion,
    pub block: usize,
}

/// Decode `examples` on `lanes`, each into its region of `layout` with the decoder
/// configuration `cfg_for(region length)`, and score the answers (exact match, characters in
/// place, multi-question items); the first `show` wrong answers go to `progress` as notes.
pub fn decode_examples(
    model: &Model,
    lanes: &DiffusionLanes,
    examples: &[Example],
    layout: Layout,
    cfg_for: &dyn Fn(usize) -> Result<llada_decode::diffusion::DiffusionConfig>,
    show: usize,
    progress: &dyn Progress,
) -> Result<TaskEval> {
    progress.set_len(examples.len() as u64);
    let mut r = TaskEval {
        examples: examples.len(),
        ..Default::default()
    };
    let mut shown = 0;
    for ex in examples {
        let mut prompt = vec![BOS];
        prompt.extend(CharVocab::encode(&ex.prompt));
        let gen = layout.region.length(ex.answer.len(), layout.block);
        let cfg = cfg_for(gen)?;
        let clock = std::time::Instant::now();
        let out = lanes.generate(model, &prompt, &cfg, None)?;
        r.decode_s += clock.elapsed().as_secs_f64();
        r.positions += gen;
        r.forwards += out.forward_passes;
        let got = CharVocab::decode(&out.tokens);
        let exact = r.scores.entry(ex.task).or_default().add(&ex.answer, &got);
        for (kind, ok) in item_outcomes(&ex.prompt, &ex.answer, &got) {
            let t = r.multi_items.entry(kind).or_insert((0, 0));
            *t = (t.0 + usize::from(ok), t.1 + 1);
        }
        if !exact && shown < show {
            shown += 1;
            progress.note(&format!(
                "{} → {got:?} (expected {:?})",
                ex.prompt, ex.answer
            ));
        }
        progress.inc(1);
    }
    progress.finish();
    Ok(r)
}

/// A prose evaluation: the held-out NLL bound (nats/token) over `windows` windows.
#[derive(Clone, Copy, Debug)]
pub struct ProseEval {
    pub nll_bound: f64,
    pub windows: usize,
}

/// Prose diffusion model: Monte-Carlo masked-diffusion bound on held-out NLL (nats/token),
/// over `n_windows` held-out windows of 128 tokens.
pub fn eval_prose(m: &Model, lane: &Lane, n_windows: usize) -> Result<ProseEval> {
    use llada_model::{AttnMask, ForwardRequest, KvWrite, LogitRows};
    use rand::Rng;
    let tok = m.tokenizer.as_ref().context("model has no tokenizer")?;
    let mask = m.config.mask_id.context("no mask token")?;
    let files = prose_files()?;
    let corpus =
        llada_train::prose::Corpus::load(&files, &tok.inner, m.config.eos_id.unwrap_or(0))?;
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(7);
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    check_windows(&corpus, n_windows, 128, &names.join(" + "))?;
    let windows = corpus.windows(true, n_windows, 128, &mut rng);
    let mut sum = 0f64;
    let mut n = 0usize;
    for w in &windows {
        for _ in 0..4 {
            let t: f64 = 1e-3 + (1.0 - 1e-3) * rng.random::<f64>();
            let mut x = w.clone();
            let masked: Vec<usize> = (0..w.len()).filter(|_| rng.random::<f64>() < t).collect();
            for &i in &masked {
                x[i] = mask;
            }
            if masked.is_empty() {
                n += 1;
                continue;
            }
            let rows: Vec<usize> = masked
                .iter()
                .map(|&i| {
                    if m.config.shift_logits {
                        i.max(1) - 1
                    } else {
                        i
                    }
                })
                .collect();
            let pos: Vec<u32> = (0..x.len() as u32).collect();
            let mut cache = m.new_cache();
            let out = lane.run(|| {
                m.forward(
                    &ForwardRequest {
                        tokens: &x,
                        positions: &pos,
                        mask: AttnMask::Bidirectional,
                        kv_write: KvWrite::None,
                        logits: LogitRows::Rows(&rows),
                    },
                    &mut cache,
                )
            })?;
            let mut ce = 0f64;
            for (j, &i) in masked.iter().enumerate() {
                let mut p = out.row(j).to_vec();
                llada_decode::sampling::softmax(&mut p);
                ce -= (p[w[i] as usize].max(1e-30) as f64).ln();
            }
            sum += ce / t / w.len() as f64;
            n += 1;
        }
    }
    Ok(ProseEval {
        nll_bound: sum / n.max(1) as f64,
        windows: windows.len(),
    })
}

/// A draft evaluation: top-1 agreement with the target over `total` held-out tokens, and the
/// greedy 4-token chain's drafted tokens accepted over its verifications.
#[derive(Clone, Copy, Debug, Default)]
pub struct DraftEval {
    pub agree: usize,
    pub total: usize,
    pub accepted: usize,
    pub verifies: usize,
    pub windows: usize,
}

impl DraftEval {
    /// The fraction of held-out positions where the draft's argmax is the target's.
    pub fn top1(&self) -> f64 {
        self.agree as f64 / self.total.max(1) as f64
    }
    /// Drafted tokens accepted per verification.
    pub fn mean_accepted(&self) -> f64 {
        self.accepted as f64 / self.verifies.max(1) as f64
    }
}

/// The held-out Austen windows both draft evaluations score on (64 tokens, fixed seed).
pub fn draft_eval_windows(model: &Model, n: usize) -> Result<Vec<Vec<u32>>> {
    let tok = model.tokenizer.as_ref().context("no tokenizer")?;
    let file = llada::models::data_file("austen.txt");
    let corpus =
        llada_train::prose::Corpus::load(&[&file], &tok.inner, model.config.eos_id.unwrap_or(0))?;
    check_windows(&corpus, n, 64, &file.display().to_string())?;
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(11);
    Ok(corpus.windows(true, n, 64, &mut rng))
}

/// Draft vs target: top-1 agreement on `n_windows` held-out Austen windows, and greedy chain
/// speculation with 4 drafted tokens (mean drafted tokens accepted per verification).
/// `draft_path` names the draft in the error when its token ids are not the target's.
pub fn eval_draft(
    draft_path: &std::path::Path,
    draft: &Model,
    target: &Model,
    lane: &Lane,
    n_windows: usize,
    progress: &dyn Progress,
) -> Result<DraftEval> {
    llada::draft::same_token_ids(draft_path, draft, target)?;
    let windows = draft_eval_windows(draft, n_windows)?;
    let (mut agree, mut total) = (0usize, 0usize);
    let (mut accepted, mut verifies) = (0usize, 0usize);
    progress.set_len(windows.len() as u64);
    for w in &windows {
        let (dt, tt) = (
            causal_argmax(draft, lane, w)?,
            causal_argmax(target, lane, w)?,
        );
        agree += dt.iter().zip(&tt).filter(|(x, y)| x == y).count();
        total += w.len();
        // Greedy chain speculation: prompt = first 32 tokens, generate 32.
        let mut seq: Vec<u32> = w[..32].to_vec();
        while seq.len() < 64 {
            let mut prop = seq.clone();
            for _ in 0..4 {
                let next = *causal_argmax(draft, lane, &prop)?.last().context("empty")?;
                prop.push(next);
            }
            let tv = causal_argmax(target, lane, &prop)?;
            let mut k = 0;
            while k < 4 && prop[seq.len() + k] == tv[seq.len() + k - 1] {
                k += 1;
            }
            accepted += k;
            verifies += 1;
            let bonus = tv[seq.len() + k - 1];
            seq.extend_from_slice(&prop[seq.len()..seq.len() + k]);
            seq.push(bonus);
        }
        progress.inc(1);
    }
    progress.finish();
    Ok(DraftEval {
        agree,
        total,
        accepted,
        verifies,
        windows: windows.len(),
    })
}

/// A feature drafter (`-m HEAD.safetensors`, from `llada train-feature-draft`) vs its target:
/// the same windows, agreement and 4-token greedy chain as [`eval_draft`]. The drafter reads
/// the target's feature of the position before the one it predicts, which the first position
/// of a window lacks: it is counted as a miss.
pub fn eval_feature_draft(
    head_path: &std::path::Path,
    target: &Model,
    lane: &Lane,
    n_windows: usize,
    progress: &dyn Progress,
) -> Result<DraftEval> {
    use llada_decode::speculative::drafter::Drafter;
    use llada_decode::speculative::featdraft::{FeatureDrafter, FeatureHead, FeatureModel};
    use llada_decode::speculative::tree::DraftTree;
    let head = FeatureHead::load(head_path, target).map_err(crate::error::msg)?;
    let quant = llada::draft::draft_quant(llada::draft::DRAFT_QUANT)?;
    let fm = FeatureModel::new(target, head, quant)?;
    let mut dr = FeatureDrafter::new(target, &fm, 0.0);
    let d = target.config.d_model;
    let windows = draft_eval_windows(target, n_windows)?;
    let features = |toks: &[u32]| -> Result<(Vec<u32>, Vec<f32>)> {
        let out = causal_logits(target, lane, toks)?;
        Ok((argmax_rows(&out, toks.len()), out.features))
    };
    let (mut agree, mut total) = (0usize, 0usize);
    let (mut accepted, mut verifies) = (0usize, 0usize);
    progress.set_len(windows.len() as u64);
    let empty = DraftTree::default();
    for w in &windows {
        let (tt, f) = features(w)?;
        for t in 1..w.len() {
            dr.observe_feature(&f[(t - 1) * d..t * d]);
            let p = dr.propose(&w[..t + 1], &empty, None, 1)?;
            agree += usize::from(p.top.first().map(|x| x.0) == Some(tt[t]));
        }
        total += w.len();
        // Greedy chain speculation: prompt = first 32 tokens, generate 32.
        let mut seq: Vec<u32> = w[..32].to_vec();
        let mut root_feature = f[30 * d..31 * d].to_vec();
        while seq.len() < 64 {
            dr.observe_feature(&root_feature);
            let mut tree = DraftTree::default();
            let mut prop = seq.clone();
            for i in 0..4usize {
                let parent = i.checked_sub(1);
                let p = dr.propose(&seq, &tree, parent, 1)?;
                let Some(&(x, q)) = p.top.first() else {
                    break;
                };
                tree.push(parent, x, q, 1.0);
                prop.push(x);
            }
            let (tv, fv) = features(&prop)?;
            let mut k = 0;
            while k < tree.len() && prop[seq.len() + k] == tv[seq.len() + k - 1] {
                k += 1;
            }
            accepted += k;
            verifies += 1;
            let r = seq.len() + k - 1; // the row that chose the bonus token
            root_feature = fv[r * d..(r + 1) * d].to_vec();
            seq.extend_from_slice(&prop[seq.len()..seq.len() + k]);
            seq.push(tv[r]);
        }
        progress.inc(1);
    }
    progress.finish();
    Ok(DraftEval {
        agree,
        total,
        accepted,
        verifies,
        windows: windows.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--answer-region`: `auto` rounds answer + 1 EOS up to whole blocks; a fixed N is the
    /// same for every answer, rounded up to whole blocks; zero and words are refused.
    #[test]
    fn answer_region_lengths() {
        assert_eq!(parse_answer_region("auto"), Ok(AnswerRegion::Auto));
        assert_eq!(parse_answer_region("160"), Ok(AnswerRegion::Fixed(160)));
        assert!(parse_answer_region("0").is_err());
        assert!(parse_answer_region("long").is_err());
        assert_eq!(AnswerRegion::Auto.length(31, 32), 32);
        assert_eq!(AnswerRegion::Auto.length(32, 32), 64);
        assert_eq!(AnswerRegion::Auto.length(32, 16), 48);
        assert_eq!(AnswerRegion::Fixed(160).length(3, 32), 160);
        assert_eq!(AnswerRegion::Fixed(150).length(100, 32), 160);
        assert_eq!(AnswerRegion::Fixed(150).label(32), "160");
        assert_eq!(AnswerRegion::Auto.label(32), "auto");
    }
}
