//! `llada train` and `llada eval`: the tiny model zoo.

use anyhow::{bail, Context, Result};
use clap::Args;
use llada_decode::diffusion::{
    generate as diffusion_generate, CacheMode, Confidence, DiffusionConfig, Schedule,
};
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
    if let Some(p) = prose_preset(name, 0) {
        return Ok(p);
    }
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
        tied: false,
        store_f16: false,
    };
    Ok(match name {
        "tiny-llada-tasks" => (base(Format::LLaDA, 4), 3000),
        "tiny-dream-tasks" => (base(Format::Dream, 2), 3000),
        other => bail!("unknown preset '{other}' (tiny-llada-tasks, tiny-dream-tasks, tiny-llada-prose, smollm2-draft)"),
    })
}

/// Prose presets: (spec, default steps); `vocab` 0 means "filled in from the tokenizer".
fn prose_preset(name: &str, vocab: usize) -> Option<(ModelSpec, usize)> {
    let spec = |format, d, layers, heads, kv, ffn, tied, f16| ModelSpec {
        format,
        vocab,
        d_model: d,
        n_layers: layers,
        n_heads: heads,
        n_kv_heads: kv,
        ffn,
        rope_theta: 1e4,
        rms_eps: 1e-5,
        max_len: 1024,
        mask_id: 2,
        eos_id: 0,
        bos_id: 1,
        tied,
        store_f16: f16,
    };
    match name {
        // LLaDA format, BPE 4096 trained on Austen + KJV.
        "tiny-llada-prose" => Some((spec(Format::LLaDA, 256, 6, 8, 8, 704, false, true), 3000)),
        // Llama format over SmolLM2's own token ids, tied head: ≈ 11 M MACs/token vs ≈ 134 M.
        "smollm2-draft" => Some((spec(Format::Llama, 192, 4, 6, 2, 512, true, true), 3000)),
        _ => None,
    }
}

fn train_prose(a: &TrainArgs, out: &std::path::Path) -> Result<()> {
    use llada_train::prose::{train_bpe, Corpus};
    use llada_train::trainer::{train as train_with, ProseData};
    let files = [
        std::path::Path::new("data/austen.txt"),
        std::path::Path::new("data/kjv.txt"),
    ];
    for f in files {
        if !f.exists() {
            bail!(
                "{} is missing: run `python3 scripts/fetch_corpora.py` first",
                f.display()
            );
        }
    }
    let (tokenizer, eos) = if a.preset == "smollm2-draft" {
        let path = crate::models::resolve("smollm2", false)?;
        let g = llada_formats::gguf::GgufFile::open(&path)?;
        let t = llada_formats::tokenizer::Tokenizer::from_gguf(&g)?;
        let eos = t.token_id("<|endoftext|>").unwrap_or(0);
        (t.inner, eos)
    } else {
        eprintln!(
            "training a 4096-token byte-level BPE on {} and {}",
            files[0].display(),
            files[1].display()
        );
        (train_bpe(&files, 4096)?, 0)
    };
    let vocab = tokenizer.get_vocab_size(true);
    let (mut spec, steps) = prose_preset(&a.preset, vocab).context("prose preset")?;
    if a.preset == "smollm2-draft" {
        spec.eos_id = eos;
        spec.bos_id = tokenizer.token_to_id("<|im_start|>").unwrap_or(1);
        spec.mask_id = 0;
    }
    eprintln!("tokenizing the corpora (vocab {vocab}) ...");
    let corpus = Corpus::load(&files, &tokenizer, eos)?;
    eprintln!(
        "{} train / {} held-out tokens",
        corpus.train.len(),
        corpus.heldout.len()
    );
    let opts = TrainOptions {
        steps: a.steps.unwrap_or(steps),
        batch: a.batch.max(1),
        lr: a.lr,
        warmup: 100.min(a.steps.unwrap_or(steps) / 10 + 1),
        seed: a.seed,
        checkpoint_every: a.checkpoint_every.max(1),
        curriculum: 1.0,
    };
    let mut data = ProseData {
        corpus,
        tokenizer,
        batch: opts.batch,
        seq_len: 128,
    };
    let st = train_with(spec, opts, out, a.resume, false, &mut data)?;
    eprintln!(
        "done: step {} train loss {:.4} held-out loss {:.4} in {:.0}s",
        st.step,
        st.loss,
        st.heldout_loss.unwrap_or(f64::NAN),
        st.wall_s
    );
    Ok(())
}

pub fn train(a: TrainArgs) -> Result<()> {
    if prose_preset(&a.preset, 0).is_some() {
        let out = a
            .out
            .clone()
            .unwrap_or_else(|| PathBuf::from("models").join(&a.preset));
        return train_prose(&a, &out);
    }
    let (spec, steps) = preset(&a.preset)?;
    let out = a
        .out
        .unwrap_or_else(|| PathBuf::from("models").join(&a.preset));
    let opts = TrainOptions {
        steps: a.steps.unwrap_or(steps),
        batch: a.batch.max(1),
        lr: a.lr,
        warmup: 100.min(a.steps.unwrap_or(steps) / 10 + 1),
        seed: a.seed,
        checkpoint_every: a.checkpoint_every.max(1),
        curriculum: 0.6,
    };
    eprintln!(
        "training {} -> {} ({} steps, batch {})",
        a.preset,
        out.display(),
        opts.steps,
        opts.batch
    );
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

/// Diffusion decoding options (shared by `generate --mode diffusion` and `eval`).
#[derive(Args, Clone)]
pub struct DiffusionArgs {
    /// Strategy: vanilla (recompute everything), prefix (prompt + finished blocks cached),
    /// dual (prefix + masked suffix cached; each step recomputes only the current block).
    #[arg(long, default_value = "vanilla", value_parser = ["vanilla", "prefix", "dual"])]
    pub strategy: String,
    /// Commit every masked token whose confidence reaches this (at least one per step).
    #[arg(long)]
    pub threshold: Option<f32>,
    /// Answer length in tokens (diffusion).
    #[arg(long, default_value_t = 64)]
    pub gen_length: usize,
    /// Denoising steps (default: gen-length, one token per step).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Semi-autoregressive block length.
    #[arg(long, default_value_t = 32)]
    pub block_length: usize,
    /// Confidence for remasking: top-prob (LLaDA low_confidence / Dream maskgit_plus), margin,
    /// entropy, random.
    #[arg(long, default_value = "top-prob", value_parser = ["top-prob", "margin", "entropy", "random"])]
    pub confidence: String,
    /// Commit schedule: uniform (LLaDA) or timesteps (Dream; one block over the whole answer).
    #[arg(long, default_value = "uniform", value_parser = ["uniform", "timesteps"])]
    pub schedule: String,
}

impl DiffusionArgs {
    /// The decoder configuration for an answer of `gen_length` tokens.
    pub fn config(
        &self,
        gen_length: usize,
        temperature: f32,
        seed: u64,
    ) -> Result<DiffusionConfig> {
        let timesteps = self.schedule == "timesteps";
        let block = if timesteps {
            gen_length
        } else {
            self.block_length
        };
        let cfg = DiffusionConfig {
            gen_length,
            steps: self.steps.unwrap_or(gen_length),
            block_length: block,
            schedule: if timesteps {
                Schedule::Timesteps { eps: 1e-3 }
            } else {
                Schedule::Uniform
            },
            confidence: match self.confidence.as_str() {
                "margin" => Confidence::Margin,
                "entropy" => Confidence::NegEntropy,
                "random" => Confidence::Random,
                _ => Confidence::TopProb,
            },
            temperature,
            seed,
            cache: match self.strategy.as_str() {
                "prefix" => CacheMode::Prefix,
                "dual" => CacheMode::Dual,
                _ => CacheMode::None,
            },
            threshold: self.threshold,
        };
        cfg.validate().map_err(anyhow::Error::msg)?;
        Ok(cfg)
    }
    /// A short name for reports.
    pub fn name(&self) -> String {
        match self.threshold {
            Some(t) => format!("{}+threshold{t}", self.strategy),
            None => self.strategy.clone(),
        }
    }
}

/// `llada generate --mode diffusion`.
pub fn generate_diffusion(
    prompt: &str,
    model: &str,
    threads: Option<usize>,
    raw: bool,
    json: bool,
    s: &crate::SamplingArgs,
    d: &DiffusionArgs,
) -> Result<()> {
    let path = if model == "smollm2" {
        PathBuf::from("models/tiny-llada-tasks")
    } else {
        PathBuf::from(model)
    };
    let m = Model::load(&path, &LoadOptions::default())
        .with_context(|| format!("loading {}", path.display()))?;
    let tok = m
        .tokenizer
        .as_ref()
        .context("this model has no tokenizer")?;
    let text = if raw || tok.template == llada_formats::tokenizer::ChatTemplate::Raw {
        prompt.to_string()
    } else {
        tok.template.render(
            &[llada_formats::tokenizer::Message::new("user", prompt)],
            true,
        )
    };
    let mut ids = tok.encode(&text).map_err(anyhow::Error::msg)?;
    if let Some(bos) = m.config.bos_id {
        if ids.first() != Some(&bos) {
            ids.insert(0, bos);
        }
    }
    let cfg = d.config(d.gen_length, s.temperature, s.seed)?;
    let threads = threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let lane = Lane::new("dense", threads)?;
    let out = diffusion_generate(&m, &lane, &ids, &cfg)?;
    let stop: Vec<u32> = tok
        .stop_ids
        .iter()
        .copied()
        .chain(m.config.eos_id)
        .collect();
    let end = out
        .tokens
        .iter()
        .position(|t| stop.contains(t))
        .unwrap_or(out.tokens.len());
    let answer = tok.decode(&out.tokens[..end]);
    if json {
        println!(
            "{}",
            serde_json::json!({"model": path.display().to_string(), "mode": "diffusion", "strategy": d.name(),
                "text": answer, "tokens": out.tokens, "prompt_ids": ids, "prompt_tokens": ids.len(),
                "generated_tokens": end, "forward_passes": out.forward_passes, "rows_computed": out.rows_computed,
                "timings": {"total_s": out.total_s}})
        );
    } else {
        println!("{answer}");
        eprintln!(
            "[{} forward passes, {} rows, {:.3}s, strategy {}]",
            out.forward_passes,
            out.rows_computed,
            out.total_s,
            d.name()
        );
    }
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
    #[command(flatten)]
    diffusion: DiffusionArgs,
    #[arg(long)]
    threads: Option<usize>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn eval(a: EvalArgs) -> Result<()> {
    let model = Model::load(&a.model, &LoadOptions::default())
        .with_context(|| format!("loading {}", a.model.display()))?;
    if model.config.mask_id.is_none() {
        bail!(
            "{} is not a diffusion model (no mask token)",
            a.model.display()
        );
    }
    let threads = a.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let lane = Lane::new("dense", threads)?;
    let split = held_out_split(a.per_task);
    let pb = if a.json {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(split.len() as u64)
    };
    let mut right: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for ex in &split {
        let mut prompt = vec![BOS];
        prompt.extend(CharVocab::encode(&ex.prompt));
        // gen_length: the answer plus at least one EOS, rounded up to whole blocks.
        let gen = (ex.answer.len() + 1).next_multiple_of(a.diffusion.block_length);
        let cfg = a.diffusion.config(gen, 0.0, 0)?;
        let out = diffusion_generate(&model, &lane, &prompt, &cfg)?;
        let got = CharVocab::decode(&out.tokens);
        let e = right.entry(ex.task).or_default();
        e.1 += 1;
        if got == ex.answer {
            e.0 += 1;
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    let tasks: BTreeMap<&str, f64> = right
        .iter()
        .map(|(k, (r, n))| (*k, *r as f64 / *n as f64))
        .collect();
    let total: f64 = right.values().map(|(r, _)| *r as f64).sum::<f64>() / split.len() as f64;
    if a.json {
        println!(
            "{}",
            serde_json::json!({"model": a.model.display().to_string(), "strategy": a.diffusion.name(), "tasks": tasks, "accuracy": total})
        );
    } else {
        for t in TASKS {
            if let Some(acc) = tasks.get(t) {
                println!("{t:<8} {:.1}%", 100.0 * acc);
            }
        }
        println!(
            "overall  {:.1}% ({} held-out examples, {} decoding)",
            100.0 * total,
            split.len(),
            a.diffusion.name()
        );
    }
    Ok(())
}
