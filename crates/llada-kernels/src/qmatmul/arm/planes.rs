//! NEON tiles for the plane kinds: Q5_0, Q5_1 and the K-quants (`repack` module docs). Each
//! pair of blocks (A, B) is rebuilt from its planes into four registers of 16 signed bytes —
//! elements 0–15 and 16–31 of A, then of B — against the pair's 64 paired activation bytes,
//! with the 8-bit dot products of [`super::neon`] ([`Sdot`] or [`Mull`]).
//!
//! `sdot` multiplies signed bytes, so a kind's bias is taken off the values before the dot
//! product (Q5_0: q − 16, Q6_K: q − 32, Q3_K: q − 4; all fit `i8`) and needs no term of its
//! own. Q6_K, Q3_K and Q2_K have an integer scale per 16 elements: the two halves of each block
//! are summed apart ([`Dot::halves`]) and multiplied by their scales in 32-bit integers, so every
//! block still reaches the float part as its exact integer sum `Σ_h sc_h·Σ w·x`. The offsets
//! left — Q5_1's `m`, Q4_K's and Q5_K's mins (per block, through the activations' block sums
//! `s`) and Q2_K's per-16 mins (through the half sums `h`) — are one FMA per four blocks and
//! (weight row, activation row), as on x86 (`x86/planes.rs`).
//!
//! As in [`super::neon`], each block is reduced to its exact integer sum before any float
//! arithmetic, four blocks to one vector, so both [`Dot`]s give the same floats bit for bit,
//! and every (weight row, activation row) accumulator sees the same operations whatever the
//! tile shape (batch invariance).

use super::neon::{f16x4, fold, store, Dot, Mull, Pairs, Sdot};
use super::{drive, Tile};
use crate::qmatmul::acts::QuantizedActs;
use crate::qmatmul::matrix::QMatrix;
use crate::qmatmul::repack::Kind;
use std::arch::aarch64::*;
use std::marker::PhantomData;
use std::ptr::read_unaligned;

pub(super) const Q5_0: u8 = Kind::Q5D16 as u8;
pub(super) const Q5_1: u8 = Kind::Q5DM16 as u8;
pub(super) const K4: u8 = Kind::K4 as u8;
pub(super) const K5: u8 = Kind::K5 as u8;
pub(super) const K6: u8 = Kind::K6 as u8;
pub(super) const K3: u8 = Kind::K3 as u8;
pub(super) const K2: u8 = Kind::K2 as u8;

/// Whether kind `K` has an integer scale per 16 elements (Q6_K, Q3_K, Q2_K).
const fn per16(k: u8) -> bool {
    matches!(k, K6 | K3 | K2)
}

/// Whether kind `K` has a per-block offset through the activations' block sums (Q5_1, Q4_K,
/// Q5_K).
const fn per_block_offset(k: u8) -> bool {
    matches!(k, Q5_1 | K4 | K5)
}

/// The weights of pair `pp` of a packed row, less the kind's bias: `[A 0–15, A 16–31, B 0–15,
/// B 16–31]` (A, B the pair's blocks), each lane in −32..63.
#[inline(always)]
unsafe fn unpack<const K: u8>(w: &QMatrix, row: *const u8, pp: usize) -> [int8x16_t; 4] {
    let lay = &w.lay;
    // Two-bit plane: byte j = A[j] | B[j] << 2 | A[16 + j] << 4 | B[16 + j] << 6.
    let two = || {
        let t = vld1q_u8(row.add(lay.two + pp * 16));
        let m3 = vdupq_n_u8(3);
        [
            vandq_u8(t, m3),
            vandq_u8(vshrq_n_u8::<4>(t), m3),
            vandq_u8(vshrq_n_u8::<2>(t), m3),
            vshrq_n_u8::<6>(t),
        ]
    };
    let mut v = if !matches!(K, K3 | K2) {
        // Nibble plane: 16 bytes per block, low nibbles elements 0–15, high 16–31.
        let p = row.add(lay.nib + pp * 32);
        let (a, b) = (vld1q_u8(p), vld1q_u8(p.add(16)));
        if K == K6 {
            // The two high bits above the nibble (`sli` keeps the destination's low 4 bits).
            let t = two();
            let nib = [a, vshrq_n_u8::<4>(a), b, vshrq_n_u8::<4>(b)];
            let mut v = [vdupq_n_u8(0); 4];
            for e in 0..4 {
                v[e] = vsubq_u8(vsliq_n_u8::<4>(nib[e], t[e]), vdupq_n_u8(32));
            }
            v
        } else {
            let m4 = vdupq_n_u8(0x0F);
            [
                vandq_u8(a, m4),
                vshrq_n_u8::<4>(a),
                vandq_u8(b, m4),
                vshrq_n_u8::<4>(b),
            ]
        }
    } else {
        two()
    };
    if matches!(K, Q5_0 | Q5_1 | K5 | K3) {
        // One-bit plane: two u32 per pair, bits 0–15 / 16–31 of the first A's / B's elements
        // 0–15, of the second their elements 16–31; byte k of the 8 holds 8 elements' bits.
        let bits = read_unaligned(row.add(lay.bit + pp * 8) as *const u64);
        let bits = vreinterpretq_u8_u64(vdupq_n_u64(bits));
        let sel = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
        for (e, first) in [(0usize, 0u8), (1, 4), (2, 2), (3, 6)] {
            let idx = vcombine_u8(vdup_n_u8(first), vdup_n_u8(first + 1));
            // 0xFF where the element's bit is set.
            let m = vtstq_u8(vqtbl1q_u8(bits, idx), sel);
            v[e] = match K {
                // q − 16 = nibble − 16 where the 5th bit is clear.
                Q5_0 => vsubq_u8(v[e], vbicq_u8(vdupq_n_u8(16), m)),
                // q − 4 = low bits − 4 where the 3rd bit is clear.
                K3 => vsubq_u8(v[e], vbicq_u8(vdupq_n_u8(4), m)),
                _ => vorrq_u8(v[e], vandq_u8(m, vdupq_n_u8(16))),
            };
        }
    }
    v.map(|x| vreinterpretq_s8_u8(x))
}

/// Pair `p` (0..4) of super-block `g`'s per-16 scales as two lane vectors for
/// [`Dot::halves`]: `[s(4p), s(4p), s(4p+2), s(4p+2)]` (elements 0–15 of A, of B) and
/// `[s(4p+1), s(4p+1), s(4p+3), s(4p+3)]` (elements 16–31).
#[inline(always)]
unsafe fn scales16<const K: u8>(
    w: &QMatrix,
    row: *const u8,
    g: usize,
    p: usize,
) -> (int32x4_t, int32x4_t) {
    // Header: f16 d (Q2_K: and f16 dmin), then the 16 scale bytes (Q2_K: scale | min << 4).
    let first = if K == K2 { 4 } else { 2 };
    let h = row.add(w.lay.sc + g * Kind::header_of(K) + first + 4 * p);
    let s = vreinterpret_s8_u32(vdup_n_u32(read_unaligned(h as *const u32)));
    let s = if K == K2 {
        vand_s8(s, vdup_n_s8(0x0F))
    } else {
        s
    };
    let idx = vreinterpret_s8_u64(vdup_n_u64(0x0303_0101_0202_0000));
    let s = vmovl_s8(vtbl1_s8(s, idx));
    (vmovl_s16(vget_low_s16(s)), vmovl_high_s16(s))
}

/// Four bytes at `p` as f32 lanes.
#[inline(always)]
unsafe fn bytes4(p: *const u8) -> float32x4_t {
    let b = vreinterpret_u8_u32(vdup_n_u32(read_unaligned(p as *const u32)));
    vcvtq_f32_u32(vmovl_u16(vget_low_u16(vmovl_u8(b))))
}

/// Tiles of a plane kind `K` with the dot product `D`.
pub(super) struct Planes<D, const K: u8>(PhantomData<D>);

impl<D: Dot, const K: u8> Tile for Planes<D, K> {
    #[inline(always)]
    unsafe fn tile<const NR: usize, const MR: usize>(
        w: &QMatrix,
        x: &QuantizedActs,
        n: usize,
        i: usize,
        out: *mut f32,
    ) {
        // Values exist for `nbe` blocks (whole pairs); scales and activation terms for
        // `nbp` ≥ `nbe` (whole groups of 8, zeros).
        let base = w.data.as_ptr().add(n * w.stride);
        let mut acc = [[vdupq_n_f32(0.0); MR]; NR];
        let mut b0 = 0;
        while b0 < w.lay.nbe {
            Self::quad::<NR, MR>(w, x, base, i, b0, &mut acc);
            b0 += 4;
        }
        store(&acc, w, n, i, out);
    }
}

impl<D: Dot, const K: u8> Planes<D, K> {
    /// Blocks `b0..b0 + 4` (`b0` a multiple of 4 below `nbe`; the second pair may be past it).
    #[inline(always)]
    unsafe fn quad<const NR: usize, const MR: usize>(
        w: &QMatrix,
        x: &QuantizedActs,
        base: *const u8,
        i: usize,
        b0: usize,
        acc: &mut [[float32x4_t; MR]; NR],
    ) {
        let lay = &w.lay;
        let (g, q) = (b0 / 8, b0 % 8 / 4);
        // Per weight row: the float scale of each block (lane j: block b0 + j), and the offset
        // factor (per block; Q2_K: −dmin in every lane, with the mins of the 8 halves).
        let mut a = [vdupq_n_f32(0.0); NR];
        let mut mw = [vdupq_n_f32(0.0); NR];
        let mut mn = [vdupq_n_s16(0); NR];
        for r in 0..NR {
            let row = base.add(r * w.stride);
            match K {
                Q5_0 | Q5_1 => {
                    a[r] = f16x4(row.add(lay.sc + 2 * b0));
                    if K == Q5_1 {
                        mw[r] = f16x4(row.add(lay.sc + 2 * lay.nbp + 2 * b0));
                    }
                }
                K4 | K5 => {
                    // f16 d, f16 dmin, 8 scales, 8 mins.
                    let h = row.add(lay.sc + g * Kind::header_of(K));
                    let dm = f16x4(h);
                    a[r] = vmulq_laneq_f32::<0>(bytes4(h.add(4 + 4 * q)), dm);
                    mw[r] = vmulq_laneq_f32::<1>(bytes4(h.add(12 + 4 * q)), vnegq_f32(dm));
                }
                _ => {
                    let h = row.add(lay.sc + g * Kind::header_of(K));
                    let dm = f16x4(h);
                    a[r] = vdupq_laneq_f32::<0>(dm);
                    if K == K2 {
                        mw[r] = vnegq_f32(vdupq_laneq_f32::<1>(dm));
                        let m = vshr_n_u8::<4>(vld1_u8(h.add(4 + 8 * q)));
                        mn[r] = vreinterpretq_s16_u16(vmovl_u8(m));
                    }
                }
            }
        }
        let first = Self::pair::<NR, MR>(w, x, base, i, b0);
        let second = if b0 + 2 < lay.nbe {
            Self::pair::<NR, MR>(w, x, base, i, b0 + 2)
        } else {
            [[vdupq_n_s32(0); MR]; NR]
        };
        let sums = fold(&first, &second);
        for c in 0..MR {
            let xo = (i + c) * x.nbp + b0;
            let dx = vld1q_f32(x.d.as_ptr().add(xo));
            let sx = if per_block_offset(K) {
                vld1q_f32(x.s.as_ptr().add(xo))
            } else {
                vdupq_n_f32(0.0)
            };
            let xh = if K == K2 {
                vld1q_s16(x.h.as_ptr().add(2 * xo))
            } else {
                vdupq_n_s16(0)
            };
            for r in 0..NR {
                if per_block_offset(K) {
                    acc[r][c] = vfmaq_f32(acc[r][c], mw[r], sx);
                }
                if K == K2 {
                    // Σ_h mn_h·Σx_h per block.
                    let lo = vmull_s16(vget_low_s16(xh), vget_low_s16(mn[r]));
                    let ms = vpaddq_s32(lo, vmull_high_s16(xh, mn[r]));
                    acc[r][c] = vfmaq_f32(acc[r][c], vcvtq_f32_s32(ms), vmulq_f32(mw[r], dx));
                }
                let f = vcvtq_f32_s32(sums[r][c]);
                acc[r][c] = vfmaq_f32(acc[r][c], f, vmulq_f32(a[r], dx));
            }
        }
    }

    /// Blocks `b`, `b + 1` (`b` even): per (weight row, activation row) lanes 0–1 sum to block
    /// `b`'s integer sum, 2–3 to block `b + 1`'s (scaled by the per-16 scales where the kind has
    /// them).
    #[inline(always)]
    unsafe fn pair<const NR: usize, const MR: usize>(
        w: &QMatrix,
        x: &QuantizedActs,
        base: *const u8,
        i: usize,
        b: usize,
    ) -> Pairs<NR, MR> {
        let mut s = [[vdupq_n_s32(0); MR]; NR];
        for r in 0..NR {
            let row = base.add(r * w.stride);
            let [la, ha, lb, hb] = unpack::<K>(w, row, b / 2);
            let (s0, s1) = if per16(K) {
                scales16::<K>(w, row, b / 8, b % 8 / 2)
            } else {
                (vdupq_n_s32(0), vdupq_n_s32(0))
            };
            for c in 0..MR {
                // Paired activations: A 0–15, B 0–15, A 16–31, B 16–31.
                let xp = x.qs.as_ptr().add((i + c) * x.qstride + b * 32);
                let (x0, x1) = (vld1q_s8(xp), vld1q_s8(xp.add(16)));
                let (x2, x3) = (vld1q_s8(xp.add(32)), vld1q_s8(xp.add(48)));
                s[r][c] = if per16(K) {
                    let h0 = D::halves(la, x0, lb, x1);
                    let h1 = D::halves(ha, x2, hb, x3);
                    vmlaq_s32(vmulq_s32(h0, s0), h1, s1)
                } else {
                    vpaddq_s32(D::block4(la, x0, ha, x2), D::block4(lb, x1, hb, x3))
                };
            }
        }
        s
    }
}

/// Plane kind `K` (`Kind as u8`) columns `[n0, n1)` with `sdot`.
///
/// # Safety
/// The CPU has `dotprod`; `w` is of kind `K`; `out` is the `x.m × w.rows` output and no other
/// thread writes columns `[n0, n1)`.
#[target_feature(enable = "neon,dotprod")]
pub unsafe fn range_dot<const K: u8>(
    w: &QMatrix,
    x: &QuantizedActs,
    n0: usize,
    n1: usize,
    out: *mut f32,
) {
    drive::<Planes<Sdot, K>>(w, x, n0, n1, out)
}

/// As [`range_dot`] on plain NEON.
///
/// # Safety
/// As [`range_dot`], without the `dotprod` requirement.
#[target_feature(enable = "neon")]
pub unsafe fn range<const K: u8>(
    w: &QMatrix,
    x: &QuantizedActs,
    n0: usize,
    n1: usize,
    out: *mut f32,
) {
    drive::<Planes<Mull, K>>(w, x, n0, n1, out)
}
