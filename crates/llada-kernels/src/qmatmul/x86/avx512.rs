//! AVX-512 VNNI kernels: the same packed layouts and the same integer sums as [`super::avx2`],
//! with 512-bit registers and `vpdpbusd` (unsigned × signed bytes, summed in fours into 32-bit
//! lanes: one instruction where AVX2 needs `vpmaddubsw` + `vpmaddwd`). A 4-bit pair of blocks
//! (32 bytes) becomes one register — low nibbles in the lower half, high nibbles in the upper —
//! against the pair's 64 activation bytes; a Q8_0 register holds two blocks, its signed values
//! read as `w + 128` (what `vpdpbusd` multiplies) with `128 · d_w · d_x · Σq_x` taken off per
//! block through the same 8-block FMA that applies the 4-bit offsets. Per weight row, activation
//! row and 64 products: load, `vpdpbusd`, convert, scale, FMA — where the AVX2 kernels issue
//! 10 (4-bit) and 16 (8-bit) instructions. candle-core 0.11 has a VNNI kernel for Q8_0 and
//! Q4_K only, on its own tiled layout; ours keeps the per-row layout the weight store streams
//! and repacks into. Every function needs AVX-512 F/BW/VNNI besides the AVX2 set (`isa.rs`).

use super::avx2::{load8, prefetch_rows};
use super::ROW_BLOCK;
use crate::qmatmul::acts::QuantizedActs;
use crate::qmatmul::matrix::QMatrix;
use std::arch::x86_64::*;

/// Lanes 0–7 of `v` (the rest zero) as a 512-bit register.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn wide(v: __m256) -> __m512 {
    _mm512_zextps256_ps512(v)
}

/// 4-bit tile. T: 0 = f16 d with offset −8d (Q4_0); 1 = f16 d, m (Q4_1).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn tile4<const T: u8, const NR: usize, const MR: usize>(
    w: &QMatrix,
    x: &QuantizedActs,
    n: usize,
    i: usize,
    out: *mut f32,
) {
    let nbe = w.nb.next_multiple_of(2);
    let base = w.data.as_ptr().add(n * w.stride);
    let m4 = _mm512_set1_epi8(0x0F);
    // Shift counts of the 16-bit lanes: 0 in the lower half (low nibbles), 4 in the upper.
    let shifts = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    let mut acc = [[_mm512_setzero_ps(); MR]; NR];
    for g in 0..w.nbp / 8 {
        // Offset term of 8 blocks: one FMA per (row, activation row), in lanes 0–7.
        let mut dv = [_mm512_setzero_ps(); NR];
        for r in 0..NR {
            let row = base.add(r * w.stride);
            let d8 = load8(row.add(nbe * 16 + g * 16), false);
            dv[r] = wide(d8);
            let mv = if T == 0 {
                _mm256_mul_ps(d8, _mm256_set1_ps(-8.0))
            } else {
                load8(row.add(nbe * 16 + w.nbp * 2 + g * 16), false)
            };
            for c in 0..MR {
                let sx = _mm256_loadu_ps(x.s.as_ptr().add((i + c) * x.nbp + g * 8));
                acc[r][c] = _mm512_fmadd_ps(wide(mv), wide(sx), acc[r][c]);
            }
        }
        let mut dx = [_mm512_setzero_ps(); MR];
        for c in 0..MR {
            dx[c] = wide(_mm256_loadu_ps(x.d.as_ptr().add((i + c) * x.nbp + g * 8)));
        }
        for p in 0..4 {
            let b = g * 8 + 2 * p;
            if b >= nbe {
                break;
            }
            // Lanes 0–3 and 8–11 hold block b's sums (its values 0–15, then 16–31),
            // lanes 4–7 and 12–15 block b + 1's.
            let (a0, a1) = (2 * p as i32, 2 * p as i32 + 1);
            let idx = _mm512_setr_epi32(
                a0, a0, a0, a0, a1, a1, a1, a1, a0, a0, a0, a0, a1, a1, a1, a1,
            );
            let mut xv = [_mm512_setzero_si512(); MR];
            let mut sx = [_mm512_setzero_ps(); MR];
            for c in 0..MR {
                xv[c] =
                    _mm512_loadu_si512(x.qs.as_ptr().add((i + c) * x.qstride + b * 32) as *const _);
                sx[c] = _mm512_permutexvar_ps(idx, dx[c]);
            }
            for r in 0..NR {
                let q = _mm256_loadu_si256(base.add(r * w.stride + b * 16) as *const __m256i);
                let wv = _mm512_and_si512(_mm512_srlv_epi16(_mm512_broadcast_i64x4(q), shifts), m4);
                let sw = _mm512_permutexvar_ps(idx, dv[r]);
                for c in 0..MR {
                    let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, xv[c]);
                    let sc = _mm512_mul_ps(sw, sx[c]);
                    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sc, acc[r][c]);
                }
            }
        }
    }
    for r in 0..NR {
        for c in 0..MR {
            *out.add((i + c) * w.rows + n + r) = _mm512_reduce_add_ps(acc[r][c]);
        }
    }
}

/// The lower 32 of a register's 64 bytes: one Q8_0 block.
const LOW32: __mmask64 = 0xFFFF_FFFF;

/// 8-bit tile (Q8_0): two blocks per register, values read as `w + 128`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn tile8<const NR: usize, const MR: usize>(
    w: &QMatrix,
    x: &QuantizedActs,
    n: usize,
    i: usize,
    out: *mut f32,
) {
    let base = w.data.as_ptr().add(n * w.stride);
    let flip = _mm512_set1_epi8(i8::MIN);
    let mut acc = [[_mm512_setzero_ps(); MR]; NR];
    for g in 0..w.nbp / 8 {
        // −128 · d_w · (d_x · Σq_x) of 8 blocks: one FMA per (row, activation row).
        let mut dv = [_mm512_setzero_ps(); NR];
        for r in 0..NR {
            let d8 = load8(base.add(r * w.stride + w.nb * 32 + g * 16), false);
            dv[r] = wide(d8);
            let mv = _mm256_mul_ps(d8, _mm256_set1_ps(-128.0));
            for c in 0..MR {
                let sx = _mm256_loadu_ps(x.s.as_ptr().add((i + c) * x.nbp + g * 8));
                acc[r][c] = _mm512_fmadd_ps(wide(mv), wide(sx), acc[r][c]);
            }
        }
        let mut dx = [_mm512_setzero_ps(); MR];
        for c in 0..MR {
            dx[c] = wide(_mm256_loadu_ps(x.d.as_ptr().add((i + c) * x.nbp + g * 8)));
        }
        for p in 0..4 {
            let b = g * 8 + 2 * p;
            if b >= w.nb {
                break;
            }
            // An odd last block loads only its own 32 bytes (the masked bytes read as 0
            // and are never touched in memory); its partner's scale is padding, 0.
            let two = b + 1 < w.nb;
            let (a0, a1) = (2 * p as i32, 2 * p as i32 + 1);
            let idx = _mm512_setr_epi32(
                a0, a0, a0, a0, a0, a0, a0, a0, a1, a1, a1, a1, a1, a1, a1, a1,
            );
            let mut xv = [_mm512_setzero_si512(); MR];
            let mut sx = [_mm512_setzero_ps(); MR];
            for c in 0..MR {
                let xp = x.qs.as_ptr().add((i + c) * x.qstride + b * 32);
                xv[c] = if two {
                    _mm512_loadu_si512(xp as *const _)
                } else {
                    _mm512_maskz_loadu_epi8(LOW32, xp)
                };
                sx[c] = _mm512_permutexvar_ps(idx, dx[c]);
            }
            for r in 0..NR {
                let wp = base.add(r * w.stride + b * 32);
                let wq = if two {
                    _mm512_loadu_si512(wp as *const _)
                } else {
                    _mm512_maskz_loadu_epi8(LOW32, wp as *const i8)
                };
                let wu = _mm512_xor_si512(wq, flip);
                let sw = _mm512_permutexvar_ps(idx, dv[r]);
                for c in 0..MR {
                    let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wu, xv[c]);
                    let sc = _mm512_mul_ps(sw, sx[c]);
                    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sc, acc[r][c]);
                }
            }
        }
    }
    for r in 0..NR {
        for c in 0..MR {
            *out.add((i + c) * w.rows + n + r) = _mm512_reduce_add_ps(acc[r][c]);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub unsafe fn range4<const T: u8>(
    w: &QMatrix,
    x: &QuantizedActs,
    n0: usize,
    n1: usize,
    out: *mut f32,
) {
    drive!(w, x, n0, n1, out, tile4::<T>)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub unsafe fn range8(w: &QMatrix, x: &QuantizedActs, n0: usize, n1: usize, out: *mut f32) {
    drive!(w, x, n0, n1, out, tile8)
}
