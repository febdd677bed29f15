//! AHASD: asynchronous drafting. The draft lane keeps drafting ahead of the verifier on the
//! optimistic assumption that its pending drafts will be accepted; the verify lane verifies
//! whatever is pending; on a rejection everything drafted past it is discarded (an epoch
//! counter cancels in-flight work). Two gates, each switchable:
//!
//! * **EDC** (entropy-history drafting control): after each draft batch the mean softmax
//!   entropy is bucketed into 8 levels, `floor(min(H, 10) / 10 · 7.99)`; an 8-entry history
//!   ring and a 3-bit count of unverified batches index a table of 512 two-bit saturating
//!   counters (initialised weakly taken, 2) by {mean level of the ring's upper half, of its
//!   lower half, unverified count}; drafting continues iff the counter is ≥ 2. On verification
//!   a fully accepted batch increments its counter and commits the history; otherwise the
//!   counter is decremented and the history rolled back to the committed one. The gate decides
//!   whether to *keep* drafting ahead: a round with nothing pending always drafts its first
//!   batch (a closed gate could otherwise never reopen).
//!
//! When the queue is empty the verifier waits for the next batch if that pays — a pass
//! without drafts emits one token in `T_v`, waiting `w` for a batch emits `1 + a` in `T_v + w`
//! — and a batch drafted while the verifier committed is re-aligned to the committed sequence
//! (its tokens the verifier already emitted are dropped; a batch that disagrees is discarded).
//! The drafter drafts ahead only as deep as drafts get used: at most one batch plus twice the
//! running mean of drafts accepted per pass (≤ the queue bound of 64).
//! * **TVC** (time-aware pre-verification): the verifier's remaining time is predicted from its
//!   last few (time per token, KV length) records; when the drafter would otherwise idle it
//!   pre-verifies the earliest pending drafts with the target on its own lane, as many as the
//!   time left allows at the measured per-token cost, clamped to `[1, min(8, pending)]`. A
//!   mismatch found there cancels the drafts after it and queues the target's token instead.
//!   It fills an *idle unit*: where the draft lane shares the verifier's cores or the target
//!   streams its weights, a pre-verification is a second target pass competing with the
//!   verifier, and TVC stays off unless forced ([`tvc_gate`]).
//!
//! Output is identical to target-only greedy decoding: the verify lane accepts only what the
//! target itself predicts (`greedy` rule).

use super::drafter::Drafter;
use super::tree::DraftTree;
use llada_model::{AttnMask, ForwardRequest, KvWrite, LogitRows, Model, ModelError};
use llada_runtime::{KvCache, Lane};
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Queue bounds (the paper's sizes).
pub const MAX_UNVERIFIED: usize = 64;
pub const MAX_FEEDBACK: usize = 32;
pub const MAX_PREVERIFY: usize = 16;

/// Entropy level of a batch: `floor(min(H, 10) / 10 · 7.99)`.
pub fn entropy_level(h: f32) -> u8 {
    (h.clamp(0.0, 10.0) / 10.0 * 7.99).floor() as u8
}

/// The EDC predictor.
#[derive(Debug, Clone)]
pub struct Edc {
    table: [u8; 512],
    ring: [u8; 8],
    committed: [u8; 8],
    head: usize,
    committed_head: usize,
    unverified: u8,
}

impl Default for Edc {
    fn default() -> Self {
        Self {
            table: [2; 512],
            ring: [0; 8],
            committed: [0; 8],
            head: 0,
            committed_head: 0,
            unverified: 0,
        }
    }
}

impl Edc {
    fn index(&self) -> usize {
        // Ring entries in age order: newest first.
        let age = |k: usize| self.ring[(self.head + 8 - 1 - k) % 8] as usize;
        let upper = (0..4).map(age).sum::<usize>() / 4;
        let lower = (4..8).map(age).sum::<usize>() / 4;
        (upper << 6) | (lower << 3) | self.unverified.min(7) as usize
    }
    /// Keep drafting?
    pub fn should_draft(&self) -> bool {
        self.table[self.index()] >= 2
    }
    /// A batch was drafted with mean entropy `h`; returns the table index to credit later.
    pub fn on_draft(&mut self, h: f32) -> usize {
        let idx = self.index();
        self.ring[self.head] = entropy_level(h);
        self.head = (self.head + 1) % 8;
        self.unverified = (self.unverified + 1).min(7);
        idx
    }
    /// A batch drafted at table index `idx` was verified.
    pub fn on_verify(&mut self, idx: usize, fully_accepted: bool) {
        self.unverified = self.unverified.saturating_sub(1);
        if fully_accepted {
            self.table[idx] = (self.table[idx] + 1).min(3);
            self.committed = self.ring;
            self.committed_head = self.head;
        } else {
            self.table[idx] = self.table[idx].saturating_sub(1);
            self.ring = self.committed;
            self.head = self.committed_head;
            self.unverified = 0;
        }
    }
    pub fn counter(&self, idx: usize) -> u8 {
        self.table[idx]
    }
}

/// TVC's model of the verifier: its recent passes as (seconds, tokens, KV length) records.
///
/// AHASD's rule prices a pass per token (`time left / per-token cost`). A pass of a target
/// whose weights are streamed from storage costs its weight reads whatever its width, so a
/// per-token price calls a one-token pre-verification cheap when it costs a whole pass (and
/// reads every streamed weight a second time, competing with the verifier's own reads). The
/// records are therefore fitted as `cost(n) = fixed + n · per_token` (least squares over the
/// records, both terms ≥ 0; with one pass width only, `fixed` = 0 and AHASD's per-token price),
/// scaled by KV length; a pre-verification runs only when one token fits in the time left.
#[derive(Debug, Clone, Default)]
pub struct Tvc {
    records: VecDeque<(f64, usize, usize)>,
}

impl Tvc {
    pub fn record(&mut self, secs: f64, tokens: usize, kv_len: usize) {
        self.records.push_back((secs, tokens.max(1), kv_len));
        while self.records.len() > 8 {
            self.records.pop_front();
        }
    }
    /// `(fixed, per_token)` seconds of a pass at `kv_len` (`None` before any record).
    pub fn cost_model(&self, kv_len: usize) -> Option<(f64, f64)> {
        if self.records.is_empty() {
            return None;
        }
        let n = self.records.len() as f64;
        let mk = self.records.iter().map(|r| r.2 as f64).sum::<f64>() / n;
        let f = super::fit_line(self.records.iter().map(|r| (r.1 as f64, r.0)));
        // Without a usable slope (one pass width, or a negative intercept clipped to 0): the
        // line through the origin, AHASD's per-token price.
        let through_origin = (0.0, f.mean_y / f.mean_x);
        let (fixed, per) = match f.slope {
            Some(slope) => {
                let b = slope.max(0.0);
                let a = (f.mean_y - b * f.mean_x).max(0.0);
                if a == 0.0 {
                    through_origin
                } else {
                    (a, b)
                }
            }
            None => through_origin,
        };
        let scale = (kv_len as f64 / mk.max(1.0)).max(0.5);
        Some((fixed * scale, per * scale))
    }
    /// Predicted seconds of a pass of `tokens` tokens at `kv_len`.
    pub fn pass_cost(&self, tokens: usize, kv_len: usize) -> Option<f64> {
        self.cost_model(kv_len).map(|(a, b)| a + b * tokens as f64)
    }
    /// Pre-verification length for `time_left` seconds and a pass costing `fixed + n ·
    /// per_token`: as many tokens as fit, clamped to [1, min(8, pending)] — and 0 when not
    /// even one fits (with `fixed` = 0 this is AHASD's `time left / per-token cost` rule).
    pub fn preverify_len(time_left: f64, fixed: f64, per_token: f64, pending: usize) -> usize {
        let hi = pending.min(8);
        if hi == 0 || (fixed > 0.0 && time_left < fixed + per_token) {
            return 0;
        }
        (((time_left - fixed) / per_token.max(1e-9)) as usize).clamp(1, hi)
    }
}

/// Why TVC pre-verifies nothing in a run, or `None` when it may.
///
/// AHASD's TVC fills the time the drafter's unit would idle. Here the drafter's unit is the
/// draft lane, and its idle time is idle hardware only if nothing the verifier needs is
/// shared: a pre-verification is a target pass, so it competes with the verifier for
/// * the target's streamed weights, when the target does not fit its memory budget
///   (`streamed`): the pass reads every streamed weight a second time, beside the
///   verifier's own reads, and holds a second set of staging buffers;
/// * the cores, when the draft lane's and the verify lane's threads outnumber them.
///
/// Measured (`llada bench spec --budgets 25%`, 2 cores): pre-verifying anyway ran
/// at 0.55x of lock-step (15.3 against 27.6 tok/s), read 86.8 MB per token against 48.8, and
/// held 41.4 MB of weights against a 33.2 MB budget + staging.
pub fn tvc_gate(
    streamed: bool,
    verify_threads: usize,
    draft_threads: usize,
    cores: usize,
) -> Option<String> {
    if streamed {
        return Some(
            "the target streams its weights: a pre-verification would read them a second time beside the verifier"
                .into(),
        );
    }
    if verify_threads + draft_threads > cores {
        let hint = match cores.checked_sub(draft_threads) {
            Some(spare) if spare > 0 => format!("--threads {spare} leaves it one"),
            _ => "no core is left for it".into(),
        };
        return Some(format!(
            "the draft lane shares the verifier's cores ({verify_threads} + {draft_threads} threads on {cores} cores; {hint})"
        ));
    }
    None
}

/// Options of the asynchronous pipeline.
#[derive(Debug, Clone)]
pub struct AsyncConfig {
    pub max_tokens: usize,
    /// Tokens per draft batch.
    pub batch: usize,
    /// Most pending tokens one verification takes.
    pub max_verify: usize,
    pub edc: bool,
    pub tvc: bool,
    /// Run TVC's pre-verification even where it competes with the verifier ([`tvc_gate`]).
    pub tvc_on_shared: bool,
    /// Run the drafter in lock-step with the verifier instead (the synchronous baseline of the
    /// same configuration).
    pub synchronous: bool,
    pub stop_ids: Vec<u32>,
    /// Greedy only (temperature 0); its repetition penalty applies to every verification.
    pub sampling: crate::SamplingParams,
}

/// Result and lane statistics.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AsyncOutput {
    pub tokens: Vec<u32>,
    pub verify_passes: usize,
    pub accepted: usize,
    pub drafted: usize,
    pub discarded: usize,
    pub preverified: usize,
    pub edc_stops: usize,
    /// Idle moments where TVC found no pre-verification that fits the verifier's time left.
    pub tvc_skips: usize,
    /// With TVC on: why it pre-verified nothing in this run ([`tvc_gate`]), if it did not run.
    pub tvc_gated: Option<String>,
    pub draft_busy_s: f64,
    pub verify_busy_s: f64,
    pub total_s: f64,
    /// Target prefill of the prompt (included in `total_s`).
    pub prefill_s: f64,
}

struct Pending {
    token: u32,
    /// EDC table index of the batch it came from (and whether it is the batch's last token).
    edc_idx: usize,
    batch_end: bool,
}

struct Shared {
    committed: Vec<u32>,
    pending: VecDeque<Pending>,
    epoch: u64,
    done: bool,
    edc: Edc,
    tvc: Tvc,
    verify_started: Option<Instant>,
    verify_expected: f64,
    /// Running means for the verifier's wait decision: seconds per draft batch, seconds per
    /// verification pass, drafts accepted per pass that had drafts to verify.
    draft_batch_s: f64,
    verify_pass_s: f64,
    accepted_per_pass: f64,
    /// The drafter finished an attempt (even an empty one), or its thread stopped: what the
    /// verifier's first pass waits for.
    drafter_started: bool,
    out: AsyncOutput,
}

/// Running mean with weight 1/4 on the new value (the first value is taken as is).
fn ema(old: f64, new: f64) -> f64 {
    if old == 0.0 {
        new
    } else {
        0.75 * old + 0.25 * new
    }
}

/// Wait on `cv` for at most `d` (the verifier waiting for the drafter); a poisoned lock is an
/// error.
fn wait_on<'a>(
    cv: &Condvar,
    s: std::sync::MutexGuard<'a, Shared>,
    d: Duration,
) -> Result<std::sync::MutexGuard<'a, Shared>, ModelError> {
    cv.wait_timeout(s, d)
        .map(|(s, _)| s)
        .map_err(|_| ModelError::Other("pipeline poisoned".into()))
}

/// Greedy target verification of `chain` after `ctx` (cache holds ctx[..len−1]); returns the
/// number of chain tokens accepted and the target's next token. `params` carries the
/// repetition penalty: row `k` is penalised for `ctx` and `chain[..k]`.
fn verify_chain(
    target: &Model,
    lane: &Lane,
    cache: &mut KvCache,
    ctx: &[u32],
    chain: &[u32],
    params: &crate::SamplingParams,
) -> Result<(usize, u32), ModelError> {
    let base = ctx.len() - 1;
    let mut toks = vec![ctx[base]];
    toks.extend(chain);
    let pos: Vec<u32> = (base as u32..(base + toks.len()) as u32).collect();
    let out = lane.run(|| {
        target.forward(
            &ForwardRequest {
                tokens: &toks,
                positions: &pos,
                mask: AttnMask::Causal,
                kv_write: KvWrite::Append,
                logits: LogitRows::All,
            },
            cache,
        )
    })?;
    let mut k = 0;
    let mut history = ctx.to_vec();
    loop {
        let y = params.greedy_after(out.row(k), &history);
        history.extend(chain.get(k));
        if k < chain.len() && chain[k] == y {
            k += 1;
        } else {
            // Keep the root and the accepted tokens' KV.
            cache.truncate(base + 1 + k);
            return Ok((k, y));
        }
    }
}

/// A batch drafted after `ctx`, re-aligned to the sequence now known (`committed` + `pending`):
/// `Ok(tokens that extend it)` when `ctx` is a prefix of that sequence and the batch agrees
/// with the tokens committed since (possibly none left), `Err(batch length)` otherwise.
fn align_batch(
    committed: &[u32],
    pending: &VecDeque<Pending>,
    ctx: &[u32],
    batch: Vec<u32>,
) -> Result<Vec<u32>, usize> {
    let now: Vec<u32> = committed
        .iter()
        .copied()
        .chain(pending.iter().map(|p| p.token))
        .collect();
    if now.len() < ctx.len() || now[..ctx.len()] != *ctx {
        return Err(batch.len());
    }
    let known = &now[ctx.len()..];
    let overlap = known.len().min(batch.len());
    if batch[..overlap] != known[..overlap] {
        return Err(batch.len());
    }
    Ok(batch[overlap..].to_vec())
}

/// Draft `n` tokens greedily after `ctx`; returns tokens and the mean entropy.
fn draft_batch(
    drafter: &mut dyn Drafter,
    ctx: &[u32],
    n: usize,
) -> Result<(Vec<u32>, f32), ModelError> {
    let mut t = DraftTree::default();
    let mut node = None;
    let mut h = 0f32;
    for _ in 0..n {
        let p = drafter.propose(ctx, &t, node, 4)?;
        let Some(&(tok, q)) = p.top.first() else {
            break;
        };
        h += match &p.full {
            Some(full) => full
                .iter()
                .filter(|v| **v > 0.0)
                .map(|v| -v * v.ln())
                .sum::<f32>(),
            // n-gram: entropy of the proposal counts, plus the untrusted mass.
            None => {
                let rest = (1.0 - p.top.iter().map(|c| c.1).sum::<f32>()).max(1e-6);
                p.top.iter().map(|c| -c.1 * c.1.max(1e-6).ln()).sum::<f32>() - rest * rest.ln()
                    + rest * 8.0
            }
        };
        node = Some(t.push(node, tok, q, q));
    }
    let n = t.len().max(1) as f32;
    Ok((t.tokens, h / n))
}

/// Asynchronous (or, with `synchronous`, lock-step) draft/verify generation, greedy.
pub fn generate(
    target: &Model,
    verify_lane: &Lane,
    draft_lane: &Lane,
    drafter: &mut dyn Drafter,
    prompt: &[u32],
    cfg: &AsyncConfig,
) -> Result<AsyncOutput, ModelError> {
    cfg.sampling.validate().map_err(ModelError::BadRequest)?;
    if !cfg.sampling.is_greedy() {
        return Err(ModelError::BadRequest(
            "the AHASD pipeline verifies greedily: use temperature 0".into(),
        ));
    }
    if prompt.is_empty() || cfg.batch == 0 || cfg.max_verify == 0 {
        return Err(ModelError::BadRequest(
            "empty prompt, or zero batch / verify length".into(),
        ));
    }
    if cfg.batch > MAX_UNVERIFIED {
        return Err(ModelError::BadRequest(format!(
            "a draft batch of {} tokens exceeds the queue of unverified drafts ({MAX_UNVERIFIED})",
            cfg.batch
        )));
    }
    if drafter.wants_features() {
        // The draft lane drafts past unverified tokens, for which the target has no features.
        return Err(ModelError::BadRequest(format!(
            "the {} drafter reads the target's features, which AHASD's draft lane does not get; use it with --tree chain|topk|lever",
            drafter.name()
        )));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let gated = if !cfg.tvc {
        None
    } else if cfg.synchronous {
        // Lock-step drafts only between verifications: the draft lane never waits on one.
        Some("lock-step (--ahasd sync): the drafter never runs beside the verifier, so it has no idle time to fill".into())
    } else if cfg.tvc_on_shared {
        None
    } else {
        tvc_gate(
            target.store.is_some(),
            verify_lane.threads(),
            draft_lane.threads(),
            cores,
        )
    };
    let tvc = cfg.tvc && gated.is_none();
    let t0 = Instant::now();
    let mut cache = target.new_cache();
    super::append_context(target, verify_lane, &mut cache, &prompt[..prompt.len() - 1])?;
    let prefill_s = t0.elapsed().as_secs_f64();
    // With TVC, a streamed target runs two passes at once (the verifier's and a
    // pre-verification on the draft lane), each holding its own staging units. The pool keeps
    // a second staging allowance for this generation — what those passes hold anyway — so
    // their units are recycled instead of freed and re-allocated all along (measured: 0.8–0.9 GB
    // re-allocated over a four-prompt bench run without it).
    let _tvc_pool = target
        .store
        .as_ref()
        .filter(|_| tvc)
        .map(|st| st.reserve_second_pass());
    let shared = Mutex::new(Shared {
        committed: prompt.to_vec(),
        pending: VecDeque::new(),
        epoch: 0,
        done: false,
        edc: Edc::default(),
        tvc: Tvc::default(),
        verify_started: None,
        verify_expected: 0.0,
        draft_batch_s: 0.0,
        verify_pass_s: 0.0,
        accepted_per_pass: 1.0,
        drafter_started: false,
        out: AsyncOutput {
            tvc_gated: gated,
            ..Default::default()
        },
    });
    let cv = Condvar::new();
    let lock = || {
        shared
            .lock()
            .map_err(|_| ModelError::Other("pipeline poisoned".into()))
    };

    // The drafter's step: draft one batch (or pre-verify, or report idle).
    let draft_step = |drafter: &mut dyn Drafter,
                      target_snapshot: Option<&KvCache>|
     -> Result<bool, ModelError> {
        let (ctx, ahead, epoch, gate_ok, full) = {
            let s = lock()?;
            if s.done {
                return Ok(false);
            }
            let mut ctx = s.committed.clone();
            ctx.extend(s.pending.iter().map(|p| p.token));
            // EDC decides whether to *keep* drafting ahead of the verifier; a new round (nothing
            // pending) always drafts its first batch — else a gate that closed could never
            // reopen (its counters only move when drafts are verified).
            let gate_ok = !cfg.edc || s.pending.is_empty() || s.edc.should_draft();
            // Draft ahead only as deep as drafts get used: one batch plus twice the drafts a
            // pass accepts (running mean), at most the queue bound. Deeper drafts are almost
            // always discarded, and on shared cores the drafting thread slows the verifier.
            let depth =
                (cfg.batch + (2.0 * s.accepted_per_pass).ceil() as usize).min(MAX_UNVERIFIED);
            // Drafting past something the verifier will commit first: pending drafts, or the
            // one token of a pass running without drafts (never in lock-step, whose rounds
            // draft from the committed sequence).
            let ahead = !cfg.synchronous && (!s.pending.is_empty() || s.verify_started.is_some());
            let n = s.pending.len() + cfg.batch;
            (
                ctx,
                ahead,
                s.epoch,
                gate_ok,
                n > depth || n + usize::from(ahead) > MAX_UNVERIFIED,
            )
        };
        if gate_ok && !full {
            let t = Instant::now();
            // A batch drafted ahead of the verifier is one token longer: when the verifier
            // accepts everything pending (or had nothing to verify), its own next token takes
            // the batch's first position (dropped from the batch if the batch agrees), and a
            // full batch is left.
            let (toks, h) = draft_batch(drafter, &ctx, cfg.batch + usize::from(ahead))?;
            let mut s = lock()?;
            s.out.draft_busy_s += t.elapsed().as_secs_f64();
            s.draft_batch_s = ema(s.draft_batch_s, t.elapsed().as_secs_f64());
            // Wake a verifier waiting for the first attempt, even one that queues nothing.
            s.drafter_started = true;
            cv.notify_all();
            // The verifier may have committed tokens meanwhile: keep the part of the batch
            // that still extends committed + pending (none after a cancellation).
            let toks = if s.epoch == epoch {
                align_batch(&s.committed, &s.pending, &ctx, toks)
            } else {
                Err(toks.len())
            };
            let toks = match toks {
                Ok(t) if !t.is_empty() => t,
                Ok(_) => return Ok(true),
                Err(n) => {
                    s.out.discarded += n;
                    return Ok(true);
                }
            };
            let idx = s.edc.on_draft(h);
            s.out.drafted += toks.len();
            let n = toks.len();
            for (i, tok) in toks.into_iter().enumerate() {
                s.pending.push_back(Pending {
                    token: tok,
                    edc_idx: idx,
                    batch_end: i + 1 == n,
                });
            }
            cv.notify_all();
            return Ok(true);
        }
        // Would idle: time-aware pre-verification of the earliest pending drafts.
        if tvc {
            if let Some(snap) = target_snapshot {
                let (plan, committed, epoch) = {
                    let mut s = lock()?;
                    if !cfg.edc || s.edc.should_draft() {
                        // (queue full) fall through to the pre-verification below
                    } else {
                        s.out.edc_stops += 1;
                    }
                    let left = match s.verify_started {
                        Some(st) => s.verify_expected - st.elapsed().as_secs_f64(),
                        None => 0.0,
                    };
                    let n = match s.tvc.cost_model(s.committed.len()) {
                        Some((a, b)) if left > 0.0 => {
                            Tvc::preverify_len(left, a, b, s.pending.len())
                        }
                        _ => 0,
                    }
                    .min(MAX_PREVERIFY);
                    if n == 0 && left > 0.0 && !s.pending.is_empty() {
                        s.out.tvc_skips += 1;
                    }
                    let chain: Vec<u32> = s.pending.iter().take(n).map(|p| p.token).collect();
                    (chain, s.committed.clone(), s.epoch)
                };
                if !plan.is_empty() && snap.len() + 1 == committed.len() {
                    let t = Instant::now();
                    let mut c2 = snap.clone();
                    let (k, y) = verify_chain(
                        target,
                        draft_lane,
                        &mut c2,
                        &committed,
                        &plan,
                        &cfg.sampling,
                    )?;
                    let mut s = lock()?;
                    s.out.draft_busy_s += t.elapsed().as_secs_f64();
                    s.out.preverified += plan.len();
                    if s.epoch == epoch && k < plan.len() {
                        // Cancel drafts past the mismatch; queue the target's own token.
                        let dropped = s.pending.len() - k;
                        s.pending.truncate(k);
                        s.out.discarded += dropped;
                        let idx = s.edc.on_draft(0.0);
                        s.pending.push_back(Pending {
                            token: y,
                            edc_idx: idx,
                            batch_end: true,
                        });
                        s.epoch += 1;
                        cv.notify_all();
                    }
                    return Ok(true);
                }
            }
        }
        let s = lock()?;
        if !s.done {
            let _ = cv.wait_timeout(s, Duration::from_millis(2));
        }
        Ok(true)
    };

    // The verifier's step: verify what is pending (at least one target token per pass).
    let snapshot: Mutex<Option<KvCache>> = Mutex::new(None);
    let verify_step = |cache: &mut KvCache| -> Result<bool, ModelError> {
        let (ctx, chain, epoch0) = {
            let mut s = lock()?;
            if s.out.tokens.len() >= cfg.max_tokens {
                s.done = true;
                cv.notify_all();
                return Ok(false);
            }
            let room = cfg.max_tokens - s.out.tokens.len();
            let chain: Vec<u32> = s
                .pending
                .iter()
                .take(cfg.max_verify.min(room.saturating_sub(1)))
                .map(|p| p.token)
                .collect();
            s.verify_started = Some(Instant::now());
            s.verify_expected = s
                .tvc
                .pass_cost(chain.len() + 1, s.committed.len())
                .unwrap_or(0.0);
            (s.committed.clone(), chain, s.epoch)
        };
        let t = Instant::now();
        let (k, y) = verify_chain(target, verify_lane, cache, &ctx, &chain, &cfg.sampling)?;
        let secs = t.elapsed().as_secs_f64();
        let mut s = lock()?;
        s.tvc.record(secs, chain.len() + 1, ctx.len());
        s.verify_pass_s = ema(s.verify_pass_s, secs);
        if !chain.is_empty() {
            s.accepted_per_pass = 0.75 * s.accepted_per_pass + 0.25 * k as f64;
        }
        s.out.verify_busy_s += secs;
        s.out.verify_passes += 1;
        s.out.accepted += k;
        // EDC feedback: a batch whose last token was accepted succeeded; the batch holding the
        // first rejected token failed (and everything after it is discarded).
        if s.epoch != epoch0 {
            // The drafter's pre-verification rewrote the queue meanwhile: start it afresh from
            // what the verifier committed (the verifier is authoritative).
            let dropped = s.pending.len();
            s.out.discarded += dropped;
            s.pending.clear();
            s.epoch += 1;
        }
        let nv = chain.len().min(s.pending.len());
        let verified: Vec<Pending> = s.pending.drain(..nv).collect();
        for (i, p) in verified.iter().enumerate() {
            if i >= k {
                s.edc.on_verify(p.edc_idx, false);
                break;
            }
            if p.batch_end {
                s.edc.on_verify(p.edc_idx, true);
            }
        }
        if k < chain.len() {
            let dropped = s.pending.len() + (chain.len() - k);
            s.out.discarded += dropped;
            s.pending.clear();
            s.epoch += 1;
        } else if let Some(front) = s.pending.front() {
            // Everything verified was accepted and the target's own token `y` takes the next
            // position: the queue stays valid only if its next draft is that token.
            if front.token == y {
                let p = s.pending.pop_front();
                if let Some(p) = p.filter(|p| p.batch_end) {
                    s.edc.on_verify(p.edc_idx, true);
                }
            } else {
                s.out.discarded += s.pending.len();
                s.pending.clear();
                s.epoch += 1;
            }
        }
        let mut stop = false;
        for tok in chain[..k].iter().copied().chain([y]) {
            if s.out.tokens.len() >= cfg.max_tokens {
                stop = true;
                break;
            }
            s.out.tokens.push(tok);
            s.committed.push(tok);
            if cfg.stop_ids.contains(&tok) {
                stop = true;
                break;
            }
        }
        let keep = s.committed.len() - 1;
        cache.truncate(keep);
        if let Ok(mut snap) = snapshot.lock() {
            *snap = tvc.then(|| cache.clone());
        }
        if stop || s.out.tokens.len() >= cfg.max_tokens {
            s.done = true;
        }
        s.verify_started = None;
        cv.notify_all();
        Ok(!s.done)
    };

    if cfg.synchronous {
        // Lock-step: one draft batch, then one verification.
        loop {
            draft_step(drafter, None)?;
            if !verify_step(&mut cache)? {
                break;
            }
        }
    } else {
        std::thread::scope(|sc| -> Result<(), ModelError> {
            let h = sc.spawn(|| -> Result<(), ModelError> {
                llada_runtime::trace::set_thread_lane("draft");
                // However the drafter's loop ends (done, an error, a panic), a verifier still
                // waiting for its first attempt is released.
                struct Release<'a>(&'a Mutex<Shared>, &'a Condvar);
                impl Drop for Release<'_> {
                    fn drop(&mut self) {
                        let mut s = match self.0.lock() {
                            Ok(s) => s,
                            Err(poisoned) => poisoned.into_inner(),
                        };
                        s.drafter_started = true;
                        self.1.notify_all();
                    }
                }
                let _release = Release(&shared, &cv);
                loop {
                    let snap = snapshot.lock().ok().and_then(|s| s.clone());
                    if !draft_step(drafter, snap.as_ref())? {
                        return Ok(());
                    }
                }
            });
            let wait = |s, d| wait_on(&cv, s, d);
            let r = (|| -> Result<(), ModelError> {
                loop {
                    // Nothing to verify: wait for the drafter's next batch when it pays. A
                    // pass without drafts emits 1 token in T_v; waiting w for a batch emits
                    // 1 + a in T_v + w, better iff a · T_v > w (a: drafts accepted per pass,
                    // running means of all three). Without this the verifier, slower than a
                    // batch, starts every pass after a rejection with an empty queue and the
                    // pipeline degenerates to target-only decoding.
                    let mut s = lock()?;
                    let w = s.draft_batch_s;
                    if !s.drafter_started {
                        // No batch drafted yet (the drafter is reading the prompt): the first
                        // pass waits for it, as a lock-step round would, rather than spend a
                        // whole target pass on one token. Any finished attempt, even an
                        // empty one, ends the wait, and so does the drafter's thread ending
                        // (an error or a panic there: the verifier then decodes alone, and
                        // the drafter's error is returned at the end).
                        while !s.drafter_started && s.pending.is_empty() && !s.done {
                            s = wait(s, Duration::from_millis(50))?;
                        }
                    } else if s.pending.is_empty()
                        && !s.done
                        && w > 0.0
                        && s.accepted_per_pass * s.verify_pass_s > w
                    {
                        let deadline = Instant::now() + Duration::from_secs_f64((2.0 * w).min(1.0));
                        while s.pending.is_empty() && !s.done {
                            let left = deadline.saturating_duration_since(Instant::now());
                            if left.is_zero() {
                                break;
                            }
                            s = wait(s, left)?;
                        }
                    } else if s.pending.is_empty() && !s.done {
                        s = wait(s, Duration::from_millis(1))?;
                    }
                    drop(s);
                    if !verify_step(&mut cache)? {
                        break;
                    }
                }
                Ok(())
            })();
            {
                let mut s = lock()?;
                s.done = true;
                cv.notify_all();
            }
            let d = h
                .join()
                .map_err(|_| ModelError::Other("the draft lane panicked".into()))?;
            r.and(d)
        })?;
    }
    let mut s = lock()?;
    s.out.total_s = t0.elapsed().as_secs_f64();
    s.out.prefill_s = prefill_s;
    Ok(std::mem::take(&mut s.out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn late_batches_are_realigned_to_the_committed_sequence() {
        let q = |toks: &[u32]| -> VecDeque<Pending> {
            toks.iter()
                .map(|&token| Pending {
                    token,
                    edc_idx: 0,
                    batch_end: false,
                })
                .collect()
        };
        // Nothing changed: the whole batch extends the sequence.
        assert_eq!(
            align_batch(&[1, 2], &q(&[3]), &[1, 2, 3], vec![4, 5]),
            Ok(vec![4, 5])
        );
        // The verifier committed 4 meanwhile (its own token): the batch's 4 is dropped.
        assert_eq!(
            align_batch(&[1, 2, 3, 4], &q(&[]), &[1, 2, 3], vec![4, 5, 6]),
            Ok(vec![5, 6])
        );
        // ... or committed 7, which the batch did not predict: the batch is stale.
        assert_eq!(
            align_batch(&[1, 2, 3, 7], &q(&[]), &[1, 2, 3], vec![4, 5, 6]),
            Err(3)
        );
        // The sequence moved past the whole batch.
        assert_eq!(
            align_batch(&[1, 2, 3, 4, 5], &q(&[]), &[1, 2, 3], vec![4]),
            Ok(vec![])
        );
        // A rejection rewrote the context the batch was drafted from.
        assert_eq!(align_batch(&[1, 9], &q(&[]), &[1, 2, 3], vec![4]), Err(1));
    }

    #[test]
    fn entropy_levels() {
        assert_eq!(entropy_level(0.0), 0);
        assert_eq!(entropy_level(5.0), 3);
        assert_eq!(entropy_level(9.99), 7);
        assert_eq!(entropy_level(42.0), 7);
    }

    #[test]
    fn edc_counter_table() {
        let mut e = Edc::default();
        assert!(e.should_draft()); // weakly taken
        let i = e.on_draft(9.5);
        e.on_verify(i, false);
        // One failure at this index: 2 → 1, and drafting stops there.
        assert_eq!(e.counter(i), 1);
        assert!(!e.should_draft() || e.index() != i);
        // Successes saturate at 3.
        let mut e = Edc::default();
        for _ in 0..5 {
            let i = e.on_draft(0.5);
            e.on_verify(i, true);
        }
        assert!(e.should_draft());
        // A rejection rolls the history back to the committed ring.
        let before = (e.ring, e.head);
        let j = e.on_draft(9.9);
        assert_ne!((e.ring, e.head), before);
        e.on_verify(j, false);
        assert_eq!((e.ring, e.head), before);
        assert_eq!(e.unverified, 0);
    }

    #[test]
    fn tvc_clamps_the_length() {
        // No fixed cost: AHASD's rule, time left / per-token cost in [1, min(8, pending)].
        assert_eq!(Tvc::preverify_len(0.010, 0.0, 0.001, 20), 8);
        assert_eq!(Tvc::preverify_len(0.010, 0.0, 0.001, 3), 3);
        assert_eq!(Tvc::preverify_len(0.0001, 0.0, 0.001, 5), 1);
        assert_eq!(Tvc::preverify_len(1.0, 0.0, 0.001, 0), 0);
        // A pass with a fixed cost (streamed weights): what fits after it, or nothing.
        assert_eq!(Tvc::preverify_len(0.1055, 0.100, 0.001, 20), 5);
        assert_eq!(Tvc::preverify_len(0.050, 0.100, 0.001, 20), 0);
        let mut t = Tvc::default();
        assert!(t.cost_model(100).is_none());
        // One pass width: no fixed part, the per-token price of the records.
        t.record(0.02, 2, 100);
        assert_eq!(t.cost_model(100), Some((0.0, 0.01)));
        assert!(t.pass_cost(3, 200).unwrap() > t.pass_cost(3, 100).unwrap());
        // Passes of 1, 3 and 5 tokens costing 0.1 + 0.002 n: the fit recovers both terms.
        let mut t = Tvc::default();
        for n in [1usize, 3, 5, 3] {
            t.record(0.1 + 0.002 * n as f64, n, 100);
        }
        let (a, b) = t.cost_model(100).unwrap();
        assert!(
            (a - 0.1).abs() < 1e-9 && (b - 0.002).abs() < 1e-9,
            "{a} {b}"
        );
        assert!((t.pass_cost(4, 100).unwrap() - 0.108).abs() < 1e-9);
    }

    #[test]
    fn tvc_runs_only_on_idle_hardware() {
        // A resident target and a lane of its own: AHASD's rule applies.
        assert_eq!(tvc_gate(false, 1, 1, 2), None);
        assert_eq!(tvc_gate(false, 3, 1, 4), None);
        // The lanes outnumber the cores: the draft lane's idle time is the verifier's.
        let why = tvc_gate(false, 2, 1, 2).unwrap();
        assert!(why.contains("2 + 1 threads on 2 cores"), "{why}");
        assert!(why.contains("--threads 1 leaves it one"), "{why}");
        let why = tvc_gate(false, 8, 1, 8).unwrap();
        assert!(why.contains("--threads 7"), "{why}");
        let why = tvc_gate(false, 1, 1, 1).unwrap();
        assert!(why.contains("no core is left"), "{why}");
        // A streamed target: a pre-verification re-reads the weights, whatever the cores.
        for cores in [2, 64] {
            let why = tvc_gate(true, 1, 1, cores).unwrap();
            assert!(why.contains("streams its weights"), "{why}");
        }
    }
}
