//! Diffusion decoding (LLaDA / Dream).
//!
//! The vanilla reference, as LLaDA's `generate`: the answer starts as `gen_length` mask tokens;
//! blocks of `block_length` are finished left to right; each block gets `steps / n_blocks`
//! steps; at every step the whole sequence is recomputed (bidirectional, no cache), every
//! masked position of the current block is predicted, and the `k` most confident predictions
//! are committed, `k` following LLaDA's schedule (`masked // steps`, remainder to the first
//! steps). Confidence is the softmax probability of the chosen token (`low_confidence`) or
//! uniform noise (`random`); positions beyond the current block get −∞.
//!
//! Dream's shifted logits are handled here, once: position `i` reads the output row `i − 1`.

pub use crate::revision::Revision;
use crate::revision::{build_probe, judge, Verdict};
use crate::sampling::{argmax, softmax};
use crate::window::{self, WINDOW_SHAPES};
pub use crate::window::{MultiBlock, TokenState};
use llada_model::{AttnMask, ForwardRequest, KvWrite, LogitRows, Model, ModelError};
use llada_runtime::trace::OpSpan;
use llada_runtime::{KvCache, Lane};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::time::Instant;

/// How confident the model is in a masked position's prediction (which positions commit first).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Confidence {
    /// Softmax probability of the chosen token (LLaDA `low_confidence`, Dream `maskgit_plus`).
    TopProb,
    /// Top-1 minus top-2 probability (Dream `topk_margin`).
    Margin,
    /// Negative entropy of the distribution (Dream `entropy`).
    NegEntropy,
    /// Uniform noise (LLaDA `random`).
    Random,
}

/// How many tokens each step commits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    /// LLaDA: `steps` split evenly over blocks; in a block, `masked // steps` per step with the
    /// remainder on the first steps.
    Uniform,
    /// Dream: timesteps `linspace(1, eps, steps + 1)`; step i commits
    /// `int(masked · (1 − s/t))` (all that remain at the last step).
    Timesteps { eps: f32 },
}

/// What the decoder keeps between steps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheMode {
    /// Recompute the whole sequence every step (the reference).
    None,
    /// KV of the prompt and finished blocks (llada.cpp's baseline): each finished block is
    /// appended at the next block start; the prompt's KV is the first pass's unless
    /// [`DiffusionConfig::refresh_prefix`] recomputes the whole prefix there.
    Prefix,
    /// Prefix KV plus the KV of the masked suffix after the current block (Fast-dLLM dual
    /// cache); each step recomputes only the current block.
    Dual,
}

/// Options of the diffusion decoder.
#[derive(Debug, Clone)]
pub struct DiffusionConfig {
    pub gen_length: usize,
    pub steps: usize,
    pub block_length: usize,
    pub schedule: Schedule,
    pub confidence: Confidence,
    /// Gumbel-noise temperature (0 = argmax).
    pub temperature: f32,
    pub seed: u64,
    pub cache: CacheMode,
    /// Prefix and dual caches: at each block start recompute the whole cached prefix (prompt and
    /// finished blocks), as Fast-dLLM's block-wise cache does, so its KV has seen every token
    /// committed so far. `false` (the default) only appends the newly finished block: the
    /// prompt's KV stays as computed while the whole answer was masked — fewer rows per block;
    /// on the task models the refresh bought no accuracy (docs/diffusion.md).
    pub refresh_prefix: bool,
    /// Prefix and dual caches: every `refresh_every`-th step of a block (its first included)
    /// recomputes every row and rewrites the whole cache, as at a refreshing block start; the
    /// steps between reuse it (dLLM-Cache's interval refresh). 0 = off. The block-start refresh
    /// leaves the cached rows stale while the block fills; this bounds their staleness to
    /// `refresh_every − 1` steps at one full pass per `refresh_every` steps.
    pub refresh_every: usize,
    /// Confidence-threshold parallel commit: every masked position of the block whose
    /// confidence reaches it commits (at least one per step); `steps` is then only a cap.
    pub threshold: Option<f32>,
    /// Multi-block speculative decoding (sliding window + adaptive lookahead; dual cache only).
    pub multi_block: Option<MultiBlock>,
    /// Dual-path progressive revision on the sparse lane (dual cache only).
    pub revision: Option<Revision>,
    /// Classifier-free guidance scale (LLaDA: `un + (s + 1)(cond − un)`, the unconditional pass
    /// masks the prompt); 0 = off. Vanilla only (it doubles every pass).
    pub cfg_scale: f32,
    /// Dream's `alg_temp`: with a schedule (no threshold), the positions that commit are drawn
    /// without replacement from `softmax(confidence / alg_temp)` over the masked positions
    /// instead of taken by top confidence ([`sample_transfer`]); 0 = top-k (Dream's `None`).
    pub alg_temp: f32,
}

impl DiffusionConfig {
    /// LLaDA's reference: one token per step, low-confidence remasking, blocks of `block_length`.
    pub fn one_per_step(gen_length: usize, block_length: usize) -> Self {
        Self {
            gen_length,
            steps: gen_length,
            block_length,
            schedule: Schedule::Uniform,
            confidence: Confidence::TopProb,
            temperature: 0.0,
            seed: 0,
            cache: CacheMode::None,
            refresh_prefix: false,
            refresh_every: 0,
            threshold: None,
            multi_block: None,
            revision: None,
            cfg_scale: 0.0,
            alg_temp: 0.0,
        }
    }
    /// Dream's reference (`diffusion_generate`): one block, timestep schedule.
    pub fn dream(gen_length: usize, steps: usize, confidence: Confidence) -> Self {
        Self {
            gen_length,
            steps,
            block_length: gen_length,
            schedule: Schedule::Timesteps { eps: 1e-3 },
            confidence,
            temperature: 0.0,
            seed: 0,
            cache: CacheMode::None,
            refresh_prefix: false,
            refresh_every: 0,
            threshold: None,
            multi_block: None,
            revision: None,
            cfg_scale: 0.0,
            alg_temp: 0.0,
        }
    }
    pub fn validate(&self) -> Result<(), String> {
        if self.gen_length == 0
            || self.block_length == 0
            || !self.gen_length.is_multiple_of(self.block_length)
        {
            return Err(format!(
                "gen_length {} must be a positive multiple of block_length {}",
                self.gen_length, self.block_length
            ));
        }
        let blocks = self.gen_length / self.block_length;
        if self.steps == 0 || !self.steps.is_multiple_of(blocks) {
            return Err(format!(
                "steps {} must be a positive multiple of the number of blocks {blocks}",
                self.steps
            ));
        }
        if let Some(t) = self.threshold {
            if !(t > 0.0 && t <= 1.0) {
                return Err(format!("threshold must be in (0, 1], got {t}"));
            }
        }
        if self.temperature.is_nan() || self.temperature < 0.0 {
            return Err(format!("temperature must be ≥ 0, got {}", self.temperature));
        }
        if (self.multi_block.is_some() || self.revision.is_some()) && self.cache != CacheMode::Dual
        {
            return Err("multi-block decoding and revision need the dual cache".into());
        }
        if let Some(mb) = &self.multi_block {
            if !WINDOW_SHAPES.contains(&mb.window) || mb.lookahead == 0 {
                return Err(format!(
                    "window must be one of {WINDOW_SHAPES:?} and lookahead ≥ 1 (got {} / {})",
                    mb.window, mb.lookahead
                ));
            }
        }
        if let Some(r) = &self.revision {
            let ok = |t: f32| t > 0.0 && t <= 1.0;
            if !ok(r.revise_threshold)
                || !ok(r.stable_threshold)
                || !r.stable_on_commit.is_none_or(ok)
                || r.max_probes == 0
            {
                return Err("revision thresholds must be in (0, 1] and max_probes ≥ 1".into());
            }
        }
        if !(self.alg_temp.is_finite() && self.alg_temp >= 0.0) {
            return Err(format!("alg_temp must be ≥ 0, got {}", self.alg_temp));
        }
        if self.alg_temp > 0.0 && self.threshold.is_some() {
            return Err("alg_temp samples which positions a schedule commits; a confidence threshold decides that itself (use one or the other)".into());
        }
        if self.cfg_scale.is_nan() || self.cfg_scale < 0.0 {
            return Err(format!("cfg scale must be ≥ 0, got {}", self.cfg_scale));
        }
        if self.refresh_every > 0 && self.cache == CacheMode::None {
            return Err("refresh_every refreshes a cache; the vanilla strategy keeps none".into());
        }
        if self.cfg_scale > 0.0 && self.cache != CacheMode::None {
            return Err(
                "classifier-free guidance is only supported by the vanilla strategy".into(),
            );
        }
        Ok(())
    }
}

/// Result of a diffusion generation.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DiffusionOutput {
    /// The `gen_length` answer tokens.
    pub tokens: Vec<u32>,
    /// Dense-lane forward passes.
    pub forward_passes: usize,
    /// Rows computed over all dense passes (the dense lane's work).
    pub rows_computed: usize,
    /// Rows a static-shape accelerator would add to reach the window shapes.
    pub padded_rows: usize,
    /// Sparse-lane passes and rows.
    pub sparse_passes: usize,
    pub sparse_rows: usize,
    /// Token identities changed by revision.
    pub revised: usize,
    /// Time in dense / sparse passes, and the time both ran at once.
    pub dense_s: f64,
    pub sparse_s: f64,
    pub overlap_s: f64,
    pub total_s: f64,
}

/// What an observer (e.g. `--visual`) sees after every step.
pub struct StepView<'a> {
    pub tokens: &'a [u32],
    pub states: &'a [TokenState],
    /// Positions whose token was changed by revision at least once.
    pub revised: &'a [bool],
    pub mask_id: u32,
}

/// LLaDA's `get_num_transfer_tokens`: how many tokens each of `steps` steps commits.
pub fn transfer_schedule(masked: usize, steps: usize) -> Vec<usize> {
    let base = masked / steps;
    let rem = masked % steps;
    (0..steps).map(|i| base + usize::from(i < rem)).collect()
}

/// Dream's per-step count: `int(masked · (1 − s/t))` with `t, s` from `linspace(1, eps, steps+1)`
/// in f32, everything left at the last step.
pub fn dream_transfer(masked: usize, step: usize, steps: usize, eps: f32) -> usize {
    if step + 1 >= steps {
        return masked;
    }
    let ts = |i: usize| -> f32 { 1.0 + (eps - 1.0) * (i as f32 / steps as f32) };
    let (t, s) = (ts(step), ts(step + 1));
    (masked as f32 * (1.0 - s / t)) as usize
}

/// Confidence and token for one position's logits (temperature 0: argmax).
fn score(logits: &[f32], conf: Confidence, tok: u32, rng: &mut StdRng) -> f32 {
    match conf {
        Confidence::Random => rng.random::<f32>(),
        c => {
            let mut p = logits.to_vec();
            softmax(&mut p);
            match c {
                Confidence::TopProb => p[tok as usize],
                Confidence::Margin => {
                    let mut top2 = f32::NEG_INFINITY;
                    for (i, v) in p.iter().enumerate() {
                        if i != tok as usize && *v > top2 {
                            top2 = *v;
                        }
                    }
                    p[tok as usize] - top2
                }
                _ => p.iter().map(|v| v * (v + 1e-10).ln()).sum(),
            }
        }
    }
}

/// The diffusion decoder on one lane (revision, if enabled and concurrent, is joined onto
/// that lane's threads).
pub fn generate(
    model: &Model,
    lane: &Lane,
    prompt: &[u32],
    cfg: &DiffusionConfig,
) -> Result<DiffusionOutput, ModelError> {
    generate_with(model, lane, None, prompt, cfg, None)
}

/// Which rows one dense pass computes and where their K/V go.
struct DensePlan {
    row0: usize,
    row1: usize,
    slots: Vec<Option<usize>>,
    /// Rows a static-shape accelerator would pad this pass with.
    padding: usize,
}

/// The dense lane's rows for this step: the cache mode decides what is recomputed.
///
/// `cache_len`: the rows a block-start pass keeps from the cache (0 refreshes everything).
/// `first_dirty`: the first row whose token was committed after its KV row was computed (`n`
/// if none); a dual block start recomputes from there.
fn dense_plan(
    cache_mode: CacheMode,
    cache_len: usize,
    block_start: bool,
    shift: bool,
    (bs, ws, we, n): (usize, usize, usize, usize),
    first_dirty: usize,
    win: &window::Window,
) -> DensePlan {
    let s = usize::from(shift);
    match (cache_mode, block_start) {
        (CacheMode::None, _) => DensePlan {
            row0: 0,
            row1: n,
            slots: vec![None; n],
            padding: 0,
        },
        // Prefix: the prompt and finished blocks are cached (refreshed at each block start);
        // Dream also recomputes row bs − 1 (its output predicts position bs).
        (CacheMode::Prefix, true) => {
            let r0 = cache_len.min(bs - s);
            DensePlan {
                row0: r0,
                row1: n,
                slots: (r0..n).map(|r| (r < bs).then_some(r)).collect(),
                padding: 0,
            }
        }
        (CacheMode::Prefix, false) => DensePlan {
            row0: bs - s,
            row1: n,
            slots: (bs - s..n).map(|r| (r < bs).then_some(r)).collect(),
            padding: 0,
        },
        // Dual: slot = position. At a block start everything from the window on is refreshed
        // (Fast-dLLM's dual cache), and so are the finished block's rows committed after their
        // KV was last computed — its last step's commits, whose rows still hold the mask's KV
        // (the prefix cache rewrites them when it appends the block); later steps recompute
        // only the window.
        (CacheMode::Dual, true) => {
            let r0 = cache_len.min(ws - s).min(first_dirty);
            DensePlan {
                row0: r0,
                row1: n,
                slots: (r0..n).map(Some).collect(),
                padding: 0,
            }
        }
        (CacheMode::Dual, false) => DensePlan {
            row0: ws - s,
            row1: we,
            slots: (ws - s..we).map(Some).collect(),
            padding: win.padding(),
        },
    }
}

/// The diffusion decoder: every strategy is an option of this one loop. With
/// `Revision::concurrent`, the revision pass runs at the same time as the dense pass: on
/// `sparse`, a pool of its own, or (`None`) on the dense lane's threads through a
/// work-stealing join ([`Lane::join`]; no oversubscription where the cores are few); without
/// it, after the dense pass. `observe` is called after every step.
pub fn generate_with(
    model: &Model,
    dense: &Lane,
    sparse: Option<&Lane>,
    prompt: &[u32],
    cfg: &DiffusionConfig,
    mut observe: Option<&mut dyn FnMut(&StepView)>,
) -> Result<DiffusionOutput, ModelError> {
    cfg.validate().map_err(ModelError::BadRequest)?;
    let mask = model.config.mask_id.ok_or_else(|| {
        ModelError::BadRequest("this model has no mask token: not a diffusion LM".into())
    })?;
    if prompt.is_empty() {
        return Err(ModelError::BadRequest("the prompt is empty".into()));
    }
    let t0 = Instant::now();
    let p = prompt.len();
    let gen = cfg.gen_length;
    let n = p + gen;
    if n > model.config.max_ctx {
        return Err(ModelError::ContextOverflow {
            pos: n as u32,
            ctx: model.config.max_ctx,
        });
    }
    let shift = model.config.shift_logits;
    let bl = cfg.block_length;
    let mut x: Vec<u32> = prompt.to_vec();
    x.extend(std::iter::repeat_n(mask, gen));
    let positions: Vec<u32> = (0..n as u32).collect();
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let steps_per_block = cfg.steps / (gen / bl);
    let mut cache = model.new_cache();
    let mut out = DiffusionOutput::default();
    // Per answer position: state, "committed since its KV row was computed", speculative
    // (committed ahead of its block), probes so far, ever revised.
    let mut states = vec![TokenState::Invisible; gen];
    let mut dirty = vec![false; gen];
    let mut spec = vec![false; gen];
    let mut probes = vec![0u8; gen];
    let mut revised = vec![false; gen];
    // Final once its KV row holds it: without revision every commit, with revision one
    // committed at `Revision::stable_on_commit` confidence or more (not worth a probe).
    let sure_of = |confidence: f32| {
        cfg.revision
            .as_ref()
            .is_none_or(|r| r.stable_on_commit.is_some_and(|t| confidence >= t))
    };
    let mut sure = vec![false; gen];
    let mut shadow: Option<KvCache> = None;
    let spec_threshold = cfg.threshold.unwrap_or(0.9);
    let (mut last_block, mut step, mut plan) = (None, 0usize, Vec::new());
    while let Some(win) = window::plan(&states, &dirty, bl, cfg.multi_block.as_ref()) {
        let cur = win.current_block;
        let block_start = last_block != Some(cur);
        let (bs, be) = (p + cur * bl, p + ((cur + 1) * bl).min(gen));
        if block_start {
            // Block commit semantics: speculations of the new current block join it.
            spec[cur * bl..(be - p)].iter_mut().for_each(|s| *s = false);
            let masked0 = states[cur * bl..be - p]
                .iter()
                .filter(|s| **s == TokenState::Invisible)
                .count();
            plan = transfer_schedule(masked0, steps_per_block);
            step = 0;
            last_block = Some(cur);
        }
        let (ws, we) = (p + win.start, p + win.end);
        // A refreshing step recomputes every row and rewrites the whole cache: a block start
        // with `refresh_prefix`, or every `refresh_every`-th step of a block (its first included).
        let refresh = (block_start && cfg.refresh_prefix)
            || (cfg.refresh_every > 0 && step.is_multiple_of(cfg.refresh_every));
        // The rows a non-refreshing step computes; a refreshing step computes all of them
        // (a block-start plan keeping no cached row).
        let first_dirty = dirty.iter().position(|&d| d).map_or(n, |i| p + i);
        let plain = dense_plan(
            cfg.cache,
            cache.len(),
            block_start,
            shift,
            (bs, ws, we, n),
            first_dirty,
            &win,
        );
        // The sparse lane's probes take the Visible tokens left of `plain`'s rows, on
        // refreshing steps too (on the step-start snapshot, as ever): a refresh rewrites their
        // KV, but only a probe re-predicts a token, and without them a refresh at every step
        // left revision with no probe at all.
        let probe_end = plain.row0;
        let dp = if refresh {
            dense_plan(cfg.cache, 0, true, shift, (bs, ws, we, n), n, &win)
        } else {
            plain
        };
        // Masked positions predicted this pass (selective logits: nothing else gets the head).
        let targets: Vec<usize> = (ws..we)
            .filter(|&i| x[i] == mask && (cfg.multi_block.is_some() || i < be))
            .collect();
        let logit_rows: Vec<usize> = targets
            .iter()
            .map(|&i| if shift { i.max(1) - 1 } else { i } - dp.row0)
            .collect();
        let probed: Vec<usize> = match &cfg.revision {
            Some(r) => {
                let mut v: Vec<usize> = (p..probe_end.max(p))
                    .filter(|&i| states[i - p] == TokenState::Visible && !dirty[i - p])
                    .collect();
                v.sort_by_key(|&i| (probes[i - p], i));
                v.truncate(r.max_rows);
                v.sort_unstable();
                v
            }
            None => vec![],
        };
        let probe = (!probed.is_empty()).then(|| build_probe(&x, &probed, mask, shift));
        // The sparse lane reads a snapshot of the cache as of the step's start (the dense
        // pass overwrites its rows meanwhile): `shadow`, a second cache kept equal to the live
        // one row by row at every step end (a full clone per step cost more than the copies).
        if probe.is_some() && shadow.is_none() {
            shadow = Some(cache.clone());
        }
        let mut snapshot = probe.as_ref().and(shadow.as_mut());
        let dense_req = ForwardRequest {
            tokens: &x[dp.row0..dp.row1],
            positions: &positions[dp.row0..dp.row1],
            mask: AttnMask::Bidirectional,
            kv_write: KvWrite::Slots(&dp.slots),
            logits: LogitRows::Rows(&logit_rows),
        };
        // The two passes, timed; which threads run them is decided below.
        let dense_pass = |cache: &mut KvCache| {
            let _s = OpSpan::begin("dense_window", -1, &[(dp.row1 - dp.row0) as u64], "tokens")
                .padded(dp.padding as u64);
            let a = Instant::now();
            let r = model.forward(&dense_req, cache);
            (r, a, Instant::now())
        };
        let sparse_pass = |snap: &mut KvCache, pb: &crate::revision::ProbeBatch| {
            let req = ForwardRequest {
                tokens: &pb.tokens,
                positions: &pb.positions,
                mask: AttnMask::Explicit(&pb.visible),
                kv_write: KvWrite::Slots(&pb.slots),
                logits: LogitRows::Rows(&pb.logit_rows),
            };
            let a = Instant::now();
            let r = model.forward(&req, snap);
            (r, a, Instant::now())
        };
        let concurrent = cfg.revision.as_ref().is_some_and(|r| r.concurrent);
        let (dres, sres) = match (&probe, snapshot.as_mut(), sparse) {
            // Concurrent on the sparse lane's own pool (cores to spare for it).
            (Some(pb), Some(snap), Some(sl)) if concurrent => std::thread::scope(|sc| {
                let h = sc.spawn(|| sl.run(|| sparse_pass(snap, pb)));
                let d = dense.run(|| dense_pass(&mut cache));
                let s = h
                    .join()
                    .map_err(|_| ModelError::Other("the sparse lane panicked".into()));
                (d, Some(s))
            }),
            // Concurrent on the dense lane's threads (work-stealing join: no oversubscription).
            (Some(pb), Some(snap), None) if concurrent => {
                let (d, s) = dense.join(
                    || dense_pass(&mut cache),
                    || sparse_pass(snap, pb),
                    "sparse",
                );
                (d, Some(Ok(s)))
            }
            // Sequential: the deterministic schedule (same results by construction).
            (Some(pb), Some(snap), sl) => {
                let d = dense.run(|| dense_pass(&mut cache));
                let s = match sl {
                    Some(l) => l.run(|| sparse_pass(snap, pb)),
                    None => dense.run(|| sparse_pass(snap, pb)),
                };
                (d, Some(Ok(s)))
            }
            _ => (dense.run(|| dense_pass(&mut cache)), None),
        };
        let (dout, da, db) = dres;
        let mut dout = dout?;
        out.dense_s += (db - da).as_secs_f64();
        out.forward_passes += 1;
        out.rows_computed += dp.row1 - dp.row0;
        out.padded_rows += dp.padding;
        if cfg.cfg_scale > 0.0 {
            // Unconditional pass: the prompt masked (LLaDA's `un_x`).
            let mut un: Vec<u32> = x.clone();
            un[..p].iter_mut().for_each(|t| *t = mask);
            let uout = dense.run(|| {
                model.forward(
                    &ForwardRequest {
                        tokens: &un[dp.row0..dp.row1],
                        positions: &positions[dp.row0..dp.row1],
                        mask: AttnMask::Bidirectional,
                        kv_write: KvWrite::None,
                        logits: LogitRows::Rows(&logit_rows),
                    },
                    &mut cache,
                )
            })?;
            out.forward_passes += 1;
            out.rows_computed += dp.row1 - dp.row0;
            let s = cfg.cfg_scale;
            dout.logits
                .iter_mut()
                .zip(&uout.logits)
                .for_each(|(c, u)| *c = u + (s + 1.0) * (*c - u));
        }
        // Rows written with their real token have clean KV now.
        for (r, slot) in (dp.row0..dp.row1).zip(&dp.slots) {
            if r >= p && (slot.is_some() || cfg.cache != CacheMode::Dual) {
                dirty[r - p] = false;
            }
        }
        // Sparse lane: deferred merge of refreshed rows, then the verdicts.
        let sres = match sres {
            Some(Ok((Ok(o), a, b))) => Some((o, a, b)),
            Some(Ok((Err(e), _, _))) | Some(Err(e)) => return Err(e),
            None => None,
        };
        if let (Some((sout, sa, sb)), Some(snap), Some(r)) = (sres, &snapshot, &cfg.revision) {
            out.sparse_s += (sb - sa).as_secs_f64();
            let (lo, hi) = (sa.max(da), sb.min(db));
            if hi > lo {
                out.overlap_s += (hi - lo).as_secs_f64();
            }
            out.sparse_passes += 1;
            out.sparse_rows += probe.as_ref().map_or(0, |pb| pb.tokens.len());
            for (k, &i) in probed.iter().enumerate() {
                // A row the dense pass rewrote (a refreshing step) keeps the dense row: it saw
                // this step's context, the probe's `A_i` only the snapshot's.
                let dense_wrote = i >= dp.row0 && i < dp.row1 && dp.slots[i - dp.row0].is_some();
                if !dense_wrote {
                    cache
                        .copy_slot_from(snap, i)
                        .map_err(|e| ModelError::Other(e.to_string()))?;
                }
                let a = i - p;
                match judge(x[i], sout.row(k), r, probes[a]) {
                    Verdict::Stable => states[a] = TokenState::Stable,
                    Verdict::Revise(y) => {
                        x[i] = y;
                        revised[a] = true;
                        sure[a] = false;
                        out.revised += 1;
                    }
                    Verdict::Keep => {}
                }
                probes[a] = probes[a].saturating_add(1);
            }
        }
        // The shadow takes the rows the dense pass wrote (the merged ones it holds already).
        if let Some(sh) = shadow.as_mut() {
            for &slot in dp.slots.iter().flatten() {
                sh.copy_slot_from(&cache, slot)
                    .map_err(|e| ModelError::Other(e.to_string()))?;
            }
            // The invariant, checked in this crate's unit tests (a clone would be equal).
            if cfg!(test) {
                assert!(
                    sh.same_rows(&cache),
                    "the sparse lane's shadow cache diverged"
                );
            }
        }
        // Dense commits: the current block by schedule or threshold, future blocks (multi-
        // block speculation) by threshold only.
        let mut cand: Vec<(f32, usize, u32)> = Vec::with_capacity(targets.len());
        for (j, &i) in targets.iter().enumerate() {
            let logits = dout.row(j);
            let tok = if cfg.temperature > 0.0 {
                // Gumbel-max sampling, as LLaDA's add_gumbel_noise.
                let noisy: Vec<f32> = logits
                    .iter()
                    .map(|&v| {
                        let u: f64 = rng.random::<f64>().max(1e-20);
                        (v as f64 / cfg.temperature as f64 - (-(u.ln())).ln()) as f32
                    })
                    .collect();
                argmax(&noisy)
            } else {
                argmax(logits)
            };
            cand.push((score(logits, cfg.confidence, tok, &mut rng), i, tok));
        }
        let (mut now, future): (Vec<_>, Vec<_>) = cand.into_iter().partition(|c| c.1 < be);
        // Highest confidence first; ties to the leftmost position.
        now.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let k = match (cfg.threshold, cfg.schedule) {
            (Some(th), _) => now.iter().filter(|c| c.0 >= th).count().max(1),
            _ if step >= steps_per_block => now.len(),
            (None, Schedule::Uniform) => plan[step],
            (None, Schedule::Timesteps { eps }) => {
                dream_transfer(now.len(), step, steps_per_block, eps)
            }
        };
        if cfg.alg_temp > 0.0 && cfg.threshold.is_none() && k < now.len() {
            // Dream's alg_temp: which positions commit is sampled, not the top k.
            let conf: Vec<f32> = now.iter().map(|c| c.0).collect();
            let pick = sample_transfer(&conf, k, cfg.alg_temp, &mut rng);
            now = pick.iter().map(|&j| now[j]).collect();
        }
        let commits = now.iter().take(k).map(|c| (c, false)).chain(
            future
                .iter()
                .filter(|c| c.0 >= spec_threshold)
                .map(|c| (c, true)),
        );
        for (&(cf, i, tok), speculative) in commits {
            x[i] = tok;
            sure[i - p] = sure_of(cf);
            states[i - p] = TokenState::Visible;
            dirty[i - p] = true;
            spec[i - p] = speculative;
        }
        for a in 0..gen {
            if sure[a] && states[a] == TokenState::Visible && !dirty[a] && !spec[a] {
                states[a] = TokenState::Stable;
            }
        }
        if let Some(f) = observe.as_mut() {
            f(&StepView {
                tokens: &x[p..],
                states: &states,
                revised: &revised,
                mask_id: mask,
            });
        }
        step += 1;
    }
    states.iter_mut().for_each(|s| *s = TokenState::Stable);
    if let Some(f) = observe.as_mut() {
        f(&StepView {
            tokens: &x[p..],
            states: &states,
            revised: &revised,
            mask_id: mask,
        });
    }
    out.tokens = x[p..].to_vec();
    out.total_s = t0.elapsed().as_secs_f64();
    Ok(out)
}

/// `k` distinct indices of `conf` drawn without replacement with probabilities
/// `softmax(conf / alg_temp)` (renormalised over what is left after each draw), as Dream's
/// `torch.multinomial(softmax(confidence / alg_temp), k)`. Confidences of −∞ are never drawn
/// while a finite one is left.
pub fn sample_transfer(conf: &[f32], k: usize, alg_temp: f32, rng: &mut impl Rng) -> Vec<usize> {
    let mx = conf
        .iter()
        .copied()
        .filter(|c| c.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    let mut w: Vec<f64> = conf
        .iter()
        .map(|&c| {
            if c.is_finite() {
                (((c - mx) / alg_temp) as f64).exp()
            } else {
                0.0
            }
        })
        .collect();
    let mut out = Vec::with_capacity(k.min(conf.len()));
    while out.len() < k.min(conf.len()) {
        let total: f64 = w.iter().sum();
        let j = if total > 0.0 {
            let mut u = rng.random::<f64>() * total;
            let mut pick = None;
            for (j, &wj) in w.iter().enumerate() {
                if wj > 0.0 {
                    pick = Some(j);
                    if u < wj {
                        break;
                    }
                    u -= wj;
                }
            }
            pick
        } else {
            // Only −∞ (or underflowed) weights left: the leftmost not yet drawn.
            (0..conf.len()).find(|j| !out.contains(j))
        };
        let Some(j) = j else { break };
        w[j] = 0.0;
        out.push(j);
    }
    out
}

/// The vanilla reference (no cache, no threshold), kept as a named entry point.
pub fn generate_vanilla(
    model: &Model,
    lane: &Lane,
    prompt: &[u32],
    cfg: &DiffusionConfig,
) -> Result<DiffusionOutput, ModelError> {
    let cfg = DiffusionConfig {
        cache: CacheMode::None,
        threshold: None,
        refresh_every: 0,
        ..cfg.clone()
    };
    generate(model, lane, prompt, &cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Draw frequencies against the analytic probabilities: the first draw follows
    /// softmax(conf / T); a pair's draw follows the without-replacement product.
    #[test]
    fn alg_temp_draws_follow_the_softmax() {
        let conf = [0.9f32, 0.5, 0.2, f32::NEG_INFINITY];
        let t = 0.25f32;
        let e: Vec<f64> = conf[..3]
            .iter()
            .map(|&c| ((c as f64) / t as f64).exp())
            .collect();
        let z: f64 = e.iter().sum();
        let mut rng = StdRng::seed_from_u64(7);
        let n = 40_000;
        let (mut first, mut pair01) = ([0usize; 4], 0usize);
        for _ in 0..n {
            let d = sample_transfer(&conf, 2, t, &mut rng);
            assert_eq!(d.len(), 2);
            assert_ne!(d[0], d[1]);
            assert!(!d.contains(&3), "a −∞ confidence was drawn");
            first[d[0]] += 1;
            pair01 += usize::from(d == [0, 1]);
        }
        for j in 0..3 {
            let p = e[j] / z;
            let f = first[j] as f64 / n as f64;
            // 5 standard errors.
            assert!(
                (f - p).abs() < 5.0 * (p * (1.0 - p) / n as f64).sqrt(),
                "{j}: {f} vs {p}"
            );
        }
        let p01 = e[0] / z * e[1] / (z - e[0]);
        let f01 = pair01 as f64 / n as f64;
        assert!((f01 - p01).abs() < 5.0 * (p01 * (1.0 - p01) / n as f64).sqrt());
        // Only −∞ left: still k distinct indices.
        assert_eq!(
            sample_transfer(&[f32::NEG_INFINITY; 3], 2, 1.0, &mut rng),
            vec![0, 1]
        );
        // A tiny temperature is top-k.
        assert_eq!(sample_transfer(&conf, 2, 1e-4, &mut rng), vec![0, 1]);
    }

    #[test]
    fn schedule_matches_llada() {
        assert_eq!(transfer_schedule(10, 4), vec![3, 3, 2, 2]);
        assert_eq!(transfer_schedule(32, 32), vec![1; 32]);
        assert_eq!(transfer_schedule(5, 8), vec![1, 1, 1, 1, 1, 0, 0, 0]);
        assert_eq!(transfer_schedule(10, 4).iter().sum::<usize>(), 10);
    }

    /// The sparse lane's shadow cache stays equal to the live cache at every step end (the
    /// loop asserts it under `cfg(test)`), on both formats, with the sparse pass on its own
    /// pool, joined onto the dense lane, and sequential.
    #[test]
    fn shadow_cache_tracks_the_live_cache() {
        use crate::revision::Revision;
        use crate::window::MultiBlock;
        use llada_model::LoadOptions;
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
        if !dir.join("expected.json").exists() {
            panic!(
                "fixtures missing: run `python3 tests/reference/make_fixtures.py tests/fixtures`"
            );
        }
        let (dense, sparse) = (
            Lane::new("dense", 2).unwrap(),
            Lane::new("sparse", 1).unwrap(),
        );
        for name in ["hf-llada", "hf-dream"] {
            let opts = LoadOptions {
                no_tokenizer: true,
                ..Default::default()
            };
            let model = Model::load(&dir.join(name), &opts).unwrap();
            // Refreshing steps (every step, 2nd, 3rd) rewrite rows the probes also compute:
            // the shadow must still track the cache, and the probes must still run.
            for refresh_every in [0, 1, 2, 3] {
                let mut outs = vec![];
                for (concurrent, pool) in [(true, true), (true, false), (false, false)] {
                    let cfg = DiffusionConfig {
                        cache: CacheMode::Dual,
                        refresh_every,
                        threshold: Some(0.05),
                        multi_block: Some(MultiBlock {
                            window: 16,
                            lookahead: 6,
                        }),
                        revision: Some(Revision {
                            revise_threshold: 0.05,
                            stable_threshold: 0.5,
                            max_probes: 3,
                            stable_on_commit: None,
                            concurrent,
                            ..Revision::default()
                        }),
                        ..DiffusionConfig::one_per_step(32, 8)
                    };
                    let sl = pool.then_some(&sparse);
                    let o = generate_with(&model, &dense, sl, &[5, 17, 33, 8, 2, 61], &cfg, None);
                    let o = o.unwrap();
                    assert!(
                        o.sparse_passes > 1,
                        "{name} every {refresh_every}: the sparse lane must run"
                    );
                    outs.push(o.tokens);
                }
                assert!(outs.windows(2).all(|w| w[0] == w[1]), "{name}");
            }
        }
    }
}
