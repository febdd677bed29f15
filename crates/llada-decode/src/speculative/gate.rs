//! When drafting does not pay: the cost-aware tree (Lever) shrinks a tree whose nodes cost more
//! than they are expected to return ([`super::tree::CostModel::worth_adding`], with the draft's
//! own time per proposal), but even its first node costs a draft proposal. Where a draft token
//! costs a large share of a target pass (a 0.5B draft for a 1.5B target, both resident, on two
//! cores), a run whose drafts are seldom accepted would be slower than plain decoding.
//!
//! [`DraftGate`] compares the measured rate of the drafted steps (tokens emitted per second of
//! drafting and verifying) with the measured rate of plain one-row steps. The first drafted
//! step is not judged (its draft prefills the whole prompt). Before any plain step has been
//! measured, a drafted step slower than the fitted cost of a one-row pass buys one plain step
//! to measure it (a fit from tree passes alone misjudged the plain rate and declined drafting
//! that paid 3x under a memory budget). When drafting is slower than the measured plain rate,
//! the next steps verify the root alone, for a back-off that doubles while drafting keeps
//! losing (4, 8, … 64 steps) and resets when it wins; after each back-off one drafted step
//! probes again. Invariant: the gate only chooses whether a step drafts; the tokens are the
//! target's either way.

/// Smoothing of the rates (weight of the newest step).
const EMA: f64 = 0.3;
/// Back-off bounds, in steps.
const BACKOFF_MIN: usize = 4;
const BACKOFF_MAX: usize = 64;
/// Drafting must reach this fraction of the plain rate to continue (hysteresis against noise).
const KEEP: f64 = 0.97;

/// The per-run decision to draft or to verify the root alone.
#[derive(Debug, Clone)]
pub struct DraftGate {
    /// Tokens per second of drafted steps, and of plain steps (smoothed; `None` until seen).
    spec_rate: Option<f64>,
    plain_rate: Option<f64>,
    /// Plain steps left before the next drafted probe.
    skip: usize,
    backoff: usize,
    /// Drafted steps recorded so far.
    drafted: usize,
    /// Steps verified without drafting, over the run.
    pub declined: usize,
}

impl Default for DraftGate {
    fn default() -> Self {
        Self {
            spec_rate: None,
            plain_rate: None,
            skip: 0,
            backoff: BACKOFF_MIN,
            drafted: 0,
            declined: 0,
        }
    }
}

fn ema(prev: Option<f64>, x: f64) -> f64 {
    prev.map_or(x, |p| p + EMA * (x - p))
}

impl DraftGate {
    /// Whether the next step drafts.
    pub fn should_draft(&mut self) -> bool {
        if self.skip > 0 {
            self.skip -= 1;
            self.declined += 1;
            false
        } else {
            true
        }
    }

    /// Record a step: whether it drafted, the tokens it emitted and its seconds (drafting,
    /// verifying, selecting). `plain_estimate`: seconds of a one-row pass from the cost model,
    /// used until a plain step has been measured.
    pub fn record(&mut self, drafted: bool, tokens: usize, secs: f64, plain_estimate: f64) {
        if !secs.is_finite() || secs <= 0.0 || tokens == 0 {
            return;
        }
        let rate = tokens as f64 / secs;
        if !drafted {
            self.plain_rate = Some(ema(self.plain_rate, rate));
            return;
        }
        self.drafted += 1;
        if self.drafted == 1 {
            return; // the warm-up step: the draft read the prompt
        }
        let spec = ema(self.spec_rate, rate);
        self.spec_rate = Some(spec);
        let Some(plain) = self.plain_rate else {
            // No plain step measured yet: one, if the fitted estimate says drafting may lose.
            if plain_estimate > 0.0 && spec < KEEP / plain_estimate {
                self.skip = 1;
            }
            return;
        };
        if spec < KEEP * plain {
            self.skip = self.backoff;
            self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
            // The probe after the back-off is judged on its own step, not on the old average.
            self.spec_rate = None;
        } else {
            self.backoff = BACKOFF_MIN;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drive a gate with drafted steps of `spec` tokens/s and plain steps of `plain` tokens/s;
    /// the fraction of steps that drafted.
    fn drafted_fraction(spec: f64, plain: f64, steps: usize) -> f64 {
        let mut g = DraftGate::default();
        let mut drafted = 0;
        for _ in 0..steps {
            if g.should_draft() {
                drafted += 1;
                g.record(true, 4, 4.0 / spec, 1.0 / plain);
            } else {
                g.record(false, 1, 1.0 / plain, 1.0 / plain);
            }
        }
        drafted as f64 / steps as f64
    }

    #[test]
    fn drafting_that_pays_is_kept_and_drafting_that_loses_backs_off() {
        assert_eq!(drafted_fraction(20.0, 10.0, 200), 1.0);
        // Slower than plain decoding: one probe per back-off, the back-off growing to 64.
        let f = drafted_fraction(5.0, 10.0, 400);
        assert!(f < 0.05, "drafted {f}");
        assert!(f > 0.0, "never probed again");
        // Within the hysteresis: kept.
        assert_eq!(drafted_fraction(9.8, 10.0, 100), 1.0);
    }

    #[test]
    fn a_pessimistic_estimate_buys_one_measured_plain_step() {
        let mut g = DraftGate::default();
        // The warm-up step is not judged, however slow.
        assert!(g.should_draft());
        g.record(true, 1, 10.0, 0.1);
        assert!(g.should_draft());
        // Drafted at 5 tok/s against an estimated 10 tok/s plain pass: measure one plain step.
        g.record(true, 5, 1.0, 0.1);
        assert!(!g.should_draft());
        // It runs at 2 tok/s (the estimate was wrong): drafting continues.
        g.record(false, 1, 0.5, 0.1);
        for _ in 0..10 {
            assert!(g.should_draft());
            g.record(true, 5, 1.0, 0.1);
        }
        assert_eq!(g.declined, 1);
        // A degenerate step (no time, no tokens) changes nothing.
        let before = g.clone();
        g.record(true, 0, 1.0, 0.1);
        g.record(true, 3, 0.0, 0.1);
        assert_eq!(g.skip, before.skip);
    }
}
