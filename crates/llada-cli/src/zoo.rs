//! `llada train` and `llada eval`: the tiny model zoo.

use anyhow::{bail, Context, Result};
use clap::Args;
use llada_decode::diffusion::{generate_vanilla, DiffusionConfig};
use llada_model::{LoadOptions, Model};
use llada_runtime::Lane;
use llada_train::model::{Format, ModelSpec};
use llada_train::tasks::{held_out_split, TASKS};
use llada_train::trainer::{train_tasks, TrainOptions};
use llada_train::vocab::{CharVocab, BOS, EOS, MASK};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Args)]
pub struct TrainArgs {
    /// What to train: tiny-llada-tasks (LLaDA format) or tiny-dream-tasks (Dream format).
    #[arg(long)]
    preset: String,
    /// Output directory (default: models/PRESET).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Optimizer steps (default: the preset's).
    #[arg(long)]
    steps: Option<usize>,
    /// Sequences per batch.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Peak learning rate.
    #[arg(long, default_value_t = 2e-3)]
    lr: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Continue from the checkpoint in the output directory.
    #[arg(long)]
    resume: bool,
    /// Save a checkpoint every N steps.
    #[arg(long, default_value_t = 200)]
    checkpoint_every: usize,
}

fn preset(name: &str) -> Result<(ModelSpec, usize)> {
    let base = |format, kv| ModelSpec {
        format,
        vocab: CharVocab::size(),
        d_model: 128,
        n_layers: 4,
        n_heads: 4,
        n_kv_heads: kv,
        ffn: 384,
        rope_theta: if format == Format::Dream { 1e6 } else { 5e5 },
        rms_eps: if format == Format::Dream { 1e-6 } else { 1e-5 },
        max_len: 512,
        mask_id: MASK,
        eos_id: EOS,
        bos_id: BOS,
    };
    Ok(match name {
        "tiny-llada-tasks" => (base(Format::LLaDA, 4), 3000),
        "tiny-dream-tasks" => (base(Format::Dream, 2), 3000),
        other => bail!("unknown preset '{other}' (tiny-llada-tasks, tiny-dream-tasks)"),
    })
}

pub fn train(a: TrainArgs) -> Result<()> {
    let (spec, steps) = preset(&a.preset)?;
    let out = a.out.unwrap_or_else(|| PathBuf::from("models").join(&a.preset));
    let opts = TrainOptions {
        steps: a.steps.unwrap_or(steps),
        batch: a.batch.max(1),
        lr: a.lr,
        warmup: 100.min(a.steps.unwrap_or(steps) / 10 + 1),
        seed: a.seed,
        checkpoint_every: a.checkpoint_every.max(1),
        curriculum: 0.6,
    };
    eprintln!("training {} -> {} ({} steps, batch {})", a.preset, out.display(), opts.steps, opts.batch);
    let st = train_tasks(spec, opts, &out, a.resume, false)?;
    eprintln!(
        "done: step {} train loss {:.4} held-out loss {:.4} in {:.0}s",
        st.step,
        st.loss,
        st.heldout_loss.unwrap_or(f64::NAN),
        st.wall_s
    );
    Ok(())
}

#[derive(Args)]
pub struct EvalArgs {
    /// Model directory (a task model of the zoo).
    #[arg(long, short = 'm')]
    model: PathBuf,
    /// Held-out examples per task.
    #[arg(long, default_value_t = 20)]
    per_task: usize,
    /// Block length of semi-autoregressive decoding.
    #[arg(long, default_value_t = 32)]
    block_length: usize,
    /// Decoding strategy (vanilla: one token per step, low-confidence remasking).
    #[arg(long, default_value = "vanilla")]
    strategy: String,
    #[arg(long)]
    threads: Option<usize>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn eval(a: EvalArgs) -> Result<()> {
    if a.strategy != "vanilla" {
        bail!("strategy '{}' is not available yet (vanilla)", a.strategy);
    }
    let model = Model::load(&a.model, &LoadOptions::default()).with_context(|| format!("loading {}", a.model.display()))?;
    if model.config.mask_id.is_none() {
        bail!("{} is not a diffusion model (no mask token)", a.model.display());
    }
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    let lane = Lane::new("dense", threads)?;
    let split = held_out_split(a.per_task);
    let pb = if a.json { indicatif::ProgressBar::hidden() } else { indicatif::ProgressBar::new(split.len() as u64) };
    let mut right: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for ex in &split {
        let mut prompt = vec![BOS];
        prompt.extend(CharVocab::encode(&ex.prompt));
        // gen_length: the answer plus at least one EOS, rounded up to whole blocks.
        let gen = (ex.answer.len() + 1).next_multiple_of(a.block_length);
        let cfg = DiffusionConfig::one_per_step(gen, a.block_length);
        let out = generate_vanilla(&model, &lane, &prompt, &cfg)?;
        let got = CharVocab::decode(&out.tokens);
        let e = right.entry(ex.task).or_default();
        e.1 += 1;
        if got == ex.answer {
            e.0 += 1;
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    let tasks: BTreeMap<&str, f64> = right.iter().map(|(k, (r, n))| (*k, *r as f64 / *n as f64)).collect();
    let total: f64 = right.values().map(|(r, _)| *r as f64).sum::<f64>() / split.len() as f64;
    if a.json {
        println!("{}", serde_json::json!({"model": a.model.display().to_string(), "strategy": a.strategy, "tasks": tasks, "accuracy": total}));
    } else {
        for t in TASKS {
            if let Some(acc) = tasks.get(t) {
                println!("{t:<8} {:.1}%", 100.0 * acc);
            }
        }
        println!("overall  {:.1}% ({} held-out examples, vanilla decoding)", 100.0 * total, split.len());
    }
    Ok(())
}
