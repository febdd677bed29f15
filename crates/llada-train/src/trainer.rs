//! The training loop: AdamW, warm-up + cosine learning rate, progress bar (loss, tokens/s, ETA),
//! periodic checkpoints in the final HF format, resumable from the last checkpoint.

use crate::model::{Format, ModelSpec, TrainModel};
use crate::objective::{
    diffusion_batch_padded, next_token_batch, shifted_next_token_batch, tailed_region,
    two_stream_batch, weighted_ce,
};
use crate::tasks::{Example, TaskGen};
use crate::vocab::CharVocab;
use anyhow::{bail, Context, Result};
use candle_core::Device;
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use std::io::IsTerminal;
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
    /// Stop (after a checkpoint) once the run's wall time reaches this many seconds.
    #[serde(default)]
    pub time_budget_s: Option<f64>,
    /// Fine-tuning: start from this checkpoint directory's weights (same shape) with a fresh
    /// schedule, instead of the seeded initialisation. A resumed run ignores it.
    #[serde(default)]
    pub init_from: Option<std::path::PathBuf>,
    /// Data-parallel shards per step (≥ 1): the batch's rows are split into this many shards,
    /// each shard's forward and backward runs on its own one-thread pool at once, and their
    /// gradients are summed before one optimizer step (see [`DataParallel`]). 1: one graph
    /// whose ops use every thread of the global pool.
    #[serde(default = "one")]
    pub data_parallel: usize,
    /// AdamW's second-moment decay (candle's default 0.999).
    #[serde(default = "beta2_default")]
    pub beta2: f64,
}

fn one() -> usize {
    1
}

impl TrainOptions {
    /// Refuses options no run can use, before any work: no steps, an empty batch, a learning
    /// rate that is not a finite number ≥ 0 (NaN trained NaN weights and saved them over the
    /// checkpoint it resumed), a time budget that is not a finite positive number, β₂ outside
    /// (0, 1). The messages name the `llada train` options.
    pub fn validate(&self) -> Result<()> {
        if self.steps == 0 {
            bail!("--steps must be at least 1 (a run of 0 steps trains nothing)");
        }
        if self.batch == 0 {
            bail!("--batch must be at least 1");
        }
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            bail!(
                "--lr {}: the learning rate must be a finite number ≥ 0",
                self.lr
            );
        }
        if self.checkpoint_every == 0 {
            bail!("--checkpoint-every must be at least 1");
        }
        if !(self.curriculum.is_finite() && self.curriculum >= 0.0) {
            bail!(
                "--curriculum {}: must be a finite fraction ≥ 0",
                self.curriculum
            );
        }
        if let Some(b) = self.time_budget_s {
            if !(b.is_finite() && b > 0.0) {
                bail!(
                    "--minutes {}: the time budget must be a finite number of minutes > 0",
                    b / 60.0
                );
            }
        }
        if self.data_parallel == 0 {
            bail!("--data-parallel must be at least 1");
        }
        if !(self.beta2 > 0.0 && self.beta2 < 1.0) {
            bail!("--beta2 {}: must be in (0, 1)", self.beta2);
        }
        Ok(())
    }
}

/// Checks an output directory before any work: `out` must not be a file (nor lie under one),
/// and with `resume` it must hold a checkpoint (`train_state.json`) to continue from. Creates
/// nothing.
pub fn check_out_dir(out: &Path, resume: bool) -> Result<()> {
    if out.exists() && !out.is_dir() {
        bail!(
            "the output directory {} is a file, not a directory (give --out a directory)",
            out.display()
        );
    }
    if let Some(a) = out.ancestors().skip(1).find(|a| a.exists()) {
        if !a.is_dir() {
            bail!(
                "the output directory {} cannot be created: {} is a file",
                out.display(),
                a.display()
            );
        }
    }
    if resume && !out.join("train_state.json").exists() {
        bail!(
            "--resume: {} holds no checkpoint to continue (no train_state.json); leave out \
             --resume to start a new run there",
            out.display()
        );
    }
    Ok(())
}

fn beta2_default() -> f64 {
    0.999
}

/// While alive, candle's CPU matmuls run single-threaded (`RAYON_NUM_THREADS=1`, which candle
/// reads at every matmul to choose gemm's parallelism); the previous value comes back on drop.
///
/// A data-parallel shard runs on a one-thread pool, but candle would still ask gemm for
/// `Rayon(cores)` parallelism inside it, which measured ≈ 30 % *slower* per step than one
/// graph over both cores (315 against 441–455 steps in 150 s of `--preset tiny-llada-tasks`);
/// with single-threaded gemm the two shards made 442 steps in 90 s against 261 (1.69x). Set
/// and restored on the training thread while no shard thread runs (edition 2021's
/// `set_var`; the process's other threads do not read the environment meanwhile).
struct OneThreadMatmuls(Option<std::ffi::OsString>);

impl OneThreadMatmuls {
    fn set() -> Self {
        let old = std::env::var_os("RAYON_NUM_THREADS");
        std::env::set_var("RAYON_NUM_THREADS", "1");
        Self(old)
    }
}

impl Drop for OneThreadMatmuls {
    fn drop(&mut self) {
        match self.0.take() {
            Some(v) => std::env::set_var("RAYON_NUM_THREADS", v),
            None => std::env::remove_var("RAYON_NUM_THREADS"),
        }
    }
}

/// Loss of `batch` scaled by `share` (its fraction of the step's rows), and its gradients.
fn shard_loss_and_grads(
    model: &TrainModel,
    batch: &crate::objective::Batch,
    share: f64,
) -> Result<(f64, candle_core::backprop::GradStore)> {
    let mut loss = batch_loss(model, batch)?;
    if share != 1.0 {
        loss = (loss * share)?;
    }
    let grads = loss.backward()?;
    Ok((loss.to_scalar::<f32>()? as f64, grads))
}

/// Data-parallel training within one process.
///
/// The task and draft models are small (d_model 128–192): their matmuls are too short for
/// candle's intra-op threading to keep two cores busy, and each step has serial stretches
/// (graph bookkeeping, allocation, small element-wise ops). Two one-thread runs side by side
/// each kept ≈ 80 % of a two-thread run's step rate (docs/training.md, "Time budgets,
/// progress, reproducibility"). This runs that way inside one run: the batch's rows are split into `n` shards and each shard's
/// forward and backward run concurrently, each on its own one-thread rayon pool (candle's CPU
/// ops and the fused ops here parallelise over the *current* pool), then the gradients are
/// summed in shard order (deterministic for a given `n`). Shard `i`'s loss is scaled by its
/// share of the rows, so the summed gradient is the whole batch's (the loss is a mean over
/// rows; test `data_parallel_gradient_equals_the_whole_batch`).
pub struct DataParallel {
    pools: Vec<rayon::ThreadPool>,
}

impl DataParallel {
    pub fn new(n: usize) -> Result<Self> {
        let pools = (0..n.max(1))
            .map(|i| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(1)
                    .thread_name(move |_| format!("shard-{i}"))
                    .build()
            })
            .collect::<std::result::Result<_, _>>()
            .context("building the data-parallel thread pools")?;
        Ok(Self { pools })
    }

    /// The batch's loss and its gradients, computed in up to `pools.len()` shards of rows.
    pub fn loss_and_grads(
        &self,
        model: &TrainModel,
        batch: &crate::objective::Batch,
    ) -> Result<(f64, candle_core::backprop::GradStore)> {
        let b = batch.ids.dim(0)?;
        let n = self.pools.len().min(b).max(1);
        if n == 1 {
            return shard_loss_and_grads(model, batch, 1.0);
        }
        // Rows split as evenly as possible, earlier shards taking the remainder.
        let mut shards = vec![];
        let mut start = 0;
        for i in 0..n {
            let rows = b / n + usize::from(i < b % n);
            shards.push((batch.rows(start, rows)?, rows as f64 / b as f64));
            start += rows;
        }
        let results: Vec<Result<(f64, candle_core::backprop::GradStore)>> =
            std::thread::scope(|scope| {
                let handles: Vec<_> = shards
                    .iter()
                    .zip(&self.pools)
                    .map(|((shard, share), pool)| {
                        scope.spawn(move || {
                            pool.install(|| shard_loss_and_grads(model, shard, *share))
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err(anyhow::anyhow!("a training shard panicked")))
                    })
                    .collect()
            });
        let mut total = 0.0;
        let mut sum: Option<candle_core::backprop::GradStore> = None;
        for r in results {
            let (l, mut g) = r?;
            total += l;
            match &mut sum {
                None => sum = Some(g),
                Some(acc) => {
                    for v in model.varmap.all_vars() {
                        if let Some(gi) = g.remove(v.as_tensor()) {
                            let s = match acc.remove(v.as_tensor()) {
                                Some(a) => (a + gi)?,
                                None => gi,
                            };
                            acc.insert(v.as_tensor(), s);
                        }
                    }
                }
            }
        }
        let grads = sum.context("no training shard ran")?;
        Ok((total, grads))
    }
}

/// Global gradient-norm clip (the standard 1.0: the 1/t-weighted diffusion loss has rare
/// large-gradient batches that otherwise undo progress).
pub const GRAD_CLIP: f64 = 1.0;

/// Scale every gradient so that their global L2 norm is at most `max`; returns the norm.
pub fn clip_grad_norm(
    model: &TrainModel,
    grads: &mut candle_core::backprop::GradStore,
    max: f64,
) -> Result<f64> {
    let vars = model.varmap.all_vars();
    let mut sq = 0f64;
    for v in &vars {
        if let Some(g) = grads.get(v.as_tensor()) {
            sq += g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
        }
    }
    let norm = sq.sqrt();
    if norm > max {
        let scale = max / (norm + 1e-6);
        for v in &vars {
            if let Some(g) = grads.remove(v.as_tensor()) {
                grads.insert(v.as_tensor(), (g * scale)?);
            }
        }
    }
    Ok(norm)
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

/// Where training batches come from.
pub trait DataSource {
    /// The batch of `step` (deterministic given `rng`), or the fixed held-out batch.
    fn batch(
        &mut self,
        step: usize,
        progress: f64,
        spec: &ModelSpec,
        heldout: bool,
        rng: &mut rand::rngs::StdRng,
        dev: &Device,
    ) -> Result<crate::objective::Batch>;
    /// The fixed held-out batches whose mean loss the trainer reports (default: the one
    /// held-out `batch`).
    fn heldout_batches(
        &mut self,
        spec: &ModelSpec,
        rng: &mut rand::rngs::StdRng,
        dev: &Device,
    ) -> Result<Vec<crate::objective::Batch>> {
        Ok(vec![self.batch(0, 1.0, spec, true, rng, dev)?])
    }
    /// Write `tokenizer.json` (and `tokenizer_config.json`) into `dir`.
    fn save_tokenizer(&self, dir: &Path) -> Result<()>;
    /// Told the loss of each of `heldout_batches` (in its order) before the first step and
    /// at every checkpoint; a source may adapt what it draws next. Returns a line for the log
    /// (default: nothing).
    fn observe_heldout(&mut self, _losses: &[f64]) -> Option<String> {
        None
    }
}

/// How training batches choose their task: uniformly over [`TaskData::tasks`] (the default),
/// or, with `adaptive` > 0, partly in proportion to each task's current held-out loss, so
/// that steps go where the model still errs instead of to tasks it has solved.
///
/// Invariant: the weights are a function of the last held-out losses only (set before the
/// first step and at each checkpoint), so a resumed run draws as an uninterrupted one does
/// from its last checkpoint on.
#[derive(Debug, Clone, Default)]
pub struct TaskMix {
    /// Share of the draws given in proportion to held-out loss, in [0, 1]: task `k` is drawn
    /// with probability `(1 − a) · n_k / n + a · L_k / Σ L` (`n_k`: times it is listed).
    pub adaptive: f64,
    /// The task of each held-out batch, in `heldout_batches`' order.
    heldout_task: Vec<&'static str>,
    /// Current draw weights (empty: uniform over `tasks`).
    weights: Vec<(&'static str, f64)>,
    /// Training batches only: the sub-tasks drawn for the items of a multi-question row
    /// (a name listed twice is drawn twice as often; empty: [`crate::tasks::MULTI_SUBTASKS`],
    /// as the held-out split always uses).
    pub multi: Vec<&'static str>,
}

impl TaskMix {
    /// A mix giving share `adaptive` of the draws in proportion to held-out loss.
    pub fn with_adaptive(adaptive: f64) -> Self {
        Self {
            adaptive,
            ..Default::default()
        }
    }
    /// Draw weights from the tasks' listing and their mean held-out losses (`adaptive` of
    /// the mass in proportion to loss; losses ≤ 0 or non-finite count as 0).
    pub fn weights_for(
        adaptive: f64,
        listed: &[&'static str],
        losses: &[(&'static str, f64)],
    ) -> Vec<(&'static str, f64)> {
        let total: f64 = losses
            .iter()
            .map(|(_, l)| if l.is_finite() { l.max(0.0) } else { 0.0 })
            .sum();
        let n = listed.len().max(1) as f64;
        losses
            .iter()
            .map(|&(t, l)| {
                let base = listed.iter().filter(|&&x| x == t).count() as f64 / n;
                let share = if total > 0.0 && l.is_finite() {
                    l.max(0.0) / total
                } else {
                    base
                };
                (t, (1.0 - adaptive) * base + adaptive * share)
            })
            .collect()
    }
}

/// Smallest masking ratio ε of the diffusion objective (`t ~ U(ε, 1)`, weight `1/t`): 0.05 caps
/// a single-token row's weight at 20× (ε = 1e-3 let one row dominate a 32-row batch).
pub const MASK_EPS: f64 = 0.05;

/// The synthetic tasks (char vocabulary), with a length curriculum.
pub struct TaskData {
    pub batch: usize,
    /// Token budget of a training batch (0: off): a batch of long rows keeps only
    /// `batch_tokens / row length` of its `batch` rows (at least 4), so that a step of long sorts
    /// costs about what a step of short sums does and the short tasks are not starved of steps
    /// by the long ones. The held-out batch is never trimmed.
    pub batch_tokens: usize,
    pub seed: u64,
    pub curriculum: f64,
    /// Tasks to draw from (empty: all); a task listed twice is drawn twice as often.
    pub tasks: Vec<&'static str>,
    /// Largest length scale (1 = full task lengths).
    pub max_scale: f64,
    /// Fraction of rows with contiguous (suffix / prefix) masks
    /// ([`crate::objective::diffusion_batch_padded`]).
    pub structured: f64,
    /// Fraction of the run's progress trained autoregressively first, as Dream-7B starts
    /// from an autoregressive model: Dream in its shifted layout
    /// ([`crate::objective::shifted_next_token_batch`]), LLaDA as plain next-token
    /// prediction ([`crate::objective::next_token_batch`]).
    pub ar_warmup: f64,
    /// LLaDA's warm-up in its own alignment ([`crate::objective::two_stream_batch`]: output
    /// `i` predicts token `i` from a mask at `i`) instead of plain next-token prediction.
    pub two_stream: bool,
    /// Diffusion rows: EOS-pad answers to multiples of this many tokens (0: off), the lengths
    /// `llada eval` decodes ([`crate::objective::layout_padded`]). Held-out batches keep the
    /// unpadded layout.
    pub pad_answers: usize,
    /// Diffusion rows, with `hide_padding`: `Some((p, max))` gives each row, with probability
    /// `p`, a region of its answer, one EOS and a uniform `0..=max` more EOS instead of the
    /// rounded one ([`crate::objective::layout_padded`]'s `tails`), so the region's end no longer
    /// tells the model how long the answer is and other block and generation lengths decode in
    /// its training layout (docs/training.md, "Objectives"). The draws come from the
    /// batch's random stream only when set: `None` leaves every batch as before.
    pub eos_tail: Option<(f64, usize)>,
    /// Diffusion rows: hide the EOS padding beyond each row's own answer region from
    /// attention and loss ([`crate::objective::diffusion_batch_padded`]'s `hide_padding`), so
    /// rows of any length share a batch without changing what each one trains on. The
    /// autoregressive warm-up rows then stop their loss at the row's answer and one EOS
    /// (causal: no attention reaches beyond).
    pub hide_padding: bool,
    /// One length band (a quarter of the range) per training batch (true by
    /// default: without hidden padding it keeps a short row's padding small); false draws every length.
    pub bands: bool,
    /// How batches choose their task (uniform unless `mix.adaptive` > 0).
    pub mix: TaskMix,
}

impl TaskData {
    /// `tasks` at full length in `batch`-row batches seeded by `seed`, with nothing else on:
    /// no token budget, curriculum, structured masks, warm-up, answer padding or EOS tails,
    /// one length band per batch, the uniform mix. Other settings by struct update.
    pub fn plain(tasks: Vec<&'static str>, batch: usize, seed: u64) -> Self {
        TaskData {
            batch,
            batch_tokens: 0,
            seed,
            curriculum: 1.0,
            tasks,
            max_scale: 1.0,
            structured: 0.0,
            ar_warmup: 0.0,
            two_stream: false,
            pad_answers: 0,
            eos_tail: None,
            hide_padding: false,
            bands: true,
            mix: TaskMix::default(),
        }
    }

    /// The tasks drawn from, as listed (a task listed twice is drawn twice as often; empty
    /// `tasks` means all of them once).
    fn listed_tasks(&self) -> Vec<&'static str> {
        if self.tasks.is_empty() {
            crate::tasks::TASKS.to_vec()
        } else {
            self.tasks.clone()
        }
    }
}

impl DataSource for TaskData {
    fn batch(
        &mut self,
        step: usize,
        progress: f64,
        spec: &ModelSpec,
        heldout: bool,
        rng: &mut rand::rngs::StdRng,
        dev: &Device,
    ) -> Result<crate::objective::Batch> {
        let mut gen = if heldout {
            TaskGen::new(self.seed ^ 0xabcdef, true)
        } else {
            TaskGen::new(self.seed.wrapping_add(step as u64 * 7919), false)
        };
        if !self.tasks.is_empty() {
            gen.tasks = self.tasks.clone();
        }
        if !heldout && !self.mix.multi.is_empty() {
            gen.multi_tasks = self.mix.multi.clone();
        }
        gen.scale = if heldout {
            self.max_scale
        } else {
            (0.2 + 0.8 * progress / self.curriculum.max(1e-9)).min(1.0) * self.max_scale
        };
        // Training batches are bucketed: one task and (with `bands`) one length band (a quarter
        // of the range) per batch, so rows need little EOS padding beyond their own answer
        // (mixed-length batches made the padding dominate the 1/(t·L) loss, unless it is
        // hidden). The held-out batch mixes all (the trainer's loss report uses
        // `heldout_batches` instead).
        let task = if heldout {
            None
        } else {
            // Drawn only with bands: with them the random stream is the one before `bands`.
            let band = if self.bands {
                Some(rand::Rng::random_range(&mut *rng, 0..4u32) as f64)
            } else {
                None
            };
            let task = if self.mix.weights.is_empty() {
                Some(gen.tasks[rand::Rng::random_range(&mut *rng, 0..gen.tasks.len())])
            } else {
                let total: f64 = self.mix.weights.iter().map(|w| w.1).sum();
                let mut r = rand::Rng::random::<f64>(&mut *rng) * total;
                let mut pick = self.mix.weights[0].0;
                for &(t, w) in &self.mix.weights {
                    pick = t;
                    if r < w {
                        break;
                    }
                    r -= w;
                }
                Some(pick)
            };
            if let Some(band) = band {
                gen.scale *= (band + 1.0) / 4.0;
                gen.lo = band / (band + 1.0);
            }
            task
        };
        let mut ex: Vec<Example> = (0..self.batch)
            .map(|_| gen.try_next(task))
            .collect::<Result<_>>()?;
        let ar = !heldout && progress < self.ar_warmup;
        let pad = if heldout || ar { 0 } else { self.pad_answers };
        // Random EOS tails: diffusion training rows with hidden padding only (a row's region
        // is its own only when the padding beyond is hidden).
        let mut tails: Vec<Option<usize>> = match self.eos_tail {
            Some((p, most)) if !heldout && !ar && self.hide_padding => ex
                .iter()
                .map(|_| {
                    (rand::Rng::random::<f64>(&mut *rng) < p)
                        .then(|| rand::Rng::random_range(&mut *rng, 0..=most))
                })
                .collect(),
            _ => vec![],
        };
        if !heldout && self.batch_tokens > 0 {
            // + BOS; the answer with its EOS padding (at least one) or its tail.
            let row = ex
                .iter()
                .enumerate()
                .map(|(r, e)| {
                    let tail = tails.get(r).copied().flatten();
                    e.prompt.len() + 1 + tailed_region(e.answer.len(), 1, pad, tail)
                })
                .max()
                .unwrap_or(1);
            let keep = (self.batch_tokens / row).clamp(4.min(self.batch), self.batch);
            ex.truncate(keep);
            tails.truncate(keep);
        }
        let structured = if heldout { 0.0 } else { self.structured };
        let hide = self.hide_padding && !heldout;
        encode(
            &ex,
            spec,
            ar,
            self.two_stream,
            structured,
            pad,
            &tails,
            hide,
            rng,
            dev,
        )
    }
    /// One batch per task and length quarter (`batch / 4` held-out rows each, at least 1),
    /// each with independent masks. In one batch mixing every task and length, a sum's row
    /// is padded to the longest sort and ≈ 95 % of its 1/(t·L) weight falls on EOS padding:
    /// the figure could not tell a model that solves a third of the split from one that
    /// solves none.
    fn heldout_batches(
        &mut self,
        spec: &ModelSpec,
        rng: &mut rand::rngs::StdRng,
        dev: &Device,
    ) -> Result<Vec<crate::objective::Batch>> {
        let mut tasks = self.listed_tasks();
        // Weights repeat names; each task's held-out batches are measured once.
        let mut seen = std::collections::HashSet::new();
        tasks.retain(|t| seen.insert(*t));
        let per = (self.batch / 4).max(1);
        let mut out = vec![];
        self.mix.heldout_task.clear();
        for t in tasks {
            let mut gen = TaskGen::new(self.seed ^ 0xabcdef, true);
            gen.scale = self.max_scale;
            let mut ex: Vec<Example> = (0..4 * per)
                .map(|_| gen.try_next(Some(t)))
                .collect::<Result<_>>()?;
            ex.sort_by_key(|e| e.prompt.len() + e.answer.len());
            for band in ex.chunks(per) {
                out.push(encode(
                    band,
                    spec,
                    false,
                    false,
                    0.0,
                    0,
                    &[],
                    false,
                    rng,
                    dev,
                )?);
                self.mix.heldout_task.push(t);
            }
        }
        Ok(out)
    }
    fn save_tokenizer(&self, dir: &Path) -> Result<()> {
        write_file(
            &dir.join("tokenizer.json"),
            CharVocab::tokenizer_json().to_string(),
        )?;
        // Task prompts are used as they are: a template that adds nothing.
        let tcfg = serde_json::json!({
            "chat_template": "{{ messages[0]['content'] }}",
            "bos_token": "<|startoftext|>",
            "eos_token": "<|endoftext|>"
        });
        write_file(
            &dir.join("tokenizer_config.json"),
            serde_json::to_string_pretty(&tcfg)?,
        )?;
        Ok(())
    }
    /// Logs each task's held-out loss; with `mix.adaptive` > 0, re-weights the tasks' draws.
    fn observe_heldout(&mut self, losses: &[f64]) -> Option<String> {
        if losses.len() != self.mix.heldout_task.len() {
            return None;
        }
        let mut per: Vec<(&'static str, f64, usize)> = vec![];
        for (&t, &l) in self.mix.heldout_task.iter().zip(losses) {
            match per.iter_mut().find(|p| p.0 == t) {
                Some(p) => {
                    p.1 += l;
                    p.2 += 1;
                }
                None => per.push((t, l, 1)),
            }
        }
        let means: Vec<(&'static str, f64)> =
            per.iter().map(|&(t, s, n)| (t, s / n as f64)).collect();
        let mut line = String::from("held-out by task:");
        for (t, l) in &means {
            line += &format!(" {t} {l:.4}");
        }
        if self.mix.adaptive > 0.0 {
            self.mix.weights =
                TaskMix::weights_for(self.mix.adaptive, &self.listed_tasks(), &means);
            line += " | draws:";
            for (t, w) in &self.mix.weights {
                line += &format!(" {t} {w:.2}");
            }
        }
        Some(line)
    }
}

/// Task examples as the batch `spec`'s objective trains on: next-token rows for LLaMA drafts
/// and, with `ar`, for a diffusion model's autoregressive warm-up; masked-diffusion rows (a
/// fraction `structured` with contiguous masks) otherwise.
#[allow(clippy::too_many_arguments)]
fn encode(
    ex: &[Example],
    spec: &ModelSpec,
    ar: bool,
    two_stream: bool,
    structured: f64,
    pad_to: usize,
    tails: &[Option<usize>],
    hide_padding: bool,
    rng: &mut rand::rngs::StdRng,
    dev: &Device,
) -> Result<crate::objective::Batch> {
    Ok(match spec.format {
        Format::Llama => next_token_batch(ex, false, dev)?,
        Format::Dream if ar => shifted_next_token_batch(ex, hide_padding, dev)?,
        // LLaDA has no shifted head: its warm-up is plain next-token prediction with causal
        // attention (output `i` predicts token `i + 1`), so the masked-diffusion phase has to
        // move each prediction one position right — one attention head's job.
        Format::LLaDA if ar && two_stream => two_stream_batch(ex, spec.mask_id, hide_padding, dev)?,
        Format::LLaDA if ar => next_token_batch(ex, hide_padding, dev)?,
        f => diffusion_batch_padded(
            ex,
            spec.mask_id,
            MASK_EPS,
            f == Format::Dream,
            structured,
            pad_to,
            tails,
            hide_padding,
            rng,
            dev,
        )?,
    })
}

/// Prose windows (masked-diffusion pretraining for LLaDA/Dream, next-token for Llama drafts).
pub struct ProseData {
    pub corpus: crate::prose::Corpus,
    pub tokenizer: tokenizers::Tokenizer,
    pub batch: usize,
    pub seq_len: usize,
    /// Reduced vocabulary `(ids, full vocabulary size)`: the corpus already holds row indices
    /// ([`crate::prose::reduce_vocab`]); the saved `config.json` gets `vocab_size` = the full id
    /// space and `reduced_vocab_ids` = `ids`, which the engine's loader understands.
    pub reduced_vocab: Option<(Vec<u32>, usize)>,
    /// Distillation set for drafts: `(inputs, labels)` windows of `seq_len` tokens (row
    /// indices), where `labels[i]` is the target model's argmax after `inputs[..=i]`. When
    /// non-empty, training batches are drawn from it (hard distillation: the draft learns the
    /// target's greedy choice, which is what speculative acceptance rewards); the held-out
    /// loss stays next-token on the corpus.
    pub distill: Vec<(Vec<u32>, Vec<u32>)>,
    /// Soft labels of the distillation windows (empty: hard distillation): per window `T·k`
    /// classes (row indices) and probabilities, see [`distill_batch`].
    pub distill_soft: Vec<(Vec<u32>, Vec<f32>)>,
    /// Fraction of the run's progress before distillation batches start (corpus next-token
    /// batches until then).
    pub distill_from: f64,
    /// Once distillation has started, the share of batches drawn from `distill` (the others
    /// are corpus batches); 1: all.
    pub distill_share: f64,
    /// LLaDA prose: fraction of the run's progress trained autoregressively first (see
    /// [`TaskData::ar_warmup`]): with [`crate::prose::two_stream_windows`] when `two_stream`,
    /// else plain next-token windows. Other formats ignore it.
    pub ar_warmup: f64,
    pub two_stream: bool,
}

/// A distillation batch: `b` windows drawn uniformly from `set`, weights `1/T` per position.
/// With `soft` (one entry per window of `set`: `T·k` classes and their probabilities, the
/// teacher's top-k after every prefix), the batch carries those as [`SoftTargets`] and the loss
/// is the cross-entropy against them; `targets` keep the argmax labels.
///
/// [`SoftTargets`]: crate::objective::SoftTargets
pub fn distill_batch(
    set: &[(Vec<u32>, Vec<u32>)],
    soft: &[(Vec<u32>, Vec<f32>)],
    b: usize,
    rng: &mut rand::rngs::StdRng,
    dev: &Device,
) -> Result<crate::objective::Batch> {
    use candle_core::Tensor;
    let t = set
        .first()
        .map(|w| w.0.len())
        .context("empty distillation set")?;
    if !soft.is_empty() && soft.len() != set.len() {
        anyhow::bail!(
            "{} soft-label windows for {} distillation windows",
            soft.len(),
            set.len()
        );
    }
    let (mut ids, mut tg) = (Vec::with_capacity(b * t), Vec::with_capacity(b * t));
    let mut st = crate::objective::SoftTargets::default();
    for _ in 0..b {
        let k = rand::Rng::random_range(&mut *rng, 0..set.len());
        let (x, y) = &set[k];
        ids.extend_from_slice(x);
        tg.extend_from_slice(y);
        if let Some((c, p)) = soft.get(k) {
            st.classes.extend_from_slice(c);
            st.probs.extend_from_slice(p);
        }
    }
    Ok(crate::objective::Batch {
        ids: Tensor::from_vec(ids, (b, t), dev)?,
        targets: Tensor::from_vec(tg, (b, t), dev)?,
        weights: Tensor::from_vec(vec![1.0 / t as f32; b * t], (b, t), dev)?,
        tokens: b * t,
        causal: true,
        two_stream: false,
        soft: (!soft.is_empty()).then_some(st),
        ends: None,
    })
}

impl DataSource for ProseData {
    fn batch(
        &mut self,
        _step: usize,
        progress: f64,
        spec: &ModelSpec,
        heldout: bool,
        rng: &mut rand::rngs::StdRng,
        dev: &Device,
    ) -> Result<crate::objective::Batch> {
        let ar = !heldout && progress < self.ar_warmup;
        // A draft's training batch comes from the distillation windows once distillation has
        // started, with probability `distill_share`. Share < 1 draws one number per batch;
        // share 1 draws none (a run without these options keeps its random stream).
        let distill = spec.format == Format::Llama
            && !heldout
            && !self.distill.is_empty()
            && progress >= self.distill_from
            && (self.distill_share >= 1.0
                || rand::Rng::random::<f64>(&mut *rng) < self.distill_share);
        Ok(match spec.format {
            Format::LLaDA if ar && self.two_stream => crate::prose::two_stream_windows(
                &self.corpus.windows(false, self.batch, self.seq_len, rng),
                spec.mask_id,
                dev,
            )?,
            // Plain next-token prediction (output `i` predicts token `i + 1`), as for the tasks.
            Format::LLaDA if ar => crate::prose::next_token_windows(
                &self
                    .corpus
                    .windows(false, self.batch, self.seq_len + 1, rng),
                dev,
            )?,
            Format::Llama if distill => {
                distill_batch(&self.distill, &self.distill_soft, self.batch, rng, dev)?
            }
            Format::Llama => crate::prose::next_token_windows(
                &self
                    .corpus
                    .windows(heldout, self.batch, self.seq_len + 1, rng),
                dev,
            )?,
            // ε = 0.05 as for the tasks: below it, the one position always masked gets a
            // weight up to 1/(ε·T), and single tokens dominate a small batch's gradient.
            _ => crate::prose::pretrain_batch(
                &self.corpus.windows(heldout, self.batch, self.seq_len, rng),
                spec.mask_id,
                0.05,
                rng,
                dev,
            )?,
        })
    }
    fn save_tokenizer(&self, dir: &Path) -> Result<()> {
        let json = self
            .tokenizer
            .to_string(false)
            .map_err(|e| anyhow::anyhow!("saving tokenizer: {e}"))?;
        write_file(&dir.join("tokenizer.json"), json)?;
        let tcfg = serde_json::json!({"chat_template": "{{ messages[0]['content'] }}", "eos_token": "<|endoftext|>"});
        write_file(
            &dir.join("tokenizer_config.json"),
            serde_json::to_string_pretty(&tcfg)?,
        )?;
        if let Some((ids, vocab)) = &self.reduced_vocab {
            let path = dir.join("config.json");
            let mut cfg: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&path)?)?;
            cfg["vocab_size"] = serde_json::json!(vocab);
            cfg["reduced_vocab_ids"] = serde_json::json!(ids);
            write_file(&path, serde_json::to_string(&cfg)?)?;
        }
        Ok(())
    }
}

/// Save `model` as an HF directory (config.json, model.safetensors) plus the data's tokenizer.
pub fn save_with(model: &TrainModel, data: &dyn DataSource, dir: &Path) -> Result<()> {
    save(model, dir)?;
    data.save_tokenizer(dir)
}

/// Save `model`'s weights and `config.json` as an HF directory (the tokenizer comes from the data:
/// [`save_with`]).
pub fn save(model: &TrainModel, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // candle writes a path, not a writer: a temporary name unique to this process, renamed
    // over the checkpoint once complete (as `write_file` does for the other files).
    let tmp = dir.join(format!("model.safetensors.{}.part", std::process::id()));
    let dtype = if model.spec.store_f16 {
        candle_core::DType::F16
    } else {
        candle_core::DType::F32
    };
    let tensors: std::collections::HashMap<String, candle_core::Tensor> = model
        .varmap
        .data()
        .lock()
        .map_err(|_| anyhow::anyhow!("variable map poisoned"))?
        .iter()
        .map(|(k, v)| Ok((k.clone(), v.as_tensor().to_dtype(dtype)?)))
        .collect::<candle_core::Result<_>>()?;
    if let Err(e) = candle_core::safetensors::save(&tensors, &tmp)
        .map_err(anyhow::Error::from)
        .and_then(|()| Ok(std::fs::rename(&tmp, dir.join("model.safetensors"))?))
    {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.context(format!(
            "writing {}",
            dir.join("model.safetensors").display()
        )));
    }
    write_file(
        &dir.join("config.json"),
        serde_json::to_string_pretty(&model.spec.config_json())?,
    )?;
    Ok(())
}

/// Writes `bytes` to `path` atomically (`llada_formats::atomic`): an interrupted run never
/// leaves a truncated checkpoint file, nor destroys the one it resumed from.
pub(crate) fn write_file(path: &Path, bytes: impl AsRef<[u8]>) -> Result<()> {
    llada_formats::atomic::write(path, bytes.as_ref())?;
    Ok(())
}

fn batch_loss(model: &TrainModel, b: &crate::objective::Batch) -> Result<candle_core::Tensor> {
    let s = &model.spec;
    let logits = if b.two_stream {
        let (positions, vis) = crate::objective::two_stream_layout(b.ids.dim(1)? / 2);
        model.forward_with(&b.ids, Some(&positions), vis)?
    } else if let Some(ends) = &b.ends {
        let vis = crate::ops::Visibility::Ends {
            ends: ends.clone(),
            per: s.n_heads * b.ids.dim(1)?,
        };
        model.forward_with(&b.ids, None, vis)?
    } else {
        model.forward(&b.ids, b.causal || s.format == Format::Llama)?
    };
    Ok(weighted_ce(&logits, b, s.format == Format::Dream)?)
}

/// How far a run is, in [0, 1]: the step fraction, or — when the run has a time budget — the
/// larger of that and the fraction of the budget spent. The curriculum and the learning-rate
/// decay follow it, so a run cut by `--minutes` still ends annealed at full task lengths
/// (step-based schedules left time-cut runs at a high learning rate and at 60 % of the
/// lengths). The price: where a time-budgeted run ends, and its schedule, depend on the
/// machine's speed; batches stay seeded per step.
pub fn run_progress(opts: &TrainOptions, step: usize, wall_s: f64) -> f64 {
    let by_step = step as f64 / opts.steps.max(1) as f64;
    let by_time = opts
        .time_budget_s
        .filter(|b| *b > 0.0)
        .map_or(0.0, |b| wall_s / b);
    by_step.max(by_time).clamp(0.0, 1.0)
}

/// Linear warm-up over `opts.warmup` steps, then cosine decay to 10 % of the peak over the
/// rest of the run's progress ([`run_progress`]).
pub fn learning_rate(opts: &TrainOptions, step: usize, progress: f64) -> f64 {
    if step < opts.warmup {
        return opts.lr * (step + 1) as f64 / opts.warmup.max(1) as f64;
    }
    let p0 = opts.warmup as f64 / opts.steps.max(1) as f64;
    let p = ((progress - p0) / (1.0 - p0).max(1e-9)).clamp(0.0, 1.0);
    opts.lr * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * p).cos()))
}

/// Train a task model; with `resume`, continues from the checkpoint in `out` (an error when
/// there is none).
pub fn train_tasks(
    spec: ModelSpec,
    opts: TrainOptions,
    out: &Path,
    resume: bool,
    quiet: bool,
) -> Result<TrainState> {
    let mut data = TaskData {
        curriculum: opts.curriculum,
        ..TaskData::plain(vec![], opts.batch, opts.seed)
    };
    train(spec, opts, out, resume, quiet, &mut data)
}

/// Set every trainable variable from `dir/model.safetensors` (a checkpoint of the same shape).
fn load_weights(model: &TrainModel, dir: &Path, dev: &Device) -> Result<()> {
    let file = dir.join("model.safetensors");
    let saved = candle_core::safetensors::load(&file, dev)
        .with_context(|| format!("reading {}", file.display()))?;
    for (name, var) in model
        .varmap
        .data()
        .lock()
        .map_err(|_| anyhow::anyhow!("variable map poisoned"))?
        .iter()
    {
        let t = saved
            .get(name)
            .with_context(|| format!("{} lacks {name}", file.display()))?;
        if t.dims() != var.dims() {
            anyhow::bail!(
                "{}: {name} has shape {:?}, this preset needs {:?}",
                file.display(),
                t.dims(),
                var.dims()
            );
        }
        var.set(&t.to_dtype(candle_core::DType::F32)?)?;
    }
    Ok(())
}

/// Train on any data source; checkpoints go to `out` (resumable with `resume`: an error when
/// `out` holds no checkpoint). Returns the state of the last checkpoint. A step whose loss is
/// not finite, or a checkpoint whose held-out loss is not, stops the run with an error before
/// anything is saved: the previous checkpoint stays as it was.
pub fn train(
    spec: ModelSpec,
    opts: TrainOptions,
    out: &Path,
    resume: bool,
    quiet: bool,
    data: &mut dyn DataSource,
) -> Result<TrainState> {
    opts.validate()?;
    check_out_dir(out, resume)?;
    let dev = Device::Cpu;
    let model = TrainModel::new(spec, &dev, opts.seed)?;
    let state_path = out.join("train_state.json");
    let mut start = 0;
    let mut wall0 = 0.0;
    let mut tokens: u64 = 0;
    // The state of the last checkpoint (the resumed one until this run saves its own).
    let mut last: Option<TrainState> = None;
    if resume {
        let st = read_state(&state_path, out)?;
        load_weights(&model, out, &dev)?;
        start = st.step;
        wall0 = st.wall_s;
        tokens = st.tokens;
        last = Some(st);
        if !quiet {
            eprintln!("resuming from step {start} (AdamW moments restart)");
        }
    } else if let Some(dir) = &opts.init_from {
        load_weights(&model, dir, &dev)?;
        if !quiet {
            eprintln!("fine-tuning from {}", dir.display());
        }
    }
    let params = ParamsAdamW {
        lr: opts.lr,
        weight_decay: 0.01,
        beta2: opts.beta2,
        ..Default::default()
    };
    let mut opt = AdamW::new(model.varmap.all_vars(), params)?;
    let dp = DataParallel::new(opts.data_parallel)?;
    let _one_thread_matmuls = (opts.data_parallel > 1).then(OneThreadMatmuls::set);
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
    // Held-out batches for the loss report (fixed).
    let heldout = {
        let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed ^ 0x5eed);
        data.heldout_batches(&model.spec, &mut rng, &dev)?
    };
    let heldout_losses = |model: &TrainModel| -> Result<Vec<f64>> {
        heldout
            .iter()
            .map(|b| Ok(batch_loss(model, b)?.to_scalar::<f32>()? as f64))
            .collect()
    };
    // The source sees the held-out losses before the first step (a resumed run's weights
    // are those of its last checkpoint) and at every checkpoint.
    let initial = heldout_losses(&model)?;
    if initial.iter().any(|l| !l.is_finite()) {
        bail!(
            "the held-out loss of the starting weights ({}) is not finite: they cannot be trained",
            if resume {
                format!("the checkpoint in {}", out.display())
            } else if let Some(dir) = &opts.init_from {
                format!("{}", dir.display())
            } else {
                "the seeded initialisation".to_string()
            }
        );
    }
    // Created before the first step, so that an unwritable place fails before the training
    // rather than at its first checkpoint.
    std::fs::create_dir_all(out)
        .with_context(|| format!("creating the output directory {}", out.display()))?;
    let log_line = data.observe_heldout(&initial);
    if let (Some(line), false) = (log_line, quiet) {
        pb.suspend(|| eprintln!("{line}"));
    }
    for step in start..opts.steps {
        // Seeded per step: a resumed run draws the same batches as an uninterrupted one.
        let mut rng = rand::rngs::StdRng::seed_from_u64(
            opts.seed.wrapping_mul(1_000_003).wrapping_add(step as u64),
        );
        let progress = run_progress(&opts, step, wall0 + t0.elapsed().as_secs_f64());
        let batch = data.batch(step, progress, &model.spec, false, &mut rng, &dev)?;
        let lr = learning_rate(&opts, step, progress);
        opt.set_learning_rate(lr);
        let ntok = batch.tokens;
        let (l, mut grads) = dp.loss_and_grads(&model, &batch)?;
        if !l.is_finite() {
            pb.abandon();
            bail!("{}", diverged(step + 1, "training", l, out, last.as_ref()));
        }
        clip_grad_norm(&model, &mut grads, GRAD_CLIP)?;
        opt.step(&grads)?;
        tokens += ntok as u64;
        ema = if ema.is_nan() {
            l
        } else {
            0.98 * ema + 0.02 * l
        };
        let el = t0.elapsed().as_secs_f64();
        pb.set_message(format!(
            "loss {ema:.4} lr {lr:.2e} {:.0} tok/s",
            tokens as f64 / (wall0 + el).max(1e-9)
        ));
        pb.inc(1);
        let out_of_time = opts
            .time_budget_s
            .is_some_and(|b| wall0 + t0.elapsed().as_secs_f64() >= b);
        if (step + 1) % opts.checkpoint_every == 0 || step + 1 == opts.steps || out_of_time {
            // Measured before saving: weights that a step has made non-finite must not
            // replace the previous checkpoint.
            let losses = heldout_losses(&model)?;
            let hl = losses.iter().sum::<f64>() / heldout.len().max(1) as f64;
            if !hl.is_finite() || !ema.is_finite() {
                pb.abandon();
                let (what, l) = if hl.is_finite() {
                    ("training", ema)
                } else {
                    ("held-out", hl)
                };
                bail!("{}", diverged(step + 1, what, l, out, last.as_ref()));
            }
            save_with(&model, &*data, out)?;
            let by_task = data.observe_heldout(&losses);
            let st = TrainState {
                step: step + 1,
                loss: ema,
                heldout_loss: Some(hl),
                wall_s: wall0 + el,
                tokens,
                options: opts.clone(),
            };
            write_file(&state_path, serde_json::to_string_pretty(&st)?)?;
            last = Some(st);
            // The bar is invisible when stderr is a file (a background run): log a line.
            if !quiet && !std::io::stderr().is_terminal() {
                eprintln!(
                    "step {}/{} loss {ema:.4} held-out {hl:.4} lr {lr:.2e} {:.0} tok/s {:.0} s",
                    step + 1,
                    opts.steps,
                    tokens as f64 / (wall0 + el).max(1e-9),
                    wall0 + el
                );
                if let Some(line) = by_task {
                    eprintln!("  {line}");
                }
            }
        }
        if out_of_time {
            if !quiet {
                pb.suspend(|| {
                    eprintln!(
                        "time budget reached at step {}: checkpoint saved (continue with --resume)",
                        step + 1
                    )
                });
            }
            break;
        }
    }
    pb.finish();
    // Every run saves at its last step; a resumed run that had already reached `opts.steps`
    // ran none and reports its checkpoint.
    last.with_context(|| format!("no checkpoint was written to {}", out.display()))
}

/// The error of a run whose `what` loss ("training" or "held-out") became `loss` at `step`.
fn diverged(step: usize, what: &str, loss: f64, out: &Path, last: Option<&TrainState>) -> String {
    let kept = match last {
        Some(st) => format!("{} keeps its checkpoint of step {}", out.display(), st.step),
        None => format!("no checkpoint was written to {}", out.display()),
    };
    format!(
        "the loss diverged at step {step} ({what} loss {loss}): stopped without saving, so \
         {kept}; a lower learning rate (--lr) may help"
    )
}

/// The state of the checkpoint in `out` (`state_path`, its `train_state.json`), or an error
/// that says why it cannot be resumed.
fn read_state(state_path: &Path, out: &Path) -> Result<TrainState> {
    let text = std::fs::read_to_string(state_path)
        .with_context(|| format!("reading {}", state_path.display()))?;
    let err = match serde_json::from_str::<TrainState>(&text) {
        Ok(st) => return Ok(st),
        Err(e) => e,
    };
    // A diverged run of an older `llada train` saved NaN weights with `"loss": null`.
    let v: Option<serde_json::Value> = serde_json::from_str(&text).ok();
    if v.as_ref()
        .is_some_and(|v| v.get("options").is_some() && v.get("loss").is_some_and(|l| l.is_null()))
    {
        bail!(
            "{} records a diverged run (\"loss\": null): the checkpoint in {} holds no usable \
             weights and cannot be resumed; start a new run without --resume",
            state_path.display(),
            out.display()
        );
    }
    // A checkpoint trained by scripts/train_tasks_torch.py has a state file of its own
    // (steps, options, no AdamW step counter in our layout): say so instead of serde's
    // "missing field".
    Err(anyhow::Error::new(err).context(format!(
        "{} is not a `llada train` state, so {} cannot be resumed (was it written by \
         scripts/train_tasks_torch.py? Its weights can be fine-tuned with --init-from into \
         another --out directory)",
        state_path.display(),
        out.display()
    )))
}
