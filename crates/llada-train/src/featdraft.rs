//! Training a feature drafter's head (`llada_decode::speculative::featdraft`): given the
//! target's final feature `f_t` at a position and the token `x_{t+1}` read next, predict the
//! target's feature one position later and, through the target's own (tied) embedding rows of
//! a reduced vocabulary, its next argmax:
//!
//! ```text
//! f̂  = f_t + silu([f_t ; e(x_{t+1})] · W₁ + b₁) · W₂ + b₂
//! loss = CE(f̂ · E_Kᵀ, y_{t+1}) + λ · mean((f̂ − f_{t+1})²)
//! ```
//!
//! `W₂` starts at zero, so training starts from "the next feature is this one". AdamW with a
//! cosine schedule over mini-batches drawn without replacement, seeded.

use anyhow::{ensure, Result};
use candle_core::{DType, Device, Tensor, Var, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// Training examples, one per (window, position): `inputs` row `i` is `[f_t ; e(x_{t+1})]`
/// (`2d`), `next` row `i` is `f_{t+1}` (`d`), `label[i]` the index of `y_{t+1}` in the head's
/// reduced vocabulary.
pub struct FeatureData {
    pub d: usize,
    pub inputs: Vec<f32>,
    pub next: Vec<f32>,
    pub label: Vec<u32>,
}

impl FeatureData {
    pub fn len(&self) -> usize {
        self.label.len()
    }
    pub fn is_empty(&self) -> bool {
        self.label.is_empty()
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
    pub seed: u64,
}

/// Trained weights, in the layouts of `FeatureHead` (`w1`: `H × 2d`, `w2`: `H × d`).
pub struct FittedHead {
    pub hidden: usize,
    pub w1: Vec<f32>,
    pub b1: Vec<f32>,
    pub w2: Vec<f32>,
    pub b2: Vec<f32>,
}

/// The per-batch loss of the head on `(inputs, next, label)`; `rows` is `E_K` (`K × d`).
#[allow(clippy::too_many_arguments)]
fn loss(
    w1: &Tensor,
    b1: &Tensor,
    w2: &Tensor,
    b2: &Tensor,
    rows_t: &Tensor,
    z: &Tensor,
    next: &Tensor,
    label: &Tensor,
    d: usize,
    feature_weight: f64,
) -> Result<(Tensor, Tensor)> {
    let f = z.narrow(1, 0, d)?;
    let a = z.matmul(w1)?.broadcast_add(b1)?;
    let fh = (f + candle_nn::ops::silu(&a)?.matmul(w2)?.broadcast_add(b2)?)?;
    let logits = fh.matmul(rows_t)?;
    let m = logits.max_keepdim(D::Minus1)?;
    let lse = (logits
        .broadcast_sub(&m)?
        .exp()?
        .sum_keepdim(D::Minus1)?
        .log()?
        + &m)?;
    let picked = logits.gather(label, D::Minus1)?;
    let ce = (lse - picked)?.mean_all()?;
    let mse = (fh - next)?.sqr()?.mean_all()?;
    let total = (&ce + (mse * feature_weight)?)?;
    Ok((total, ce))
}

/// Train the head. `rows`: `E_K`, the target's embedding rows of the reduced vocabulary
/// (`K × d`). `progress(step, steps, ce)` is called every 50 steps.
pub fn fit(
    data: &FeatureData,
    rows: &[f32],
    opts: &FitOptions,
    mut progress: impl FnMut(usize, usize, f32),
) -> Result<FittedHead> {
    let d = data.d;
    let n = data.len();
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
    let std1 = (1.0 / (2.0 * d as f64)).sqrt();
    // Uniform with the standard deviation of a 1/sqrt(fan-in) normal.
    let a1 = (std1 * 3f64.sqrt()) as f32;
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
    let mut order: Vec<usize> = (0..n).collect();
    let per_epoch = n / opts.batch;
    for step in 0..steps {
        if step % per_epoch == 0 {
            order.shuffle(&mut rng);
        }
        let b0 = (step % per_epoch) * opts.batch;
        let idx = &order[b0..b0 + opts.batch];
        let mut z = Vec::with_capacity(idx.len() * 2 * d);
        let mut nx = Vec::with_capacity(idx.len() * d);
        let mut lb = Vec::with_capacity(idx.len());
        for &i in idx {
            z.extend_from_slice(&data.inputs[i * 2 * d..(i + 1) * 2 * d]);
            nx.extend_from_slice(&data.next[i * d..(i + 1) * d]);
            lb.push(data.label[i]);
        }
        let b = idx.len();
        let z = Tensor::from_vec(z, (b, 2 * d), &dev)?;
        let nx = Tensor::from_vec(nx, (b, d), &dev)?;
        let lb = Tensor::from_vec(lb, (b, 1), &dev)?;
        let (total, ce) = loss(
            w1.as_tensor(),
            b1.as_tensor(),
            w2.as_tensor(),
            b2.as_tensor(),
            &rows_t,
            &z,
            &nx,
            &lb,
            d,
            opts.feature_weight,
        )?;
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

/// Mean cross-entropy of the head (as [`fit`] trains it) on `data` — for tests and reports.
pub fn mean_ce(head: &FittedHead, data: &FeatureData, rows: &[f32]) -> Result<f32> {
    let d = data.d;
    let dev = Device::Cpu;
    let k = rows.len() / d;
    let w1 = Tensor::from_slice(&head.w1, (head.hidden, 2 * d), &dev)?.t()?;
    let b1 = Tensor::from_slice(&head.b1, head.hidden, &dev)?;
    let w2 = Tensor::from_slice(&head.w2, (head.hidden, d), &dev)?;
    let b2 = Tensor::from_slice(&head.b2, d, &dev)?;
    let rows_t = Tensor::from_slice(rows, (k, d), &dev)?.t()?;
    let n = data.len();
    let z = Tensor::from_slice(&data.inputs, (n, 2 * d), &dev)?;
    let nx = Tensor::from_slice(&data.next, (n, d), &dev)?;
    let lb = Tensor::from_slice(&data.label, (n, 1), &dev)?;
    let (_, ce) = loss(&w1, &b1, &w2, &b2, &rows_t, &z, &nx, &lb, d, 0.0)?;
    Ok(ce.to_scalar::<f32>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A learnable toy: the label is the argmax of a fixed linear map of the input; a few
    /// epochs must lower the cross-entropy well below its start (uniform over K).
    #[test]
    fn fitting_lowers_the_loss() {
        let (d, k, n) = (8usize, 6usize, 512usize);
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        use rand::Rng;
        let rows: Vec<f32> = (0..k * d).map(|_| rng.random_range(-1.0..1.0)).collect();
        let mut data = FeatureData {
            d,
            inputs: vec![],
            next: vec![],
            label: vec![],
        };
        for _ in 0..n {
            let z: Vec<f32> = (0..2 * d).map(|_| rng.random_range(-1.0..1.0)).collect();
            // Target feature: the sum of the two halves; label: its best row.
            let f: Vec<f32> = (0..d).map(|i| z[i] + z[d + i]).collect();
            let best = (0..k)
                .max_by(|&a, &b| {
                    let s = |r: usize| (0..d).map(|i| rows[r * d + i] * f[i]).sum::<f32>();
                    s(a).total_cmp(&s(b))
                })
                .unwrap_or(0);
            data.inputs.extend(&z);
            data.next.extend(&f);
            data.label.push(best as u32);
        }
        let zero = FittedHead {
            hidden: 16,
            w1: vec![0.0; 16 * 2 * d],
            b1: vec![0.0; 16],
            w2: vec![0.0; 16 * d],
            b2: vec![0.0; d],
        };
        let before = mean_ce(&zero, &data, &rows).unwrap();
        let opts = FitOptions {
            hidden: 16,
            epochs: 30.0,
            batch: 32,
            lr: 1e-2,
            feature_weight: 0.1,
            seed: 1,
        };
        let fitted = fit(&data, &rows, &opts, |_, _, _| {}).unwrap();
        let after = mean_ce(&fitted, &data, &rows).unwrap();
        assert!(after < 0.6 * before, "ce {before} -> {after}");
        // Deterministic for a seed.
        let again = fit(&data, &rows, &opts, |_, _, _| {}).unwrap();
        assert_eq!(fitted.w2, again.w2);
    }
}
