//! TVC, time-aware pre-verification: the verifier's cost model ([`Tvc`]), where it may run
//! at all ([`tvc_gate`]), and the draft lane's pre-verification of pending drafts.

use super::pipeline::{Chain, Pending, Pipeline};
use super::verify::verify_chain;
use super::MAX_PREVERIFY;
use llada_model::ModelError;
use llada_runtime::KvCache;
use std::collections::VecDeque;
use std::time::Instant;

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
        let f = crate::speculative::fit_line(self.records.iter().map(|r| (r.1 as f64, r.0)));
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

impl Pipeline<'_> {
    /// The drafter would idle: pre-verify the earliest pending drafts with the target on the
    /// draft lane, from `snap`, the verifier's cache after its last pass. Returns whether a
    /// pre-verification ran.
    pub fn preverify(&self, snap: &KvCache) -> Result<bool, ModelError> {
        let Chain {
            ctx: committed,
            drafts: plan,
            epoch,
        } = self.preverify_plan()?;
        if plan.is_empty() || snap.len() + 1 != committed.len() {
            return Ok(false);
        }
        let t = Instant::now();
        let mut c2 = snap.clone();
        let (k, y) = verify_chain(
            self.target,
            self.draft_lane,
            &mut c2,
            &committed,
            &plan,
            &self.cfg.sampling,
        )?;
        let mut s = self.lock()?;
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
            self.cv.notify_all();
        }
        Ok(true)
    }

    /// The drafts to pre-verify (as many as the verifier's predicted time left allows), the
    /// committed sequence they follow, and the queue's epoch.
    fn preverify_plan(&self) -> Result<Chain, ModelError> {
        let mut s = self.lock()?;
        if !self.cfg.edc || s.edc.should_draft() {
            // (queue full) fall through to the pre-verification below
        } else {
            s.out.edc_stops += 1;
        }
        let left = match s.verify_started {
            Some(st) => s.verify_expected - st.elapsed().as_secs_f64(),
            None => 0.0,
        };
        let n = match s.tvc.cost_model(s.committed.len()) {
            Some((a, b)) if left > 0.0 => Tvc::preverify_len(left, a, b, s.pending.len()),
            _ => 0,
        }
        .min(MAX_PREVERIFY);
        if n == 0 && left > 0.0 && !s.pending.is_empty() {
            s.out.tvc_skips += 1;
        }
        let chain: Vec<u32> = s.pending.iter().take(n).map(|p| p.token).collect();
        Ok(Chain {
            ctx: s.committed.clone(),
            drafts: chain,
            epoch: s.epoch,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
