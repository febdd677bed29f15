//! `llada train`: the options of a zoo model's training run, handed to
//! [`llada_zoo::train::train`]; the final losses printed.

use crate::progress::Bar;
use anyhow::Result;
use clap::Args;
use llada_zoo::train::TrainRequest;
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

impl TrainArgs {
    /// The library's request: these options, the shards' default resolved.
    fn request(self) -> TrainRequest {
        TrainRequest {
            preset: self.preset,
            out: self.out,
            steps: self.steps,
            batch: self.batch,
            batch_tokens: self.batch_tokens,
            lr: self.lr,
            beta2: self.beta2,
            curriculum: self.curriculum,
            seed: self.seed,
            resume: self.resume,
            tasks: self.tasks,
            max_scale: self.max_scale,
            rope_theta: self.rope_theta,
            init_std: self.init_std,
            data_parallel: self
                .data_parallel
                .map_or_else(|| crate::threads_or_all(None), |n| n.get()),
            layers: self.layers,
            d_model: self.d_model,
            heads: self.heads,
            minutes: self.minutes,
            distill: self.distill,
            distill_windows: self.distill_windows,
            distill_source: self.distill_source,
            distill_generated: self.distill_generated,
            distill_soft: self.distill_soft,
            distill_from: self.distill_from,
            distill_share: self.distill_share,
            init_from: self.init_from,
            target_layers: self.target_layers,
            revocab: self.revocab,
            structured_masks: self.structured_masks,
            ar_warmup: self.ar_warmup,
            two_stream: self.two_stream,
            pad_answers: self.pad_answers,
            padding: self.padding,
            eos_tail: self.eos_tail,
            bands: self.bands,
            adaptive_mix: self.adaptive_mix,
            multi_tasks: self.multi_tasks,
            checkpoint_every: self.checkpoint_every,
        }
    }
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

pub fn run(a: TrainArgs) -> Result<()> {
    keep_freed_pages();
    // A line at once (data preparation can take minutes before the first step is reported).
    eprintln!(
        "training preset {}{}: preparing data",
        a.preset,
        a.minutes
            .map_or(String::new(), |m| format!(" for at most {m} minutes"))
    );
    let st = llada_zoo::train::train(&a.request(), &Bar::lines())?;
    eprintln!(
        "done: step {} train loss {:.4} held-out loss {:.4} in {:.0}s",
        st.step,
        st.loss,
        st.heldout_loss.unwrap_or(f64::NAN),
        st.wall_s
    );
    Ok(())
}
