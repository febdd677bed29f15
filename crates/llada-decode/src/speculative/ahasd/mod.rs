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
//!
//! Layout: `pipeline` holds the state both lanes share and the loops that drive them, `draft`
//! the drafter's step, `verify` the verifier's, `edc` and `tvc` the two gates (TVC's
//! pre-verification included).

mod draft;
mod edc;
mod pipeline;
mod tvc;
mod verify;

pub use self::edc::{entropy_level, Edc};
pub use self::tvc::{tvc_gate, Tvc};
use super::drafter::Drafter;
use llada_model::{Model, ModelError};
use llada_runtime::Lane;
use pipeline::Pipeline;
use serde::Serialize;
use std::time::Instant;

/// Queue bounds (the paper's sizes).
pub const MAX_UNVERIFIED: usize = 64;
pub const MAX_FEEDBACK: usize = 32;
pub const MAX_PREVERIFY: usize = 16;

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

/// Asynchronous (or, with `synchronous`, lock-step) draft/verify generation, greedy.
pub fn generate(
    target: &Model,
    verify_lane: &Lane,
    draft_lane: &Lane,
    drafter: &mut dyn Drafter,
    prompt: &[u32],
    cfg: &AsyncConfig,
) -> Result<AsyncOutput, ModelError> {
    check_request(drafter, prompt, cfg)?;
    let gated = tvc_gated(target, verify_lane, draft_lane, cfg);
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
    let lanes = (target, verify_lane, draft_lane);
    let pipe = Pipeline::new(lanes, cfg, tvc, prompt, gated);
    if cfg.synchronous {
        pipe.run_lock_step(drafter, &mut cache)?;
    } else {
        pipe.run_async(drafter, &mut cache)?;
    }
    pipe.finish(t0, prefill_s)
}

/// The request's checks: greedy sampling, a prompt, batch and verify lengths within the
/// queue, and a drafter that needs no target features.
fn check_request(
    drafter: &dyn Drafter,
    prompt: &[u32],
    cfg: &AsyncConfig,
) -> Result<(), ModelError> {
    cfg.sampling.validate()?;
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
    Ok(())
}

/// Why TVC stays off in this run ([`tvc_gate`]; `None` when it is off anyway or may run).
fn tvc_gated(
    target: &Model,
    verify_lane: &Lane,
    draft_lane: &Lane,
    cfg: &AsyncConfig,
) -> Option<String> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if !cfg.tvc {
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
    }
}
