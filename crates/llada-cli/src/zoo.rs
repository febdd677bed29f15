//! `llada train` and `llada eval`: the tiny model zoo.

use crate::LoadContext;
use anyhow::{bail, Context, Result};
use clap::Args;
use llada_decode::diffusion::{Confidence, DiffusionConfig, Revision};
use llada_decode::strategy::{DiffusionLanes, Strategy, StrategyOptions};
use llada_model::{LoadOptions, Model};
use llada_runtime::Lane;
use llada_train::model::{Format, ModelSpec};
use llada_train::tasks::{held_out_tasks, item_outcomes, Score, MULTI_SUBTASKS, TASKS};
use llada_train::trainer::TrainOptions;
use llada_train::vocab::{CharVocab, BOS, EOS, MASK};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Args)]
pub struct TrainArgs {
    /// What to train: tiny-llada-tasks (LLaDA format), tiny-dream-tasks (Dream format),
    /// tiny-ar-tasks (LLaMA, control), tiny-llada-prose (LLaDA on Austen + KJV), smollm2-draft
    /// (LLaMA draft sharing SmolLM2's token ids). See docs/training.md.
    #[arg(long)]
    preset: String,
    /// Output directory (default: models/PRESET).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Optimizer steps (default: the preset's).
    #[arg(long)]
    steps: Option<usize>,
    /// Sequences per batch (task models: at most, see --batch-tokens).
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Task models: token budget of a training batch (0: off). Batches of long rows keep
    /// only BATCH_TOKENS / row length of their --batch rows (at least 4), so a step costs about
    /// the same whatever the task and short tasks get their share of the compute
    /// [default: 2048].
    #[arg(long)]
    batch_tokens: Option<usize>,
    /// Peak learning rate.
    #[arg(long, default_value_t = 2e-3)]
    lr: f64,
    /// AdamW's second-moment decay β₂, in (0, 1).
    #[arg(long, default_value_t = 0.999, value_parser = parse_open_unit)]
    beta2: f64,
    /// Task models: fraction of the run over which task lengths grow from 20 % to 100 % of
    /// their range (0: full lengths from the start) [default: 0.6].
    #[arg(long, value_parser = parse_fraction)]
    curriculum: Option<f64>,
    /// Seed of the initialisation, the data and the masks (a run is reproducible from it).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Continue from the checkpoint in the output directory (an error when it holds none).
    #[arg(long)]
    resume: bool,
    /// Restrict task models to these tasks (comma-separated: add,sort,rev,cumsum,multi). A task
    /// named twice is drawn twice as often (`--tasks add,sort,sort,rev,cumsum,multi,multi`).
    #[arg(long, value_delimiter = ',')]
    tasks: Vec<String>,
    /// Scale task lengths down (0 < s ≤ 1), e.g. for quick experiments.
    #[arg(long, default_value_t = 1.0)]
    max_scale: f64,
    /// Override the preset's RoPE base.
    #[arg(long)]
    rope_theta: Option<f64>,
    /// Override the preset's init standard deviation (default ≈ 1/√d_model).
    #[arg(long)]
    init_std: Option<f64>,
    /// Data-parallel shards per step: the batch's rows are split, each shard runs forward and
    /// backward on its own thread at once, and the gradients are summed (the same gradient as
    /// one graph, computed faster on small models; docs/training.md) [default: the number of
    /// threads, RAYON_NUM_THREADS or the cores; 1 = one graph over every thread].
    #[arg(long)]
    data_parallel: Option<std::num::NonZeroUsize>,
    /// Override the preset's number of layers (e.g. for a deeper task model).
    #[arg(long)]
    layers: Option<usize>,
    /// Override the preset's width: d_model (a multiple of the head size, which stays as the
    /// preset's); heads, KV heads and the MLP keep the preset's ratios to it, the init
    /// standard deviation scales as 1/√d_model.
    #[arg(long)]
    d_model: Option<usize>,
    /// Override the number of attention heads at the (possibly overridden) width: the head
    /// size becomes d_model / HEADS (even, for RoPE) and the KV heads keep the preset's
    /// query-heads-per-KV-head ratio. More, smaller heads cost the same projections and give
    /// more separate attention patterns (e.g. `--heads 8`: head size 16 at d_model 128).
    #[arg(long)]
    heads: Option<usize>,
    /// Stop after this many minutes of training (wall time, resumed runs included), saving a
    /// checkpoint; `--resume` continues. With --distill the target's labelling counts against
    /// it (the budget is the whole command's) [default: 55 for tiny-llada-tasks,
    /// tiny-dream-tasks and tiny-llada-prose, their cards' budget; none otherwise].
    #[arg(long)]
    minutes: Option<f64>,
    /// Drafts: train on a target model's greedy choices (hard distillation) instead of the
    /// corpus's next tokens. The target (alias, GGUF or HF dir, e.g. smollm2) labels
    /// --distill-windows windows of the training split once, before training; the labels are
    /// cached under data/ and reused.
    #[arg(long)]
    distill: Option<String>,
    /// Windows of 128 tokens the target labels for --distill.
    #[arg(long, default_value_t = 2048)]
    distill_windows: usize,
    /// Where --distill's windows come from: `corpus` (training-split windows, labelled with
    /// the target's argmax), `generated` (a 32-token training-split prefix, alternately as raw
    /// text and inside a chat request, continued by the target's own greedy tokens: the text
    /// a draft meets during speculation) or `mixed` (even windows from the corpus, odd ones
    /// generated: the held-out prose a draft is evaluated on and the text it drafts in use).
    /// A corpus window costs one causal pass of the target (its argmax and, with
    /// --distill-soft, its top K come from the same logits); a generated one a greedy decode.
    #[arg(long, default_value = "corpus", value_parser = ["corpus", "generated", "mixed"])]
    distill_source: String,
    /// With `--distill-source mixed`: the fraction of the windows the target writes (spread
    /// evenly over them; the rest are corpus windows). A written window costs ≈ 2.7x a corpus
    /// one to label. 0.5 (the default) is every other window.
    #[arg(long)]
    distill_generated: Option<f64>,
    /// Soft distillation: train on the target's K most likely next tokens after every prefix
    /// (its softmax, renormalised over those K; ids outside a draft's reduced vocabulary pool
    /// in its "other" class) instead of its argmax alone. The windows are --distill's (the same
    /// cache); the target labels them once more with one causal forward each, cached beside
    /// them. 0: hard distillation.
    #[arg(long, default_value_t = 0)]
    distill_soft: usize,
    /// Drafts with --distill: train on the corpus's next tokens for the first F of the run's
    /// progress and draw from the distillation windows only after it (one command: a corpus
    /// pre-training and a distillation fine-tune under one schedule). 0: every batch may be a
    /// distillation batch.
    #[arg(long, default_value_t = 0.0)]
    distill_from: f64,
    /// Drafts with --distill: once distillation has started (--distill-from), the share of
    /// batches drawn from the distillation windows; the rest stay corpus next-token batches
    /// (they keep the draft a model of the corpus, and fewer passes over the windows over-fit
    /// them less).
    #[arg(long, default_value_t = 1.0)]
    distill_share: f64,
    /// Fine-tune: start from this checkpoint directory's weights (same preset) with a fresh
    /// schedule, e.g. `--init-from models/smollm2-draft --distill smollm2 --distill-source
    /// generated`.
    #[arg(long)]
    init_from: Option<PathBuf>,
    /// Drafts: start from the target's own weights instead of random ones — its embedding
    /// (the reduced vocabulary's rows), final norm and these layers (e.g. `0,29`: a layer-
    /// skipping draft with the target's width, heads and MLP) — then train as usual (with
    /// --distill: on the target's labels). The target is --distill's, else smollm2.
    #[arg(long, value_delimiter = ',')]
    target_layers: Vec<usize>,
    /// Drafts, with --init-from: choose the reduced vocabulary afresh (corpus and distillation
    /// text) instead of keeping the checkpoint's; rows of ids in both carry over, new ids start
    /// from the checkpoint's shared "other" row.
    #[arg(long)]
    revocab: bool,
    /// Task models: fraction of training rows masked as one contiguous run (half suffix, half
    /// prefix of the answer) instead of independently per position; see docs/training.md
    /// [default: 0.5].
    #[arg(long)]
    structured_masks: Option<f64>,
    /// Diffusion models (task presets and tiny-llada-prose): train autoregressively (causal
    /// attention, next token) for this fraction of the run before the diffusion objective, as
    /// Dream-7B starts from an autoregressive model. Dream's shifted logits already predict
    /// position i from output i − 1; a LLaDA model's output i predicts token i + 1 during the
    /// warm-up unless --two-stream [default: the cards' recipe, 0.3 for tiny-llada-tasks, 0.5 for
    /// tiny-dream-tasks and tiny-llada-prose; 0 for tiny-ar-tasks].
    #[arg(long)]
    ar_warmup: Option<f64>,
    /// LLaDA models: run the --ar-warmup in LLaDA's own alignment — output i predicts token i
    /// from a mask at i and the tokens left of it (two-stream attention: each row is trained
    /// as a content stream and a query stream of masks, twice the columns) — instead of plain
    /// next-token prediction (`--two-stream false`) [default: true for tiny-llada-tasks and
    /// tiny-llada-prose with a warm-up].
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    two_stream: Option<bool>,
    /// Diffusion task models: EOS-pad each training answer to a multiple of N tokens, the
    /// generation lengths `llada eval` decodes with (answer + 1 rounded up to 32-token blocks),
    /// so the model learns long EOS tails instead of meeting them first at decode time
    /// [default: 32 for tiny-llada-tasks and tiny-dream-tasks, their cards' recipe; 0 = pad
    /// only to the batch's longest answer otherwise].
    #[arg(long)]
    pad_answers: Option<usize>,
    /// Diffusion task models: what the EOS padding beyond a row's own answer region (up to
    /// the batch's longest row) is. `answer`: part of the answer, attended to, masked and
    /// weighted (the recipe of the shipped Rust-trained cards). `hidden`: hidden from attention
    /// and the loss, so each row trains in the layout `llada eval` decodes it in whatever the
    /// batch holds; the autoregressive warm-up's loss then stops at each row's answer and one
    /// EOS too (docs/training.md, "Objectives").
    #[arg(long, default_value = "answer", value_parser = ["answer", "hidden"])]
    padding: String,
    /// Diffusion task models with `--padding hidden`: with probability P a training row's
    /// answer region is its answer, one EOS and 0 to MAX (uniform, inclusive) more EOS, instead
    /// of answer + 1 rounded up to --pad-answers. With P = 1 the region's end no longer tells
    /// the model how long the answer is, so it learns to end answers itself and decodes in
    /// fixed regions up to about answer + MAX (`--gen-length 64`, `llada eval --answer-region
    /// 64` after `--eos-tail 1:64`; not far beyond what was drawn). MAX ≤ 512
    /// (docs/training.md, "Objectives").
    #[arg(long, value_name = "P:MAX", value_parser = parse_eos_tail)]
    eos_tail: Option<(f64, usize)>,
    /// Task models: one length band (a quarter of the range) per training batch (`--bands
    /// false`: every batch draws every length; with `--padding answer` a short row is then
    /// padded to the batch's longest).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    bands: bool,
    /// Task models: draw this share of the training batches' tasks in proportion to each
    /// task's held-out loss (measured before the first step and at every checkpoint), the rest
    /// uniformly, so that late steps go to the tasks still unsolved rather than to those the
    /// model already answers; the log shows the per-task losses and draw weights. 0: uniform.
    #[arg(long, default_value_t = 0.0)]
    adaptive_mix: f64,
    /// Task models: the sub-tasks drawn for the items of training multi-question rows
    /// (comma-separated from add,rev,cumsum; a name listed twice is drawn twice as often, e.g.
    /// `--multi-tasks add,rev,rev,cumsum`). The held-out split keeps the uniform draw
    /// [default: add,rev,cumsum].
    #[arg(long, value_delimiter = ',')]
    multi_tasks: Vec<String>,
    /// Save a checkpoint every N steps.
    #[arg(long, default_value_t = 200)]
    checkpoint_every: usize,
}

impl TrainArgs {
    /// Apply `--rope-theta` and `--init-std` to a preset's shape (every preset).
    fn override_spec(&self, spec: &mut ModelSpec) -> Result<()> {
        if let Some(t) = self.rope_theta {
            if !(t > 1.0 && t.is_finite()) {
                bail!("--rope-theta must be > 1");
            }
            spec.rope_theta = t;
        }
        if let Some(s) = self.init_std {
            if !(s > 0.0 && s < 1.0) {
                bail!("--init-std must be in (0, 1)");
            }
            spec.init_std = s;
        }
        if !self.target_layers.is_empty() && (self.layers.is_some() || self.d_model.is_some()) {
            bail!("--layers and --d-model do not combine with --target-layers (the draft takes the target's shapes)");
        }
        if let Some(l) = self.layers {
            if !(1..=64).contains(&l) {
                bail!("--layers must be in 1..=64");
            }
            spec.n_layers = l;
        }
        if let Some(d) = self.d_model {
            let hd = spec.head_dim();
            let group = spec.n_heads / spec.n_kv_heads.max(1);
            if d == 0 || d % (hd * group) != 0 || d > 4096 {
                bail!(
                    "--d-model must be a positive multiple of {} (head size {hd} × {group} query heads per KV head), at most 4096",
                    hd * group
                );
            }
            if self.init_std.is_none() {
                // The presets' ≈ 1/√d_model.
                spec.init_std *= (spec.d_model as f64 / d as f64).sqrt();
            }
            spec.ffn = spec.ffn * d / spec.d_model;
            spec.n_heads = d / hd;
            spec.n_kv_heads = spec.n_heads / group;
            spec.d_model = d;
        }
        if let Some(h) = self.heads {
            if !self.target_layers.is_empty() {
                bail!("--heads does not combine with --target-layers (the draft takes the target's shapes)");
            }
            let group = spec.n_heads / spec.n_kv_heads.max(1);
            if h == 0
                || !spec.d_model.is_multiple_of(h)
                || !(spec.d_model / h).is_multiple_of(2)
                || !h.is_multiple_of(group)
            {
                bail!(
                    "--heads must divide d_model {} into heads of an even size (RoPE) and be a multiple of {group} (query heads per KV head)",
                    spec.d_model
                );
            }
            spec.n_heads = h;
            spec.n_kv_heads = h / group;
        }
        Ok(())
    }

    /// The cards' 55-minute budget, for presets whose bare command re-trains a shipped model
    /// (`--minutes` overrides it).
    fn card_budget(&self, opts: &mut TrainOptions) {
        if self.minutes.is_none() {
            opts.time_budget_s = Some(55.0 * 60.0);
        }
    }

    /// The numeric options no run can use, refused before any work (the rest are checked
    /// where they are used, and [`TrainOptions::validate`] checks the assembled options).
    fn check_numbers(&self) -> Result<()> {
        if !(self.lr.is_finite() && self.lr > 0.0) {
            bail!(
                "--lr {}: the learning rate must be a finite number > 0",
                self.lr
            );
        }
        if self.steps == Some(0) {
            bail!("--steps must be at least 1 (a run of 0 steps trains nothing)");
        }
        // 4 096 sequences of a task model's ≤ 512 tokens are 2 M tokens a step, a thousand
        // times the recipes' batches; beyond, a batch only allocates until the kernel kills it.
        if !(1..=4096).contains(&self.batch) {
            bail!("--batch {}: between 1 and 4096 sequences", self.batch);
        }
        if self.distill.is_some() && self.distill_windows == 0 {
            bail!("--distill-windows must be at least 1");
        }
        if self.checkpoint_every == 0 {
            bail!("--checkpoint-every must be at least 1");
        }
        if let Some(m) = self.minutes {
            if !(m.is_finite() && m > 0.0) {
                bail!("--minutes {m}: the time budget must be a finite number of minutes > 0");
            }
        }
        check_max_scale(self.max_scale)
    }

    /// Optimizer options from the flags (checked by [`TrainArgs::check_numbers`]), with the
    /// preset's default step count.
    fn options(&self, default_steps: usize, curriculum: f64) -> TrainOptions {
        let steps = self.steps.unwrap_or(default_steps);
        TrainOptions {
            steps,
            batch: self.batch,
            lr: self.lr,
            warmup: 100.min(steps / 10 + 1),
            seed: self.seed,
            checkpoint_every: self.checkpoint_every,
            curriculum: self.curriculum.unwrap_or(curriculum),
            time_budget_s: self.minutes.map(|m| m * 60.0),
            init_from: self.init_from.clone(),
            data_parallel: self
                .data_parallel
                .map_or_else(|| crate::threads_or_all(None), |n| n.get()),
            beta2: self.beta2,
        }
    }
}

/// Each of `names` (a command-line list) as the entry of `known` it names; an unknown one is
/// an error that lists `known` (`what` names the kind, e.g. "task").
fn known_names(names: &[String], known: &[&'static str], what: &str) -> Result<Vec<&'static str>> {
    names
        .iter()
        .map(|t| {
            known
                .iter()
                .copied()
                .find(|k| k == t)
                .with_context(|| format!("unknown {what} '{t}' (one of {})", known.join(", ")))
        })
        .collect()
}

/// A number in (0, 1).
fn parse_open_unit(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v < 1.0 => Ok(v),
        _ => Err(format!("expected a number in (0, 1), got '{s}'")),
    }
}

/// `--eos-tail P:MAX`: P in (0, 1], MAX a token count up to 512 (the task models' context).
fn parse_eos_tail(s: &str) -> Result<(f64, usize), String> {
    let bad =
        || format!("expected P:MAX with P in (0, 1] and MAX in 0..=512 (e.g. 1:64), got '{s}'");
    let (p, most) = s.split_once(':').ok_or_else(bad)?;
    match (p.parse::<f64>(), most.parse::<usize>()) {
        (Ok(p), Ok(most)) if p > 0.0 && p <= 1.0 && most <= 512 => Ok((p, most)),
        _ => Err(bad()),
    }
}

/// A number in [0, 1].
fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("expected a number in [0, 1], got '{s}'")),
    }
}

/// Task-model presets (char vocabulary): (spec, default steps).
fn task_preset(name: &str) -> Result<(ModelSpec, usize)> {
    let base = |format, kv| ModelSpec {
        format,
        vocab: CharVocab::size(),
        d_model: 128,
        n_layers: 4,
        n_heads: 4,
        n_kv_heads: kv,
        ffn: 384,
        // RoPE base 10⁴ rather than LLaDA-8B's 5·10⁵ / Dream's 10⁶: the tasks need sharp
        // relative positions over a few hundred tokens, not long-context extrapolation.
        rope_theta: 1e4,
        rms_eps: if format == Format::Dream { 1e-6 } else { 1e-5 },
        max_len: 512,
        mask_id: MASK,
        eos_id: EOS,
        bos_id: BOS,
        tied: false,
        store_f16: false,
        // ≈ 1/√d_model. The 0.02 of large models is far too small at d = 128: attention logits
        // start near zero and the model sat on a plateau (copying a letter two positions back
        // stayed at ln 26 for 300 steps; with 0.08 a short-word reversal reached 30–45 % exact
        // match in 2.5 minutes where 0.02 reached 0 %).
        init_std: 0.08,
    };
    Ok(match name {
        // The cards' step count (on 2 cores: ≈ 42 minutes with two shards; one thread beside
        // another run stops at the 55-minute budget first).
        "tiny-llada-tasks" => (base(Format::LLaDA, 4), 16000),
        "tiny-dream-tasks" => (base(Format::Dream, 2), 16000),
        // Autoregressive control on the same tasks (checks the trainer independently of diffusion).
        "tiny-ar-tasks" => (base(Format::Llama, 4), 3000),
        other => bail!("unknown preset '{other}' (tiny-llada-tasks, tiny-dream-tasks, tiny-ar-tasks, tiny-llada-prose, smollm2-draft)"),
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
        // 1/√d_model (0.072 at d = 192); 0.02 kept the prose model at the unigram level
        // (held-out 6.40 nats/token vs the unigram entropy's 6.36) — see the task presets.
        init_std: 1.0 / (d as f64).sqrt(),
    };
    match name {
        // LLaDA format, BPE 4096 trained on Austen + KJV.
        // (d 192, 4 layers: ≈ 2 s/step on one core, so the card's 40-minute budget sees about
        // one epoch; RoPE θ 10⁴ — LLaDA-8B's 5·10⁵ separates nearby positions poorly at this
        // head size, see docs/training.md.)
        "tiny-llada-prose" => Some((
            ModelSpec {
                rope_theta: 1e4,
                ..spec(Format::LLaDA, 192, 4, 6, 6, 512, false, true)
            },
            3000,
        )),
        // Llama format over SmolLM2's own token ids, tied head over 8 192 ids: ≈ 3.1 M MACs/token vs ≈ 134 M.
        "smollm2-draft" => Some((spec(Format::Llama, 192, 4, 6, 2, 512, true, true), 900)),
        _ => None,
    }
}

/// The prose corpora (`austen.txt`, `kjv.txt` in [`crate::models::data_dir`]), or an error
/// saying how to fetch them.
pub(crate) fn prose_files() -> Result<[PathBuf; 2]> {
    let files = [
        crate::models::data_file("austen.txt"),
        crate::models::data_file("kjv.txt"),
    ];
    if let Some(f) = files.iter().find(|f| !f.exists()) {
        bail!(
            "{} is missing: run `python3 scripts/fetch_corpora.py` first",
            f.display()
        );
    }
    Ok(files)
}

/// Rows of `smollm2-draft`'s reduced vocabulary.
const DRAFT_VOCAB: usize = 8192;

fn train_prose(a: &TrainArgs, out: &std::path::Path) -> Result<()> {
    use llada_train::prose::{train_bpe, Corpus};
    use llada_train::trainer::{train as train_with, ProseData};
    let files = prose_files()?;
    // With --distill, the data preparation (tokenizing, the target's labelling) counts
    // against --minutes: the budget is the whole command's.
    let started = std::time::Instant::now();
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
    a.override_spec(&mut spec)?;
    let from_target = if a.target_layers.is_empty() {
        None
    } else {
        let target = a.distill.as_deref().unwrap_or("smollm2");
        let path = crate::models::resolve(target, false)?;
        let (c, tensors) = llada_model::load::export_layers_f32(&path, &a.target_layers)
            .with_context(|| format!("reading layers of {}", path.display()))?;
        if c.vocab != vocab {
            bail!(
                "{} has {} token ids, the draft's tokenizer {vocab}",
                path.display(),
                c.vocab
            );
        }
        spec.d_model = c.d_model;
        spec.n_layers = a.target_layers.len();
        spec.n_heads = c.n_heads;
        spec.n_kv_heads = c.n_kv_heads;
        spec.ffn = c.ffn;
        spec.rope_theta = c.rope_theta;
        spec.rms_eps = c.rms_eps;
        spec.tied = true;
        eprintln!(
            "initialising from {} layers {:?} (d {}, {} heads / {} KV heads, MLP {})",
            path.display(),
            a.target_layers,
            c.d_model,
            c.n_heads,
            c.n_kv_heads,
            c.ffn
        );
        Some((target.to_string(), tensors))
    };
    if a.preset == "smollm2-draft" {
        spec.eos_id = eos;
        spec.bos_id = tokenizer.token_to_id("<|im_start|>").unwrap_or(1);
        spec.mask_id = 0;
    }
    eprintln!("tokenizing the corpora (vocab {vocab}) ...");
    let mut corpus = Corpus::load(&files, &tokenizer, eos)?;
    let seq_len = 128;
    let (mut distill, mut distill_soft) = match &a.distill {
        Some(t) => {
            let source = Source::parse(&a.distill_source, a.distill_generated)?;
            let windows = Source::windows(&corpus.train, a.distill_windows, seq_len)?;
            let data = std::path::Path::new("data");
            label_windows(t, &windows, seq_len, source, a.distill_soft, data)?
        }
        None => (vec![], vec![]),
    };
    let reduced_vocab = if a.preset == "smollm2-draft" && DRAFT_VOCAB < vocab {
        // The draft embeds and predicts only the most frequent ids (one shared row for the
        // rest): its head costs K·d instead of 49152·d MACs per token.
        // A fine-tune keeps its checkpoint's ids; otherwise the most frequent ids of the
        // corpus and, when distilling, of the target's own text (its chat template and modern
        // words are rare in Austen and the KJV: with corpus counts alone, 15 % of the tokens
        // of the target-written windows fell into the "other" row).
        let distill_text: Vec<u32> = distill
            .iter()
            .flat_map(|(x, y)| x.iter().chain(y))
            .copied()
            .collect();
        let (ids, cover) = match a.init_from.as_ref().filter(|_| !a.revocab) {
            Some(dir) => {
                let ids = checkpoint_ids(dir)?;
                let cover = llada_train::prose::apply_vocab(&mut corpus, &ids, vocab);
                (ids, cover)
            }
            None => llada_train::prose::reduce_vocab_with(
                &mut corpus,
                vocab,
                DRAFT_VOCAB,
                &distill_text,
            ),
        };
        let row = llada_train::prose::row_map(&ids, vocab);
        let (n, inside) = (
            distill_text.len(),
            distill_text
                .iter()
                .filter(|&&t| (row[t as usize] as usize) < ids.len())
                .count(),
        );
        eprintln!(
            "reduced vocabulary: {} ids cover {:.2}% of the training tokens{}",
            ids.len(),
            100.0 * cover,
            if n > 0 {
                format!(
                    ", {:.2}% of the distillation text",
                    100.0 * inside as f64 / n as f64
                )
            } else {
                String::new()
            }
        );
        spec.vocab = ids.len() + 1;
        Some((ids, vocab))
    } else {
        None
    };
    eprintln!(
        "{} train / {} held-out tokens",
        corpus.train.len(),
        corpus.heldout.len()
    );
    // Labels and inputs into the draft's rows (ids outside the reduced set: the "other" row).
    if let Some((ids, vocab)) = &reduced_vocab {
        let row = llada_train::prose::row_map(ids, *vocab);
        for (x, y) in &mut distill {
            llada_train::prose::to_rows(&row, ids.len() as u32, x);
            llada_train::prose::to_rows(&row, ids.len() as u32, y);
        }
        for (c, p) in &mut distill_soft {
            merge_soft_rows(&row, ids.len() as u32, a.distill_soft, c, p);
        }
    }
    let mut opts = a.options(steps, 1.0);
    if a.distill.is_some() {
        if let Some(b) = opts.time_budget_s.as_mut() {
            let spent = started.elapsed().as_secs_f64();
            eprintln!(
                "{:.1} of the {:.1} minutes went to tokenizing and to the target's labels",
                spent / 60.0,
                *b / 60.0
            );
            if spent >= *b {
                bail!("the target's labels took the whole --minutes budget: raise it or lower --distill-windows");
            }
            *b -= spent;
        }
    }
    if let (true, Some(dir), Some((ids, _))) = (a.revocab, &a.init_from, &reduced_vocab) {
        opts.init_from = Some(write_revocab_init(dir, ids)?);
    }
    if let Some((target, tensors)) = from_target {
        let ids = reduced_vocab.as_ref().map(|(ids, _)| ids.as_slice());
        opts.init_from = Some(write_target_init(&target, &a.target_layers, tensors, ids)?);
    }
    // The card's recipe is the default of tiny-llada-prose (a bare `llada train --preset
    // tiny-llada-prose` re-trains the shipped model): 55 minutes, the first half a two-stream
    // warm-up.
    let diffusion = a.preset == "tiny-llada-prose";
    if diffusion {
        a.card_budget(&mut opts);
    }
    let ar_warmup = a.ar_warmup.unwrap_or(if diffusion { 0.5 } else { 0.0 });
    if !(0.0..1.0).contains(&ar_warmup) {
        bail!("--ar-warmup must be in [0, 1)");
    }
    if a.two_stream == Some(true) && ar_warmup == 0.0 {
        bail!("--two-stream needs an --ar-warmup > 0");
    }
    let mut data = ProseData {
        corpus,
        tokenizer,
        batch: opts.batch,
        seq_len,
        reduced_vocab,
        distill,
        distill_soft,
        distill_from: a.distill_from,
        distill_share: a.distill_share,
        ar_warmup,
        two_stream: a.two_stream.unwrap_or(ar_warmup > 0.0),
    };
    let st = train_with(spec, opts, out, a.resume, false, &mut data)?;
    report(&st);
    Ok(())
}

/// Writes the target's exported tensors as a draft checkpoint to start from
/// (`data/init-TARGET-L…/model.safetensors`) and returns its directory. With a reduced
/// vocabulary the embedding keeps the rows of `ids`, and the shared "other" row is the mean of
/// every other row.
fn write_target_init(
    target: &str,
    layers: &[usize],
    tensors: Vec<llada_model::load::ExportedTensor>,
    ids: Option<&[u32]>,
) -> Result<PathBuf> {
    use candle_core::{Device, Tensor};
    let stem = file_stem(target);
    let tag: Vec<String> = layers.iter().map(usize::to_string).collect();
    let dir = PathBuf::from("data").join(format!("init-{stem}-L{}", tag.join("_")));
    let mut map = std::collections::HashMap::new();
    for t in tensors {
        let (shape, data) = match (t.name.as_str(), ids) {
            ("model.embed_tokens.weight", Some(ids)) => {
                let d = t.shape[1];
                let mut keep = vec![false; t.shape[0]];
                let mut rows = Vec::with_capacity((ids.len() + 1) * d);
                for &i in ids {
                    let i = i as usize;
                    let row = t
                        .data
                        .get(i * d..(i + 1) * d)
                        .context("a reduced-vocabulary id beyond the target's embedding")?;
                    rows.extend_from_slice(row);
                    keep[i] = true;
                }
                let mut other = vec![0f64; d];
                let mut n = 0usize;
                for (r, _) in keep.iter().enumerate().filter(|(_, k)| !**k) {
                    for (o, v) in other.iter_mut().zip(&t.data[r * d..(r + 1) * d]) {
                        *o += *v as f64;
                    }
                    n += 1;
                }
                rows.extend(other.iter().map(|v| (*v / n.max(1) as f64) as f32));
                (vec![ids.len() + 1, d], rows)
            }
            _ => (t.shape, t.data),
        };
        map.insert(t.name, Tensor::from_vec(data, shape, &Device::Cpu)?);
    }
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("model.safetensors");
    candle_core::safetensors::save(&map, &file)
        .with_context(|| format!("writing {}", file.display()))?;
    Ok(dir)
}

/// `dir`'s checkpoint with its embedding (and untied head) moved to the reduced vocabulary
/// `ids`: an id it already had keeps its row, a new one starts from its "other" row (the last).
/// Written to `data/init-revocab-NAME/` and returned (the directory to start from).
fn write_revocab_init(dir: &std::path::Path, ids: &[u32]) -> Result<PathBuf> {
    use candle_core::{Device, Tensor};
    let old = checkpoint_ids(dir)?;
    let file = dir.join("model.safetensors");
    let mut map = candle_core::safetensors::load(&file, &Device::Cpu)
        .with_context(|| format!("reading {}", file.display()))?;
    let old_row: std::collections::HashMap<u32, usize> =
        old.iter().enumerate().map(|(r, &t)| (t, r)).collect();
    let index: Vec<u32> = ids
        .iter()
        .map(|t| old_row.get(t).copied().unwrap_or(old.len()) as u32)
        .chain(std::iter::once(old.len() as u32))
        .collect();
    let index = Tensor::new(index.as_slice(), &Device::Cpu)?;
    let mut moved = 0;
    for name in ["model.embed_tokens.weight", "lm_head.weight"] {
        if let Some(t) = map.get(name) {
            if t.dim(0)? != old.len() + 1 {
                bail!(
                    "{}: {name} has {} rows, its config lists {} ids (+ other)",
                    file.display(),
                    t.dim(0)?,
                    old.len()
                );
            }
            let t = t.index_select(&index, 0)?;
            map.insert(name.to_string(), t);
            moved += 1;
        }
    }
    if moved == 0 {
        bail!("{} has no embedding to move", file.display());
    }
    let kept = ids.iter().filter(|t| old_row.contains_key(t)).count();
    eprintln!(
        "revocab: {kept} of {} ids keep their rows from {}",
        ids.len(),
        dir.display()
    );
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "draft".into());
    let out = PathBuf::from("data").join(format!("init-revocab-{name}"));
    std::fs::create_dir_all(&out)?;
    candle_core::safetensors::save(&map, out.join("model.safetensors"))
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(out)
}

/// `name` with every character but ASCII letters and digits replaced by `_` (cache file names).
fn file_stem(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The target that labels distillation windows, one one-thread lane per worker, and a progress
/// bar over `n` windows (lines every 32 windows when stderr is not a terminal).
///
/// Windows are labelled by independent workers (one per thread, each on its own one-thread
/// lane) rather than by one lane over every thread: a greedy decode is a chain of one-row
/// passes that one thread keeps busy less than fully, and measured on SmolLM2-135M two
/// one-thread decodes side by side produce ≈ 1.5x the tokens per second of one two-thread
/// decode (`llada generate --threads 1|2`, 183 + 184 vs 240 tok/s). Each window's result is
/// the same whichever worker computes it.
struct Labeller {
    model: Model,
    lanes: Vec<Lane>,
    pb: indicatif::ProgressBar,
    done: std::sync::atomic::AtomicUsize,
    what: &'static str,
}

impl Labeller {
    fn load(target: &str, n: usize, what: &'static str) -> Result<Self> {
        let tpath = crate::models::resolve(target, false)?;
        let model = Model::load(&tpath, &LoadOptions::default())
            .with_context(|| format!("loading the distillation target {}", tpath.display()))?;
        let lanes = (0..crate::threads_or_all(None).clamp(1, n.max(1)))
            .map(|i| Lane::new(&format!("label{i}"), 1))
            .collect::<std::io::Result<Vec<_>>>()?;
        let pb = indicatif::ProgressBar::new(n as u64);
        pb.set_style(
            indicatif::ProgressStyle::with_template(&format!(
                "{what} {{bar:30}} {{pos}}/{{len}} windows [{{elapsed_precise}} < {{eta_precise}}]"
            ))
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Ok(Self {
            model,
            lanes,
            pb,
            done: std::sync::atomic::AtomicUsize::new(0),
            what,
        })
    }

    /// One window is done.
    fn tick(&self) {
        self.pb.inc(1);
        let i = self.done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if (i + 1).is_multiple_of(32) && !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            let n = self.pb.length().unwrap_or(0);
            eprintln!("{}: {}/{n} windows", self.what, i + 1);
        }
    }

    /// `f(model, lane, k)` for every window `k < n`, spread over the workers (each takes the
    /// next window not yet taken: windows of unequal cost — a `mixed` source's corpus and
    /// generated windows alternate — keep every worker busy to the end), results in window
    /// order; the first error stops the rest.
    fn map<T: Send>(
        &self,
        n: usize,
        f: impl Fn(&Model, &Lane, usize) -> Result<T> + Sync,
    ) -> Result<Vec<T>> {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failed = std::sync::atomic::AtomicBool::new(false);
        let parts: Vec<Result<Vec<(usize, T)>>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .lanes
                .iter()
                .map(|lane| {
                    let (f, failed, next) = (&f, &failed, &next);
                    s.spawn(move || {
                        let mut out = Vec::new();
                        loop {
                            let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if k >= n || failed.load(std::sync::atomic::Ordering::Relaxed) {
                                break;
                            }
                            match f(&self.model, lane, k) {
                                Ok(v) => out.push((k, v)),
                                Err(e) => {
                                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                                    return Err(e);
                                }
                            }
                            self.tick();
                        }
                        Ok(out)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a labelling worker panicked")))
                })
                .collect()
        });
        self.pb.finish();
        let mut all: Vec<(usize, T)> = Vec::with_capacity(n);
        for p in parts {
            all.extend(p?);
        }
        all.sort_by_key(|(k, _)| *k);
        Ok(all.into_iter().map(|(_, v)| v).collect())
    }
}

/// A label cache's little-endian u32 words (`None`: unreadable).
fn read_words(path: &std::path::Path) -> Option<Vec<u32>> {
    let bytes = std::fs::read(path).ok()?;
    Some(
        bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

fn write_words(path: &std::path::Path, w: &[u32]) -> Result<()> {
    let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::create_dir_all("data")?;
    llada_formats::atomic::write(path, &bytes)?;
    Ok(())
}

/// Tokens of a `generated` distillation window's corpus prefix.
const GEN_PREFIX: usize = 32;

/// Where distillation windows come from (`--distill-source`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Source {
    Corpus,
    Generated,
    /// Corpus windows and windows the target writes, this fraction of them written.
    Mixed(f64),
}

impl Source {
    /// `--distill-source` and `--distill-generated`.
    fn parse(s: &str, generated: Option<f64>) -> Result<Self> {
        Ok(match (s, generated) {
            ("mixed", g) => {
                let g = g.unwrap_or(0.5);
                if !(g > 0.0 && g < 1.0) {
                    bail!("--distill-generated must be in (0, 1), got {g}");
                }
                Self::Mixed(g)
            }
            (_, Some(_)) => bail!("--distill-generated needs --distill-source mixed"),
            ("generated", None) => Self::Generated,
            _ => Self::Corpus,
        })
    }

    /// The caches' name stem (`distill-mix` for every other window written, as before the
    /// fraction could be chosen; `distill-mix25` for a quarter).
    fn kind(self) -> String {
        match self {
            Self::Corpus => "distill".into(),
            Self::Generated => "distill-gen".into(),
            Self::Mixed(0.5) => "distill-mix".into(),
            Self::Mixed(g) => format!("distill-mix{}", (100.0 * g).round()),
        }
    }

    /// How window `k` is made: `None`, a corpus window; `Some(chat)`, written by the target
    /// from the window's first [`GEN_PREFIX`] tokens, inside a chat request when `chat`.
    /// Mixed: window `k` is written when `⌊(k + 1)·g⌋ > ⌊k·g⌋` (evenly spread; with g = ½ the
    /// odd windows), and the written ones alternate raw text and chat requests.
    fn generated(self, k: usize) -> Option<bool> {
        match self {
            Self::Corpus => None,
            Self::Generated => Some(k % 2 == 1),
            Self::Mixed(g) => {
                let before = (k as f64 * g).floor();
                (((k + 1) as f64 * g).floor() > before).then_some(before as usize % 2 == 1)
            }
        }
    }

    /// `n` windows of `t` tokens spread evenly over the training split (full token ids): the
    /// corpus windows themselves, or the prefixes the target continues (whatever the source).
    fn windows(train: &[u32], n: usize, t: usize) -> Result<Vec<Vec<u32>>> {
        if n == 0 || train.len() < t + 1 {
            bail!("--distill-windows must be > 0 and the corpus longer than a window");
        }
        let stride = ((train.len() - t) / n).max(1);
        Ok((0..n)
            .map(|k| (k * stride).min(train.len() - t))
            .map(|s| train[s..s + t].to_vec())
            .collect())
    }
}

/// Labelled distillation windows: inputs and the target's argmax after every prefix.
type Hard = Vec<(Vec<u32>, Vec<u32>)>;
/// The target's `k` most likely next tokens after every prefix (full ids, position-major) with
/// their probabilities renormalised over those `k`.
type Soft = Vec<(Vec<u32>, Vec<f32>)>;

/// Windows of `t` tokens for `llada train-feature-draft`, made as distillation windows are
/// (`source` as `--distill-source`: `corpus`, `generated` or `mixed`, every other one written):
/// spread over the training split, those the source says written by the target greedily
/// from their first 32 tokens (cached with their labels in `data/`, as distillation's).
pub(crate) fn feature_windows(
    target: &str,
    train: &[u32],
    n: usize,
    t: usize,
    source: &str,
) -> Result<Vec<Vec<u32>>> {
    let source = Source::parse(source, None)?;
    let windows = Source::windows(train, n, t)?;
    if source == Source::Corpus {
        return Ok(windows);
    }
    let (hard, _) = label_windows(target, &windows, t, source, 0, std::path::Path::new("data"))?;
    Ok(hard.into_iter().map(|(x, _)| x).collect())
}

const FEATURE_MAGIC: u32 = 0x5446_4453;

/// The target's final feature at every position of `windows` (`n·t × d`, one causal pass per
/// window, one worker per thread) and its argmax there, for `llada train-feature-draft`.
/// Cached in `data/features-TARGET-NxT.bin` (magic, n, t, d, the windows' tokens, the
/// argmaxes, the features as f32 bits), used only if it holds exactly these windows.
pub(crate) fn record_features(
    target: &str,
    windows: &[Vec<u32>],
    what: &'static str,
) -> Result<(Vec<f32>, Vec<u32>)> {
    let n = windows.len();
    let t = windows.first().map_or(0, Vec::len);
    if windows.iter().any(|w| w.len() != t) {
        bail!("feature windows must have one length");
    }
    let cache =
        std::path::Path::new("data").join(format!("features-{}-{n}x{t}.bin", file_stem(target)));
    if let Some(w) = read_words(&cache) {
        let d = w.get(3).copied().unwrap_or(0) as usize;
        let ok = w.len() == 4 + 2 * n * t + n * t * d
            && w[..3] == [FEATURE_MAGIC, n as u32, t as u32]
            && w[4..4 + n * t].iter().eq(windows.iter().flatten());
        if ok {
            eprintln!("{what}: {} (cached)", cache.display());
            let best = w[4 + n * t..4 + 2 * n * t].to_vec();
            let feats = w[4 + 2 * n * t..]
                .iter()
                .map(|&b| f32::from_bits(b))
                .collect();
            return Ok((feats, best));
        }
    }
    let l = Labeller::load(target, n, what)?;
    let per = l.map(n, |model, lane, i| {
        let out = causal_logits(model, lane, &windows[i])?;
        Ok((out.features.clone(), argmax_rows(&out, t)))
    })?;
    let d = per.first().map_or(0, |p| p.0.len() / t.max(1));
    let mut feats = Vec::with_capacity(n * t * d);
    let mut best = Vec::with_capacity(n * t);
    for (f, b) in per {
        feats.extend(f);
        best.extend(b);
    }
    let mut w: Vec<u32> = vec![FEATURE_MAGIC, n as u32, t as u32, d as u32];
    w.extend(windows.iter().flatten());
    w.extend(&best);
    w.extend(feats.iter().map(|v| v.to_bits()));
    write_words(&cache, &w)?;
    Ok((feats, best))
}

const HARD_MAGIC: u32 = 0x4c4c_4453;
const SOFT_MAGIC: u32 = 0x4b4c_4453;

/// Labels `inputs` (from [`Source::windows`]) with the target: every window's argmax labels
/// and, with `k > 0`, its top-`k` soft labels, in one pass per window — a corpus window is one
/// causal forward (both labels from the same logits), a generated one a greedy decode from its
/// prefix (see [`generate_window`]) plus one causal forward for the soft labels.
///
/// Cached in `DIR/KIND-TARGET-NxT.bin` (magic, n, t, inputs, labels as little-endian u32) and
/// `DIR/KIND-softK-TARGET-NxT.bin` (magic, n, t, k, inputs, ids, probabilities as f32 bits);
/// a cache is used only if its inputs are these windows (a generated window: if it starts with
/// its prefix, or is a chat request), and soft labels alone are added to cached hard ones.
fn label_windows(
    target: &str,
    inputs: &[Vec<u32>],
    t: usize,
    source: Source,
    k: usize,
    dir: &std::path::Path,
) -> Result<(Hard, Soft)> {
    let n = inputs.len();
    let stem = file_stem(target);
    let kind = source.kind();
    let hard_cache = dir.join(format!("{kind}-{stem}-{n}x{t}.bin"));
    let soft_cache = dir.join(format!("{kind}-soft{k}-{stem}-{n}x{t}.bin"));
    let p = GEN_PREFIX.min(t);
    let same_source = |i: usize, x: &[u32]| match source.generated(i) {
        None => x == inputs[i].as_slice(),
        Some(chat) => chat || x[..p] == inputs[i][..p],
    };
    let cached = read_hard(&hard_cache, n, t)
        .filter(|w| w.iter().enumerate().all(|(i, (x, _))| same_source(i, x)));
    if let Some(hard) = cached {
        eprintln!("distillation labels: {} (cached)", hard_cache.display());
        if k == 0 {
            return Ok((hard, vec![]));
        }
        if let Some(soft) = read_soft(&soft_cache, &hard, k) {
            eprintln!("soft labels: {} (cached)", soft_cache.display());
            return Ok((hard, soft));
        }
        let l = Labeller::load(target, n, "soft labels")?;
        let soft = l.map(n, |model, lane, i| causal_top_k(model, lane, &hard[i].0, k))?;
        write_soft(&soft_cache, &hard, &soft, k)?;
        return Ok((hard, soft));
    }
    if hard_cache.exists() {
        eprintln!(
            "{} does not match these windows: relabelling",
            hard_cache.display()
        );
    }
    let l = Labeller::load(target, n, "labelling")?;
    let out = l.map(n, |model, lane, i| {
        let x = &inputs[i];
        match source.generated(i) {
            None => {
                let out = causal_logits(model, lane, x)?;
                let y = argmax_rows(&out, t);
                let soft = (k > 0).then(|| top_k_rows(&out, t, k));
                Ok(((x.clone(), y), soft))
            }
            Some(chat) => {
                let (x, y) = generate_window(model, lane, &x[..p], chat, t)?;
                let soft = match k {
                    0 => None,
                    _ => Some(causal_top_k(model, lane, &x, k)?),
                };
                Ok(((x, y), soft))
            }
        }
    })?;
    let (hard, soft): (Hard, Vec<_>) = out.into_iter().unzip();
    let soft: Soft = soft.into_iter().flatten().collect();
    let mut w: Vec<u32> = vec![HARD_MAGIC, n as u32, t as u32];
    w.extend(hard.iter().flat_map(|(x, _)| x.iter().copied()));
    w.extend(hard.iter().flat_map(|(_, y)| y.iter().copied()));
    write_words(&hard_cache, &w)?;
    if k > 0 {
        write_soft(&soft_cache, &hard, &soft, k)?;
    }
    Ok((hard, soft))
}

/// A hard-label cache's windows, if it holds `n` windows of `t` tokens.
fn read_hard(path: &std::path::Path, n: usize, t: usize) -> Option<Hard> {
    let w = read_words(path)?;
    if w.len() != 3 + 2 * n * t || w[0] != HARD_MAGIC || w[1] as usize != n || w[2] as usize != t {
        return None;
    }
    let (xs, ys) = w[3..].split_at(n * t);
    Some(
        xs.chunks(t)
            .map(<[u32]>::to_vec)
            .zip(ys.chunks(t).map(<[u32]>::to_vec))
            .collect(),
    )
}

/// A soft-label cache's labels, if they are top-`k` labels of exactly these windows.
fn read_soft(path: &std::path::Path, windows: &Hard, k: usize) -> Option<Soft> {
    let n = windows.len();
    let t = windows.first().map_or(0, |w| w.0.len());
    let w = read_words(path)?;
    let head = [SOFT_MAGIC, n as u32, t as u32, k as u32];
    if w.len() != 4 + n * t * (1 + 2 * k) || w[..4] != head {
        return None;
    }
    let (xs, rest) = w[4..].split_at(n * t);
    let (cs, ps) = rest.split_at(n * t * k);
    if !xs.chunks(t).zip(windows).all(|(x, w)| x == w.0.as_slice()) {
        return None;
    }
    Some(
        cs.chunks(t * k)
            .zip(ps.chunks(t * k))
            .map(|(c, p)| (c.to_vec(), p.iter().map(|&b| f32::from_bits(b)).collect()))
            .collect(),
    )
}

fn write_soft(path: &std::path::Path, windows: &Hard, soft: &Soft, k: usize) -> Result<()> {
    let t = windows.first().map_or(0, |w| w.0.len());
    let mut w: Vec<u32> = vec![SOFT_MAGIC, windows.len() as u32, t as u32, k as u32];
    w.extend(windows.iter().flat_map(|(x, _)| x.iter().copied()));
    w.extend(soft.iter().flat_map(|(c, _)| c.iter().copied()));
    w.extend(soft.iter().flat_map(|(_, p)| p.iter().map(|v| v.to_bits())));
    write_words(path, &w)
}

/// The `k` largest entries of the softmax of every row of one causal forward over `tokens`,
/// renormalised over those `k`, most likely first: `(ids, probabilities)`, `tokens.len()·k`
/// each.
fn causal_top_k(m: &Model, lane: &Lane, tokens: &[u32], k: usize) -> Result<(Vec<u32>, Vec<f32>)> {
    let out = causal_logits(m, lane, tokens)?;
    Ok(top_k_rows(&out, tokens.len(), k))
}

/// [`top_k_softmax`] of the first `rows` rows of a forward's logits, concatenated.
fn top_k_rows(out: &llada_model::ForwardOutput, rows: usize, k: usize) -> (Vec<u32>, Vec<f32>) {
    let (mut ids, mut probs) = (Vec::new(), Vec::new());
    for i in 0..rows {
        let (c, p) = top_k_softmax(out.row(i), k);
        ids.extend(c);
        probs.extend(p);
    }
    (ids, probs)
}

/// The `k` most likely classes of `softmax(logits)` (ties: lower id first), probabilities
/// renormalised over them. Fewer than `k` logits: all of them.
fn top_k_softmax(logits: &[f32], k: usize) -> (Vec<u32>, Vec<f32>) {
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let by_logit = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let k = k.min(idx.len());
    if k < idx.len() {
        idx.select_nth_unstable_by(k, by_logit);
        idx.truncate(k);
    }
    idx.sort_by(by_logit);
    let max = idx.first().map_or(0.0, |&i| logits[i as usize]);
    let e: Vec<f32> = idx
        .iter()
        .map(|&i| (logits[i as usize] - max).exp())
        .collect();
    let z: f32 = e.iter().sum();
    (idx, e.into_iter().map(|v| v / z).collect())
}

/// Soft labels (full ids) into a reduced vocabulary's rows: ids that share a row (the "other"
/// row) have their probabilities added, and each position keeps `k` entries (padding: row 0
/// with probability 0).
fn merge_soft_rows(row: &[u32], other: u32, k: usize, classes: &mut [u32], probs: &mut [f32]) {
    for (c, p) in classes.chunks_mut(k).zip(probs.chunks_mut(k)) {
        let mut merged: Vec<(u32, f32)> = Vec::with_capacity(k);
        for (&id, &q) in c.iter().zip(p.iter()) {
            let r = row.get(id as usize).copied().unwrap_or(other);
            match merged.iter_mut().find(|(m, _)| *m == r) {
                Some(e) => e.1 += q,
                None => merged.push((r, q)),
            }
        }
        merged.resize(k, (0, 0.0));
        for (j, (r, q)) in merged.into_iter().enumerate() {
            c[j] = r;
            p[j] = q;
        }
    }
}

/// A `t`-token window — `prefix` (as raw text, or inside a chat request) continued by the
/// target's own greedy tokens — and its labels, the target's argmax after every position. Past
/// the prompt the argmax *is* the next greedy token (one more is generated for the last
/// label), so only the prompt needs a labelling pass.
fn generate_window(
    model: &Model,
    lane: &Lane,
    prefix: &[u32],
    chat: bool,
    t: usize,
) -> Result<(Vec<u32>, Vec<u32>)> {
    let prompt = if chat {
        let tok = model
            .tokenizer
            .as_ref()
            .context("the target has no tokenizer")?;
        let text = format!("Continue this passage:\n{}", tok.decode(prefix));
        let msg = llada_formats::tokenizer::Message::new("user", &text);
        let ids = tok
            .encode(&tok.template.render(&[msg], true))
            .map_err(anyhow::Error::msg)?;
        ids[..ids.len().min(t - 1)].to_vec()
    } else {
        prefix.to_vec()
    };
    let cfg = llada_decode::ar::GenerateConfig {
        max_tokens: t + 1 - prompt.len(),
        stop_at_eos: false,
        ..Default::default()
    };
    let g = llada_decode::ar::generate(model, lane, &prompt, &cfg, |_| true)?;
    let mut y = causal_argmax(model, lane, &prompt[..prompt.len() - 1])?;
    let mut x = prompt;
    x.extend_from_slice(&g.tokens);
    if x.len() != t + 1 {
        bail!("the target produced {} of {t} window tokens", x.len() - 1);
    }
    y.extend_from_slice(&x[y.len() + 1..]);
    x.truncate(t);
    Ok((x, y))
}

/// The reduced vocabulary a draft checkpoint was trained over (a fine-tune keeps it).
fn checkpoint_ids(dir: &std::path::Path) -> Result<Vec<u32>> {
    let file = dir.join("config.json");
    let cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?,
    )
    .with_context(|| format!("parsing {}", file.display()))?;
    // The engine's own reading of `reduced_vocab_ids` (validated), not a second parser.
    llada_model::ModelConfig::from_hf(&cfg, &file)?
        .vocab_ids
        .with_context(|| format!("{} has no reduced vocabulary", dir.display()))
}

fn report(st: &llada_train::trainer::TrainState) {
    eprintln!(
        "done: step {} train loss {:.4} held-out loss {:.4} in {:.0}s",
        st.step,
        st.loss,
        st.heldout_loss.unwrap_or(f64::NAN),
        st.wall_s
    );
}

/// `--max-scale` (`train`, `eval`): a fraction of the task lengths, in (0, 1].
fn check_max_scale(s: f64) -> Result<()> {
    if !(s > 0.0 && s <= 1.0) {
        bail!("--max-scale {s}: must be in (0, 1]");
    }
    Ok(())
}

/// Training frees and re-allocates the same tens of megabytes of activations and gradients every
/// step. mimalloc returns freed pages to the OS after a delay (v3: 1 s), so each step faulted them
/// back in and the kernel zeroed them again: perf showed ≈ 20 % of a task-model run in
/// `clear_page_erms`/`memset`. With purging off, 40 steps of `--preset tiny-llada-tasks` took
/// 39–42 s instead of 77–81 s (alternated, one session). Only training sets it: generation showed
/// no difference, and the speculative engine's resident-memory accounting wants pages returned.
fn keep_freed_pages() {
    // SAFETY: sets one process-wide allocator option; mimalloc reads it on its next purge.
    unsafe { libmimalloc_sys::mi_option_set(crate::MI_OPTION_PURGE_DELAY, -1) }
}

pub fn train(a: TrainArgs) -> Result<()> {
    keep_freed_pages();
    a.check_numbers()?;
    // The output directory is checked before any work (tokenizing, labelling, training).
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("models").join(&a.preset));
    llada_train::trainer::check_out_dir(&out, a.resume)?;
    if a.distill.is_some() && a.preset != "smollm2-draft" {
        bail!("--distill applies to drafts (--preset smollm2-draft)");
    }
    if a.distill_soft > 0 && a.distill.is_none() {
        bail!("--distill-soft needs --distill TARGET (the model whose distribution is learnt)");
    }
    if a.distill.is_none() && (a.distill_from != 0.0 || a.distill_share != 1.0) {
        bail!("--distill-from and --distill-share need --distill TARGET");
    }
    if !((0.0..1.0).contains(&a.distill_from) && a.distill_share > 0.0 && a.distill_share <= 1.0) {
        bail!("--distill-from must be in [0, 1) and --distill-share in (0, 1]");
    }
    if a.distill_soft == 1 || a.distill_soft > 256 {
        bail!("--distill-soft takes 0 (hard labels) or 2 to 256 classes per position");
    }
    if !a.target_layers.is_empty() {
        if a.preset != "smollm2-draft" {
            bail!("--target-layers applies to drafts (--preset smollm2-draft)");
        }
        if a.init_from.is_some() {
            bail!("--target-layers and --init-from both say where to start: give one");
        }
    }
    if a.revocab && (a.init_from.is_none() || a.preset != "smollm2-draft") {
        bail!("--revocab moves a draft checkpoint to a new vocabulary: it needs --preset smollm2-draft and --init-from");
    }
    if prose_preset(&a.preset, 0).is_some() {
        // Task-model options would otherwise be accepted and silently ignored.
        if !a.tasks.is_empty()
            || a.structured_masks.is_some()
            || a.batch_tokens.is_some()
            || a.pad_answers.is_some()
            || a.padding != "answer"
            || a.eos_tail.is_some()
            || !a.bands
            || a.adaptive_mix != 0.0
            || !a.multi_tasks.is_empty()
        {
            bail!(
                "--tasks, --structured-masks, --batch-tokens, --pad-answers, --padding, --eos-tail, --bands, --adaptive-mix and --multi-tasks apply to the task presets \
                 (tiny-llada-tasks, tiny-dream-tasks, tiny-ar-tasks), not to {}",
                a.preset
            );
        }
        if a.preset != "tiny-llada-prose" && (a.ar_warmup.is_some() || a.two_stream.is_some()) {
            bail!(
                "--ar-warmup and --two-stream apply to the diffusion presets, not to {}",
                a.preset
            );
        }
        return train_prose(&a, &out);
    }
    let (mut spec, steps) = task_preset(&a.preset)?;
    a.override_spec(&mut spec)?;
    // The cards' recipe is the default of the two diffusion task presets (a bare `llada train
    // --preset tiny-llada-tasks` re-trains the shipped model); every part can be overridden.
    let card = matches!(a.preset.as_str(), "tiny-llada-tasks" | "tiny-dream-tasks");
    let mut opts = a.options(steps, 0.6);
    if card {
        a.card_budget(&mut opts);
    }
    let tasks = known_names(&a.tasks, &TASKS, "task")?;
    let multi_tasks = known_names(&a.multi_tasks, &MULTI_SUBTASKS, "--multi-tasks item")?;
    let (structured, ar_warmup) = (
        a.structured_masks.unwrap_or(0.5),
        // LLaDA's two-stream warm-up step costs ≈ 1.8 diffusion steps: a shorter warm-up leaves
        // more of the 55 minutes to diffusion (measured: held-out loss 0.206 at 0.3, 0.461 at 0.5).
        a.ar_warmup.unwrap_or(match (card, spec.format) {
            (false, _) => 0.0,
            (true, Format::LLaDA) => 0.3,
            (true, _) => 0.5,
        }),
    );
    let pad_answers = a.pad_answers.unwrap_or(if card { 32 } else { 0 });
    if !(0.0..=1.0).contains(&a.adaptive_mix) {
        bail!("--adaptive-mix must be in [0, 1]");
    }
    if !(0.0..=1.0).contains(&structured) || !(0.0..1.0).contains(&ar_warmup) {
        bail!("--structured-masks must be in [0, 1] and --ar-warmup in [0, 1)");
    }
    if a.two_stream == Some(true) && (spec.format != Format::LLaDA || ar_warmup == 0.0) {
        bail!("--two-stream applies to the --ar-warmup of LLaDA models (tiny-llada-tasks, tiny-llada-prose)");
    }
    let two_stream = a
        .two_stream
        .unwrap_or(spec.format == Format::LLaDA && ar_warmup > 0.0);
    if (ar_warmup > 0.0
        || a.pad_answers.is_some_and(|p| p > 0)
        || a.padding != "answer"
        || a.eos_tail.is_some())
        && spec.format == Format::Llama
    {
        bail!(
            "--ar-warmup, --pad-answers, --padding and --eos-tail apply to diffusion models \
             (tiny-llada-tasks, tiny-dream-tasks)"
        );
    }
    if a.eos_tail.is_some() && a.padding != "hidden" {
        bail!("--eos-tail needs --padding hidden (each row its own answer region)");
    }
    // Announced once every option has been checked (a bad one is an error before this line).
    eprintln!(
        "training {} -> {} ({} steps, batch {})",
        a.preset,
        out.display(),
        opts.steps,
        opts.batch
    );
    let mut data = llada_train::trainer::TaskData {
        batch: opts.batch,
        batch_tokens: a.batch_tokens.unwrap_or(2048),
        seed: opts.seed,
        curriculum: opts.curriculum,
        tasks,
        max_scale: a.max_scale,
        structured,
        ar_warmup,
        two_stream,
        pad_answers,
        eos_tail: a.eos_tail,
        hide_padding: a.padding == "hidden",
        bands: a.bands,
        mix: llada_train::trainer::TaskMix::with_adaptive(a.adaptive_mix),
    };
    data.mix.multi = multi_tasks;
    let st = llada_train::trainer::train(spec, opts, &out, a.resume, false, &mut data)?;
    report(&st);
    Ok(())
}

/// Diffusion decoding options (shared by `generate --mode diffusion` and `eval`).
#[derive(Args, Clone)]
pub struct DiffusionArgs {
    /// Strategy [default: vanilla]; multi-block, revision and full commit by confidence
    /// threshold (default 0.9). The table of what each caches and commits:
    /// `llada_decode::strategy` (docs/diffusion.md).
    #[arg(long, value_enum)]
    pub strategy: Option<Strategy>,
    /// Commit every masked token whose confidence reaches this (at least one per step).
    #[arg(long)]
    pub threshold: Option<f32>,
    /// Multi-block: the execution window's length, the most rows the dense lane recomputes
    /// per pass (a static shape: 8, 16, 32, 64, 128, 256). On a CPU a pass costs its rows, so
    /// the smallest shape is fastest (docs/diffusion.md); an NPU would want its compiled shape.
    #[arg(long, default_value_t = 8)]
    pub window: usize,
    /// Multi-block: look ahead into future blocks when the current block has fewer masked
    /// tokens than this.
    #[arg(long, default_value_t = 8)]
    pub lookahead: usize,
    /// Revision: change a token when the re-prediction differs with at least this probability.
    #[arg(long, default_value_t = 0.9)]
    pub revise_threshold: f32,
    /// Revision: a token becomes stable when re-predicted with at least this probability.
    #[arg(long, default_value_t = 0.9)]
    pub stable_threshold: f32,
    /// Revision: probes after which a token becomes stable regardless.
    #[arg(long, default_value_t = Revision::default().max_probes)]
    pub max_probes: u8,
    /// Revision: a token committed with at least this confidence becomes stable without a
    /// probe; `off` probes every commit.
    #[arg(long, default_value = "0.99", value_parser = parse_stable_on_commit)]
    pub stable_on_commit: StableOnCommit,
    /// Revision: run the sparse lane after the dense lane instead of concurrently (same
    /// result; a deterministic schedule).
    #[arg(long)]
    pub sequential_revision: bool,
    /// Prefix and dual caches: recompute the whole cached prefix (prompt and finished blocks)
    /// at every block start, as Fast-dLLM's block-wise cache does, instead of keeping the
    /// prompt's KV from the first pass and appending each finished block. More rows per block;
    /// on the task models it bought no accuracy (docs/diffusion.md).
    #[arg(long)]
    pub prefix_refresh: bool,
    /// Prefix and dual caches: also recompute every row, and rewrite the whole cache, every N
    /// steps inside a block (a block's first step included; 0 = off): the cached rows are
    /// then at most N − 1 steps stale, at one full pass per N steps (dLLM-Cache's interval
    /// refresh). The fast strategies' lost accuracy on tiny-llada-tasks' sorts is that
    /// staleness (docs/diffusion.md).
    #[arg(long, default_value_t = 0)]
    pub refresh_every: usize,
    /// Revision: give the concurrent sparse lane a one-thread pool of its own instead of
    /// sharing the dense lane's threads (for machines with a core to spare; on 2 cores it
    /// slows the dense lane down).
    #[arg(long)]
    pub sparse_pool: bool,
    /// Redraw the answer in the terminal as it denoises (stderr): masked positions as ░,
    /// committed tokens in yellow, revised in magenta, stable in the default colour.
    #[arg(long)]
    pub visual: bool,
    /// Classifier-free guidance scale (vanilla only; 0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub cfg_scale: f32,
    /// Dream's alg_temp: sample which positions a step commits from softmax(confidence /
    /// alg_temp) instead of taking the most confident (0 = off; schedules only, not with a
    /// threshold).
    #[arg(long, default_value_t = 0.0)]
    pub alg_temp: f32,
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

/// `--stable-on-commit`: a confidence, or `off` (`None`).
#[derive(Debug, Clone, Copy)]
pub struct StableOnCommit(pub Option<f32>);

pub fn parse_stable_on_commit(s: &str) -> Result<StableOnCommit, String> {
    if s == "off" {
        return Ok(StableOnCommit(None));
    }
    match s.parse::<f32>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(StableOnCommit(Some(v))),
        _ => Err(format!(
            "expected a confidence in (0, 1] or `off`, got '{s}'"
        )),
    }
}

impl DiffusionArgs {
    /// The strategy options for an answer of `gen_length` tokens.
    pub fn options(&self, gen_length: usize, temperature: f32, seed: u64) -> StrategyOptions {
        StrategyOptions {
            strategy: self.strategy.unwrap_or(Strategy::Vanilla),
            gen_length,
            steps: self.steps,
            block_length: self.block_length,
            timesteps: self.schedule == "timesteps",
            confidence: match self.confidence.as_str() {
                "margin" => Confidence::Margin,
                "entropy" => Confidence::NegEntropy,
                "random" => Confidence::Random,
                _ => Confidence::TopProb,
            },
            temperature,
            seed,
            threshold: self.threshold,
            window: self.window,
            lookahead: self.lookahead,
            revise_threshold: self.revise_threshold,
            stable_threshold: self.stable_threshold,
            max_probes: self.max_probes,
            stable_on_commit: self.stable_on_commit.0,
            concurrent_revision: !self.sequential_revision,
            prefix_refresh: self.prefix_refresh,
            refresh_every: self.refresh_every,
            cfg_scale: self.cfg_scale,
            alg_temp: self.alg_temp,
        }
    }
    /// The decoder configuration for an answer of `gen_length` tokens, checked.
    pub fn config(
        &self,
        gen_length: usize,
        temperature: f32,
        seed: u64,
    ) -> Result<DiffusionConfig> {
        self.options(gen_length, temperature, seed)
            .config()
            .map_err(anyhow::Error::msg)
    }
    /// A short name for reports.
    pub fn name(&self) -> String {
        self.options(self.gen_length, 0.0, 0).name()
    }
}

/// The lanes a diffusion strategy runs on ([`DiffusionLanes`]).
pub type Lanes = DiffusionLanes;

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
    /// Held-out examples per task.
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

/// `llada eval --answer-region`: per example from its answer (`Auto`), or one length for all.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AnswerRegion {
    Auto,
    Fixed(usize),
}

impl AnswerRegion {
    /// Region length for an answer of `answer_len` tokens and blocks of `block`.
    fn length(self, answer_len: usize, block: usize) -> usize {
        match self {
            Self::Auto => (answer_len + 1).next_multiple_of(block),
            Self::Fixed(n) => n.next_multiple_of(block),
        }
    }

    /// How reports name it: `auto`, or the fixed length after rounding.
    fn label(self, block: usize) -> String {
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

/// Logits of every row of one causal forward over `tokens` (a fresh cache, nothing kept).
fn causal_logits(m: &Model, lane: &Lane, tokens: &[u32]) -> Result<llada_model::ForwardOutput> {
    use llada_model::{AttnMask, ForwardRequest, KvWrite, LogitRows};
    let pos: Vec<u32> = (0..tokens.len() as u32).collect();
    let mut cache = m.new_cache();
    Ok(lane.run(|| {
        m.forward(
            &ForwardRequest {
                tokens,
                positions: &pos,
                mask: AttnMask::Causal,
                kv_write: KvWrite::None,
                logits: LogitRows::All,
            },
            &mut cache,
        )
    })?)
}

/// Argmax of each row of a forward over `tokens` (causal), one per position.
fn causal_argmax(m: &Model, lane: &Lane, tokens: &[u32]) -> Result<Vec<u32>> {
    let out = causal_logits(m, lane, tokens)?;
    Ok(argmax_rows(&out, tokens.len()))
}

/// Argmax of each of the first `rows` rows of a forward's logits.
fn argmax_rows(out: &llada_model::ForwardOutput, rows: usize) -> Vec<u32> {
    (0..rows)
        .map(|i| llada_decode::sampling::argmax(out.row(i)))
        .collect()
}

/// The held-out Austen windows both draft evaluations score on (64 tokens, fixed seed).
fn draft_eval_windows(model: &Model, n: usize) -> Result<Vec<Vec<u32>>> {
    let tok = model.tokenizer.as_ref().context("no tokenizer")?;
    let file = crate::models::data_file("austen.txt");
    let corpus =
        llada_train::prose::Corpus::load(&[&file], &tok.inner, model.config.eos_id.unwrap_or(0))?;
    check_windows(&corpus, n, 64, &file.display().to_string())?;
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(11);
    Ok(corpus.windows(true, n, 64, &mut rng))
}

/// `--windows n` against the `t`-token windows the held-out split of `corpus` (read from
/// `source`) has: the windows are drawn at random starts, so there are as many distinct ones
/// as starts; asking for more only repeats them (`--windows 100000000` allocated until the
/// kernel killed the process), and a split shorter than one window has none.
fn check_windows(
    corpus: &llada_train::prose::Corpus,
    n: usize,
    t: usize,
    source: &str,
) -> Result<()> {
    let have = corpus.window_count(true, t);
    if n > have {
        bail!(
            "--windows {n}: the held-out split of {source} ({} tokens) has {have} distinct \
             windows of {t} tokens; ask for at most {have}",
            corpus.heldout.len()
        );
    }
    Ok(())
}

/// Print a draft evaluation (`--json` or text); `note` qualifies the token count.
#[allow(clippy::too_many_arguments)]
fn report_draft_eval(
    a: &EvalArgs,
    tpath: &std::path::Path,
    agree: usize,
    total: usize,
    accepted: usize,
    verifies: usize,
    windows: usize,
    note: &str,
) {
    let top1 = agree as f64 / total.max(1) as f64;
    let mal = accepted as f64 / verifies.max(1) as f64;
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

/// Draft vs target: top-1 agreement on held-out Austen, and greedy chain speculation with 4
/// drafted tokens (mean drafted tokens accepted per verification).
fn eval_draft(a: &EvalArgs, draft: &Model, lane: &Lane, target_name: &str) -> Result<()> {
    let tpath = crate::models::resolve(target_name, a.json)?;
    let target = Model::load(&tpath, &LoadOptions::default()).load_context(&tpath)?;
    crate::spec::same_token_ids(&a.model, draft, &target)?;
    let windows = draft_eval_windows(draft, a.windows)?;
    let (mut agree, mut total) = (0usize, 0usize);
    let (mut accepted, mut verifies) = (0usize, 0usize);
    let pb = crate::progress_bar(windows.len() as u64);
    for w in &windows {
        let (dt, tt) = (
            causal_argmax(draft, lane, w)?,
            causal_argmax(&target, lane, w)?,
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
            let tv = causal_argmax(&target, lane, &prop)?;
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
        pb.inc(1);
    }
    pb.finish_and_clear();
    report_draft_eval(
        a,
        &tpath,
        agree,
        total,
        accepted,
        verifies,
        windows.len(),
        "",
    );
    Ok(())
}

/// A feature drafter (`-m HEAD.safetensors`, from `llada train-feature-draft`) vs its target:
/// the same windows, agreement and 4-token greedy chain as [`eval_draft`]. The drafter reads
/// the target's feature of the position before the one it predicts, which the first position
/// of a window lacks: it is counted as a miss.
fn eval_feature_draft(a: &EvalArgs, lane: &Lane, target_name: &str) -> Result<()> {
    use llada_decode::speculative::drafter::Drafter;
    use llada_decode::speculative::featdraft::{FeatureDrafter, FeatureHead, FeatureModel};
    use llada_decode::speculative::tree::DraftTree;
    let tpath = crate::models::resolve(target_name, a.json)?;
    let target = Model::load(&tpath, &LoadOptions::default())?;
    let head = FeatureHead::load(&a.model, &target).map_err(anyhow::Error::msg)?;
    let quant = crate::spec::draft_quant(crate::spec::DRAFT_QUANT)?;
    let fm = FeatureModel::new(&target, head, quant)?;
    let mut dr = FeatureDrafter::new(&target, &fm, 0.0);
    let d = target.config.d_model;
    let windows = draft_eval_windows(&target, a.windows)?;
    let features = |toks: &[u32]| -> Result<(Vec<u32>, Vec<f32>)> {
        let out = causal_logits(&target, lane, toks)?;
        Ok((argmax_rows(&out, toks.len()), out.features))
    };
    let (mut agree, mut total) = (0usize, 0usize);
    let (mut accepted, mut verifies) = (0usize, 0usize);
    let pb = crate::progress_bar(windows.len() as u64);
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
        pb.inc(1);
    }
    pb.finish_and_clear();
    report_draft_eval(
        a,
        &tpath,
        agree,
        total,
        accepted,
        verifies,
        windows.len(),
        "; the first of each window counted as a miss",
    );
    Ok(())
}

/// Prose diffusion model: Monte-Carlo masked-diffusion bound on held-out NLL (nats/token).
fn eval_prose(a: &EvalArgs, m: &Model, lane: &Lane) -> Result<()> {
    use llada_model::{AttnMask, ForwardRequest, KvWrite, LogitRows};
    use rand::Rng;
    let tok = m.tokenizer.as_ref().context("model has no tokenizer")?;
    let mask = m.config.mask_id.context("no mask token")?;
    let files = prose_files()?;
    let corpus =
        llada_train::prose::Corpus::load(&files, &tok.inner, m.config.eos_id.unwrap_or(0))?;
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(7);
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    check_windows(&corpus, a.windows, 128, &names.join(" + "))?;
    let windows = corpus.windows(true, a.windows, 128, &mut rng);
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
    let nll = sum / n.max(1) as f64;
    if a.json {
        println!(
            "{}",
            serde_json::json!({"model": a.model.display().to_string(), "heldout_nll_bound": nll, "windows": windows.len()})
        );
    } else {
        println!(
            "held-out masked-diffusion NLL bound: {nll:.3} nats/token ({} windows of 128 tokens)",
            windows.len()
        );
    }
    Ok(())
}

pub fn eval(mut a: EvalArgs) -> Result<()> {
    // A shipped model's name or `models/…` path works from any directory.
    a.model = crate::models::resolve(&a.model.to_string_lossy(), true)?;
    if a.per_task == 0 || a.windows == 0 {
        bail!(
            "--per-task and --windows must be at least 1 (an evaluation of nothing scores nothing)"
        );
    }
    let threads = crate::threads(a.threads)?;
    check_max_scale(a.max_scale)?;
    if let (Some(t), Some("safetensors")) =
        (&a.target, a.model.extension().and_then(|e| e.to_str()))
    {
        let lane = Lane::new("dense", threads)?;
        return eval_feature_draft(&a, &lane, t);
    }
    let model = Model::load(&a.model, &LoadOptions::default()).load_context(&a.model)?;
    if let Some(t) = &a.target {
        let lane = Lane::new("dense", threads)?;
        return eval_draft(&a, &model, &lane, t);
    }
    if model.config.mask_id.is_some() && model.config.vocab != CharVocab::size() {
        let lane = Lane::new("dense", threads)?;
        return eval_prose(&a, &model, &lane);
    }
    if model.config.mask_id.is_none() {
        bail!(
            "{} is not a diffusion model (no mask token)",
            a.model.display()
        );
    }
    let lanes = Lanes::new(
        threads,
        &a.diffusion.config(a.diffusion.block_length, 0.0, 0)?,
        a.diffusion.sparse_pool,
    )?;
    let tasks = if a.tasks.is_empty() {
        TASKS.to_vec()
    } else {
        known_names(&a.tasks, &TASKS, "task")?
    };
    let split = held_out_tasks(a.per_task, &tasks, a.max_scale).with_context(|| {
        format!(
            "--max-scale {} is too small for the held-out split (drawn for every task, \
                 whatever --tasks lists)",
            a.max_scale
        )
    })?;
    if let AnswerRegion::Fixed(n) = a.answer_region {
        if let Some(ex) = split.iter().max_by_key(|ex| ex.answer.len()) {
            let need = ex.answer.len() + 1;
            if need > a.answer_region.length(need, a.diffusion.block_length) {
                bail!(
                    "--answer-region {n} cannot hold the longest held-out answer ({} tokens of \
                     task {} plus one EOS): use at least {need}, or fewer --tasks",
                    ex.answer.len(),
                    ex.task
                );
            }
        }
    }
    let pb = crate::progress_bar(split.len() as u64);
    let mut scores: BTreeMap<&str, Score> = BTreeMap::new();
    // Multi-question items by sub-task: (exact, total).
    let mut sub_items: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let mut shown = 0;
    for ex in &split {
        let mut prompt = vec![BOS];
        prompt.extend(CharVocab::encode(&ex.prompt));
        let gen = a
            .answer_region
            .length(ex.answer.len(), a.diffusion.block_length);
        let cfg = a.diffusion.config(gen, 0.0, 0)?;
        let out = lanes.generate(&model, &prompt, &cfg, None)?;
        let got = CharVocab::decode(&out.tokens);
        let exact = scores.entry(ex.task).or_default().add(&ex.answer, &got);
        for (kind, ok) in item_outcomes(&ex.prompt, &ex.answer, &got) {
            let t = sub_items.entry(kind).or_insert((0, 0));
            *t = (t.0 + usize::from(ok), t.1 + 1);
        }
        if !exact && shown < a.show {
            shown += 1;
            pb.suspend(|| eprintln!("{} → {got:?} (expected {:?})", ex.prompt, ex.answer));
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
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
            serde_json::json!({"model": a.model.display().to_string(), "strategy": a.diffusion.name(), "answer_region": region_name, "tasks": tasks, "accuracy": total, "char_tasks": char_tasks, "char_accuracy": char_total, "item_tasks": item_tasks, "multi_items": multi_items})
        );
    } else {
        println!("task     exact   chars");
        for t in TASKS {
            if let (Some(acc), Some(ch)) = (tasks.get(t), char_tasks.get(t)) {
                println!("{t:<8} {:>5.1}%  {:>5.1}%", 100.0 * acc, 100.0 * ch);
            }
        }
        println!(
            "overall  {:>5.1}%  {:>5.1}% ({} held-out examples, {} decoding, answer region {region_name}; chars: characters in place)",
            100.0 * total,
            100.0 * char_total,
            split.len(),
            a.diffusion.name()
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
    Ok(())
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

    /// Top-k of a softmax against values worked by hand: logits ln 4, ln 2, ln 1, ln 1 (softmax
    /// 0.5, 0.25, 0.125, 0.125); the top 3 renormalised are 4/7, 2/7, 1/7, ties to the lower id.
    #[test]
    fn top_k_softmax_renormalises_the_largest() {
        let l = [1f32.ln(), 4f32.ln(), 1f32.ln(), 2f32.ln()];
        let (c, p) = top_k_softmax(&l, 3);
        assert_eq!(c, vec![1, 3, 0]);
        for (got, want) in p.iter().zip([4.0 / 7.0, 2.0 / 7.0, 1.0 / 7.0]) {
            assert!((got - want).abs() < 1e-6, "{p:?}");
        }
        let (c, p) = top_k_softmax(&l, 9);
        assert_eq!(c, vec![1, 3, 0, 2]);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    /// Ids sharing the "other" row pool their probability; positions keep k entries.
    #[test]
    fn soft_labels_merge_into_reduced_rows() {
        // Reduced vocabulary {5, 7} over 10 ids: rows 0, 1; everything else row 2.
        let row = llada_train::prose::row_map(&[5, 7], 10);
        let mut c = vec![7, 3, 9, 5, 5, 7];
        let mut p = vec![0.5, 0.3, 0.2, 0.6, 0.0, 0.4];
        merge_soft_rows(&row, 2, 3, &mut c, &mut p);
        assert_eq!(c, vec![1, 2, 0, 0, 1, 0]);
        assert_eq!(p, vec![0.5, 0.5, 0.0, 0.6, 0.4, 0.0]);
    }

    /// Mixed windows: corpus windows keep their tokens, generated ones their prefix and the
    /// target's greedy continuation; the fused pass's argmax labels equal a separate forward's
    /// and the top of its soft labels; a second call reads the caches, and soft labels made
    /// afresh for cached windows (a separate pass) equal the fused ones.
    /// `--distill-generated`: ½ is the old every-other-window rule (its caches stay valid),
    /// other fractions write that share of windows, evenly spread, half of them chat requests.
    #[test]
    fn mixed_sources_write_their_fraction_of_windows() {
        let half = Source::parse("mixed", None).unwrap();
        assert_eq!(half.kind(), "distill-mix");
        for k in 0..64 {
            assert_eq!(
                half.generated(k),
                (k % 2 == 1).then_some(k % 4 == 3),
                "window {k}"
            );
        }
        let quarter = Source::parse("mixed", Some(0.25)).unwrap();
        assert_eq!(quarter.kind(), "distill-mix25");
        let written: Vec<bool> = (0..64).filter_map(|k| quarter.generated(k)).collect();
        assert_eq!(written.len(), 16);
        assert_eq!(written.iter().filter(|&&chat| chat).count(), 8);
        // Evenly spread: one written window in every four.
        for block in 0..16 {
            let n = (4 * block..4 * block + 4)
                .filter(|&k| quarter.generated(k).is_some())
                .count();
            assert_eq!(n, 1, "block {block}");
        }
        for (src, g) in [
            ("mixed", 0.0),
            ("mixed", 1.0),
            ("corpus", 0.25),
            ("generated", 0.5),
        ] {
            assert!(Source::parse(src, Some(g)).is_err(), "{src} {g}");
        }
        assert!(matches!(Source::parse("corpus", None), Ok(Source::Corpus)));
    }

    #[test]
    fn mixed_windows_are_labelled_in_one_pass_and_cached() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let target = root.join("tests/fixtures/hf-llama");
        let target = target.to_str().unwrap();
        let dir = std::env::temp_dir().join(format!("llada-label-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let t = GEN_PREFIX + 8;
        let train: Vec<u32> = (0..400u32).map(|i| (i * 7 + i / 3) % 50 + 3).collect();
        let inputs = Source::windows(&train, 3, t).unwrap();
        let (hard, soft) = label_windows(target, &inputs, t, Source::Mixed(0.5), 3, &dir).unwrap();
        assert_eq!((hard.len(), soft.len()), (3, 3));
        assert_eq!(hard[0].0, inputs[0]);
        assert_eq!(hard[2].0, inputs[2]);
        assert_eq!(hard[1].0[..GEN_PREFIX], inputs[1][..GEN_PREFIX]);
        let model = Model::load(std::path::Path::new(target), &LoadOptions::default()).unwrap();
        let lane = Lane::new("test", 1).unwrap();
        for (w, ((x, y), (c, p))) in hard.iter().zip(&soft).enumerate() {
            assert_eq!(y, &causal_argmax(&model, &lane, x).unwrap(), "window {w}");
            for j in 0..t {
                assert_eq!(c[j * 3], y[j], "window {w} position {j}");
                let z: f32 = p[j * 3..j * 3 + 3].iter().sum();
                assert!((z - 1.0).abs() < 1e-5);
            }
        }
        // The generated window continues greedily: past the prefix, each label is the next token.
        for j in GEN_PREFIX..t - 1 {
            assert_eq!(hard[1].1[j], hard[1].0[j + 1]);
        }
        let again = label_windows(target, &inputs, t, Source::Mixed(0.5), 3, &dir).unwrap();
        assert_eq!((&again.0, &again.1), (&hard, &soft));
        let stem = file_stem(target);
        std::fs::remove_file(dir.join(format!("distill-mix-soft3-{stem}-3x{t}.bin"))).unwrap();
        let fresh = label_windows(target, &inputs, t, Source::Mixed(0.5), 3, &dir).unwrap();
        assert_eq!((&fresh.0, &fresh.1), (&hard, &soft));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
