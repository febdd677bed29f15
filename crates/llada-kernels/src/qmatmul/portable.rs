//! The portable kernel: scalar Rust computing the same integer sums as the SIMD kernels from the
//! same packed layout, one block at a time. It runs where no SIMD kernel does (NEON is not
//! written yet) and is the reference the SIMD kernels are tested against.

use super::acts::QuantizedActs;
use super::matrix::QMatrix;

/// Portable path: the same integer sums, one block at a time.
pub(super) unsafe fn portable_range(
    w: &QMatrix,
    x: &QuantizedActs,
    n0: usize,
    n1: usize,
    out: *mut f32,
) {
    let mut q = [0i32; 32];
    for n in n0..n1 {
        let row = w.row(n);
        for i in 0..x.m {
            let mut acc = 0f32;
            for b in 0..w.nb {
                let (scale, offset) = w.block(row, b, &mut q);
                let dot: i32 = (0..32).map(|l| q[l] * x.q(i, b, l)).sum();
                acc += scale * x.d[i * x.nbp + b] * dot as f32 + offset * x.s[i * x.nbp + b];
            }
            *out.add(i * w.rows + n) = acc;
        }
    }
}
