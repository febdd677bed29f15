//! AVX2 tiles for the plane kinds (Q5_0, Q5_1 and the K-quants, `repack` module docs): each
//! pair of blocks is rebuilt from its planes into two registers of unsigned bytes (elements
//! 0–15 and 16–31 of both blocks), multiplied with `vpmaddubsw` against the activations, and
//! summed to 32 bits with `vpmaddwd` — by ones where a block has one scale, by the per-16
//! integer scales where the K-quant has them (Q6_K, Q3_K, Q2_K: ggml's own scheme). Offsets
//! (Q5_0's bias, Q5_1's and the K-quants' mins, the K-quants' biases) enter once per 8 blocks
//! per activation row through the activations' block sums (`s`) or half sums (`h`). The
//! AVX-512 VNNI path runs these tiles too. Every function needs AVX2, FMA and F16C (`isa.rs`).

use super::avx2::{hsum, load8, prefetch_rows};
use super::ROW_BLOCK;
use crate::qmatmul::acts::QuantizedActs;
use crate::qmatmul::matrix::QMatrix;
use crate::qmatmul::repack::Kind;
use std::arch::x86_64::*;

pub(super) const Q5_0: u8 = Kind::Q5D16 as u8;
pub(super) const Q5_1: u8 = Kind::Q5DM16 as u8;
pub(super) const K4: u8 = Kind::K4 as u8;
pub(super) const K5: u8 = Kind::K5 as u8;
pub(super) const K6: u8 = Kind::K6 as u8;
pub(super) const K3: u8 = Kind::K3 as u8;
pub(super) const K2: u8 = Kind::K2 as u8;

/// 32 bits → 32 bytes, 0xFF where the bit is set (ggml's `bytes_from_bits_32`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bits_to_bytes(p: *const u8) -> __m256i {
    let bits = std::ptr::read_unaligned(p as *const u32);
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), shuf);
    let mask = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(bytes, mask), _mm256_set1_epi64x(-1))
}

/// The unsigned values of pair `pp` of a packed row: (elements 0–15 of both blocks,
/// elements 16–31 of both blocks).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn unpack<const K: u8>(
    w: &QMatrix,
    row: *const u8,
    pp: usize,
) -> (__m256i, __m256i) {
    let lay = &w.lay;
    let (mut lo, mut hi) = (_mm256_setzero_si256(), _mm256_setzero_si256());
    if !matches!(K, K3 | K2) {
        let m4 = _mm256_set1_epi8(0x0F);
        let v = _mm256_loadu_si256(row.add(lay.nib + pp * 32) as *const __m256i);
        lo = _mm256_and_si256(v, m4);
        hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    }
    if matches!(K, K6 | K3 | K2) {
        let t = _mm_loadu_si128(row.add(lay.two + pp * 16) as *const __m128i);
        let t = _mm256_broadcastsi128_si256(t);
        let m3 = _mm256_set1_epi8(3);
        // Lower lane: block A's bits, upper lane: block B's (module docs of `repack`).
        let tlo = _mm256_and_si256(
            _mm256_srlv_epi32(t, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2)),
            m3,
        );
        let thi = _mm256_and_si256(
            _mm256_srlv_epi32(t, _mm256_setr_epi32(4, 4, 4, 4, 6, 6, 6, 6)),
            m3,
        );
        if K == K6 {
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(tlo, 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(thi, 4));
        } else {
            lo = tlo;
            hi = thi;
        }
    }
    if matches!(K, Q5_0 | Q5_1 | K5 | K3) {
        let p = row.add(lay.bit + pp * 8);
        let hb = _mm256_set1_epi8(if K == K3 { 4 } else { 16 });
        lo = _mm256_or_si256(lo, _mm256_and_si256(bits_to_bytes(p), hb));
        hi = _mm256_or_si256(hi, _mm256_and_si256(bits_to_bytes(p.add(4)), hb));
    }
    (lo, hi)
}

/// The two f16 values at `p` (a K-quant header's `d`, `dmin`) as f32, with F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16x2(p: *const u8) -> (f32, f32) {
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const i32)));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// Per group of 8 blocks and weight row: the per-block scale `a` (8 lanes), the per-16
/// integer scales (K6/K3/K2), and the offset term added to the accumulators.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn group_terms<const K: u8, const MR: usize>(
    w: &QMatrix,
    x: &QuantizedActs,
    row: *const u8,
    g: usize,
    i: usize,
    dx: &[__m256; MR],
    acc: &mut [__m256; MR],
    sc16: &mut [i16; 16],
) -> __m256 {
    let lay = &w.lay;
    let xs = |c: usize| _mm256_loadu_ps(x.s.as_ptr().add((i + c) * x.nbp + g * 8));
    match K {
        Q5_0 | Q5_1 => {
            let d = load8(row.add(lay.sc + g * 16), false);
            let mv = if K == Q5_0 {
                _mm256_mul_ps(d, _mm256_set1_ps(-16.0))
            } else {
                load8(row.add(lay.sc + lay.nbp * 2 + g * 16), false)
            };
            for c in 0..MR {
                acc[c] = _mm256_fmadd_ps(mv, xs(c), acc[c]);
            }
            d
        }
        K4 | K5 => {
            let h = row.add(lay.sc + g * 20);
            let bytes8 = |o: usize| {
                let v = _mm_loadl_epi64(h.add(o) as *const __m128i);
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))
            };
            let (d, dmin) = f16x2(h);
            let a = _mm256_mul_ps(_mm256_set1_ps(d), bytes8(4));
            let mv = _mm256_mul_ps(_mm256_set1_ps(-dmin), bytes8(12));
            for c in 0..MR {
                acc[c] = _mm256_fmadd_ps(mv, xs(c), acc[c]);
            }
            a
        }
        _ => {
            let h = row.add(lay.sc + g * Kind::header_of(K));
            // Q6_K/Q3_K headers hold one f16 (`d`); the second value read is a scale byte pair,
            // converted and unused.
            let (d, dmin) = f16x2(h);
            let (s16, mn16, off) = if K == K2 {
                let b = _mm_loadu_si128(h.add(4) as *const __m128i);
                let m4 = _mm_set1_epi8(0x0F);
                let s = _mm256_cvtepu8_epi16(_mm_and_si128(b, m4));
                let m = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(b, 4), m4));
                (s, m, -dmin)
            } else {
                let s = _mm256_cvtepi8_epi16(_mm_loadu_si128(h.add(2) as *const __m128i));
                (s, s, if K == K6 { -32.0 * d } else { -4.0 * d })
            };
            _mm256_storeu_si256(sc16.as_mut_ptr() as *mut __m256i, s16);
            let offv = _mm256_set1_ps(off);
            for c in 0..MR {
                let xh = _mm256_loadu_si256(
                    x.h.as_ptr().add(((i + c) * x.nbp + g * 8) * 2) as *const __m256i
                );
                let sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(xh, mn16));
                acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(offv, dx[c]), sums, acc[c]);
            }
            _mm256_set1_ps(d)
        }
    }
}

/// A tile of `NR` weight rows × `MR` activation rows of a plane kind `K`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const K: u8, const NR: usize, const MR: usize>(
    w: &QMatrix,
    x: &QuantizedActs,
    n: usize,
    i: usize,
    out: *mut f32,
) {
    let per16 = matches!(K, K6 | K3 | K2);
    let base = w.data.as_ptr().add(n * w.stride);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); MR]; NR];
    for g in 0..w.nbp / 8 {
        let mut dx = [_mm256_setzero_ps(); MR];
        for c in 0..MR {
            dx[c] = _mm256_loadu_ps(x.d.as_ptr().add((i + c) * x.nbp + g * 8));
        }
        let mut av = [_mm256_setzero_ps(); NR];
        let mut sc16 = [[0i16; 16]; NR];
        for r in 0..NR {
            let row = base.add(r * w.stride);
            av[r] = group_terms::<K, MR>(w, x, row, g, i, &dx, &mut acc[r], &mut sc16[r]);
        }
        for p in 0..4 {
            let b = g * 8 + 2 * p;
            if b >= w.lay.nbe {
                break;
            }
            // Lanes 0–3 take block b's scale, lanes 4–7 block b+1's.
            let (a0, a1) = (2 * p as i32, 2 * p as i32 + 1);
            let idx = _mm256_setr_epi32(a0, a0, a0, a0, a1, a1, a1, a1);
            for r in 0..NR {
                let (lo, hi) = unpack::<K>(w, base.add(r * w.stride), b / 2);
                let sw = _mm256_permutevar8x32_ps(av[r], idx);
                let s = &sc16[r];
                let (sclo, schi) = if per16 {
                    (
                        _mm256_set_m128i(_mm_set1_epi16(s[4 * p + 2]), _mm_set1_epi16(s[4 * p])),
                        _mm256_set_m128i(
                            _mm_set1_epi16(s[4 * p + 3]),
                            _mm_set1_epi16(s[4 * p + 1]),
                        ),
                    )
                } else {
                    (ones, ones)
                };
                for c in 0..MR {
                    let xp = x.qs.as_ptr().add((i + c) * x.qstride + b * 32);
                    let xlo = _mm256_loadu_si256(xp as *const __m256i);
                    let xhi = _mm256_loadu_si256(xp.add(32) as *const __m256i);
                    let (plo, phi) = (_mm256_maddubs_epi16(lo, xlo), _mm256_maddubs_epi16(hi, xhi));
                    let sum = if per16 {
                        _mm256_add_epi32(_mm256_madd_epi16(plo, sclo), _mm256_madd_epi16(phi, schi))
                    } else {
                        _mm256_madd_epi16(_mm256_add_epi16(plo, phi), ones)
                    };
                    let sc = _mm256_mul_ps(sw, _mm256_permutevar8x32_ps(dx[c], idx));
                    acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), sc, acc[r][c]);
                }
            }
        }
    }
    for r in 0..NR {
        for c in 0..MR {
            *out.add((i + c) * w.rows + n + r) = hsum(acc[r][c]);
        }
    }
}

/// Output columns `[n0, n1)` of a plane kind `K`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn range<const K: u8>(
    w: &QMatrix,
    x: &QuantizedActs,
    n0: usize,
    n1: usize,
    out: *mut f32,
) {
    drive!(w, x, n0, n1, out, tile::<K>)
}
