//! Row-wise numeric primitives of the pass: RMSNorm over chosen rows and rotate-half RoPE.
//!
//! Invariants: RMSNorm accumulates the sum of squares in f64 and scales in f64 before the
//! f32 gain; RoPE angles are computed in f64 and stored as f32 tables, one `head_dim / 2` row
//! per batch row. Changing either changes every logit bit.

use crate::ModelConfig;
use llada_runtime::trace::OpSpan;

/// RMSNorm of rows `rows` of `x` (`w.len()` wide) with gain `w`, in the order given.
pub(super) fn rmsnorm(x: &[f32], w: &[f32], eps: f64, rows: &[usize], layer: i32) -> Vec<f32> {
    let d = w.len();
    let _s = OpSpan::begin("rmsnorm", layer, &[rows.len() as u64, d as u64], "F32").cost(
        (rows.len() * d * 4 + d * 4) as u64,
        (rows.len() * d * 4) as u64,
        (rows.len() * d * 3) as u64,
    );
    let mut out = vec![0f32; rows.len() * d];
    for (o, &r) in out.chunks_exact_mut(d).zip(rows) {
        let xr = &x[r * d..(r + 1) * d];
        let ss: f64 = xr.iter().map(|v| (*v as f64) * (*v as f64)).sum();
        let inv = 1.0 / ((ss / d as f64) + eps).sqrt();
        for ((o, v), g) in o.iter_mut().zip(xr).zip(w) {
            *o = ((*v as f64) * inv) as f32 * g;
        }
    }
    out
}

/// Rotate-half RoPE (HF layout) on `n` rows of `heads` heads, in place.
pub(super) fn rope(x: &mut [f32], heads: usize, hd: usize, cos: &[f32], sin: &[f32]) {
    let half = hd / 2;
    for (r, row) in x.chunks_exact_mut(heads * hd).enumerate() {
        let (c, s) = (
            &cos[r * half..(r + 1) * half],
            &sin[r * half..(r + 1) * half],
        );
        for h in row.chunks_exact_mut(hd) {
            let (a, b) = h.split_at_mut(half);
            for i in 0..half {
                let (x1, x2) = (a[i], b[i]);
                a[i] = x1 * c[i] - x2 * s[i];
                b[i] = x2 * c[i] + x1 * s[i];
            }
        }
    }
}

/// RoPE `(cos, sin)` tables for the batch positions (angles in f64), `head_dim / 2` per row.
pub(super) fn rope_tables(positions: &[u32], c: &ModelConfig) -> (Vec<f32>, Vec<f32>) {
    let hd = c.head_dim;
    let half = hd / 2;
    let n = positions.len();
    let mut cos = vec![0f32; n * half];
    let mut sin = vec![0f32; n * half];
    for (r, &p) in positions.iter().enumerate() {
        for i in 0..half {
            let inv = c.rope_theta.powf(-2.0 * i as f64 / hd as f64);
            let a = p as f64 * inv;
            cos[r * half + i] = a.cos() as f32;
            sin[r * half + i] = a.sin() as f32;
        }
    }
    (cos, sin)
}
