//! AVX2 kernels (AVX2 + FMA + F16C): 256-bit registers, `vpmaddubsw` + `vpmaddwd` integer dot
//! products; 4-bit values are unpacked to unsigned bytes, Q8_0 uses the sign trick
//! (`|w| · sign(x, w)`). Every function needs those three features (`isa.rs`).

use super::ROW_BLOCK;
use crate::qmatmul::acts::QuantizedActs;
use crate::qmatmul::matrix::QMatrix;
use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Load 8 scales (f16 or f32) starting at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn load8(p: *const u8, f32_scales: bool) -> __m256 {
    if f32_scales {
        _mm256_loadu_ps(p as *const f32)
    } else {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
}

/// 4-bit tile. T: 0 = f16 d with offset −8d (Q4_0); 1 = f16 d, m (Q4_1).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile4<const T: u8, const NR: usize, const MR: usize>(
    w: &QMatrix,
    x: &QuantizedActs,
    n: usize,
    i: usize,
    out: *mut f32,
) {
    let nbe = w.nb.next_multiple_of(2);
    let base = w.data.as_ptr().add(n * w.stride);
    let ones = _mm256_set1_epi16(1);
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [[_mm256_setzero_ps(); MR]; NR];
    for g in 0..w.nbp / 8 {
        // Offset term of 8 blocks: one FMA per (row, activation row).
        let mut dv = [_mm256_setzero_ps(); NR];
        for r in 0..NR {
            let row = base.add(r * w.stride);
            dv[r] = load8(row.add(nbe * 16 + g * 16), false);
            let mv = if T == 0 {
                _mm256_mul_ps(dv[r], _mm256_set1_ps(-8.0))
            } else {
                load8(row.add(nbe * 16 + w.nbp * 2 + g * 16), false)
            };
            for c in 0..MR {
                let sx = _mm256_loadu_ps(x.s.as_ptr().add((i + c) * x.nbp + g * 8));
                acc[r][c] = _mm256_fmadd_ps(mv, sx, acc[r][c]);
            }
        }
        let mut dx = [_mm256_setzero_ps(); MR];
        for c in 0..MR {
            dx[c] = _mm256_loadu_ps(x.d.as_ptr().add((i + c) * x.nbp + g * 8));
        }
        for p in 0..4 {
            let b = g * 8 + 2 * p;
            if b >= nbe {
                break;
            }
            // Lanes 0-3 take block b's scale, lanes 4-7 block b+1's.
            let idx = _mm256_setr_epi32(
                2 * p as i32,
                2 * p as i32,
                2 * p as i32,
                2 * p as i32,
                2 * p as i32 + 1,
                2 * p as i32 + 1,
                2 * p as i32 + 1,
                2 * p as i32 + 1,
            );
            for r in 0..NR {
                let qv = _mm256_loadu_si256(base.add(r * w.stride + b * 16) as *const __m256i);
                let lo = _mm256_and_si256(qv, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(qv, 4), m4);
                let sw = _mm256_permutevar8x32_ps(dv[r], idx);
                for c in 0..MR {
                    let xp = x.qs.as_ptr().add((i + c) * x.qstride + b * 32);
                    let xlo = _mm256_loadu_si256(xp as *const __m256i);
                    let xhi = _mm256_loadu_si256(xp.add(32) as *const __m256i);
                    let s16 = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo, xlo),
                        _mm256_maddubs_epi16(hi, xhi),
                    );
                    let f = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, ones));
                    let sc = _mm256_mul_ps(sw, _mm256_permutevar8x32_ps(dx[c], idx));
                    acc[r][c] = _mm256_fmadd_ps(f, sc, acc[r][c]);
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

/// 8-bit tile (Q8_0): sign trick, one block at a time.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile8<const NR: usize, const MR: usize>(
    w: &QMatrix,
    x: &QuantizedActs,
    n: usize,
    i: usize,
    out: *mut f32,
) {
    let base = w.data.as_ptr().add(n * w.stride);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); MR]; NR];
    for g in 0..w.nbp / 8 {
        let mut dv = [_mm256_setzero_ps(); NR];
        for r in 0..NR {
            dv[r] = load8(base.add(r * w.stride + w.nb * 32 + g * 16), false);
        }
        for j in 0..8 {
            let b = g * 8 + j;
            if b >= w.nb {
                break;
            }
            let idx = _mm256_set1_epi32(j as i32);
            for r in 0..NR {
                let wv = _mm256_loadu_si256(base.add(r * w.stride + b * 32) as *const __m256i);
                let aw = _mm256_sign_epi8(wv, wv);
                let sw = _mm256_permutevar8x32_ps(dv[r], idx);
                for c in 0..MR {
                    let xv = _mm256_loadu_si256(
                        x.qs.as_ptr().add((i + c) * x.qstride + b * 32) as *const __m256i
                    );
                    let xs = _mm256_sign_epi8(xv, wv);
                    let f =
                        _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(aw, xs), ones));
                    let sc = _mm256_mul_ps(
                        sw,
                        _mm256_broadcast_ss(&*x.d.as_ptr().add((i + c) * x.nbp + b)),
                    );
                    acc[r][c] = _mm256_fmadd_ps(f, sc, acc[r][c]);
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

/// Prefetch `count` packed rows starting at `row` (clamped to the matrix) into L1/L2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn prefetch_rows(w: &QMatrix, row: usize, count: usize) {
    let end = (row + count).min(w.rows);
    if row >= end {
        return;
    }
    let p = w.data.as_ptr().add(row * w.stride);
    let bytes = (end - row) * w.stride;
    let mut o = 0;
    while o < bytes {
        _mm_prefetch(p.add(o) as *const i8, _MM_HINT_T0);
        o += 64;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn range4<const T: u8>(
    w: &QMatrix,
    x: &QuantizedActs,
    n0: usize,
    n1: usize,
    out: *mut f32,
) {
    drive!(w, x, n0, n1, out, tile4::<T>)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn range8(w: &QMatrix, x: &QuantizedActs, n0: usize, n1: usize, out: *mut f32) {
    drive!(w, x, n0, n1, out, tile8)
}
