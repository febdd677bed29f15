//! Dual-path progressive revision: the sparse lane's re-scoring pass and its rules.
//!
//! The sparse lane takes the `Visible` positions left of the dense window (their KV rows are in
//! the cache) and, in one forward pass on a *snapshot* of the cache, does two things per probed
//! position `i`:
//!
//! * `A_i` — the token itself at `i`: its fresh K/V row (computed with today's context) is
//!   written into the snapshot and merged into the live cache at the step boundary (deferred
//!   merge), never mid-step.
//! * `M_i` — the mask token at `i`, seeing every other position with its token: the model's
//!   re-prediction of `i` with all the context committed since. Dream-format models read it
//!   one row earlier (shifted logits), from `P_i`, the token at `i − 1` seeing `M_i` instead of
//!   the real token at `i`.
//!
//! `M_i`/`P_i` are probes: nobody else sees them, and they write nothing. The verdict
//! ([`judge`]) keeps, revises or stabilises the token; `Stable` tokens are never probed again.

use crate::sampling::{argmax, softmax};
use serde::Serialize;

/// Revision options.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Revision {
    /// Change a `Visible` token when the re-prediction differs and reaches this probability.
    pub revise_threshold: f32,
    /// `Visible → Stable` when the re-prediction equals the token with at least this probability.
    pub stable_threshold: f32,
    /// Probes after which a `Visible` token becomes `Stable` regardless (bounds the work).
    /// Default 1: on the task models a repeated probe never decided anything — of 459 probes
    /// over four long answers, every second probe repeated an undecided first one ("keep"),
    /// also when it waited for 8 or 24 more commits, and every third ended "stable by count".
    pub max_probes: u8,
    /// A token the dense lane commits with at least this confidence becomes `Stable` as soon
    /// as its KV row holds it, without a probe (`None`: every commit is probed). On the task
    /// models half the commits (mostly EOS tails) reach 0.99, and a re-prediction that
    /// overturns one needs another token at ≥ `revise_threshold` — the sparse lane spends its
    /// rows on the uncertain half instead.
    pub stable_on_commit: Option<f32>,
    /// Positions re-scored per step at most (the sparse lane's budget).
    pub max_rows: usize,
    /// Run the sparse lane on its own thread, concurrently with the dense lane. `false` runs it
    /// after the dense pass on the same snapshot: the results are identical by construction
    /// (a deterministic schedule for tests).
    pub concurrent: bool,
}

impl Default for Revision {
    fn default() -> Self {
        Self {
            revise_threshold: 0.9,
            stable_threshold: 0.9,
            max_probes: 1,
            stable_on_commit: Some(0.99),
            max_rows: 32,
            concurrent: true,
        }
    }
}

/// What the sparse lane decides for one probed token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    Keep,
    Revise(u32),
    Stable,
}

/// The verdict for token `tok` given its re-prediction `logits`, after `probes` earlier probes.
pub fn judge(tok: u32, logits: &[f32], r: &Revision, probes: u8) -> Verdict {
    let mut p = logits.to_vec();
    softmax(&mut p);
    let y = argmax(&p);
    let py = p[y as usize];
    if y == tok && py >= r.stable_threshold {
        Verdict::Stable
    } else if y != tok && py >= r.revise_threshold {
        Verdict::Revise(y)
    } else if probes + 1 >= r.max_probes {
        Verdict::Stable
    } else {
        Verdict::Keep
    }
}

/// One sparse-lane forward request.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeBatch {
    pub tokens: Vec<u32>,
    pub positions: Vec<u32>,
    pub slots: Vec<Option<usize>>,
    /// Row-major visibility among the rows (cache slots are all visible, except the probed
    /// positions' own slots, which the `A` rows overwrite).
    pub visible: Vec<bool>,
    /// Row whose logits re-predict each probed position, in `probed` order.
    pub logit_rows: Vec<usize>,
}

/// Build the probe pass for absolute positions `probed` (sorted, distinct, each ≥ 1) of `x`.
/// The KV slot of a position is its index.
pub fn build_probe(x: &[u32], probed: &[usize], mask_id: u32, shift: bool) -> ProbeBatch {
    let m = probed.len();
    let groups = if shift { 3 } else { 2 };
    let n = groups * m;
    let mut tokens = Vec::with_capacity(n);
    let mut positions = Vec::with_capacity(n);
    let mut slots = Vec::with_capacity(n);
    for &i in probed {
        tokens.push(x[i]);
        positions.push(i as u32);
        slots.push(Some(i));
    }
    for &i in probed {
        tokens.push(mask_id);
        positions.push(i as u32);
        slots.push(None);
    }
    if shift {
        for &i in probed {
            tokens.push(x[i - 1]);
            positions.push((i - 1) as u32);
            slots.push(None);
        }
    }
    let mut visible = vec![false; n * n];
    let (a, mrow, prow) = (|k: usize| k, |k: usize| m + k, |k: usize| 2 * m + k);
    for r in 0..m {
        // A rows: every A row (the committed context).
        for c in 0..m {
            visible[a(r) * n + a(c)] = true;
        }
        // M_r: every other A row and itself.
        for c in 0..m {
            visible[mrow(r) * n + a(c)] = c != r;
        }
        visible[mrow(r) * n + mrow(r)] = true;
        if shift {
            // P_r sits at i − 1: it sees M_r instead of the token at i; its own position comes
            // from itself when i − 1 is probed (its slot is overwritten), else from the cache.
            let i = probed[r];
            for c in 0..m {
                visible[prow(r) * n + a(c)] = probed[c] != i && probed[c] != i - 1;
            }
            visible[prow(r) * n + mrow(r)] = true;
            visible[prow(r) * n + prow(r)] = probed.binary_search(&(i - 1)).is_ok();
        }
    }
    let logit_rows = (0..m)
        .map(|k| if shift { prow(k) } else { mrow(k) })
        .collect();
    ProbeBatch {
        tokens,
        positions,
        slots,
        visible,
        logit_rows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r() -> Revision {
        Revision {
            max_probes: 3,
            ..Revision::default()
        }
    }

    #[test]
    fn verdicts() {
        // Confident agreement → Stable; confident disagreement → Revise; unsure → Keep, until
        // the probe budget runs out.
        assert_eq!(judge(1, &[0.0, 9.0, 0.0], &r(), 0), Verdict::Stable);
        assert_eq!(judge(0, &[0.0, 9.0, 0.0], &r(), 0), Verdict::Revise(1));
        assert_eq!(judge(0, &[1.0, 1.2, 0.0], &r(), 0), Verdict::Keep);
        assert_eq!(judge(0, &[1.0, 1.2, 0.0], &r(), 2), Verdict::Stable);
    }

    #[test]
    fn probe_rows_never_see_their_own_token() {
        let x = [7u32, 8, 9, 10, 11, 12];
        let b = build_probe(&x, &[2, 3, 5], 99, false);
        let n = 6;
        assert_eq!(b.tokens, vec![9, 10, 12, 99, 99, 99]);
        assert_eq!(b.slots[..3], [Some(2), Some(3), Some(5)]);
        assert!(b.slots[3..].iter().all(|s| s.is_none()));
        assert_eq!(b.logit_rows, vec![3, 4, 5]);
        for r in 0..3 {
            // M_r does not see A_r (its own token) but sees the other A rows and itself.
            assert!(!b.visible[(3 + r) * n + r]);
            assert!(b.visible[(3 + r) * n + 3 + r]);
            assert!((0..3)
                .filter(|&c| c != r)
                .all(|c| b.visible[(3 + r) * n + c]));
            // Nobody sees a probe row except itself.
            for q in 0..n {
                if q != 3 + r {
                    assert!(!b.visible[q * n + 3 + r]);
                }
            }
        }
    }

    #[test]
    fn shifted_probe_reads_the_previous_row() {
        let x = [7u32, 8, 9, 10, 11, 12];
        let b = build_probe(&x, &[2, 3, 5], 99, true);
        let n = 9;
        // P rows: tokens of i − 1, at i − 1, logits there.
        assert_eq!(&b.tokens[6..], &[8, 9, 11]);
        assert_eq!(&b.positions[6..], &[1, 2, 4]);
        assert_eq!(b.logit_rows, vec![6, 7, 8]);
        // P for i = 3 (row 7): 2 is probed, so it sees itself and neither A(2) nor A(3).
        assert!(b.visible[7 * n + 7]);
        assert!(!b.visible[7 * n]);
        assert!(!b.visible[7 * n + 1]);
        assert!(b.visible[7 * n + 2]);
        assert!(b.visible[7 * n + 4]); // M for 3
                                       // P for i = 2 (row 6): 1 is not probed → from the cache, not itself.
        assert!(!b.visible[6 * n + 6]);
        assert!(!b.visible[6 * n]);
        assert!(b.visible[6 * n + 1]);
    }
}
