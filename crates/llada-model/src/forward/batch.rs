//! The live rows of a pass: the residual stream and everything indexed by batch row
//! (positions, RoPE tables, KV slots, the logit rows), the sequences the rows belong to (each
//! with its mask and its cache plan), the embedding that starts the stream, and early exit,
//! which drops rows from all of them at once.
//!
//! Invariants: every per-row vector has `n` rows in the same order; the sequences' rows are
//! consecutive (`segs[s].start .. + segs[s].n`, in request order, covering `0..n`); `alive[i]`
//! is live row `i`'s index in its own sequence's request (what [`ForwardOutput::rows`]
//! reports); `logit_rows` index live rows, ascending by sequence; an explicit mask is `n × n`
//! over its sequence's live rows. Early exit is for one-sequence passes.

use super::ops::rope_tables;
use super::validate::{CacheRead, Checked};
use super::{AttnMask, EarlyExit, ForwardOutput, ForwardRequest};
use crate::weights::Weights;
use crate::{ModelConfig, ModelError};
use llada_runtime::trace::OpSpan;

/// One sequence's rows of a pass.
pub(super) struct Seg<'a> {
    /// First live row of the sequence, and how many.
    pub start: usize,
    pub n: usize,
    /// The request's mask; an explicit one is replaced by `emask`, which shrinks with the batch.
    mask: AttnMask<'a>,
    emask: Option<Vec<bool>>,
    /// How the sequence's cache is read.
    pub kv: CacheRead,
}

impl Seg<'_> {
    /// The mask over the sequence's live rows.
    pub fn mask(&self) -> AttnMask<'_> {
        match &self.emask {
            Some(m) => AttnMask::Explicit(m),
            None => self.mask,
        }
    }
    /// The sequence's live rows.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.start..self.start + self.n
    }
}

pub(super) struct Batch<'a> {
    pub n: usize,
    /// `0..n`: the rows every layer norm runs over.
    pub rows: Vec<usize>,
    pub alive: Vec<usize>,
    pub positions: Vec<u32>,
    pub slots: Vec<Option<usize>>,
    pub logit_rows: Vec<usize>,
    pub segs: Vec<Seg<'a>>,
    /// `n × d_model`, the residual stream.
    pub x: Vec<f32>,
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

impl<'a> Batch<'a> {
    /// The embedded rows of checked requests (one per sequence, with its cache plan), with
    /// their RoPE tables.
    pub fn new(
        reqs: Vec<(&ForwardRequest<'a>, Checked, CacheRead)>,
        c: &ModelConfig,
        w: &Weights,
    ) -> Result<Self, ModelError> {
        let mut b = Self {
            n: 0,
            rows: vec![],
            alive: vec![],
            positions: vec![],
            slots: vec![],
            logit_rows: vec![],
            segs: vec![],
            x: vec![],
            cos: vec![],
            sin: vec![],
        };
        let tokens: Vec<u32> = reqs.iter().flat_map(|r| r.0.tokens).copied().collect();
        for (req, checked, kv) in reqs {
            let (start, n) = (b.n, req.tokens.len());
            let emask = match req.mask {
                AttnMask::Explicit(m) => Some(m.to_vec()),
                _ => None,
            };
            b.alive.extend(0..n);
            b.positions.extend_from_slice(req.positions);
            b.slots.extend(checked.slots);
            b.logit_rows
                .extend(checked.logit_rows.iter().map(|r| start + r));
            b.segs.push(Seg {
                start,
                n,
                mask: req.mask,
                emask,
                kv,
            });
            b.n += n;
        }
        b.rows = (0..b.n).collect();
        b.x = embed(&tokens, c, w)?;
        (b.cos, b.sin) = rope_tables(&b.positions, c);
        Ok(b)
    }

    /// The outputs of the logit rows, split by sequence: `logits` (and `features`) hold
    /// `width` values per logit row, in `logit_rows` order.
    pub fn split(&self, logits: &[f32], features: &[f32], width: usize) -> Vec<ForwardOutput> {
        let fw = if self.logit_rows.is_empty() {
            0
        } else {
            features.len() / self.logit_rows.len()
        };
        let mut at = 0;
        self.segs
            .iter()
            .map(|s| {
                let mine = self.logit_rows[at..]
                    .iter()
                    .take_while(|&&r| s.range().contains(&r))
                    .count();
                let (a, e) = (at, at + mine);
                at = e;
                ForwardOutput {
                    logits: logits[a * width..e * width].to_vec(),
                    rows: self.logit_rows[a..e]
                        .iter()
                        .map(|&r| self.alive[r])
                        .collect(),
                    vocab: width,
                    features: features[a * fw..e * fw].to_vec(),
                }
            })
            .collect()
    }

    /// After layer `li`: ask `e.keep` which rows stay, and drop the others.
    pub fn early_exit(
        &mut self,
        e: &EarlyExit,
        li: usize,
        c: &ModelConfig,
    ) -> Result<(), ModelError> {
        let n = self.n;
        if self.segs.len() != 1 {
            return Err(ModelError::BadRequest(
                "early exit is for passes of one sequence".into(),
            ));
        }
        let keep = (e.keep)(&self.x, &self.alive);
        if keep.len() != n || !keep.iter().any(|k| *k) {
            return Err(ModelError::BadRequest(format!(
                "early exit must keep at least one of {n} rows (got {} flags)",
                keep.len()
            )));
        }
        if keep.iter().any(|k| !k) {
            let idx: Vec<usize> = (0..n).filter(|&i| keep[i]).collect();
            let _s = OpSpan::begin(
                "early_exit",
                li as i32,
                &[n as u64, idx.len() as u64],
                "F32",
            );
            self.retain(&idx, c.d_model, c.head_dim / 2);
        }
        Ok(())
    }

    /// Keep rows `idx` (ascending) of every per-row vector.
    fn retain(&mut self, idx: &[usize], d: usize, half: usize) {
        let n = self.n;
        let pick = |v: &[f32], w: usize| -> Vec<f32> {
            idx.iter()
                .flat_map(|&i| v[i * w..(i + 1) * w].iter().copied())
                .collect()
        };
        self.x = pick(&self.x, d);
        self.cos = pick(&self.cos, half);
        self.sin = pick(&self.sin, half);
        self.positions = idx.iter().map(|&i| self.positions[i]).collect();
        self.slots = idx.iter().map(|&i| self.slots[i]).collect();
        let seg = &mut self.segs[0];
        if let Some(m) = &seg.emask {
            seg.emask = Some(
                idx.iter()
                    .flat_map(|&a| idx.iter().map(move |&b| m[a * n + b]))
                    .collect(),
            );
        }
        let mut local = vec![usize::MAX; n];
        for (new, &old) in idx.iter().enumerate() {
            local[old] = new;
        }
        self.logit_rows = self
            .logit_rows
            .iter()
            .map(|&r| local[r])
            .filter(|&r| r != usize::MAX)
            .collect();
        self.alive = idx.iter().map(|&i| self.alive[i]).collect();
        self.n = idx.len();
        seg.n = idx.len();
        self.rows = (0..self.n).collect();
    }

    /// The residual stream of the logit rows (`d` wide), per sequence, as the outputs of a
    /// pass stopped before the final norm ([`crate::Model::forward_hidden`]).
    pub fn hidden(&self, d: usize) -> Vec<ForwardOutput> {
        let x: Vec<f32> = self
            .logit_rows
            .iter()
            .flat_map(|&r| self.x[r * d..(r + 1) * d].iter().copied())
            .collect();
        let mut out = self.split(&x, &[], d);
        out.iter_mut().for_each(|o| o.features.clear());
        out
    }
}

/// The embedding rows of `tokens` (through the vocabulary map when the model has one).
fn embed(tokens: &[u32], c: &ModelConfig, w: &Weights) -> Result<Vec<f32>, ModelError> {
    let (n, d) = (tokens.len(), c.d_model);
    let mut x = vec![0f32; n * d];
    let _s = OpSpan::begin("embed", -1, &[n as u64, d as u64], w.embed.view().ty.name()).cost(
        (n * w.embed.view().len / w.embed.vocab.max(1)) as u64,
        (n * d * 4) as u64,
        0,
    );
    for (row, &t) in x.chunks_exact_mut(d).zip(tokens) {
        let r = w.vocab_map.as_ref().map_or(t, |m| m.row(t));
        w.embed.lookup(r, row)?;
    }
    Ok(x)
}
