//! The training loop: AdamW, warm-up + cosine learning rate, progress bar (loss, tokens/s, ETA),
//! periodic checkpoints in the final HF format, resumable from the last checkpoint.

use crate::model::{Format, ModelSpec, TrainModel};
use crate::objective::{diffusion_batch, next_token_batch, weighted_ce};
use crate::tasks::{Example, TaskGen};
use crate::vocab::CharVocab;
use anyhow::{Context, Result};
use candle_core::Device;
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Instant;

/// Options of one training run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainOptions {
    pub steps: usize,
    pub batch: usize,
    pub lr: f64,
    pub warmup: usize,
    pub seed: u64,
    pub checkpoint_every: usize,
    /// Fraction of the run over which task lengths grow from 20% to 100% (curriculum).
    pub curriculum: f64,
}

/// What a run reached, written to `train_state.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainState {
    pub step: usize,
    pub loss: f64,
    pub heldout_loss: Option<f64>,
    pub wall_s: f64,
    pub tokens: u64,
    pub options: TrainOptions,
}

/// Save `model` as an HF directory (config.json, model.safetensors, tokenizer.json).
pub fn save(model: &TrainModel, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join("model.safetensors.tmp");
    model.varmap.save(&tmp)?;
    std::fs::rename(&tmp, dir.join("model.safetensors"))?;
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&model.spec.config_json())?,
    )?;
    std::fs::write(
        dir.join("tokenizer.json"),
        CharVocab::tokenizer_json().to_string(),
    )?;
    // Task prompts are used as they are: a template that adds nothing.
    let tcfg = serde_json::json!({
        "chat_template": "{{ messages[0]['content'] }}",
        "bos_token": "<|startoftext|>",
        "eos_token": "<|endoftext|>"
    });
    std::fs::write(dir.join("tokenizer_config.json"), serde_json::to_string_pretty(&tcfg)?)?;
    Ok(())
}

fn batch_loss(
    model: &TrainModel,
    ex: &[Example],
    rng: &mut rand::rngs::StdRng,
    dev: &Device,
) -> Result<(candle_core::Tensor, usize)> {
    let s = &model.spec;
    let shift = s.format == Format::Dream;
    let b = match s.format {
        Format::Llama => next_token_batch(ex, dev)?,
        _ => diffusion_batch(ex, s.mask_id, 1e-3, shift, rng, dev)?,
    };
    let logits = model.forward(&b.ids, s.format == Format::Llama)?;
    Ok((weighted_ce(&logits, &b, shift)?, b.tokens))
}

/// Train a task model; resumes from `out` when it holds a checkpoint and `resume` is set.
pub fn train_tasks(
    spec: ModelSpec,
    opts: TrainOptions,
    out: &Path,
    resume: bool,
    quiet: bool,
) -> Result<TrainState> {
    let dev = Device::Cpu;
    let mut model = TrainModel::new(spec, &dev)?;
    let state_path = out.join("train_state.json");
    let mut start = 0;
    let mut wall0 = 0.0;
    let mut tokens: u64 = 0;
    if resume && state_path.exists() {
        let st: TrainState = serde_json::from_str(&std::fs::read_to_string(&state_path)?)?;
        model.varmap.load(out.join("model.safetensors"))?;
        start = st.step;
        wall0 = st.wall_s;
        tokens = st.tokens;
        if !quiet {
            eprintln!("resuming from step {start} (AdamW moments restart)");
        }
    }
    let params = ParamsAdamW {
        lr: opts.lr,
        weight_decay: 0.01,
        ..Default::default()
    };
    let mut opt = AdamW::new(model.varmap.all_vars(), params)?;
    let pb = if quiet {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(opts.steps as u64)
    };
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {pos}/{len} [{elapsed_precise} < {eta_precise}] {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    pb.set_position(start as u64);
    let t0 = Instant::now();
    let mut ema = f64::NAN;
    // Held-out batch for the loss report (fixed).
    let heldout: Vec<Example> = {
        let mut g = TaskGen::new(opts.seed ^ 0xabcdef, true);
        (0..opts.batch).map(|_| g.next(None)).collect()
    };
    let mut last = 0.0;
    for step in start..opts.steps {
        // Seeded per step: a resumed run draws the same batches as an uninterrupted one.
        let mut rng = rand::rngs::StdRng::seed_from_u64(
            opts.seed.wrapping_mul(1_000_003).wrapping_add(step as u64),
        );
        let mut gen = TaskGen::new(opts.seed.wrapping_add(step as u64 * 7919), false);
        let prog = step as f64 / (opts.steps as f64 * opts.curriculum).max(1.0);
        gen.scale = (0.2 + 0.8 * prog).min(1.0);
        let ex: Vec<Example> = (0..opts.batch).map(|_| gen.next(None)).collect();
        let lr = if step < opts.warmup {
            opts.lr * (step + 1) as f64 / opts.warmup as f64
        } else {
            let p = (step - opts.warmup) as f64 / (opts.steps - opts.warmup).max(1) as f64;
            opts.lr * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * p).cos()))
        };
        opt.set_learning_rate(lr);
        let (loss, ntok) = batch_loss(&model, &ex, &mut rng, &dev)?;
        opt.backward_step(&loss)?;
        let l = loss.to_scalar::<f32>()? as f64;
        tokens += ntok as u64;
        ema = if ema.is_nan() {
            l
        } else {
            0.98 * ema + 0.02 * l
        };
        last = l;
        let el = t0.elapsed().as_secs_f64();
        pb.set_message(format!(
            "loss {ema:.4} lr {lr:.2e} {:.0} tok/s",
            tokens as f64 / (wall0 + el).max(1e-9)
        ));
        pb.inc(1);
        if (step + 1) % opts.checkpoint_every == 0 || step + 1 == opts.steps {
            save(&model, out)?;
            let mut rng = rand::rngs::StdRng::seed_from_u64(1);
            let (hl, _) = batch_loss(&model, &heldout, &mut rng, &dev)?;
            let st = TrainState {
                step: step + 1,
                loss: ema,
                heldout_loss: Some(hl.to_scalar::<f32>()? as f64),
                wall_s: wall0 + el,
                tokens,
                options: opts.clone(),
            };
            std::fs::write(&state_path, serde_json::to_string_pretty(&st)?)?;
        }
    }
    pb.finish();
    let _ = last;
    let st: TrainState = serde_json::from_str(&std::fs::read_to_string(&state_path)?)?;
    Ok(st)
}
