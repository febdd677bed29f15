//! Training a feature drafter's head (`llada_decode::speculative::featdraft`): given the
//! target's final feature `f_t` at a position and the token `x_{t+1}` read next, predict the
//! target's feature one position later and, through the target's own (tied) embedding rows of
//! a reduced vocabulary, its next argmax:
//!
//! ```text
//! f̂_{t+1} = f_t + silu([f_t ; e(x_{t+1})] · W₁ + b₁) · W₂ + b₂
//! loss_u  = CE(f̂_{t+1+u} · E_Kᵀ, y_{t+1+u}) + λ · mean((f̂_{t+1+u} − f_{t+1+u})²)
//! ```
//!
//! With `unroll` U > 1 the head is applied U times in a row, from step 2 on to its *own*
//! prediction (`f̂_{t+1}` instead of `f_{t+1}`, the gradient flowing through it) — what the
//! drafter does below the first level of a tree — and the loss is the mean over the U steps.
//! `W₂` starts at zero, so training starts from "the next feature is this one". AdamW with a
//! cosine schedule over mini-batches drawn without replacement, seeded.

use anyhow::{ensure, Result};
use candle_core::{DType, Device, Tensor, Var, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// The target's features over windows of `window` positions, row `i` of each array being
/// position `i % window` of window `i / window`.
pub struct FeatureData {
    pub d: usize,
    pub window: usize,
    /// `f`, the target's final feature at each position (`d` each).
    pub feats: Vec<f32>,
    /// `e(x)`, the target's embedding row of the token at each position (`d` each).
    pub embeds: Vec<f32>,
    /// Index of the target's argmax at each position in the head's reduced vocabulary
    /// (`u32::MAX`: outside it; such a step has no cross-entropy term).
    pub labels: Vec<u32>,
}

impl FeatureData {
    /// Positions.
    pub fn len(&self) -> usize {
        self.labels.len()
    }
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
    /// Start positions `t` with `unroll` steps inside their window (`t + unroll < window`).
    fn starts(&self, unroll: usize) -> Vec<usize> {
        (0..self.len())
            .filter(|&i| i % self.window + unroll < self.window)
            .collect()
    }
}

/// Options of [`fit`].
#[derive(Debug, Clone)]
pub struct FitOptions {
    pub hidden: usize,
    pub epochs: f64,
    pub batch: usize,
    pub lr: f64,
    /// Weight of the feature regression term.
    pub feature_weight: f64,
    /// Steps the head is applied in a row (1: always from the target's feature).
    pub unroll: usize,
    pub seed: u64,
}

/// Trained weights, in the layouts of `FeatureHead` (`w1`: `H × 2d`, `w2`: `H × d`).
#[derive(Debug, Clone)]
pub struct FittedHead {
    pub hidden: usize,
    pub w1: Vec<f32>,
    pub b1: Vec<f32>,
    pub w2: Vec<f32>,
    pub b2: Vec<f32>,
}

/// The head's parameters as tensors (`w1`: `2d × H`, `w2`: `H × d`).
struct Params<'a> {
    w1: &'a Tensor,
    b1: &'a Tensor,
    w2: &'a Tensor,
    b2: &'a Tensor,
    rows_t: &'a Tensor,
}

/// One batch: for each of `starts`, the unrolled steps' inputs and targets.
struct Batch {
    f0: Tensor,
    embeds: Vec<Tensor>,
    next: Vec<Tensor>,
    labels: Vec<Tensor>,
    weights: Vec<Tensor>,
}

fn batch(data: &FeatureData, starts: &[usize], unroll: usize, dev: &Device) -> Result<Batch> {
    let (d, b) = (data.d, starts.len());
    let rows = |off: usize, src: &[f32]| -> Result<Tensor> {
        let mut v = Vec::with_capacity(b * d);
        for &i in starts {
            v.extend_from_slice(&src[(i + off) * d..(i + off + 1) * d]);
        }
        Ok(Tensor::from_vec(v, (b, d), dev)?)
    };
    let f0 = rows(0, &data.feats)?;
    let (mut embeds, mut next, mut labels, mut weights) = (vec![], vec![], vec![], vec![]);
    for u in 1..=unroll {
        embeds.push(rows(u, &data.embeds)?);
        next.push(rows(u, &data.feats)?);
        let lab: Vec<u32> = starts.iter().map(|&i| data.labels[i + u]).collect();
        let w: Vec<f32> = lab.iter().map(|&l| f32::from(l != u32::MAX)).collect();
        let lab: Vec<u32> = lab
            .into_iter()
            .map(|l| if l == u32::MAX { 0 } else { l })
            .collect();
        labels.push(Tensor::from_vec(lab, (b, 1), dev)?);
        weights.push(Tensor::from_vec(w, (b, 1), dev)?);
    }
    Ok(Batch {
        f0,
        embeds,
        next,
        labels,
        weights,
    })
}

/// Mean loss of a batch over its unrolled steps: (total, cross-entropy of the first step).
fn loss(p: &Params, bt: &Batch, feature_weight: f64) -> Result<(Tensor, Tensor)> {
    let mut f = bt.f0.clone();
    let mut total: Option<Tensor> = None;
    let mut first_ce = None;
    let steps = bt.embeds.len();
    for u in 0..steps {
        let z = Tensor::cat(&[&f, &bt.embeds[u]], 1)?;
        let a = z.matmul(p.w1)?.broadcast_add(p.b1)?;
        let fh = (&f
            + candle_nn::ops::silu(&a)?
                .matmul(p.w2)?
                .broadcast_add(p.b2)?)?;
        let logits = fh.matmul(p.rows_t)?;
        let m = logits.max_keepdim(D::Minus1)?;
        let lse = (logits
            .broadcast_sub(&m)?
            .exp()?
            .sum_keepdim(D::Minus1)?
            .log()?
            + &m)?;
        let picked = logits.gather(&bt.labels[u], D::Minus1)?;
        let w = &bt.weights[u];
        let n = w.sum_all()?.maximum(1.0)?;
        let ce = ((lse - picked)? * w)?.sum_all()?.div(&n)?;
        let mse = (&fh - &bt.next[u])?.sqr()?.mean_all()?;
        let l = (&ce + (mse * feature_weight)?)?;
        total = Some(match total {
            None => l,
            Some(t) => (t + l)?,
        });
        if first_ce.is_none() {
            first_ce = Some(ce);
        }
        f = fh;
    }
    let total = total.ok_or_else(|| anyhow::anyhow!("no unrolled step"))?;
    let ce = first_ce.ok_or_else(|| anyhow::anyhow!("no unrolled step"))?;
    Ok(((total / steps as f64)?, ce))
}

/// Train the head. `rows`: `E_K`, the target's embedding rows of the reduced vocabulary
/// (`K × d`). `progress(step, steps, ce)` is called every 50 steps with the first step's
/// cross-entropy.
pub fn fit(
    data: &FeatureData,
    rows: &[f32],
    opts: &FitOptions,
    mut progress: impl FnMut(usize, usize, f32),
) -> Result<FittedHead> {
    let d = data.d;
    let unroll = opts.unroll.max(1);
    let mut order = data.starts(unroll);
    let n = order.len();
    ensure!(
        n >= opts.batch && opts.batch > 0,
        "{n} examples for a batch of {}",
        opts.batch
    );
    ensure!(
        rows.len().is_multiple_of(d) && !rows.is_empty(),
        "bad embedding rows"
    );
    let k = rows.len() / d;
    let dev = Device::Cpu;
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed);
    let h = opts.hidden;
    // Uniform with the standard deviation of a 1/sqrt(fan-in) normal.
    let a1 = ((1.0 / (2.0 * d as f64)).sqrt() * 3f64.sqrt()) as f32;
    let w1_init: Vec<f32> = {
        use rand::Rng;
        (0..2 * d * h).map(|_| rng.random_range(-a1..a1)).collect()
    };
    let w1 = Var::from_tensor(&Tensor::from_vec(w1_init, (2 * d, h), &dev)?)?;
    let b1 = Var::zeros(h, DType::F32, &dev)?;
    let w2 = Var::zeros((h, d), DType::F32, &dev)?;
    let b2 = Var::zeros(d, DType::F32, &dev)?;
    let rows_t = Tensor::from_slice(rows, (k, d), &dev)?.t()?.contiguous()?;
    let steps = ((opts.epochs * n as f64) / opts.batch as f64)
        .ceil()
        .max(1.0) as usize;
    let mut opt = AdamW::new(
        vec![w1.clone(), b1.clone(), w2.clone(), b2.clone()],
        ParamsAdamW {
            lr: opts.lr,
            weight_decay: 0.0,
            ..Default::default()
        },
    )?;
    let per_epoch = n / opts.batch;
    for step in 0..steps {
        if step % per_epoch == 0 {
            order.shuffle(&mut rng);
        }
        let b0 = (step % per_epoch) * opts.batch;
        let bt = batch(data, &order[b0..b0 + opts.batch], unroll, &dev)?;
        let p = Params {
            w1: w1.as_tensor(),
            b1: b1.as_tensor(),
            w2: w2.as_tensor(),
            b2: b2.as_tensor(),
            rows_t: &rows_t,
        };
        let (total, ce) = loss(&p, &bt, opts.feature_weight)?;
        let frac = step as f64 / steps as f64;
        opt.set_learning_rate(opts.lr * 0.5 * (1.0 + (std::f64::consts::PI * frac).cos()));
        opt.backward_step(&total)?;
        if step % 50 == 0 || step + 1 == steps {
            progress(step + 1, steps, ce.to_scalar::<f32>()?);
        }
    }
    let w1t = w1.as_tensor().t()?.contiguous()?; // H × 2d
    Ok(FittedHead {
        hidden: h,
        w1: w1t.flatten_all()?.to_vec1()?,
        b1: b1.as_tensor().to_vec1()?,
        w2: w2.as_tensor().flatten_all()?.to_vec1()?,
        b2: b2.as_tensor().to_vec1()?,
    })
}

/// Mean cross-entropy of the head's first step (as [`fit`] trains it) over every position of
/// `data` that has a next one — for tests and reports.
pub fn mean_ce(head: &FittedHead, data: &FeatureData, rows: &[f32]) -> Result<f32> {
    let d = data.d;
    let dev = Device::Cpu;
    let k = rows.len() / d;
    let w1 = Tensor::from_slice(&head.w1, (head.hidden, 2 * d), &dev)?.t()?;
    let b1 = Tensor::from_slice(&head.b1, head.hidden, &dev)?;
    let w2 = Tensor::from_slice(&head.w2, (head.hidden, d), &dev)?;
    let b2 = Tensor::from_slice(&head.b2, d, &dev)?;
    let rows_t = Tensor::from_slice(rows, (k, d), &dev)?.t()?;
    let p = Params {
        w1: &w1,
        b1: &b1,
        w2: &w2,
        b2: &b2,
        rows_t: &rows_t,
    };
    let bt = batch(data, &data.starts(1), 1, &dev)?;
    let (_, ce) = loss(&p, &bt, 0.0)?;
    Ok(ce.to_scalar::<f32>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A learnable toy: windows where each next feature is a fixed function of the current
    /// one and the next token's embedding, and each label the best of K rows for it. Fitting
    /// must lower the cross-entropy well below its start, with and without unrolling, and be
    /// deterministic for a seed.
    #[test]
    fn fitting_lowers_the_loss() {
        use rand::Rng;
        let (d, k, windows, t) = (8usize, 6usize, 64usize, 8usize);
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let rows: Vec<f32> = (0..k * d).map(|_| rng.random_range(-1.0..1.0)).collect();
        let best = |f: &[f32]| -> u32 {
            let s = |r: usize| (0..d).map(|i| rows[r * d + i] * f[i]).sum::<f32>();
            (0..k).max_by(|&a, &b| s(a).total_cmp(&s(b))).unwrap_or(0) as u32
        };
        let mut data = FeatureData {
            d,
            window: t,
            feats: vec![],
            embeds: vec![],
            labels: vec![],
        };
        for _ in 0..windows {
            let mut f: Vec<f32> = (0..d).map(|_| rng.random_range(-1.0..1.0)).collect();
            for pos in 0..t {
                let e: Vec<f32> = (0..d).map(|_| rng.random_range(-1.0..1.0)).collect();
                if pos > 0 {
                    f = f.iter().zip(&e).map(|(a, b)| 0.5 * a + b).collect();
                }
                data.feats.extend(&f);
                data.embeds.extend(&e);
                data.labels.push(best(&f));
            }
        }
        let zero = FittedHead {
            hidden: 16,
            w1: vec![0.0; 16 * 2 * d],
            b1: vec![0.0; 16],
            w2: vec![0.0; 16 * d],
            b2: vec![0.0; d],
        };
        let before = mean_ce(&zero, &data, &rows).unwrap();
        for unroll in [1, 2] {
            let opts = FitOptions {
                hidden: 16,
                epochs: 30.0,
                batch: 32,
                lr: 1e-2,
                feature_weight: 0.1,
                unroll,
                seed: 1,
            };
            let fitted = fit(&data, &rows, &opts, |_, _, _| {}).unwrap();
            let after = mean_ce(&fitted, &data, &rows).unwrap();
            assert!(
                after < 0.6 * before,
                "unroll {unroll}: ce {before} -> {after}"
            );
            let again = fit(&data, &rows, &opts, |_, _, _| {}).unwrap();
            assert_eq!(fitted.w2, again.w2);
        }
    }
}
