//! The portable kernel: scalar Rust computing the same integer sums as the SIMD kernels from the
//! same packed layout, one block at a time. It runs where no SIMD kernel does (neither x86-64
//! with AVX2 nor aarch64) and is the reference the SIMD kernels are tested against. Every kind
//! goes through one formula ([`super::matrix::BlockTerms`]).

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
                let t = w.block(row, b, &mut q);
                // Σ_h sc_h·(Σ q·x − bias·Σx) and Σ_h mn_h·Σx over the block's two halves.
                let (mut main, mut offs) = (0i32, 0i32);
                for h in 0..2 {
                    let dot: i32 = (16 * h..16 * h + 16).map(|l| q[l] * x.q(i, b, l)).sum();
                    let xs = x.half_sum(i, b, h);
                    main += t.sc[h] * (dot - t.bias * xs);
                    offs += t.mn[h] * xs;
                }
                let dx = x.d[i * x.nbp + b];
                acc += t.a * dx * main as f32 + t.off * dx * offs as f32;
            }
            *out.add(i * w.rows + n) = acc;
        }
    }
}
