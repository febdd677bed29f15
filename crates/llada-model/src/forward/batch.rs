//! The live rows of a pass: the residual stream and everything indexed by batch row
//! (positions, RoPE tables, KV slots, the explicit mask, the logit rows), the embedding that
//! starts the stream, and early exit, which drops rows from all of them at once.
//!
//! Invariants: every per-row vector has `n` rows in the same order; `alive[i]` is the original
//! batch index of live row `i` (what [`ForwardOutput::rows`] reports); `logit_rows` index live
//! rows; an explicit mask is `n × n` over the live rows.

use super::ops::rope_tables;
use super::validate::Checked;
use super::{AttnMask, EarlyExit, ForwardOutput, ForwardRequest};
use crate::weights::Weights;
use crate::{ModelConfig, ModelError};
use llada_runtime::trace::OpSpan;

pub(super) struct Batch<'a> {
    pub n: usize,
    /// `0..n`: the rows every layer norm runs over.
    pub rows: Vec<usize>,
    pub alive: Vec<usize>,
    pub positions: Vec<u32>,
    pub slots: Vec<Option<usize>>,
    pub logit_rows: Vec<usize>,
    /// The request's mask; an explicit one is replaced by `emask`, which shrinks with the batch.
    mask: AttnMask<'a>,
    emask: Option<Vec<bool>>,
    /// `n × d_model`, the residual stream.
    pub x: Vec<f32>,
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

impl<'a> Batch<'a> {
    /// The embedded rows of a checked request, with their RoPE tables.
    pub fn new(
        req: &ForwardRequest<'a>,
        checked: Checked,
        c: &ModelConfig,
        w: &Weights,
    ) -> Result<Self, ModelError> {
        let n = req.tokens.len();
        let emask = match req.mask {
            AttnMask::Explicit(m) => Some(m.to_vec()),
            _ => None,
        };
        let x = embed(req.tokens, c, w)?;
        let (cos, sin) = rope_tables(req.positions, c);
        Ok(Self {
            n,
            rows: (0..n).collect(),
            alive: (0..n).collect(),
            positions: req.positions.to_vec(),
            slots: checked.slots,
            logit_rows: checked.logit_rows,
            mask: req.mask,
            emask,
            x,
            cos,
            sin,
        })
    }

    /// The mask over the live rows.
    pub fn mask(&self) -> AttnMask<'_> {
        match &self.emask {
            Some(m) => AttnMask::Explicit(m),
            None => self.mask,
        }
    }

    /// After layer `li`: ask `e.keep` which rows stay, and drop the others.
    pub fn early_exit(
        &mut self,
        e: &EarlyExit,
        li: usize,
        c: &ModelConfig,
    ) -> Result<(), ModelError> {
        let n = self.n;
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
        if let Some(m) = &self.emask {
            self.emask = Some(
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
        self.rows = (0..self.n).collect();
    }

    /// The residual stream of the logit rows (`d` wide) as the output of a pass stopped before
    /// the final norm ([`crate::Model::forward_hidden`]).
    pub fn hidden(&self, d: usize) -> ForwardOutput {
        ForwardOutput {
            logits: self
                .logit_rows
                .iter()
                .flat_map(|&r| self.x[r * d..(r + 1) * d].iter().copied())
                .collect(),
            rows: self.logit_rows.iter().map(|&r| self.alive[r]).collect(),
            vocab: d,
            features: vec![],
        }
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
