//! The pipeline both lanes share: the queue of pending drafts and the statistics behind one
//! lock ([`Shared`]), and the loops that drive the drafter's step ([`Pipeline::draft_step`])
//! and the verifier's ([`Pipeline::verify_step`]) in lock-step or on two threads.

use super::{AsyncConfig, AsyncOutput, Edc, Tvc};
use crate::speculative::drafter::Drafter;
use llada_model::{Model, ModelError};
use llada_runtime::{KvCache, Lane};
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub(super) struct Pending {
    pub token: u32,
    /// EDC table index of the batch it came from (and whether it is the batch's last token).
    pub edc_idx: usize,
    pub batch_end: bool,
}

pub(super) struct Shared {
    pub committed: Vec<u32>,
    pub pending: VecDeque<Pending>,
    pub epoch: u64,
    pub done: bool,
    pub edc: Edc,
    pub tvc: Tvc,
    pub verify_started: Option<Instant>,
    pub verify_expected: f64,
    /// Running means for the verifier's wait decision: seconds per draft batch, seconds per
    /// verification pass, drafts accepted per pass that had drafts to verify.
    pub draft_batch_s: f64,
    pub verify_pass_s: f64,
    pub accepted_per_pass: f64,
    /// The drafter finished an attempt (even an empty one), or its thread stopped: what the
    /// verifier's first pass waits for.
    pub drafter_started: bool,
    pub out: AsyncOutput,
}

impl Shared {
    fn new(prompt: &[u32], tvc_gated: Option<String>) -> Self {
        Self {
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
                tvc_gated,
                ..Default::default()
            },
        }
    }
}

/// Pending drafts taken for a verification after the committed context, with the queue's
/// epoch when they were taken.
pub(super) struct Chain {
    pub ctx: Vec<u32>,
    pub drafts: Vec<u32>,
    pub epoch: u64,
}

/// Running mean with weight 1/4 on the new value (the first value is taken as is).
pub(super) fn ema(old: f64, new: f64) -> f64 {
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
    s: MutexGuard<'a, Shared>,
    d: Duration,
) -> Result<MutexGuard<'a, Shared>, ModelError> {
    cv.wait_timeout(s, d)
        .map(|(s, _)| s)
        .map_err(|_| ModelError::Other("pipeline poisoned".into()))
}

/// However the drafter's loop ends (done, an error, a panic), a verifier still waiting for its
/// first attempt is released.
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

/// One generation's two lanes and what they share.
pub(super) struct Pipeline<'a> {
    pub target: &'a Model,
    pub verify_lane: &'a Lane,
    pub draft_lane: &'a Lane,
    pub cfg: &'a AsyncConfig,
    /// TVC pre-verifies in this run (on, and not gated).
    pub tvc: bool,
    pub shared: Mutex<Shared>,
    pub cv: Condvar,
    /// The verifier's cache after its last pass, for TVC's pre-verification (`None` without).
    pub snapshot: Mutex<Option<KvCache>>,
}

impl<'a> Pipeline<'a> {
    pub fn new(
        (target, verify_lane, draft_lane): (&'a Model, &'a Lane, &'a Lane),
        cfg: &'a AsyncConfig,
        tvc: bool,
        prompt: &[u32],
        tvc_gated: Option<String>,
    ) -> Self {
        Self {
            target,
            verify_lane,
            draft_lane,
            cfg,
            tvc,
            shared: Mutex::new(Shared::new(prompt, tvc_gated)),
            cv: Condvar::new(),
            snapshot: Mutex::new(None),
        }
    }

    pub fn lock(&self) -> Result<MutexGuard<'_, Shared>, ModelError> {
        self.shared
            .lock()
            .map_err(|_| ModelError::Other("pipeline poisoned".into()))
    }

    /// Lock-step: one draft batch, then one verification.
    pub fn run_lock_step(
        &self,
        drafter: &mut dyn Drafter,
        cache: &mut KvCache,
    ) -> Result<(), ModelError> {
        loop {
            self.draft_step(drafter, None)?;
            if !self.verify_step(cache)? {
                return Ok(());
            }
        }
    }

    /// The drafter on its own thread, the verifier on this one; the drafter's error, if any,
    /// is returned after the verifier's.
    pub fn run_async(
        &self,
        drafter: &mut dyn Drafter,
        cache: &mut KvCache,
    ) -> Result<(), ModelError> {
        std::thread::scope(|sc| -> Result<(), ModelError> {
            let h = sc.spawn(|| self.drafter_loop(drafter));
            let r = self.verifier_loop(cache);
            {
                let mut s = self.lock()?;
                s.done = true;
                self.cv.notify_all();
            }
            let d = h
                .join()
                .map_err(|_| ModelError::Other("the draft lane panicked".into()))?;
            r.and(d)
        })
    }

    fn drafter_loop(&self, drafter: &mut dyn Drafter) -> Result<(), ModelError> {
        llada_runtime::trace::set_thread_lane("draft");
        let _release = Release(&self.shared, &self.cv);
        loop {
            let snap = self.snapshot.lock().ok().and_then(|s| s.clone());
            if !self.draft_step(drafter, snap.as_ref())? {
                return Ok(());
            }
        }
    }

    fn verifier_loop(&self, cache: &mut KvCache) -> Result<(), ModelError> {
        loop {
            self.wait_for_drafts()?;
            if !self.verify_step(cache)? {
                return Ok(());
            }
        }
    }

    /// Nothing to verify: wait for the drafter's next batch when it pays. A pass without
    /// drafts emits 1 token in T_v; waiting w for a batch emits 1 + a in T_v + w, better iff
    /// a · T_v > w (a: drafts accepted per pass, running means of all three). Without this the
    /// verifier, slower than a batch, starts every pass after a rejection with an empty queue
    /// and the pipeline degenerates to target-only decoding.
    fn wait_for_drafts(&self) -> Result<(), ModelError> {
        let wait = |s, d| wait_on(&self.cv, s, d);
        let mut s = self.lock()?;
        let w = s.draft_batch_s;
        if !s.drafter_started {
            // No batch drafted yet (the drafter is reading the prompt): the first pass waits
            // for it, as a lock-step round would, rather than spend a whole target pass on one
            // token. Any finished attempt, even an empty one, ends the wait, and so does the
            // drafter's thread ending (an error or a panic there: the verifier then decodes
            // alone, and the drafter's error is returned at the end).
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
        Ok(())
    }

    /// The output, with the run's and the prefill's times.
    pub fn finish(&self, t0: Instant, prefill_s: f64) -> Result<AsyncOutput, ModelError> {
        let mut s = self.lock()?;
        s.out.total_s = t0.elapsed().as_secs_f64();
        s.out.prefill_s = prefill_s;
        Ok(std::mem::take(&mut s.out))
    }
}
