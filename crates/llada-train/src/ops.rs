//! Fused training ops, forward and backward: the attention softmax and the weighted
//! cross-entropy.
//!
//! candle offers a fused `softmax_last_dim` without a backward pass, and a composed `softmax`
//! (max, subtract, exp, sum, divide) whose autograd graph makes five `[B, H, T, T]` tensors
//! forward and about twice as many backward. The attention scores are the largest tensors of a
//! task-model step, so the composed graph's element-wise passes and allocations were a large
//! share of training time. [`softmax`] is one pass forward (rows in parallel) and one pass
//! backward (`dx = y ⊙ (g − Σ g ⊙ y)` per row), with the causal mask applied inside (masked
//! columns get probability exactly 0, so no `−∞` tensor is added). It is checked against the
//! composed ops in the tests (`fused_softmax_matches_composed_softmax`).
//!
//! The loss is the same story one level up: a composed log-softmax and `gather` over the
//! `[B, T, V]` logits (V = 8 193 for the draft: 134 MB per temporary) cost more than the head's
//! matmul. [`weighted_nll`] computes `w · (logsumexp(row) − row[target])` per row in one pass and
//! its gradient `g · w · (softmax(row) − onehot)` in another, skipping rows of weight 0 (the
//! unmasked positions of a diffusion batch); checked against the composed ops in
//! `fused_nll_matches_composed_log_softmax`.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// Rows per rayon task: enough work per task that scheduling stays negligible.
const ROWS_PER_TASK: usize = 64;

/// Which columns each row of a trailing `[T, T]` score matrix sees: always a prefix
/// `0..m(row)` (others get probability exactly 0).
#[derive(Clone, Debug)]
pub enum Visibility {
    /// Every column.
    All,
    /// Row `i` sees columns `0..=i`.
    Causal,
    /// Row `i` sees columns `0..prefix[i]` (each at least 1; `prefix.len() == T`).
    Prefix(std::sync::Arc<Vec<u32>>),
    /// Per sequence: every row of batch element `b` sees columns `0..ends[b]` (key padding
    /// beyond a row's own end hidden; [`crate::objective::diffusion_batch_padded`]).
    /// `per` is the number of `[T]` rows of one batch element (`H · T` for `[B, H, T, T]`
    /// scores), and the scores must hold exactly `ends.len() · per` rows.
    Ends {
        ends: std::sync::Arc<[u32]>,
        per: usize,
    },
}

/// Softmax over the last dimension of an f32 tensor; with `causal`, row `i` of each trailing
/// `[T, T]` matrix sees columns `0..=i` only (others get probability 0).
pub fn softmax(x: &Tensor, causal: bool) -> Result<Tensor> {
    softmax_visible(
        x,
        if causal {
            Visibility::Causal
        } else {
            Visibility::All
        },
    )
}

/// [`softmax`] with any prefix [`Visibility`].
pub fn softmax_visible(x: &Tensor, vis: Visibility) -> Result<Tensor> {
    x.contiguous()?.apply_op1(Softmax { vis })
}

/// The contiguous f32 slice behind `storage`/`layout`.
fn f32_slice<'a>(storage: &'a CpuStorage, layout: &Layout, op: &str) -> Result<&'a [f32]> {
    let CpuStorage::F32(v) = storage else {
        candle_core::bail!("{op}: f32 tensors only")
    };
    match layout.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => candle_core::bail!("{op}: input must be contiguous"),
    }
}

/// Row length and, for a masked visibility, the check that the trailing two dimensions are
/// square (and match a prefix table).
fn row_len(shape: &Shape, vis: &Visibility, op: &str) -> Result<usize> {
    let dims = shape.dims();
    let n = *dims.last().unwrap_or(&0);
    if n == 0 {
        candle_core::bail!("{op}: empty last dimension");
    }
    let square = dims.len() >= 2 && dims[dims.len() - 2] == n;
    match vis {
        Visibility::All => {}
        Visibility::Causal if !square => {
            candle_core::bail!("{op}: causal softmax needs square [.., T, T] scores, got {dims:?}")
        }
        Visibility::Prefix(p)
            if !square || p.len() != n || p.iter().any(|&m| m == 0 || m as usize > n) =>
        {
            candle_core::bail!("{op}: a prefix table of {} entries in 1..={n} needs square [.., {n}, {n}] scores, got {dims:?}", p.len())
        }
        Visibility::Ends { ends, per }
            if *per == 0
                || shape.elem_count() / n != ends.len() * per
                || ends.iter().any(|&m| m == 0 || m as usize > n) =>
        {
            candle_core::bail!(
                "{op}: {} row ends in 1..={n} of {per} rows each do not fit scores {dims:?}",
                ends.len()
            )
        }
        _ => {}
    }
    Ok(n)
}

/// Columns row `r` (flat index) may see.
fn visible(r: usize, n: usize, vis: &Visibility) -> usize {
    match vis {
        Visibility::All => n,
        Visibility::Causal => r % n + 1,
        Visibility::Prefix(p) => p[r % n] as usize,
        Visibility::Ends { ends, per } => ends[r / per] as usize,
    }
}

struct Softmax {
    vis: Visibility,
}

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        "llada-softmax"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let src = f32_slice(storage, layout, self.name())?;
        let n = row_len(layout.shape(), &self.vis, self.name())?;
        let mut dst = vec![0f32; src.len()];
        dst.par_chunks_mut(n * ROWS_PER_TASK)
            .zip(src.par_chunks(n * ROWS_PER_TASK))
            .enumerate()
            .for_each(|(task, (d, s))| {
                for (i, (d, s)) in d.chunks_mut(n).zip(s.chunks(n)).enumerate() {
                    let m = visible(task * ROWS_PER_TASK + i, n, &self.vis);
                    let (d, s) = (&mut d[..m], &s[..m]);
                    let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let mut sum = 0f32;
                    for (d, &s) in d.iter_mut().zip(s) {
                        *d = (s - max).exp();
                        sum += *d;
                    }
                    let inv = 1.0 / sum;
                    d.iter_mut().for_each(|d| *d *= inv);
                }
            });
        Ok((CpuStorage::F32(dst), layout.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let (y, g) = (res.contiguous()?, grad_res.contiguous()?);
        Ok(Some(y.apply_op2_no_bwd(
            &g,
            &SoftmaxGrad {
                vis: self.vis.clone(),
            },
        )?))
    }
}

/// `dx = y ⊙ (g − Σ_row g ⊙ y)` for `y = softmax(x)`; masked columns (y = 0) get 0.
struct SoftmaxGrad {
    vis: Visibility,
}

impl CustomOp2 for SoftmaxGrad {
    fn name(&self) -> &'static str {
        "llada-softmax-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let y = f32_slice(s1, l1, self.name())?;
        let g = f32_slice(s2, l2, self.name())?;
        if l1.shape() != l2.shape() {
            candle_core::bail!("{}: shapes differ", self.name());
        }
        let n = row_len(l1.shape(), &self.vis, self.name())?;
        let mut dst = vec![0f32; y.len()];
        dst.par_chunks_mut(n * ROWS_PER_TASK)
            .zip(y.par_chunks(n * ROWS_PER_TASK))
            .zip(g.par_chunks(n * ROWS_PER_TASK))
            .enumerate()
            .for_each(|(task, ((d, y), g))| {
                let rows = d.chunks_mut(n).zip(y.chunks(n)).zip(g.chunks(n));
                for (i, ((d, y), g)) in rows.enumerate() {
                    let m = visible(task * ROWS_PER_TASK + i, n, &self.vis);
                    let (d, y, g) = (&mut d[..m], &y[..m], &g[..m]);
                    let dot: f32 = y.iter().zip(g).map(|(y, g)| y * g).sum();
                    for ((d, &y), &g) in d.iter_mut().zip(y).zip(g) {
                        *d = y * (g - dot);
                    }
                }
            });
        Ok((CpuStorage::F32(dst), l1.shape().clone()))
    }
}

/// Per-row weighted negative log-likelihood `w[r] · (logsumexp(x[r]) − x[r, t[r]])` of f32
/// logits `[.., V]` (shape of the result: the leading dimensions). `targets` and `weights` have
/// one entry per row; a target outside `0..V` is an error.
pub fn weighted_nll(logits: &Tensor, targets: Vec<u32>, weights: Vec<f32>) -> Result<Tensor> {
    weighted_soft_nll(logits, targets, None, weights)
}

/// Per-row weighted cross-entropy against a sparse target distribution: row `r` has `k`
/// classes `c[r·k..r·k+k]` with probabilities `p[..]` (summing to 1 for a proper
/// distribution; 0-probability entries are padding), and costs
/// `w[r] · (logsumexp(x[r]) − Σ_j p[r,j] · x[r, c[r,j]])` — soft distillation from a teacher's
/// top-k. `probs = None` is [`weighted_nll`] (`k` = 1, probability 1). The gradient is
/// `w · (softmax(x) − Σ_j p_j · onehot(c_j))`. One fused pass forward and one backward, like
/// the hard case: candle's composed `log_softmax` + `gather` materialises three copies of
/// the `[rows × V]` logits.
pub fn weighted_soft_nll(
    logits: &Tensor,
    classes: Vec<u32>,
    probs: Option<Vec<f32>>,
    weights: Vec<f32>,
) -> Result<Tensor> {
    let dims = logits.dims();
    let v = *dims.last().unwrap_or(&0);
    let rows = logits.elem_count() / v.max(1);
    if rows == 0 && v > 0 && classes.is_empty() && weights.is_empty() {
        return Tensor::zeros(&dims[..dims.len() - 1], logits.dtype(), logits.device());
    }
    let k = classes.len() / rows.max(1);
    if v == 0
        || k == 0
        || classes.len() != rows * k
        || weights.len() != rows
        || probs.as_ref().is_some_and(|p| p.len() != classes.len())
        || (probs.is_none() && k != 1)
    {
        candle_core::bail!(
            "weighted_nll: {rows} rows of {v} logits, {} targets, {} probabilities, {} weights",
            classes.len(),
            probs.as_ref().map_or(0, Vec::len),
            weights.len()
        );
    }
    if let Some(t) = classes.iter().find(|&&t| t as usize >= v) {
        candle_core::bail!("weighted_nll: target {t} outside the {v}-entry vocabulary");
    }
    logits
        .contiguous()?
        .apply_op1(WeightedNll {
            k,
            targets: std::sync::Arc::new(classes),
            probs: probs.map(std::sync::Arc::new),
            weights: std::sync::Arc::new(weights),
            shift: Default::default(),
        })?
        .reshape(&dims[..dims.len() - 1])
}

/// `max` and `ln Σ exp(x − max)` of one row.
fn max_and_log_sum_exp(x: &[f32]) -> (f32, f32) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = x.iter().map(|&x| (x - max).exp()).sum();
    (max, sum.ln())
}

#[derive(Clone)]
struct WeightedNll {
    /// Target classes per row.
    k: usize,
    targets: std::sync::Arc<Vec<u32>>,
    /// Their probabilities (`None`: one class of probability 1 per row).
    probs: Option<std::sync::Arc<Vec<f32>>>,
    weights: std::sync::Arc<Vec<f32>>,
    /// `max + logsumexp` of each weighted row, kept by the forward pass for the backward (the
    /// graph holds this op, so the backward sees what the forward stored).
    shift: std::sync::Arc<std::sync::OnceLock<Vec<f32>>>,
}

impl WeightedNll {
    /// Row `r`'s target classes and their probabilities.
    fn targets(&self, r: usize) -> impl Iterator<Item = (usize, f32)> + '_ {
        let span = r * self.k..(r + 1) * self.k;
        self.targets[span.clone()]
            .iter()
            .enumerate()
            .map(move |(j, &c)| {
                let p = self.probs.as_ref().map_or(1.0, |p| p[span.start + j]);
                (c as usize, p)
            })
    }
}

impl CustomOp1 for WeightedNll {
    fn name(&self) -> &'static str {
        "llada-weighted-nll"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = f32_slice(storage, layout, self.name())?;
        let rows = self.weights.len();
        let v = x.len() / rows.max(1);
        let mut out = vec![0f32; rows];
        let mut shift = vec![0f32; rows];
        out.par_iter_mut()
            .zip(shift.par_iter_mut())
            .zip(x.par_chunks(v))
            .enumerate()
            .for_each(|(r, ((o, sh), x))| {
                let w = self.weights[r];
                if w != 0.0 {
                    let (max, lse) = max_and_log_sum_exp(x);
                    *sh = max + lse;
                    *o = w * self.targets(r).map(|(c, p)| p * (*sh - x[c])).sum::<f32>();
                }
            });
        // Set once: every `weighted_nll` call builds a fresh op, and candle runs its forward once.
        let _ = self.shift.set(shift);
        Ok((CpuStorage::F32(out), Shape::from(rows)))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let g = grad_res.flatten_all()?.contiguous()?;
        Ok(Some(
            arg.apply_op2_no_bwd(&g, &WeightedNllGrad(self.clone()))?,
        ))
    }
}

/// `dx[r] = g[r] · w[r] · (Σ_j p_j · softmax(x[r]) − Σ_j p_j · onehot(c_j))` (for a proper
/// distribution Σ_j p_j = 1).
struct WeightedNllGrad(WeightedNll);

impl CustomOp2 for WeightedNllGrad {
    fn name(&self) -> &'static str {
        "llada-weighted-nll-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = f32_slice(s1, l1, self.name())?;
        let g = f32_slice(s2, l2, self.name())?;
        let weights = &self.0.weights;
        if g.len() != weights.len() {
            candle_core::bail!(
                "{}: {} gradients for {} rows",
                self.name(),
                g.len(),
                weights.len()
            );
        }
        let v = x.len() / weights.len().max(1);
        let Some(shifts) = self.0.shift.get() else {
            candle_core::bail!("{}: backward before forward", self.name());
        };
        let mut dst = vec![0f32; x.len()];
        dst.par_chunks_mut(v)
            .zip(x.par_chunks(v))
            .enumerate()
            .for_each(|(r, (d, x))| {
                let scale = g[r] * weights[r];
                if scale == 0.0 {
                    return;
                }
                let mass: f32 = self.0.targets(r).map(|(_, p)| p).sum();
                let shift = shifts[r];
                for (d, &x) in d.iter_mut().zip(x) {
                    *d = scale * mass * (x - shift).exp();
                }
                for (c, p) in self.0.targets(r) {
                    d[c] -= scale * p;
                }
            });
        Ok((CpuStorage::F32(dst), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, IndexOp, Var, D};
    use rand::{Rng, SeedableRng};

    /// Normal draws from a seeded generator (Box–Muller): candle's CPU `randn` cannot be
    /// seeded, and a test's inputs must be the same on every run.
    fn randn(seed: u64, std: f32, shape: &[usize]) -> Result<Tensor> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| {
                let (u1, u2): (f32, f32) = (rng.random_range(f32::EPSILON..1.0), rng.random());
                std * (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
            })
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu)
    }

    /// Random scores and upstream gradients, the fused op against candle's composed softmax
    /// (with an explicit −∞ mask for the causal case), forward values and input gradients.
    #[test]
    fn fused_softmax_matches_composed_softmax() -> Result<()> {
        let dev = Device::Cpu;
        // Row i of the prefix case sees (7i mod 70) + 1 columns: ragged, never empty.
        let prefix: Vec<u32> = (0..70u32).map(|i| (i * 7) % 70 + 1).collect();
        let cases = [
            (Visibility::All, vec![70u32; 70]),
            (Visibility::Causal, (1..=70u32).collect::<Vec<_>>()),
            (
                Visibility::Prefix(std::sync::Arc::new(prefix.clone())),
                prefix,
            ),
        ];
        for (vis, seen) in cases {
            // 2 × 3 × 70 rows: more than one rayon task, rows not a multiple of ROWS_PER_TASK.
            let x = Var::from_tensor(&randn(1, 3.0, &[2, 3, 70, 70])?)?;
            let g = randn(2, 1.0, &[2, 3, 70, 70])?;
            let fused = softmax_visible(x.as_tensor(), vis.clone())?;
            // The composed reference: an explicit −∞ mask on the hidden columns.
            let m: Vec<f32> = (0..70 * 70)
                .map(|i| {
                    if (i % 70) as u32 >= seen[i / 70] {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
                .collect();
            let composed_in =
                x.as_tensor()
                    .broadcast_add(&Tensor::from_vec(m.clone(), (70, 70), &dev)?)?;
            let composed = candle_nn::ops::softmax(&composed_in, D::Minus1)?;
            let diff = (&fused - &composed)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(diff < 1e-6, "forward differs by {diff} ({vis:?})");
            // Hidden columns are exactly 0.
            let hidden = Tensor::from_vec(
                m.iter()
                    .map(|v| f32::from(u8::from(v.is_infinite())))
                    .collect::<Vec<_>>(),
                (70, 70),
                &dev,
            )?;
            let leak = fused
                .broadcast_mul(&hidden)?
                .abs()?
                .max_all()?
                .to_scalar::<f32>()?;
            assert_eq!(leak, 0.0, "masked columns must be exactly 0 ({vis:?})");
            let gf = (&fused * &g)?.sum_all()?.backward()?;
            let gc = (&composed * &g)?.sum_all()?.backward()?;
            let (gf, gc) = (
                gf.get(x.as_tensor()).expect("fused grad"),
                gc.get(x.as_tensor()).expect("composed grad"),
            );
            let diff = (gf - gc)?.abs()?.max_all()?.to_scalar::<f32>()?;
            let scale = gc.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(scale > 1e-3, "the test's gradients must not vanish");
            assert!(
                diff < 1e-5 * scale.max(1.0),
                "gradient differs by {diff} ({vis:?})"
            );
        }
        Ok(())
    }

    /// A fused loss and its composed reference agree in value (1e-5) and in the gradient of
    /// `Σ loss · up` with respect to `x` (relative 1e-5); returns the fused gradient.
    fn assert_same_loss(x: &Var, fused: &Tensor, composed: &Tensor, up: &Tensor) -> Result<Tensor> {
        let diff = (fused - composed)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff < 1e-5, "forward differs by {diff}");
        let gf = (fused * up)?.sum_all()?.backward()?;
        let gc = (composed * up)?.sum_all()?.backward()?;
        let (gf, gc) = (
            gf.get(x.as_tensor()).expect("fused grad"),
            gc.get(x.as_tensor()).expect("composed grad"),
        );
        let diff = (gf - gc)?.abs()?.max_all()?.to_scalar::<f32>()?;
        let scale = gc.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(scale > 1e-2, "the test's gradients must not vanish");
        assert!(diff < 1e-5 * scale.max(1.0), "gradient differs by {diff}");
        Ok(gf.clone())
    }

    /// Random logits, targets and weights (some 0): per-row values and the logits' gradient of
    /// the fused NLL against `log_softmax` + `gather` composed by candle.
    #[test]
    fn fused_nll_matches_composed_log_softmax() -> Result<()> {
        let dev = Device::Cpu;
        let (b, t, v) = (3, 5, 37);
        let x = Var::from_tensor(&randn(3, 2.0, &[b, t, v])?)?;
        let targets: Vec<u32> = (0..b * t).map(|i| ((i * 7 + 3) % v) as u32).collect();
        let weights: Vec<f32> = (0..b * t)
            .map(|i| {
                if i % 4 == 1 {
                    0.0
                } else {
                    0.5 + i as f32 * 0.1
                }
            })
            .collect();
        let fused = weighted_nll(x.as_tensor(), targets.clone(), weights.clone())?;
        assert_eq!(fused.dims(), &[b, t]);
        let tt = Tensor::from_vec(targets.clone(), (b, t, 1), &dev)?;
        let wt = Tensor::from_vec(weights.clone(), (b, t), &dev)?;
        let lsm = candle_nn::ops::log_softmax(x.as_tensor(), D::Minus1)?;
        let composed = (lsm.gather(&tt, D::Minus1)?.squeeze(D::Minus1)?.neg()? * &wt)?;
        // A non-uniform upstream gradient, so the per-row scale is exercised.
        let gf = assert_same_loss(&x, &fused, &composed, &randn(4, 1.0, &[b, t])?)?;
        // Rows of weight 0 get no gradient at all.
        let row1 = gf.i((0, 1))?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert_eq!(row1, 0.0);
        assert!(weighted_nll(x.as_tensor(), vec![v as u32; b * t], weights).is_err());
        // No rows: an empty result, not a panic.
        let empty = weighted_nll(&Tensor::zeros((0, t, v), DType::F32, &dev)?, vec![], vec![])?;
        assert_eq!(empty.dims(), &[0, t]);
        Ok(())
    }

    /// Soft targets (k classes per row, probabilities summing to 1, one padded entry of
    /// probability 0, a repeated class): values and gradient against candle's composed
    /// `−Σ_j p_j · log_softmax(x)[c_j]`, and the hard case as k = 1 with probability 1.
    #[test]
    fn soft_nll_matches_composed_log_softmax() -> Result<()> {
        let dev = Device::Cpu;
        let (rows, k, v) = (6, 3, 11);
        let x = Var::from_tensor(&randn(5, 2.0, &[rows, v])?)?;
        let mut classes = Vec::new();
        let mut probs = Vec::new();
        for r in 0..rows {
            let c = [
                (r * 3) % v,
                (r * 5 + 1) % v,
                if r == 2 { (r * 3) % v } else { 7 },
            ];
            let p = if r == 4 {
                [0.9, 0.1, 0.0]
            } else {
                [0.5, 0.3, 0.2]
            };
            classes.extend(c.iter().map(|&c| c as u32));
            probs.extend(p);
        }
        let weights: Vec<f32> = (0..rows).map(|r| 0.25 + r as f32 * 0.1).collect();
        let fused = weighted_soft_nll(
            x.as_tensor(),
            classes.clone(),
            Some(probs.clone()),
            weights.clone(),
        )?;
        let lsm = candle_nn::ops::log_softmax(x.as_tensor(), D::Minus1)?;
        let ct = Tensor::from_vec(classes.clone(), (rows, k), &dev)?;
        let pt = Tensor::from_vec(probs.clone(), (rows, k), &dev)?;
        let wt = Tensor::from_vec(weights.clone(), rows, &dev)?;
        let composed = ((lsm.gather(&ct, D::Minus1)? * &pt)?.sum(D::Minus1)?.neg()? * &wt)?;
        assert_same_loss(&x, &fused, &composed, &randn(6, 1.0, &[rows])?)?;
        // k = 1 with probability 1 is the hard loss.
        let hard_t: Vec<u32> = classes.iter().step_by(k).copied().collect();
        let hard = weighted_nll(x.as_tensor(), hard_t.clone(), weights.clone())?;
        let one = weighted_soft_nll(x.as_tensor(), hard_t, Some(vec![1.0; rows]), weights)?;
        let diff = (hard - one)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert_eq!(diff, 0.0);
        // Mismatched lengths are errors, not panics.
        assert!(weighted_soft_nll(
            x.as_tensor(),
            classes.clone(),
            Some(vec![1.0; 2]),
            vec![1.0; rows]
        )
        .is_err());
        assert!(weighted_soft_nll(x.as_tensor(), classes, None, vec![1.0; rows]).is_err());
        Ok(())
    }
}
