//! Batched quantized matmul: `Y[M×N] = X[M×K] · W[N×K]ᵀ` with `W` quantized.
//!
//! Scheme (llama.cpp's arithmetic, our own layout and blocking):
//! 1. At load, weights are **repacked** from GGML's array-of-blocks into a per-row
//!    structure-of-arrays: the 4- or 8-bit values of the whole row, then the block scales (and
//!    offsets) as contiguous arrays. Scales of 8 blocks then convert/load with one instruction
//!    and the offset term of 8 blocks is one FMA. Q4_0, Q4_1 and Q4_K all become "4-bit values
//!    `w = d·q + m` per 32-element block" (Q4_K's per-sub-block scale and min are exact in f32);
//!    Q8_0 keeps signed 8-bit values with f16 scales. Repacking keeps the bytes per block.
//! 2. The activations are quantized once per call to 8-bit blocks of 32 ([`QuantizedActs`]),
//!    in the byte order the weight layout wants (4-bit kernels process two blocks per 256-bit
//!    register: low nibbles hold elements 0–15 of both blocks, high nibbles 16–31).
//! 3. Register tiles of `NR` weight rows × `MR` activation rows: each weight block that is
//!    loaded and unpacked serves `MR` activation rows — this is what makes the kernel scale with M
//!    (candle-core 0.11's quantized matmul does not: ≈ 20 GFLOP/s at every M on our 2-core
//!    machine, where llama.cpp reaches ≈ 98 at M = 32).
//! 4. The N dimension is split across the current rayon pool (the lane's threads).
//!
//! x86-64 with AVX2+FMA+F16C uses `_mm256_maddubs_epi16` (AVX-512 VNNI `vpdpbusd` where
//! present), aarch64 NEON (`sdot` where the CPU has the dot-product extension); elsewhere a
//! portable scalar path computes the same sums from the same layout.
//!
//! Files, lower layers first (none imports a higher one):
//! * [`weight_memory`], [`recycle`], `buffers`: memory holding weight bytes — counters, the
//!   arena pool, and the buffers built on them ([`WeightBuf`], [`StagingBytes`]);
//! * `isa`: run-time CPU feature detection and the process-wide choice of [`Isa`];
//! * `repack`: the packed row layout; `matrix`: [`QMatrix`], built from GGML bytes in that
//!   layout; `acts`: [`QuantizedActs`];
//! * `portable`, `x86::*`, `arm::*`: the kernels;
//! * this file: the public API and the dispatch (threads, then the kernel of the chosen ISA).

mod acts;
#[cfg(target_arch = "aarch64")]
mod arm;
mod buffers;
mod isa;
mod matrix;
mod portable;
pub mod recycle;
mod repack;
#[cfg(test)]
mod tests;
pub mod weight_memory;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use acts::{ActLayout, QuantizedActs};
pub use buffers::{StagingBytes, WeightBuf};
pub use isa::{best_isa, default_isa, isa, isa_reason, set_isa, Isa};
pub use matrix::{ByteOwner, QMatrix, QMatrixError};

use crate::dequant::dequantize;
use crate::types::GgmlType;
use portable::portable_range;
use rayon::prelude::*;
#[cfg(target_arch = "x86_64")]
use repack::Kind;
#[cfg(target_arch = "x86_64")]
use x86::{avx2, avx512};

/// The plane kernel of kind `k` (Q5_0, Q5_1, K-quants) from `module` (`x86::planes`, AVX2, or
/// `x86::planes512`, AVX-512 VNNI): its `range` takes the kind as a const parameter.
#[cfg(target_arch = "x86_64")]
macro_rules! plane_range {
    ($module:path, $k:expr, $w:expr, $x:expr, $n0:expr, $n1:expr, $out:expr) => {{
        use $module as m;
        match $k {
            Kind::Q5D16 => m::range::<{ Kind::Q5D16 as u8 }>($w, $x, $n0, $n1, $out),
            Kind::Q5DM16 => m::range::<{ Kind::Q5DM16 as u8 }>($w, $x, $n0, $n1, $out),
            Kind::K4 => m::range::<{ Kind::K4 as u8 }>($w, $x, $n0, $n1, $out),
            Kind::K5 => m::range::<{ Kind::K5 as u8 }>($w, $x, $n0, $n1, $out),
            Kind::K6 => m::range::<{ Kind::K6 as u8 }>($w, $x, $n0, $n1, $out),
            Kind::K3 => m::range::<{ Kind::K3 as u8 }>($w, $x, $n0, $n1, $out),
            Kind::K2 => m::range::<{ Kind::K2 as u8 }>($w, $x, $n0, $n1, $out),
            Kind::Q4D16 | Kind::Q4DM16 | Kind::Q8D16 => unreachable!("not a plane kind"),
        }
    }};
}

impl QMatrix {
    /// The activation layout this matrix's kernel reads.
    pub fn act_layout(&self) -> ActLayout {
        if self.kind.is_q4() {
            ActLayout::Paired
        } else {
            ActLayout::Plain
        }
    }

    /// `out[M×rows] = x[M×cols] · selfᵀ`.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) {
        let acts = QuantizedActs::quantize(x, m, self.cols, self.act_layout());
        self.matmul_q(&acts, out)
    }

    /// Same as [`QMatrix::matmul`] with activations already quantized (share them across the
    /// matrices that read the same input and want the same layout).
    pub fn matmul_q(&self, x: &QuantizedActs, out: &mut [f32]) {
        assert_eq!(x.k, self.cols, "matmul: inner dimensions differ");
        assert_eq!(
            x.layout,
            self.act_layout(),
            "matmul: activation layout mismatch"
        );
        assert_eq!(
            out.len(),
            x.m * self.rows,
            "matmul: output has the wrong size"
        );
        let n = self.rows;
        let threads = rayon::current_num_threads().max(1);
        let work = x.m * n * self.cols;
        // Few tasks per thread for load balance; each a whole number of 4-row tiles.
        let chunk = n.div_ceil(threads * 3).next_multiple_of(4).max(4);
        let out_ptr = SendPtr(out.as_mut_ptr());
        let run = |c0: usize| {
            let c1 = (c0 + chunk).min(n);
            // SAFETY: chunks write disjoint column ranges [c0, c1) of `out`.
            unsafe { self.range(x, c0, c1, out_ptr) };
        };
        if threads == 1 || work < 1 << 15 {
            run_serial(n, chunk, run);
        } else {
            (0..n.div_ceil(chunk))
                .into_par_iter()
                .for_each(|i| run(i * chunk));
        }
    }

    /// Output columns `[n0, n1)` for all activation rows.
    ///
    /// # Safety
    /// `out` points to an `x.m × self.rows` buffer; no other thread writes columns `[n0, n1)`.
    unsafe fn range(&self, x: &QuantizedActs, n0: usize, n1: usize, out: SendPtr) {
        self.range_on(isa(), x, n0, n1, out)
    }

    /// [`Self::range`] on `isa`, which the CPU must support ([`best_isa`] or a lesser one).
    ///
    /// # Safety
    /// As [`Self::range`].
    unsafe fn range_on(&self, isa: Isa, x: &QuantizedActs, n0: usize, n1: usize, out: SendPtr) {
        #[cfg(target_arch = "x86_64")]
        {
            match isa {
                Isa::Avx512Vnni => {
                    match self.kind {
                        Kind::Q4D16 => avx512::range4::<0>(self, x, n0, n1, out.0),
                        Kind::Q4DM16 => avx512::range4::<1>(self, x, n0, n1, out.0),
                        Kind::Q8D16 => avx512::range8(self, x, n0, n1, out.0),
                        k => plane_range!(x86::planes512, k, self, x, n0, n1, out.0),
                    }
                    return;
                }
                Isa::Avx2 => {
                    match self.kind {
                        Kind::Q4D16 => avx2::range4::<0>(self, x, n0, n1, out.0),
                        Kind::Q4DM16 => avx2::range4::<1>(self, x, n0, n1, out.0),
                        Kind::Q8D16 => avx2::range8(self, x, n0, n1, out.0),
                        k => plane_range!(x86::planes, k, self, x, n0, n1, out.0),
                    }
                    return;
                }
                Isa::NeonDot | Isa::Neon | Isa::Portable => {}
            }
        }
        #[cfg(target_arch = "aarch64")]
        if let Some(kernel) = arm::kernel(self.kind, isa) {
            return kernel(self, x, n0, n1, out.0);
        }
        portable_range(self, x, n0, n1, out.0)
    }
}

fn run_serial(n: usize, chunk: usize, run: impl Fn(usize)) {
    (0..n).step_by(chunk).for_each(run)
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

/// Plain f32 matmul `out[M×N] = x[M×K] · w[N×K]ᵀ` (reference for tests).
pub fn matmul_f32(x: &[f32], m: usize, k: usize, w: &[f32], n: usize, out: &mut [f32]) {
    assert_eq!(x.len(), m * k);
    assert_eq!(w.len(), n * k);
    assert_eq!(out.len(), m * n);
    for i in 0..m {
        let xr = &x[i * k..(i + 1) * k];
        for j in 0..n {
            let wr = &w[j * k..(j + 1) * k];
            out[i * n + j] = xr.iter().zip(wr).map(|(a, b)| a * b).sum();
        }
    }
}

/// Dequantize a GGML-layout row (re-exported for callers that hold raw bytes).
pub fn dequantize_raw(ty: GgmlType, src: &[u8], out: &mut [f32]) {
    dequantize(ty, src, out)
}
