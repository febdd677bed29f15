//! The verifier's step: verify what is pending in one target pass (at least one target token
//! per pass), feed the outcome back to EDC and the queue, and commit the accepted tokens.

use super::pipeline::{ema, Chain, Pending, Pipeline, Shared};
use llada_model::{AttnMask, ForwardRequest, KvWrite, LogitRows, Model, ModelError};
use llada_runtime::{KvCache, Lane};
use std::time::Instant;

impl Pipeline<'_> {
    /// The verifier's step: verify what is pending. `false` once the pipeline is done.
    pub fn verify_step(&self, cache: &mut KvCache) -> Result<bool, ModelError> {
        let cfg = self.cfg;
        let Some(Chain {
            ctx,
            drafts: chain,
            epoch: epoch0,
        }) = self.take_chain()?
        else {
            return Ok(false);
        };
        let t = Instant::now();
        let (k, y) = verify_chain(
            self.target,
            self.verify_lane,
            cache,
            &ctx,
            &chain,
            &cfg.sampling,
        )?;
        let secs = t.elapsed().as_secs_f64();
        let mut s = self.lock()?;
        s.record_pass(secs, (chain.len(), ctx.len()), k);
        s.settle_queue(chain.len(), k, y, epoch0);
        let stop = s.emit(chain[..k].iter().copied().chain([y]), cfg);
        let keep = s.committed.len() - 1;
        cache.truncate(keep);
        if let Ok(mut snap) = self.snapshot.lock() {
            *snap = self.tvc.then(|| cache.clone());
        }
        if stop || s.out.tokens.len() >= cfg.max_tokens {
            s.done = true;
        }
        s.verify_started = None;
        self.cv.notify_all();
        Ok(!s.done)
    }

    /// The committed context, the pending drafts this pass verifies and the queue's epoch
    /// (`None`: the answer is complete); starts the pass's clock for TVC.
    fn take_chain(&self) -> Result<Option<Chain>, ModelError> {
        let cfg = self.cfg;
        let mut s = self.lock()?;
        if s.out.tokens.len() >= cfg.max_tokens {
            s.done = true;
            self.cv.notify_all();
            return Ok(None);
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
        Ok(Some(Chain {
            ctx: s.committed.clone(),
            drafts: chain,
            epoch: s.epoch,
        }))
    }
}

impl Shared {
    /// A pass of `secs` over `chain_len` drafts at KV length `kv_len` accepted `k` of them.
    fn record_pass(&mut self, secs: f64, (chain_len, kv_len): (usize, usize), k: usize) {
        self.tvc.record(secs, chain_len + 1, kv_len);
        self.verify_pass_s = ema(self.verify_pass_s, secs);
        if chain_len > 0 {
            self.accepted_per_pass = 0.75 * self.accepted_per_pass + 0.25 * k as f64;
        }
        self.out.verify_busy_s += secs;
        self.out.verify_passes += 1;
        self.out.accepted += k;
    }

    /// EDC feedback and the queue after a pass that verified `chain_len` drafts, accepted
    /// `k` and produced the target's token `y`: a batch whose last token was accepted
    /// succeeded; the batch holding the first rejected token failed (and everything after it
    /// is discarded).
    fn settle_queue(&mut self, chain_len: usize, k: usize, y: u32, epoch0: u64) {
        if self.epoch != epoch0 {
            // The drafter's pre-verification rewrote the queue meanwhile: start it afresh from
            // what the verifier committed (the verifier is authoritative).
            let dropped = self.pending.len();
            self.out.discarded += dropped;
            self.pending.clear();
            self.epoch += 1;
        }
        let nv = chain_len.min(self.pending.len());
        let verified: Vec<Pending> = self.pending.drain(..nv).collect();
        for (i, p) in verified.iter().enumerate() {
            if i >= k {
                self.edc.on_verify(p.edc_idx, false);
                break;
            }
            if p.batch_end {
                self.edc.on_verify(p.edc_idx, true);
            }
        }
        if k < chain_len {
            let dropped = self.pending.len() + (chain_len - k);
            self.out.discarded += dropped;
            self.pending.clear();
            self.epoch += 1;
        } else if let Some(front) = self.pending.front() {
            // Everything verified was accepted and the target's own token `y` takes the next
            // position: the queue stays valid only if its next draft is that token.
            if front.token == y {
                let p = self.pending.pop_front();
                if let Some(p) = p.filter(|p| p.batch_end) {
                    self.edc.on_verify(p.edc_idx, true);
                }
            } else {
                self.out.discarded += self.pending.len();
                self.pending.clear();
                self.epoch += 1;
            }
        }
    }

    /// Commit `tokens` up to the length limit or a stop token; returns whether either ended
    /// the answer.
    fn emit(&mut self, tokens: impl Iterator<Item = u32>, cfg: &super::AsyncConfig) -> bool {
        for tok in tokens {
            if self.out.tokens.len() >= cfg.max_tokens {
                return true;
            }
            self.out.tokens.push(tok);
            self.committed.push(tok);
            if cfg.stop_ids.contains(&tok) {
                return true;
            }
        }
        false
    }
}

/// Greedy target verification of `chain` after `ctx` (cache holds ctx[..len−1]); returns the
/// number of chain tokens accepted and the target's next token. `params` carries the
/// repetition penalty: row `k` is penalised for `ctx` and `chain[..k]`.
pub(super) fn verify_chain(
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
