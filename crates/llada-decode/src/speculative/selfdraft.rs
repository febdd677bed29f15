//! Early-exit self-drafting: the target drafts for itself with its first `k` layers and a
//! trained head, so no second model (and no second tokenizer) is needed.
//!
//! Head: `logits_t = ⟨h_k · W, E_t⟩` for the `K` most frequent token ids `t` of the calibration
//! corpus, where `h_k` is the residual stream after layer `k`, `E_t` the target's embedding row
//! (its LM head when tied) and `W` a `d × d` adapter fitted by ridge regression of the target's
//! final normalised hidden state `RMSNorm_final(h_L)` on `h_k` ([`fit_head`], closed form:
//! `(HᵀH + λI) W = HᵀY`, solved by Cholesky). Per drafted token the cost is `k` layers, `d²`
//! and `K · d` MACs — against `L` layers and `vocab · d` for the target.
//!
//! The drafter keeps its own KV cache of the first `k` layers (target-shaped, upper layers
//! unused); those layers must be resident (a memory budget that streams them makes
//! [`Model::forward_hidden`] refuse).

use super::drafter::{proposal, step_rows, ContextCache, Drafter, Proposal};
use super::tree::DraftTree;
use crate::error::DecodeError;
use llada_model::{AttnMask, ForwardRequest, KvWrite, LogitRows, Model, ModelError};
use llada_runtime::{KvCache, Lane};
use std::path::Path;

/// The trained part of a self-drafter.
#[derive(Debug, Clone)]
pub struct SelfHead {
    /// Layers of the target the drafter runs.
    pub layers: usize,
    /// `d × d`, row-major: `y = h · W`.
    pub adapter: Vec<f32>,
    /// Token ids the head can propose.
    pub ids: Vec<u32>,
}

impl SelfHead {
    /// Save as safetensors (`adapter` F32 `[d, d]`, `ids` U32 `[K]`, `layers` U32 `[1]`).
    pub fn save(&self, path: &Path) -> Result<(), DecodeError> {
        self.write(path).map_err(DecodeError::File)
    }

    fn write(&self, path: &Path) -> Result<(), String> {
        use safetensors::tensor::{Dtype, TensorView};
        let d = (self.adapter.len() as f64).sqrt() as usize;
        let a: Vec<u8> = self.adapter.iter().flat_map(|v| v.to_le_bytes()).collect();
        let i: Vec<u8> = self.ids.iter().flat_map(|v| v.to_le_bytes()).collect();
        let l: Vec<u8> = (self.layers as u32).to_le_bytes().to_vec();
        let e = |e: safetensors::SafeTensorError| e.to_string();
        let views = vec![
            (
                "adapter",
                TensorView::new(Dtype::F32, vec![d, d], &a).map_err(e)?,
            ),
            (
                "ids",
                TensorView::new(Dtype::U32, vec![self.ids.len()], &i).map_err(e)?,
            ),
            (
                "layers",
                TensorView::new(Dtype::U32, vec![1], &l).map_err(e)?,
            ),
        ];
        safetensors::serialize_to_file(views, None, path).map_err(e)
    }

    /// Load and check against `target` (width, layer count, vocabulary).
    pub fn load(path: &Path, target: &Model) -> Result<Self, DecodeError> {
        Self::read(path, target).map_err(DecodeError::File)
    }

    fn read(path: &Path, target: &Model) -> Result<Self, String> {
        use safetensors::tensor::Dtype;
        let bytes = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        let st = safetensors::SafeTensors::deserialize(&bytes)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let get = |name: &str, dt: Dtype| -> Result<Vec<u8>, String> {
            let t = st
                .tensor(name)
                .map_err(|_| format!("{}: missing tensor {name}", path.display()))?;
            if t.dtype() != dt {
                return Err(format!(
                    "{}: {name} is {:?}, want {dt:?}",
                    path.display(),
                    t.dtype()
                ));
            }
            Ok(t.data().to_vec())
        };
        let f32s = |b: Vec<u8>| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        let u32s = |b: Vec<u8>| -> Vec<u32> {
            b.chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        let adapter = f32s(get("adapter", Dtype::F32)?);
        let ids = u32s(get("ids", Dtype::U32)?);
        let layers = u32s(get("layers", Dtype::U32)?)
            .first()
            .copied()
            .unwrap_or(0) as usize;
        let c = &target.config;
        if adapter.len() != c.d_model * c.d_model {
            return Err(format!(
                "{}: adapter has {} values, the target is {} wide",
                path.display(),
                adapter.len(),
                c.d_model
            ));
        }
        if layers == 0 || layers >= c.n_layers {
            return Err(format!(
                "{}: {layers} layers for a {}-layer target",
                path.display(),
                c.n_layers
            ));
        }
        if ids.is_empty() || ids.iter().any(|&t| t as usize >= c.vocab) {
            return Err(format!(
                "{}: token ids outside the vocabulary",
                path.display()
            ));
        }
        Ok(Self {
            layers,
            adapter,
            ids,
        })
    }
}

/// Fit a head on the target's own hidden states over `windows` (causal passes): `layers`
/// early layers, the `k` most frequent ids of `windows`, ridge strength `lambda` (relative to
/// the mean diagonal of `HᵀH`).
pub fn fit_head(
    target: &Model,
    lane: &Lane,
    windows: &[Vec<u32>],
    layers: usize,
    k: usize,
    lambda: f64,
    mut progress: impl FnMut(usize),
) -> Result<SelfHead, ModelError> {
    let c = &target.config;
    let d = c.d_model;
    let mut a = vec![0f64; d * d];
    let mut b = vec![0f64; d * d];
    let mut count = vec![0u64; c.vocab];
    for (wi, w) in windows.iter().enumerate() {
        for &t in w {
            if let Some(n) = count.get_mut(t as usize) {
                *n += 1;
            }
        }
        let pos: Vec<u32> = (0..w.len() as u32).collect();
        let req = ForwardRequest {
            tokens: w,
            positions: &pos,
            mask: AttnMask::Causal,
            kv_write: KvWrite::None,
            logits: LogitRows::All,
        };
        let hk = lane.run(|| target.forward_hidden(&req, &mut target.new_cache(), layers))?;
        // Final residual stream: the hidden state after the last layer, normalised.
        let hl = lane.run(|| target.forward_hidden(&req, &mut target.new_cache(), c.n_layers))?;
        for r in 0..w.len() {
            let x = hk.row(r);
            let y = normalise(hl.row(r), &target.weights.final_norm, c.rms_eps);
            for i in 0..d {
                let xi = x[i] as f64;
                let (ar, br) = (&mut a[i * d..(i + 1) * d], &mut b[i * d..(i + 1) * d]);
                for j in 0..d {
                    ar[j] += xi * x[j] as f64;
                    br[j] += xi * y[j] as f64;
                }
            }
        }
        progress(wi + 1);
    }
    let mean_diag = (0..d).map(|i| a[i * d + i]).sum::<f64>() / d as f64;
    for i in 0..d {
        a[i * d + i] += lambda * mean_diag.max(1e-12);
    }
    let w = cholesky_solve(&a, &b, d)
        .ok_or_else(|| ModelError::Other("self-draft regression is singular".into()))?;
    let mut order: Vec<u32> = (0..c.vocab as u32).collect();
    order.sort_by_key(|&t| (std::cmp::Reverse(count[t as usize]), t));
    order.truncate(k.min(c.vocab));
    Ok(SelfHead {
        layers,
        adapter: w.iter().map(|&v| v as f32).collect(),
        ids: order,
    })
}

/// `RMSNorm(h) · g`.
fn normalise(h: &[f32], g: &[f32], eps: f64) -> Vec<f32> {
    let ss: f64 = h.iter().map(|v| (*v as f64) * (*v as f64)).sum();
    let inv = (1.0 / ((ss / h.len() as f64) + eps).sqrt()) as f32;
    h.iter().zip(g).map(|(v, g)| v * inv * g).collect()
}

/// Solve `A X = B` for symmetric positive definite `A` (`d × d`), `B` `d × m` with `m = d`.
fn cholesky_solve(a: &[f64], b: &[f64], d: usize) -> Option<Vec<f64>> {
    let mut l = vec![0f64; d * d];
    for i in 0..d {
        for j in 0..=i {
            let s: f64 = (0..j).map(|k| l[i * d + k] * l[j * d + k]).sum();
            if i == j {
                let v = a[i * d + i] - s;
                if v <= 0.0 {
                    return None;
                }
                l[i * d + i] = v.sqrt();
            } else {
                l[i * d + j] = (a[i * d + j] - s) / l[j * d + j];
            }
        }
    }
    let m = b.len() / d;
    let mut x = b.to_vec();
    for col in 0..m {
        // L z = b, then Lᵀ x = z.
        for i in 0..d {
            let s: f64 = (0..i).map(|k| l[i * d + k] * x[k * m + col]).sum();
            x[i * m + col] = (x[i * m + col] - s) / l[i * d + i];
        }
        for i in (0..d).rev() {
            let s: f64 = (i + 1..d).map(|k| l[k * d + i] * x[k * m + col]).sum();
            x[i * m + col] = (x[i * m + col] - s) / l[i * d + i];
        }
    }
    Some(x)
}

/// The self-drafter.
pub struct SelfDrafter<'m> {
    target: &'m Model,
    lane: &'m Lane,
    head: SelfHead,
    /// Embedding rows of `head.ids`, `K × d` (dequantized once).
    rows: Vec<f32>,
    ctx: ContextCache,
    temperature: f32,
}

impl<'m> SelfDrafter<'m> {
    pub fn new(
        target: &'m Model,
        lane: &'m Lane,
        head: SelfHead,
        temperature: f32,
    ) -> Result<Self, ModelError> {
        let d = target.config.d_model;
        let mut rows = vec![0f32; head.ids.len() * d];
        for (r, &t) in rows.chunks_exact_mut(d).zip(&head.ids) {
            let row = target.weights.vocab_map.as_ref().map_or(t, |m| m.row(t));
            target.weights.embed.lookup(row, r)?;
        }
        Ok(Self {
            target,
            lane,
            head,
            rows,
            ctx: ContextCache::new(target.new_cache()),
            temperature,
        })
    }
}

impl Drafter for SelfDrafter<'_> {
    fn name(&self) -> String {
        format!("self-{}", self.head.layers)
    }
    fn propose(
        &mut self,
        context: &[u32],
        tree: &DraftTree,
        node: Option<usize>,
        k: usize,
    ) -> Result<Proposal, ModelError> {
        if context.is_empty() {
            return Ok(Proposal::default());
        }
        let (target, lane, layers) = (self.target, self.lane, self.head.layers);
        let hidden = |cache: &mut KvCache, toks: &[u32], pos: &[u32], write, rows| {
            lane.run(|| {
                target.forward_hidden(
                    &ForwardRequest {
                        tokens: toks,
                        positions: pos,
                        mask: AttnMask::Causal,
                        kv_write: write,
                        logits: rows,
                    },
                    cache,
                    layers,
                )
            })
        };
        self.ctx.sync(context, |cache, toks| {
            let p0 = cache.len() as u32;
            let pos: Vec<u32> = (p0..p0 + toks.len() as u32).collect();
            hidden(cache, toks, &pos, KvWrite::Append, LogitRows::None).map(|_| ())
        })?;
        let (toks, pos) = step_rows(context, tree, node);
        let out = hidden(
            &mut self.ctx.cache,
            &toks,
            &pos,
            KvWrite::None,
            LogitRows::Last,
        )?;
        let d = target.config.d_model;
        let mut y = vec![0f32; d];
        for (i, &hi) in out.row(0).iter().enumerate() {
            llada_kernels::vecops::axpy(&mut y, hi, &self.head.adapter[i * d..(i + 1) * d]);
        }
        let logits: Vec<f32> = self
            .rows
            .chunks_exact(d)
            .map(|e| llada_kernels::vecops::dot(&y, e))
            .collect();
        Ok(proposal(
            logits,
            Some(&self.head.ids),
            target.config.vocab,
            k,
            self.temperature,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cholesky_solves_a_small_system() {
        // A = [[4, 2], [2, 3]], B = I → A⁻¹ = [[3, −2], [−2, 4]] / 8.
        let x = cholesky_solve(&[4.0, 2.0, 2.0, 3.0], &[1.0, 0.0, 0.0, 1.0], 2).unwrap();
        let want = [0.375, -0.25, -0.25, 0.5];
        for (a, b) in x.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{x:?}");
        }
        assert!(cholesky_solve(&[1.0, 2.0, 2.0, 1.0], &[1.0, 0.0, 0.0, 1.0], 2).is_none());
    }
}
