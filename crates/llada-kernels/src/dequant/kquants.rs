//! Scalar dequantizers of the 5-bit and K-quant block types, transliterated from ggml's
//! `dequantize_row_*` (ggml-quants.c) with the same float operation order. Each takes whole
//! blocks (`src` a multiple of the block bytes, `y` of the block elements).

use super::{f16_at, q4k_scale_min};

/// Q5_0: 32 elements in 22 bytes: f16 d, u32 qh (bit j = 5th bit of element j), u8 qs[16].
pub(super) fn q5_0(src: &[u8], y: &mut [f32]) {
    for (y, b) in y.chunks_exact_mut(32).zip(src.chunks_exact(22)) {
        let d = f16_at(b, 0);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        for j in 0..16 {
            let (lo, hi) = q5_pair(b[6 + j], qh, j);
            y[j] = (lo - 16) as f32 * d;
            y[j + 16] = (hi - 16) as f32 * d;
        }
    }
}

/// Q5_1: 32 elements in 24 bytes: f16 d, f16 m, u32 qh, u8 qs[16]; `y = q·d + m`.
pub(super) fn q5_1(src: &[u8], y: &mut [f32]) {
    for (y, b) in y.chunks_exact_mut(32).zip(src.chunks_exact(24)) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        for j in 0..16 {
            let (lo, hi) = q5_pair(b[8 + j], qh, j);
            y[j] = lo as f32 * d + m;
            y[j + 16] = hi as f32 * d + m;
        }
    }
}

/// The 5-bit values of elements `j` and `j + 16` from their nibble byte and the high bits.
#[inline]
pub(crate) fn q5_pair(q: u8, qh: u32, j: usize) -> (i32, i32) {
    let h0 = ((qh >> j) << 4) & 0x10;
    let h1 = (qh >> (j + 12)) & 0x10;
    ((q as u32 & 0xF | h0) as i32, ((q >> 4) as u32 | h1) as i32)
}

/// Q2_K: 256 elements in 84 bytes: u8 scales[16] (low nibble scale, high nibble min of each
/// 16 elements), u8 qs[64] (2-bit values), f16 d, f16 dmin.
pub(super) fn q2_k(src: &[u8], y: &mut [f32]) {
    for (y, b) in y.chunks_exact_mut(256).zip(src.chunks_exact(84)) {
        let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
        for e in 0..256 {
            let sc = b[e / 16];
            let (dl, ml) = (d * (sc & 0xF) as f32, dmin * (sc >> 4) as f32);
            y[e] = dl * q2k_value(&b[16..80], e) as f32 - ml;
        }
    }
}

/// The 2-bit value of element `e` (0..256) of a Q2_K/Q3_K block's `qs[64]`: in each half of
/// 128, byte `l` of the half's 32 holds elements `l`, `l + 32`, `l + 64`, `l + 96` at bit
/// offsets 0, 2, 4, 6.
#[inline]
pub(crate) fn q2k_value(qs: &[u8], e: usize) -> u8 {
    let (half, r) = (e / 128, e % 128);
    (qs[32 * half + r % 32] >> (2 * (r / 32))) & 3
}

/// Q3_K: 256 elements in 110 bytes: u8 hmask[32], u8 qs[64], u8 scales[12] (16 6-bit scales
/// biased by 32), f16 d. Value `q2 − (hbit ? 0 : 4)`.
pub(super) fn q3_k(src: &[u8], y: &mut [f32]) {
    for (y, b) in y.chunks_exact_mut(256).zip(src.chunks_exact(110)) {
        let d = f16_at(b, 108);
        let sc = q3k_scales(&b[96..108]);
        for e in 0..256 {
            let dl = d * (sc[e / 16] as i32 - 32) as f32;
            y[e] = dl * (q3k_value(b, e) as i32 - 4) as f32;
        }
    }
}

/// Element `e`'s 3-bit value `q2 + 4·hbit` (0..8) of a Q3_K block: the high bit of element
/// `e` is bit `e / 32` of `hmask[e % 32]`.
#[inline]
pub(crate) fn q3k_value(b: &[u8], e: usize) -> u8 {
    let h = (b[e % 32] >> (e / 32)) & 1;
    q2k_value(&b[32..96], e) | (h << 2)
}

/// The 16 6-bit scales of a Q3_K block (still biased by 32), ggml's `kmask` unpacking.
pub(crate) fn q3k_scales(s: &[u8]) -> [u8; 16] {
    let w = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (a0, a1, tmp) = (w(0), w(1), w(2));
    const K1: u32 = 0x0303_0303;
    const K2: u32 = 0x0f0f_0f0f;
    let aux = [
        (a0 & K2) | ((tmp & K1) << 4),
        (a1 & K2) | (((tmp >> 2) & K1) << 4),
        ((a0 >> 4) & K2) | (((tmp >> 4) & K1) << 4),
        ((a1 >> 4) & K2) | (((tmp >> 6) & K1) << 4),
    ];
    let mut out = [0u8; 16];
    for (o, a) in out.chunks_exact_mut(4).zip(aux) {
        o.copy_from_slice(&a.to_le_bytes());
    }
    out
}

/// Q5_K: 256 elements in 176 bytes: f16 d, f16 dmin, u8 scales[12] (as Q4_K), u8 qh[32],
/// u8 qs[128].
pub(super) fn q5_k(src: &[u8], y: &mut [f32]) {
    for (y, b) in y.chunks_exact_mut(256).zip(src.chunks_exact(176)) {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        for s in 0..8 {
            let (sc, mn) = q4k_scale_min(s, &b[4..16]);
            let (d1, m1) = (d * sc as f32, dmin * mn as f32);
            for l in 0..32 {
                y[32 * s + l] = d1 * q5k_value(b, 32 * s + l) as f32 - m1;
            }
        }
    }
}

/// Element `e`'s 5-bit value of a Q5_K block: nibble of `qs[32·(s/2) + l]` (low for even
/// sub-block `s = e / 32`, high for odd), high bit = bit `s` of `qh[l]`.
#[inline]
pub(crate) fn q5k_value(b: &[u8], e: usize) -> u8 {
    let (s, l) = (e / 32, e % 32);
    let q = b[48 + 32 * (s / 2) + l] >> (4 * (s % 2)) & 0xF;
    q | (((b[16 + l] >> s) & 1) << 4)
}
