//! AVX-512 VNNI tiles for the plane kinds: a pair of blocks is rebuilt from its planes into
//! one 512-bit register (`unpack512`) — elements 0–15 of both blocks in the lower half, 16–31
//! in the upper — against the pair's 64 activation bytes, one `vpdpbusd` per weight row and
//! activation row. The per-16 integer scales of Q6_K, Q3_K
//! and Q2_K enter the float scale of each lane (`d · sc` per 16 elements) instead of a
//! `vpmaddwd`. Offsets use [`super::planes`]'s 8-block terms, added to the accumulators once per
//! group, so every activation row's result is the same whatever the tile height.

use super::avx2::prefetch_rows;
use super::planes::{group_terms, K2, K3, K5, K6, Q5_0, Q5_1};
use super::ROW_BLOCK;
use crate::qmatmul::acts::QuantizedActs;
use crate::qmatmul::matrix::QMatrix;
use std::arch::x86_64::*;

/// The unsigned values of pair `pp` of a packed row as one register: elements 0–15 of both
/// blocks in the lower 32 bytes, 16–31 in the upper (the order of the pair's activations).
/// Nibbles: one 32-byte load broadcast, the upper half shifted by 4; the two-bit plane: its 16
/// bytes broadcast to the four 128-bit lanes, shifted by 0, 2, 4, 6; the bit plane: its 64 bits
/// are a byte mask.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn unpack512<const K: u8>(w: &QMatrix, row: *const u8, pp: usize) -> __m512i {
    let lay = &w.lay;
    let mut v = _mm512_setzero_si512();
    if !matches!(K, K3 | K2) {
        let q = _mm256_loadu_si256(row.add(lay.nib + pp * 32) as *const __m256i);
        let shifts = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
        v = _mm512_and_si512(
            _mm512_srlv_epi16(_mm512_broadcast_i64x4(q), shifts),
            _mm512_set1_epi8(0x0F),
        );
    }
    if matches!(K, K6 | K3 | K2) {
        let t = _mm_loadu_si128(row.add(lay.two + pp * 16) as *const __m128i);
        let shifts = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
        let t = _mm512_and_si512(
            _mm512_srlv_epi32(_mm512_broadcast_i32x4(t), shifts),
            _mm512_set1_epi8(3),
        );
        v = if K == K6 {
            _mm512_or_si512(v, _mm512_slli_epi16(t, 4))
        } else {
            t
        };
    }
    if matches!(K, Q5_0 | Q5_1 | K5 | K3) {
        let bits = std::ptr::read_unaligned(row.add(lay.bit + pp * 8) as *const u64);
        let hb = _mm512_set1_epi8(if K == K3 { 4 } else { 16 });
        v = _mm512_or_si512(v, _mm512_maskz_mov_epi8(bits, hb));
    }
    v
}

/// A tile of `NR` weight rows × `MR` activation rows of a plane kind `K`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<const K: u8, const NR: usize, const MR: usize>(
    w: &QMatrix,
    x: &QuantizedActs,
    n: usize,
    i: usize,
    out: *mut f32,
) {
    let per16 = matches!(K, K6 | K3 | K2);
    let base = w.data.as_ptr().add(n * w.stride);
    let mut acc = [[_mm512_setzero_ps(); MR]; NR];
    for g in 0..w.nbp / 8 {
        let mut dx8 = [_mm256_setzero_ps(); MR];
        let mut dx = [_mm512_setzero_ps(); MR];
        for c in 0..MR {
            dx8[c] = _mm256_loadu_ps(x.d.as_ptr().add((i + c) * x.nbp + g * 8));
            dx[c] = _mm512_zextps256_ps512(dx8[c]);
        }
        // Per weight row: the per-block scales (lanes 0–7), or for per-16 kinds `d · sc` of
        // the 16 sub-blocks.
        let mut sv = [_mm512_setzero_ps(); NR];
        for r in 0..NR {
            let row = base.add(r * w.stride);
            let mut sc16 = [0i16; 16];
            // The group's offset terms, folded into lanes 0–7 of the accumulators at once (a
            // second set of accumulators would spill the tile's registers).
            let mut off = [_mm256_setzero_ps(); MR];
            let a = group_terms::<K, MR>(w, x, row, g, i, &dx8, &mut off, &mut sc16);
            for c in 0..MR {
                acc[r][c] = _mm512_add_ps(acc[r][c], _mm512_zextps256_ps512(off[c]));
            }
            sv[r] = if per16 {
                let s = _mm256_loadu_si256(sc16.as_ptr() as *const __m256i);
                let s = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(s));
                // `a` holds d in every lane for these kinds.
                _mm512_mul_ps(_mm512_set1_ps(_mm256_cvtss_f32(a)), s)
            } else {
                _mm512_zextps256_ps512(a)
            };
        }
        for p in 0..4 {
            let b = g * 8 + 2 * p;
            if b >= w.lay.nbe {
                break;
            }
            // Lanes 0–3 and 8–11 hold block b's sums (its elements 0–15, then 16–31), lanes
            // 4–7 and 12–15 block b + 1's; per-16 scales: sub-blocks 4p, 4p+2, 4p+1, 4p+3.
            let (a0, a1) = (2 * p as i32, 2 * p as i32 + 1);
            let idx = _mm512_setr_epi32(
                a0, a0, a0, a0, a1, a1, a1, a1, a0, a0, a0, a0, a1, a1, a1, a1,
            );
            let (h0, h1, h2, h3) = (
                4 * p as i32,
                4 * p as i32 + 2,
                4 * p as i32 + 1,
                4 * p as i32 + 3,
            );
            let sidx = if per16 {
                _mm512_setr_epi32(
                    h0, h0, h0, h0, h1, h1, h1, h1, h2, h2, h2, h2, h3, h3, h3, h3,
                )
            } else {
                idx
            };
            let mut xv = [_mm512_setzero_si512(); MR];
            let mut sx = [_mm512_setzero_ps(); MR];
            for c in 0..MR {
                xv[c] =
                    _mm512_loadu_si512(x.qs.as_ptr().add((i + c) * x.qstride + b * 32) as *const _);
                sx[c] = _mm512_permutexvar_ps(idx, dx[c]);
            }
            for r in 0..NR {
                let wv = unpack512::<K>(w, base.add(r * w.stride), b / 2);
                let sw = _mm512_permutexvar_ps(sidx, sv[r]);
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

/// Output columns `[n0, n1)` of a plane kind `K`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub unsafe fn range<const K: u8>(
    w: &QMatrix,
    x: &QuantizedActs,
    n0: usize,
    n1: usize,
    out: *mut f32,
) {
    drive!(w, x, n0, n1, out, tile::<K>)
}
