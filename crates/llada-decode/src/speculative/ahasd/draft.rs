//! The drafter's step: draft one batch ahead of the verifier and queue what still extends
//! the sequence, or, when EDC or the queue bound stops it, pre-verify (TVC) or idle.

use super::pipeline::{ema, Pending, Pipeline};
use super::MAX_UNVERIFIED;
use crate::speculative::drafter::Drafter;
use crate::speculative::tree::DraftTree;
use llada_model::ModelError;
use llada_runtime::KvCache;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// What the drafter read under the lock before drafting.
struct Round {
    /// Committed and pending tokens: what the batch is drafted after.
    ctx: Vec<u32>,
    /// Drafting past something the verifier will commit first.
    ahead: bool,
    epoch: u64,
    /// EDC lets it draft.
    gate_ok: bool,
    /// The queue is as deep as it should get.
    full: bool,
}

impl Pipeline<'_> {
    /// The drafter's step: draft one batch (or pre-verify, or report idle). `false` once the
    /// pipeline is done.
    pub fn draft_step(
        &self,
        drafter: &mut dyn Drafter,
        target_snapshot: Option<&KvCache>,
    ) -> Result<bool, ModelError> {
        let Some(round) = self.round()? else {
            return Ok(false);
        };
        if round.gate_ok && !round.full {
            self.draft_and_queue(drafter, round)?;
            return Ok(true);
        }
        // Would idle: time-aware pre-verification of the earliest pending drafts.
        if self.tvc {
            if let Some(snap) = target_snapshot {
                if self.preverify(snap)? {
                    return Ok(true);
                }
            }
        }
        let s = self.lock()?;
        if !s.done {
            let _ = self.cv.wait_timeout(s, Duration::from_millis(2));
        }
        Ok(true)
    }

    /// The round's context and gates (`None`: done).
    fn round(&self) -> Result<Option<Round>, ModelError> {
        let cfg = self.cfg;
        let s = self.lock()?;
        if s.done {
            return Ok(None);
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
        let depth = (cfg.batch + (2.0 * s.accepted_per_pass).ceil() as usize).min(MAX_UNVERIFIED);
        // Drafting past something the verifier will commit first: pending drafts, or the
        // one token of a pass running without drafts (never in lock-step, whose rounds
        // draft from the committed sequence).
        let ahead = !cfg.synchronous && (!s.pending.is_empty() || s.verify_started.is_some());
        let n = s.pending.len() + cfg.batch;
        Ok(Some(Round {
            ctx,
            ahead,
            epoch: s.epoch,
            gate_ok,
            full: n > depth || n + usize::from(ahead) > MAX_UNVERIFIED,
        }))
    }

    /// Draft a batch after the round's context and queue the part that still extends the
    /// sequence.
    fn draft_and_queue(&self, drafter: &mut dyn Drafter, round: Round) -> Result<(), ModelError> {
        let t = Instant::now();
        // A batch drafted ahead of the verifier is one token longer: when the verifier
        // accepts everything pending (or had nothing to verify), its own next token takes
        // the batch's first position (dropped from the batch if the batch agrees), and a
        // full batch is left.
        let n = self.cfg.batch + usize::from(round.ahead);
        let (toks, h) = draft_batch(drafter, &round.ctx, n)?;
        let mut s = self.lock()?;
        s.out.draft_busy_s += t.elapsed().as_secs_f64();
        s.draft_batch_s = ema(s.draft_batch_s, t.elapsed().as_secs_f64());
        // Wake a verifier waiting for the first attempt, even one that queues nothing.
        s.drafter_started = true;
        self.cv.notify_all();
        // The verifier may have committed tokens meanwhile: keep the part of the batch
        // that still extends committed + pending (none after a cancellation).
        let toks = if s.epoch == round.epoch {
            align_batch(&s.committed, &s.pending, &round.ctx, toks)
        } else {
            Err(toks.len())
        };
        let toks = match toks {
            Ok(t) if !t.is_empty() => t,
            Ok(_) => return Ok(()),
            Err(n) => {
                s.out.discarded += n;
                return Ok(());
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
        self.cv.notify_all();
        Ok(())
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
}
