//! A step's forward passes: the dense pass (and classifier-free guidance's unconditional
//! pass), the sparse lane's probe pass beside or after it, and the revision merge and shadow
//! update that follow them at the step boundary.

use super::step::{Decoder, DensePlan, StepPlan};
use crate::revision::{judge, ProbeBatch};
use llada_model::{AttnMask, ForwardOutput, ForwardRequest, KvWrite, LogitRows, Model, ModelError};
use llada_runtime::trace::OpSpan;
use llada_runtime::{KvCache, Lane};
use std::time::Instant;

/// A pass's result with its start and end.
type Timed<T> = (T, Instant, Instant);
type Pass = Timed<Result<ForwardOutput, ModelError>>;

/// The sparse lane's pass over `probe` on the snapshot `snap`, timed.
fn sparse_pass(model: &Model, snap: &mut KvCache, probe: &ProbeBatch) -> Pass {
    let req = ForwardRequest {
        tokens: &probe.tokens,
        positions: &probe.positions,
        mask: AttnMask::Explicit(&probe.visible),
        kv_write: KvWrite::Slots(&probe.slots),
        logits: LogitRows::Rows(&probe.logit_rows),
    };
    let a = Instant::now();
    let r = model.forward(&req, snap);
    (r, a, Instant::now())
}

/// The dense pass and, with a probe, the sparse pass: concurrently on `sparse`'s own pool or
/// joined onto the dense lane's threads, or one after the other (`concurrent` false).
fn run_passes(
    model: &Model,
    dense: &Lane,
    sparse: Option<&Lane>,
    concurrent: bool,
    (cache, dense_req, dp): (&mut KvCache, &ForwardRequest, &DensePlan),
    probe: Option<(&ProbeBatch, &mut KvCache)>,
) -> (Pass, Option<Result<Pass, ModelError>>) {
    let dense_pass = |cache: &mut KvCache| {
        let _s = OpSpan::begin("dense_window", -1, &[(dp.row1 - dp.row0) as u64], "tokens")
            .padded(dp.padding as u64);
        let a = Instant::now();
        let r = model.forward(dense_req, cache);
        (r, a, Instant::now())
    };
    match (probe, sparse) {
        // Concurrent on the sparse lane's own pool (cores to spare for it).
        (Some((pb, snap)), Some(sl)) if concurrent => std::thread::scope(|sc| {
            let h = sc.spawn(|| sl.run(|| sparse_pass(model, snap, pb)));
            let d = dense.run(|| dense_pass(cache));
            let s = h
                .join()
                .map_err(|_| ModelError::Other("the sparse lane panicked".into()));
            (d, Some(s))
        }),
        // Concurrent on the dense lane's threads (work-stealing join: no oversubscription).
        (Some((pb, snap)), None) if concurrent => {
            let (d, s) = dense.join(
                || dense_pass(cache),
                || sparse_pass(model, snap, pb),
                "sparse",
            );
            (d, Some(Ok(s)))
        }
        // Sequential: the deterministic schedule (same results by construction).
        (Some((pb, snap)), sl) => {
            let d = dense.run(|| dense_pass(cache));
            let s = match sl {
                Some(l) => l.run(|| sparse_pass(model, snap, pb)),
                None => dense.run(|| sparse_pass(model, snap, pb)),
            };
            (d, Some(Ok(s)))
        }
        (None, _) => (dense.run(|| dense_pass(cache)), None),
    }
}

impl Decoder<'_> {
    /// The step's passes: the dense pass's logits (guided, with `cfg_scale`) and the sparse
    /// pass's, with their timings. A dense error is returned before a sparse one.
    pub fn forward(
        &mut self,
        plan: &StepPlan,
        dense: &Lane,
        sparse: Option<&Lane>,
    ) -> Result<(Timed<ForwardOutput>, Option<Timed<ForwardOutput>>), ModelError> {
        let dp = &plan.dense;
        if plan.probe.is_some() && self.shadow.is_none() {
            self.shadow = Some(self.cache.clone());
        }
        let dense_req = ForwardRequest {
            tokens: &self.canvas.tokens()[dp.row0..dp.row1],
            positions: &self.positions[dp.row0..dp.row1],
            mask: AttnMask::Bidirectional,
            kv_write: KvWrite::Slots(&dp.slots),
            logits: LogitRows::Rows(&plan.logit_rows),
        };
        let probe = plan.probe.as_ref().zip(self.shadow.as_mut());
        let concurrent = self.cfg.revision.as_ref().is_some_and(|r| r.concurrent);
        let ((dout, da, db), sres) = run_passes(
            self.model,
            dense,
            sparse,
            concurrent,
            (&mut self.cache, &dense_req, dp),
            probe,
        );
        let mut dout = dout?;
        self.out.dense_s += (db - da).as_secs_f64();
        self.out.forward_passes += 1;
        self.out.rows_computed += dp.row1 - dp.row0;
        self.out.padded_rows += dp.padding;
        if self.cfg.cfg_scale > 0.0 {
            self.guide(plan, dense, &mut dout)?;
        }
        let sout = match sres {
            Some(Ok((Ok(o), a, b))) => Some((o, a, b)),
            Some(Ok((Err(e), _, _))) | Some(Err(e)) => return Err(e),
            None => None,
        };
        Ok(((dout, da, db), sout))
    }

    /// Classifier-free guidance: an unconditional pass with the prompt masked (LLaDA's
    /// `un_x`), and `un + (s + 1)(cond − un)` into `cond`.
    fn guide(
        &mut self,
        plan: &StepPlan,
        dense: &Lane,
        cond: &mut ForwardOutput,
    ) -> Result<(), ModelError> {
        let dp = &plan.dense;
        let mut un: Vec<u32> = self.canvas.tokens().to_vec();
        let (p, mask) = (self.canvas.prompt_len(), self.canvas.mask());
        un[..p].iter_mut().for_each(|t| *t = mask);
        let (model, cache) = (self.model, &mut self.cache);
        let uout = dense.run(|| {
            model.forward(
                &ForwardRequest {
                    tokens: &un[dp.row0..dp.row1],
                    positions: &self.positions[dp.row0..dp.row1],
                    mask: AttnMask::Bidirectional,
                    kv_write: KvWrite::None,
                    logits: LogitRows::Rows(&plan.logit_rows),
                },
                cache,
            )
        })?;
        self.out.forward_passes += 1;
        self.out.rows_computed += dp.row1 - dp.row0;
        let s = self.cfg.cfg_scale;
        cond.logits
            .iter_mut()
            .zip(&uout.logits)
            .for_each(|(c, u)| *c = u + (s + 1.0) * (*c - u));
        Ok(())
    }

    /// The sparse lane's results at the step boundary: the deferred merge of the rows it
    /// refreshed, then the verdicts on the probed tokens.
    pub fn merge_revision(
        &mut self,
        plan: &StepPlan,
        (da, db): (Instant, Instant),
        sparse_out: Option<Timed<ForwardOutput>>,
    ) -> Result<(), ModelError> {
        let (Some((sout, sa, sb)), Some(snap), Some(r)) =
            (sparse_out, self.shadow.as_ref(), self.cfg.revision.as_ref())
        else {
            return Ok(());
        };
        let out = &mut self.out;
        out.sparse_s += (sb - sa).as_secs_f64();
        let (lo, hi) = (sa.max(da), sb.min(db));
        if hi > lo {
            out.overlap_s += (hi - lo).as_secs_f64();
        }
        out.sparse_passes += 1;
        out.sparse_rows += plan.probe.as_ref().map_or(0, |pb| pb.tokens.len());
        let dp = &plan.dense;
        for (k, &i) in plan.probed.iter().enumerate() {
            // A row the dense pass rewrote (a refreshing step) keeps the dense row: it saw
            // this step's context, the probe's `A_i` only the snapshot's.
            let dense_wrote = i >= dp.row0 && i < dp.row1 && dp.slots[i - dp.row0].is_some();
            if !dense_wrote {
                self.cache
                    .copy_slot_from(snap, i)
                    .map_err(|e| ModelError::Other(e.to_string()))?;
            }
            let tok = self.canvas.tokens()[i];
            let verdict = judge(tok, sout.row(k), r, self.canvas.probes(i));
            if self.canvas.apply_verdict(i, verdict) {
                out.revised += 1;
            }
        }
        Ok(())
    }

    /// The shadow takes the rows the dense pass wrote (the merged ones it holds already).
    pub fn sync_shadow(&mut self, dp: &DensePlan) -> Result<(), ModelError> {
        let Some(sh) = self.shadow.as_mut() else {
            return Ok(());
        };
        for &slot in dp.slots.iter().flatten() {
            sh.copy_slot_from(&self.cache, slot)
                .map_err(|e| ModelError::Other(e.to_string()))?;
        }
        // The invariant, checked in this crate's unit tests (a clone would be equal).
        if cfg!(test) {
            assert!(
                sh.same_rows(&self.cache),
                "the sparse lane's shadow cache diverged"
            );
        }
        Ok(())
    }
}
