//! NEON kernels for Q4_0, Q4_1 (4-bit values, `T` = 0 / 1 as in the x86 kernels) and Q8_0.
//!
//! Per block of 32 the integer dot product `Σ q_w·q_x` is computed by a [`Dot`]: [`Sdot`]
//! (`sdot`, the dot-product extension) or [`Mull`] (`smull`/`smlal` + `sadalp`, plain NEON).
//! 4-bit values stay unsigned (0..15 fits `i8`), as in the x86 kernels: the offset (Q4_0's −8·d,
//! Q4_1's m) is the per-block term `m_w · s_x` with `s_x = d_x·Σq_x`. Each block's four partial
//! sums are reduced with `addp` to its exact integer sum, four blocks to one vector, before the
//! conversion to f32: one `scvtf` and one FMA per four blocks and (weight row, activation row),
//! and the same floats in the same order for both [`Dot`]s.
//!
//! Stable Rust has no `vdotq_s32` yet (`stdarch_neon_dotprod`) nor f16 vector types, so `sdot`
//! and the f16 → f32 conversion (`fcvtl`, baseline NEON) are inline assembly. The tiles are
//! `#[inline(always)]` generics compiled into the `range*` entry points, whose
//! `#[target_feature]` set they take (`sdot` assembles only inside a `dotprod` function).

use super::{drive, Tile};
use crate::qmatmul::acts::QuantizedActs;
use crate::qmatmul::matrix::QMatrix;
use std::arch::aarch64::*;
use std::arch::asm;
use std::marker::PhantomData;

/// The integer dot product of one block of 32: `w0·x0 + w1·x1` (16 signed bytes each), as a
/// vector of four partial sums whose total is exact (|Σ| < 2²⁰).
pub(super) trait Dot {
    unsafe fn block(w0: int8x16_t, x0: int8x16_t, w1: int8x16_t, x1: int8x16_t) -> int32x4_t;
    /// As [`Dot::block`] with `|w0|`, `|w1|` ≤ 64 (the 4-, 5- and 6-bit values, unsigned or
    /// less their bias).
    #[inline(always)]
    unsafe fn block4(w0: int8x16_t, x0: int8x16_t, w1: int8x16_t, x1: int8x16_t) -> int32x4_t {
        Self::block(w0, x0, w1, x1)
    }
    /// Two separate 16-element dot products `w0·x0` and `w1·x1` (`|w|` ≤ 64) in one vector:
    /// lanes 0–1 sum to the first, lanes 2–3 to the second (the per-16 scales of Q6_K, Q3_K and
    /// Q2_K multiply them apart).
    unsafe fn halves(w0: int8x16_t, x0: int8x16_t, w1: int8x16_t, x1: int8x16_t) -> int32x4_t;
}

/// `sdot`: needs the `dotprod` feature in the function it is inlined into.
pub(super) struct Sdot;

impl Dot for Sdot {
    #[inline(always)]
    unsafe fn block(w0: int8x16_t, x0: int8x16_t, w1: int8x16_t, x1: int8x16_t) -> int32x4_t {
        sdot(sdot(vdupq_n_s32(0), w0, x0), w1, x1)
    }
    #[inline(always)]
    unsafe fn halves(w0: int8x16_t, x0: int8x16_t, w1: int8x16_t, x1: int8x16_t) -> int32x4_t {
        let zero = vdupq_n_s32(0);
        vpaddq_s32(sdot(zero, w0, x0), sdot(zero, w1, x1))
    }
}

#[inline(always)]
unsafe fn sdot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    asm!(
        "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
        acc = inout(vreg) acc,
        a = in(vreg) a,
        b = in(vreg) b,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// Plain NEON: 16-bit products, two per lane (|w·x| ≤ 128·127, so two fit `i16`), widened
/// and added pairwise into 32-bit lanes.
pub(super) struct Mull;

impl Dot for Mull {
    #[inline(always)]
    unsafe fn block(w0: int8x16_t, x0: int8x16_t, w1: int8x16_t, x1: int8x16_t) -> int32x4_t {
        let lo = vmlal_s8(
            vmull_s8(vget_low_s8(w0), vget_low_s8(x0)),
            vget_low_s8(w1),
            vget_low_s8(x1),
        );
        let hi = vmlal_high_s8(vmull_high_s8(w0, x0), w1, x1);
        vpadalq_s16(vpaddlq_s16(lo), hi)
    }
    /// Four products per 16-bit lane (|Σ| ≤ 4·64·127).
    #[inline(always)]
    unsafe fn block4(w0: int8x16_t, x0: int8x16_t, w1: int8x16_t, x1: int8x16_t) -> int32x4_t {
        let p = vmull_s8(vget_low_s8(w0), vget_low_s8(x0));
        let p = vmlal_high_s8(p, w0, x0);
        let p = vmlal_s8(p, vget_low_s8(w1), vget_low_s8(x1));
        vpaddlq_s16(vmlal_high_s8(p, w1, x1))
    }
    /// Two products per 16-bit lane, then four after one `addp` (|Σ| ≤ 4·64·127).
    #[inline(always)]
    unsafe fn halves(w0: int8x16_t, x0: int8x16_t, w1: int8x16_t, x1: int8x16_t) -> int32x4_t {
        let p = vmlal_high_s8(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)), w0, x0);
        let q = vmlal_high_s8(vmull_s8(vget_low_s8(w1), vget_low_s8(x1)), w1, x1);
        vpaddlq_s16(vpaddq_s16(p, q))
    }
}

/// Four f16 scales at `p` as f32.
#[inline(always)]
pub(super) unsafe fn f16x4(p: *const u8) -> float32x4_t {
    let h = vreinterpret_u16_u8(vld1_u8(p));
    let f: float32x4_t;
    asm!(
        "fcvtl {f:v}.4s, {h:v}.4h",
        f = lateout(vreg) f,
        h = in(vreg) h,
        options(pure, nomem, nostack, preserves_flags)
    );
    f
}

/// Per (weight row, activation row): two blocks' partial sums after one `addp` (lanes 0–1 the
/// first block's, 2–3 the second's), or after [`fold`] four blocks' sums (lane `j` block `j`).
pub(super) type Pairs<const NR: usize, const MR: usize> = [[int32x4_t; MR]; NR];

/// Fold two blocks' pairs into per-block sums: lane `j` = block `j` of the four.
#[inline(always)]
pub(super) unsafe fn fold<const NR: usize, const MR: usize>(
    a: &Pairs<NR, MR>,
    b: &Pairs<NR, MR>,
) -> Pairs<NR, MR> {
    let mut s = [[vdupq_n_s32(0); MR]; NR];
    for r in 0..NR {
        for c in 0..MR {
            s[r][c] = vpaddq_s32(a[r][c], b[r][c]);
        }
    }
    s
}

/// The float part of four blocks starting at `b0`: `acc += f32(Σ) · d_w·d_x` lane-wise.
#[inline(always)]
unsafe fn scale_add<const NR: usize, const MR: usize>(
    acc: &mut [[float32x4_t; MR]; NR],
    sums: &Pairs<NR, MR>,
    dw: &[float32x4_t; NR],
    x: &QuantizedActs,
    i: usize,
    b0: usize,
) {
    let mut dx = [vdupq_n_f32(0.0); MR];
    for c in 0..MR {
        dx[c] = vld1q_f32(x.d.as_ptr().add((i + c) * x.nbp + b0));
    }
    for r in 0..NR {
        for c in 0..MR {
            let f = vcvtq_f32_s32(sums[r][c]);
            acc[r][c] = vfmaq_f32(acc[r][c], f, vmulq_f32(dw[r], dx[c]));
        }
    }
}

/// Lane sums of the accumulators into `out`.
#[inline(always)]
pub(super) unsafe fn store<const NR: usize, const MR: usize>(
    acc: &[[float32x4_t; MR]; NR],
    w: &QMatrix,
    n: usize,
    i: usize,
    out: *mut f32,
) {
    for r in 0..NR {
        for c in 0..MR {
            *out.add((i + c) * w.rows + n + r) = vaddvq_f32(acc[r][c]);
        }
    }
}

/// 4-bit tiles. T: 0 = f16 d with offset −8d (Q4_0); 1 = f16 d, m (Q4_1).
pub(super) struct Q4<D, const T: u8>(PhantomData<D>);

impl<D: Dot, const T: u8> Tile for Q4<D, T> {
    #[inline(always)]
    unsafe fn tile<const NR: usize, const MR: usize>(
        w: &QMatrix,
        x: &QuantizedActs,
        n: usize,
        i: usize,
        out: *mut f32,
    ) {
        // Values exist for `nbe` blocks (padded to even); scales and activation scales for
        // `nbp` ≥ `nbe` (padded to 8, zeros).
        let nbe = w.nb.next_multiple_of(2);
        let base = w.data.as_ptr().add(n * w.stride);
        let mut acc = [[vdupq_n_f32(0.0); MR]; NR];
        for g in 0..nbe / 4 {
            Self::group::<NR, MR>(w, x, base, i, 4 * g, 2, &mut acc);
        }
        if !nbe.is_multiple_of(4) {
            Self::group::<NR, MR>(w, x, base, i, nbe - 2, 1, &mut acc);
        }
        store(&acc, w, n, i, out);
    }
}

impl<D: Dot, const T: u8> Q4<D, T> {
    /// Blocks `b0..b0 + 4`, of which the first `2·pairs` have values.
    #[inline(always)]
    unsafe fn group<const NR: usize, const MR: usize>(
        w: &QMatrix,
        x: &QuantizedActs,
        base: *const u8,
        i: usize,
        b0: usize,
        pairs: usize,
        acc: &mut [[float32x4_t; MR]; NR],
    ) {
        let nbe = w.nb.next_multiple_of(2);
        // Offset term of four blocks: one FMA per (row, activation row).
        let mut dw = [vdupq_n_f32(0.0); NR];
        for r in 0..NR {
            let row = base.add(r * w.stride);
            dw[r] = f16x4(row.add(nbe * 16 + 2 * b0));
            let mw = if T == 0 {
                vmulq_n_f32(dw[r], -8.0)
            } else {
                f16x4(row.add(nbe * 16 + 2 * w.nbp + 2 * b0))
            };
            for c in 0..MR {
                let sx = vld1q_f32(x.s.as_ptr().add((i + c) * x.nbp + b0));
                acc[r][c] = vfmaq_f32(acc[r][c], mw, sx);
            }
        }
        let first = Self::pair::<NR, MR>(w, x, base, i, b0);
        let second = if pairs == 2 {
            Self::pair::<NR, MR>(w, x, base, i, b0 + 2)
        } else {
            [[vdupq_n_s32(0); MR]; NR]
        };
        scale_add(acc, &fold(&first, &second), &dw, x, i, b0);
    }

    /// Blocks `b`, `b + 1` (`b` even): 32 weight bytes, low nibbles elements 0–15 of both
    /// blocks, high nibbles 16–31; activations paired the same way (`ActLayout::Paired`).
    #[inline(always)]
    unsafe fn pair<const NR: usize, const MR: usize>(
        w: &QMatrix,
        x: &QuantizedActs,
        base: *const u8,
        i: usize,
        b: usize,
    ) -> Pairs<NR, MR> {
        let m4 = vdupq_n_u8(0x0F);
        let mut s = [[vdupq_n_s32(0); MR]; NR];
        for r in 0..NR {
            let wp = base.add(r * w.stride + b * 16);
            let (wa, wb) = (vld1q_u8(wp), vld1q_u8(wp.add(16)));
            let lo_a = vreinterpretq_s8_u8(vandq_u8(wa, m4));
            let hi_a = vreinterpretq_s8_u8(vshrq_n_u8::<4>(wa));
            let lo_b = vreinterpretq_s8_u8(vandq_u8(wb, m4));
            let hi_b = vreinterpretq_s8_u8(vshrq_n_u8::<4>(wb));
            for c in 0..MR {
                let xp = x.qs.as_ptr().add((i + c) * x.qstride + b * 32);
                let sa = D::block4(lo_a, vld1q_s8(xp), hi_a, vld1q_s8(xp.add(32)));
                let sb = D::block4(lo_b, vld1q_s8(xp.add(16)), hi_b, vld1q_s8(xp.add(48)));
                s[r][c] = vpaddq_s32(sa, sb);
            }
        }
        s
    }
}

/// 8-bit tiles (Q8_0): signed values straight into the dot product.
pub(super) struct Q8<D>(PhantomData<D>);

impl<D: Dot> Tile for Q8<D> {
    #[inline(always)]
    unsafe fn tile<const NR: usize, const MR: usize>(
        w: &QMatrix,
        x: &QuantizedActs,
        n: usize,
        i: usize,
        out: *mut f32,
    ) {
        // Values exist for `nb` blocks exactly; scales for `nbp` (padded to 8, zeros).
        let base = w.data.as_ptr().add(n * w.stride);
        let mut acc = [[vdupq_n_f32(0.0); MR]; NR];
        for g in 0..w.nb / 4 {
            Self::group::<NR, MR>(w, x, base, i, 4 * g, 4, &mut acc);
        }
        if !w.nb.is_multiple_of(4) {
            let b0 = w.nb / 4 * 4;
            Self::group::<NR, MR>(w, x, base, i, b0, w.nb - b0, &mut acc);
        }
        store(&acc, w, n, i, out);
    }
}

impl<D: Dot> Q8<D> {
    /// Blocks `b0..b0 + 4`, of which the first `valid` (1..=4) exist.
    #[inline(always)]
    unsafe fn group<const NR: usize, const MR: usize>(
        w: &QMatrix,
        x: &QuantizedActs,
        base: *const u8,
        i: usize,
        b0: usize,
        valid: usize,
        acc: &mut [[float32x4_t; MR]; NR],
    ) {
        let mut dw = [vdupq_n_f32(0.0); NR];
        for r in 0..NR {
            dw[r] = f16x4(base.add(r * w.stride + w.nb * 32 + 2 * b0));
        }
        let first = Self::pair::<NR, MR>(w, x, base, i, b0, valid >= 2);
        let second = if valid >= 3 {
            Self::pair::<NR, MR>(w, x, base, i, b0 + 2, valid == 4)
        } else {
            [[vdupq_n_s32(0); MR]; NR]
        };
        scale_add(acc, &fold(&first, &second), &dw, x, i, b0);
    }

    /// Block `b`, and `b + 1` where `both` (else its sums are zero).
    #[inline(always)]
    unsafe fn pair<const NR: usize, const MR: usize>(
        w: &QMatrix,
        x: &QuantizedActs,
        base: *const u8,
        i: usize,
        b: usize,
        both: bool,
    ) -> Pairs<NR, MR> {
        let mut s = [[vdupq_n_s32(0); MR]; NR];
        for r in 0..NR {
            let wp = base.add(r * w.stride + b * 32) as *const i8;
            let (w0, w1) = (vld1q_s8(wp), vld1q_s8(wp.add(16)));
            let (w2, w3) = if both {
                (vld1q_s8(wp.add(32)), vld1q_s8(wp.add(48)))
            } else {
                (vdupq_n_s8(0), vdupq_n_s8(0))
            };
            for c in 0..MR {
                let xp = x.qs.as_ptr().add((i + c) * x.qstride + b * 32);
                let sa = D::block(w0, vld1q_s8(xp), w1, vld1q_s8(xp.add(16)));
                let sb = if both {
                    D::block(w2, vld1q_s8(xp.add(32)), w3, vld1q_s8(xp.add(48)))
                } else {
                    vdupq_n_s32(0)
                };
                s[r][c] = vpaddq_s32(sa, sb);
            }
        }
        s
    }
}

/// Q4_0 (`T` = 0) or Q4_1 (`T` = 1) columns `[n0, n1)` with `sdot`.
///
/// # Safety
/// The CPU has `dotprod`; `out` is the `x.m × w.rows` output and no other thread writes
/// columns `[n0, n1)`.
#[target_feature(enable = "neon,dotprod")]
pub unsafe fn range4_dot<const T: u8>(
    w: &QMatrix,
    x: &QuantizedActs,
    n0: usize,
    n1: usize,
    out: *mut f32,
) {
    drive::<Q4<Sdot, T>>(w, x, n0, n1, out)
}

/// As [`range4_dot`] on plain NEON.
///
/// # Safety
/// As [`range4_dot`], without the `dotprod` requirement.
#[target_feature(enable = "neon")]
pub unsafe fn range4<const T: u8>(
    w: &QMatrix,
    x: &QuantizedActs,
    n0: usize,
    n1: usize,
    out: *mut f32,
) {
    drive::<Q4<Mull, T>>(w, x, n0, n1, out)
}

/// Q8_0 columns `[n0, n1)` with `sdot`.
///
/// # Safety
/// As [`range4_dot`].
#[target_feature(enable = "neon,dotprod")]
pub unsafe fn range8_dot(w: &QMatrix, x: &QuantizedActs, n0: usize, n1: usize, out: *mut f32) {
    drive::<Q8<Sdot>>(w, x, n0, n1, out)
}

/// As [`range8_dot`] on plain NEON.
///
/// # Safety
/// As [`range4`].
#[target_feature(enable = "neon")]
pub unsafe fn range8(w: &QMatrix, x: &QuantizedActs, n0: usize, n1: usize, out: *mut f32) {
    drive::<Q8<Mull>>(w, x, n0, n1, out)
}
