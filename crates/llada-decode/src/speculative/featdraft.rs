//! Feature drafting: a small network drafts from the target's own final features instead of
//! from a second model's context (the idea of EAGLE-style drafters).
//!
//! Every target pass computes, for the row that chose the next token `x`, its final feature
//! `f` (the last hidden state after the final RMSNorm: with a tied head `logits_t = ⟨f, E_t⟩`;
//! [`llada_model::ForwardOutput::features`]). The head predicts the feature the target will
//! have one position later, after reading `x`,
//!
//! ```text
//! f̂ = f + W₂ · silu(W₁ · [f ; e(x)] + b₁) + b₂          e(x): the target's embedding row of x
//! q  = softmax(⟨f̂, E_t⟩ for the K ids t of the head)
//! ```
//!
//! and applies itself again to its own `f̂` for deeper nodes. No layer of the target runs and
//! no KV cache is kept: under a memory budget nothing of the drafter is streamed, and a drafted
//! token costs `2d·H + H·d + K·d` MACs (SmolLM2-135M, H = 1536, K = 8192: 7.4 M, 18x fewer
//! than the target's 135 M), with its three matrices quantized like a draft model's (Q8_0 by
//! default: 7.8 MB). Trained by `llada train-feature-draft` on the target's features
//! over training-split prose (cross-entropy against the target's argmax one position later,
//! plus the squared error of the predicted feature).
//!
//! The engine hands the drafter `f` through [`Drafter::observe_feature`] after the prefill and
//! after every verification (the feature of the row whose logits chose the pending root).

use super::drafter::{proposal, Drafter, Proposal};
use super::tree::DraftTree;
use crate::error::DecodeError;
use llada_kernels::GgmlType;
use llada_model::weights::Linear;
use llada_model::{Model, ModelError};
use std::path::Path;

/// The trained part of a feature drafter.
#[derive(Debug, Clone)]
pub struct FeatureHead {
    /// Target width `d`.
    pub d: usize,
    /// Hidden width `H`.
    pub hidden: usize,
    /// `H × 2d`, row-major: `a = W₁ · [f ; e(x)] + b₁`.
    pub w1: Vec<f32>,
    pub b1: Vec<f32>,
    /// `H × d`, row-major (row `h` is added to the feature with weight `silu(a_h)`).
    pub w2: Vec<f32>,
    pub b2: Vec<f32>,
    /// Token ids the head can propose (its reduced vocabulary).
    pub ids: Vec<u32>,
}

impl FeatureHead {
    /// Save as safetensors, the matrices and biases in f16 (`w1` `[H, 2d]`, `b1` `[H]`, `w2`
    /// `[H, d]`, `b2` `[d]`; the drafter computes in Q8_0 by default, below f16's precision)
    /// and `ids` U32 `[K]`.
    pub fn save(&self, path: &Path) -> Result<(), DecodeError> {
        self.write(path).map_err(DecodeError::File)
    }

    fn write(&self, path: &Path) -> Result<(), String> {
        use safetensors::tensor::{Dtype, TensorView};
        let f = |v: &[f32]| -> Vec<u8> {
            v.iter()
                .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                .collect()
        };
        let (w1, b1, w2, b2) = (f(&self.w1), f(&self.b1), f(&self.w2), f(&self.b2));
        let ids: Vec<u8> = self.ids.iter().flat_map(|v| v.to_le_bytes()).collect();
        let e = |e: safetensors::SafeTensorError| e.to_string();
        let (h, d) = (self.hidden, self.d);
        let views = vec![
            (
                "w1",
                TensorView::new(Dtype::F16, vec![h, 2 * d], &w1).map_err(e)?,
            ),
            ("b1", TensorView::new(Dtype::F16, vec![h], &b1).map_err(e)?),
            (
                "w2",
                TensorView::new(Dtype::F16, vec![h, d], &w2).map_err(e)?,
            ),
            ("b2", TensorView::new(Dtype::F16, vec![d], &b2).map_err(e)?),
            (
                "ids",
                TensorView::new(Dtype::U32, vec![self.ids.len()], &ids).map_err(e)?,
            ),
        ];
        safetensors::serialize_to_file(views, None, path).map_err(e)
    }

    /// Load and check against `target` (width, vocabulary, shapes).
    pub fn load(path: &Path, target: &Model) -> Result<Self, DecodeError> {
        Self::read(path, target).map_err(DecodeError::File)
    }

    fn read(path: &Path, target: &Model) -> Result<Self, String> {
        use safetensors::tensor::Dtype;
        let bytes = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        let st = safetensors::SafeTensors::deserialize(&bytes)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let get = |name: &str| -> Result<safetensors::tensor::TensorView<'_>, String> {
            st.tensor(name)
                .map_err(|_| format!("{}: missing tensor {name}", path.display()))
        };
        // Matrices and biases in f16 (as saved) or f32.
        let floats = |name: &str| -> Result<(Vec<usize>, Vec<f32>), String> {
            let t = get(name)?;
            let b = t.data();
            let v = match t.dtype() {
                Dtype::F16 => b
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
                Dtype::F32 => b
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                other => {
                    return Err(format!(
                        "{}: {name} is {other:?}, want F16 or F32",
                        path.display()
                    ))
                }
            };
            Ok((t.shape().to_vec(), v))
        };
        let (s1, w1) = floats("w1")?;
        let (sb1, b1) = floats("b1")?;
        let (s2, w2) = floats("w2")?;
        let (sb2, b2) = floats("b2")?;
        let it = get("ids")?;
        if it.dtype() != Dtype::U32 {
            return Err(format!(
                "{}: ids is {:?}, want U32",
                path.display(),
                it.dtype()
            ));
        }
        let ids: Vec<u32> = it
            .data()
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let c = &target.config;
        let d = c.d_model;
        let h = s1.first().copied().unwrap_or(0);
        let shapes_ok = s1 == [h, 2 * d] && sb1 == [h] && s2 == [h, d] && sb2 == [d] && h > 0;
        if !shapes_ok {
            return Err(format!(
                "{}: shapes w1 {s1:?}, b1 {sb1:?}, w2 {s2:?}, b2 {sb2:?} do not fit a {d}-wide target",
                path.display()
            ));
        }
        if ids.is_empty() || ids.iter().any(|&t| t as usize >= c.vocab) {
            return Err(format!(
                "{}: token ids outside the vocabulary",
                path.display()
            ));
        }
        Ok(Self {
            d,
            hidden: h,
            w1,
            b1,
            w2,
            b2,
            ids,
        })
    }

    /// `f̂ = f + W₂ · silu(W₁ · [f ; e] + b₁) + b₂` for one feature `f` and embedding row `e`.
    pub fn step(&self, f: &[f32], e: &[f32]) -> Vec<f32> {
        use llada_kernels::vecops::{axpy, dot};
        let d = self.d;
        let mut out: Vec<f32> = f.iter().zip(&self.b2).map(|(a, b)| a + b).collect();
        for (h, row) in self.w1.chunks_exact(2 * d).enumerate() {
            let a = dot(&row[..d], f) + dot(&row[d..], e) + self.b1[h];
            let s = a / (1.0 + (-a).exp());
            axpy(&mut out, s, &self.w2[h * d..(h + 1) * d]);
        }
        out
    }
}

/// A feature head prepared for drafting: `W₁` (`H × 2d`), `W₂ᵀ` (`d × H`) and the embedding
/// rows of its ids (`K × d`) as the engine's matrices — quantized like a draft model's
/// (`--draft-quantize`) or f32 — built once per loaded head (their bytes are the drafter's
/// weight memory).
pub struct FeatureModel {
    d: usize,
    ids: Vec<u32>,
    l1: Linear,
    b1: Vec<f32>,
    l2: Linear,
    b2: Vec<f32>,
    rows: Linear,
}

impl FeatureModel {
    /// `quant`: matrix type of the three matrices (`None`: f32).
    pub fn new(
        target: &Model,
        head: FeatureHead,
        quant: Option<GgmlType>,
    ) -> Result<Self, ModelError> {
        let d = target.config.d_model;
        if head.d != d {
            return Err(ModelError::BadRequest(format!(
                "the feature head is {} wide, the target {d}",
                head.d
            )));
        }
        let h = head.hidden;
        let mut rows = vec![0f32; head.ids.len() * d];
        for (r, &t) in rows.chunks_exact_mut(d).zip(&head.ids) {
            embed(target, t, r)?;
        }
        let mut w2t = vec![0f32; d * h];
        for (k, row) in head.w2.chunks_exact(d).enumerate() {
            for (j, &v) in row.iter().enumerate() {
                w2t[j * h + k] = v;
            }
        }
        Ok(Self {
            d,
            l1: Linear::from_f32(head.w1, h, 2 * d, quant)?,
            b1: head.b1,
            l2: Linear::from_f32(w2t, d, h, quant)?,
            b2: head.b2,
            rows: Linear::from_f32(rows, head.ids.len(), d, quant)?,
            ids: head.ids,
        })
    }

    /// [`FeatureHead::step`] through the engine's matrices.
    fn step(&self, f: &[f32], e: &[f32]) -> Result<Vec<f32>, ModelError> {
        let z: Vec<f32> = f.iter().chain(e).copied().collect();
        let a = self.l1.forward(&z, &mut None, 1, -1, "feature_w1")?;
        let s: Vec<f32> = a
            .iter()
            .zip(&self.b1)
            .map(|(a, b)| {
                let a = a + b;
                a / (1.0 + (-a).exp())
            })
            .collect();
        let u = self.l2.forward(&s, &mut None, 1, -1, "feature_w2")?;
        Ok(f.iter()
            .zip(&u)
            .zip(&self.b2)
            .map(|((f, u), b)| f + u + b)
            .collect())
    }
}

/// The feature drafter.
pub struct FeatureDrafter<'m> {
    target: &'m Model,
    model: &'m FeatureModel,
    /// The target's feature of the row that chose the pending root (`None` before the first).
    observed: Option<Vec<f32>>,
    /// Predicted feature after the root (index 0) and after each node of the current tree
    /// (index `1 + node`); reset with every new tree.
    memo: Vec<Option<Vec<f32>>>,
    temperature: f32,
}

impl<'m> FeatureDrafter<'m> {
    pub fn new(target: &'m Model, model: &'m FeatureModel, temperature: f32) -> Self {
        Self {
            target,
            model,
            observed: None,
            memo: vec![],
            temperature,
        }
    }

    /// Predicted feature after `node` (`None`: after the root), from the memo or computed
    /// along its path.
    fn feature(
        &mut self,
        root: u32,
        tree: &DraftTree,
        node: Option<usize>,
    ) -> Result<Option<Vec<f32>>, ModelError> {
        let idx = node.map_or(0, |n| n + 1);
        if let Some(Some(f)) = self.memo.get(idx) {
            return Ok(Some(f.clone()));
        }
        let (prev, tok) = match node {
            None => match &self.observed {
                Some(f) => (f.clone(), root),
                None => return Ok(None),
            },
            Some(n) => match self.feature(root, tree, tree.parent[n])? {
                Some(f) => (f, tree.tokens[n]),
                None => return Ok(None),
            },
        };
        let mut e = vec![0f32; self.model.d];
        embed(self.target, tok, &mut e)?;
        let f = self.model.step(&prev, &e)?;
        if self.memo.len() <= idx {
            self.memo.resize(idx + 1, None);
        }
        self.memo[idx] = Some(f.clone());
        Ok(Some(f))
    }
}

/// The target's embedding row of token `t` into `out`.
pub fn embed(target: &Model, t: u32, out: &mut [f32]) -> Result<(), ModelError> {
    let row = target.weights.vocab_map.as_ref().map_or(t, |m| m.row(t));
    target.weights.embed.lookup(row, out)
}

impl Drafter for FeatureDrafter<'_> {
    fn name(&self) -> String {
        "feature".into()
    }
    fn wants_features(&self) -> bool {
        true
    }
    fn observe_feature(&mut self, feature: &[f32]) {
        self.observed = (feature.len() == self.model.d).then(|| feature.to_vec());
        self.memo.clear();
    }
    fn propose(
        &mut self,
        context: &[u32],
        tree: &DraftTree,
        node: Option<usize>,
        k: usize,
    ) -> Result<Proposal, ModelError> {
        let Some(&root) = context.last() else {
            return Ok(Proposal::default());
        };
        if node.is_none() {
            // A new tree: nodes of the previous one are gone.
            self.memo.clear();
        }
        let Some(f) = self.feature(root, tree, node)? else {
            return Ok(Proposal::default());
        };
        let logits = self
            .model
            .rows
            .forward(&f, &mut None, 1, -1, "feature_head")?;
        Ok(proposal(
            logits,
            Some(&self.model.ids),
            self.target.config.vocab,
            k,
            self.temperature,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One step by hand: d = 1, H = 1, f = 1, e = 2, W₁ = [0.5, 0.25], b₁ = 0.1, W₂ = 2,
    /// b₂ = 0.3: a = 1.1, silu(1.1) = 1.1 / (1 + e^−1.1) = 0.825286, f̂ = 1 + 0.3 + 2 · 0.825286.
    #[test]
    fn a_step_is_the_documented_formula() {
        let h = FeatureHead {
            d: 1,
            hidden: 1,
            w1: vec![0.5, 0.25],
            b1: vec![0.1],
            w2: vec![2.0],
            b2: vec![0.3],
            ids: vec![0],
        };
        let y = h.step(&[1.0], &[2.0]);
        assert!((y[0] - 2.950_572).abs() < 1e-5, "{}", y[0]);
    }
}
