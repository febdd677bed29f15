//! f32 → GGML blocks. Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 follow ggml's reference quantizers
//! (`quantize_row_*_ref`); the K-quants use a plain per-sub-block fit (min/max or absmax, then
//! the sub-block scales quantized against the super-block's): valid blocks that dequantize
//! within the type's resolution, not llama.cpp's error-minimising search.

use crate::types::GgmlType;
use half::{bf16, f16};

/// Quantize `x` (length a multiple of the block size) to `ty`; `None` if the length is not a
/// whole number of blocks. F32/F16/BF16 are plain conversions.
pub fn quantize(ty: GgmlType, x: &[f32]) -> Option<Vec<u8>> {
    let n = x.len();
    let mut out = Vec::with_capacity(ty.bytes_for(n as u64)? as usize);
    match ty {
        GgmlType::F32 => x.iter().for_each(|v| out.extend(v.to_le_bytes())),
        GgmlType::F16 => x
            .iter()
            .for_each(|v| out.extend(f16::from_f32(*v).to_le_bytes())),
        GgmlType::BF16 => x
            .iter()
            .for_each(|v| out.extend(bf16::from_f32(*v).to_le_bytes())),
        GgmlType::Q8_0 => {
            for b in x.chunks_exact(32) {
                let amax = b.iter().fold(0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(f16::from_f32(d).to_le_bytes());
                out.extend(b.iter().map(|v| (v * id).round() as i8 as u8));
            }
        }
        GgmlType::Q4_0 => {
            for b in x.chunks_exact(32) {
                let mut amax = 0f32;
                let mut max = 0f32;
                for &v in b {
                    if v.abs() > amax {
                        amax = v.abs();
                        max = v;
                    }
                }
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(f16::from_f32(d).to_le_bytes());
                for j in 0..16 {
                    let q0 = ((b[j] * id + 8.5) as i32).min(15) as u8;
                    let q1 = ((b[j + 16] * id + 8.5) as i32).min(15) as u8;
                    out.push(q0 | (q1 << 4));
                }
            }
        }
        GgmlType::Q4_1 => {
            for b in x.chunks_exact(32) {
                let min = b.iter().cloned().fold(f32::INFINITY, f32::min);
                let max = b.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(f16::from_f32(d).to_le_bytes());
                out.extend(f16::from_f32(min).to_le_bytes());
                for j in 0..16 {
                    let q0 = (((b[j] - min) * id + 0.5) as i32).min(15) as u8;
                    let q1 = (((b[j + 16] - min) * id + 0.5) as i32).min(15) as u8;
                    out.push(q0 | (q1 << 4));
                }
            }
        }
        GgmlType::Q4K => x.chunks_exact(256).for_each(|b| q4_k(b, &mut out)),
        GgmlType::Q5_0 => x.chunks_exact(32).for_each(|b| q5_0(b, &mut out)),
        GgmlType::Q5_1 => x.chunks_exact(32).for_each(|b| q5_1(b, &mut out)),
        GgmlType::Q2K => x.chunks_exact(256).for_each(|b| q2_k(b, &mut out)),
        GgmlType::Q3K => x.chunks_exact(256).for_each(|b| q3_k(b, &mut out)),
        GgmlType::Q5K => x.chunks_exact(256).for_each(|b| q5_k(b, &mut out)),
        GgmlType::Q6K => x.chunks_exact(256).for_each(|b| q6_k(b, &mut out)),
    }
    Some(out)
}

/// ggml's `quantize_row_q5_0_ref` for one block.
fn q5_0(b: &[f32], out: &mut Vec<u8>) {
    let max = b
        .iter()
        .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let d = max / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q = |v: f32| ((v * id + 16.5) as i8).min(31) as u8;
    q5_pack(b, d, None, q, out);
}

/// ggml's `quantize_row_q5_1_ref` for one block.
fn q5_1(b: &[f32], out: &mut Vec<u8>) {
    let min = b.iter().cloned().fold(f32::INFINITY, f32::min);
    let max = b.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let d = (max - min) / 31.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q = |v: f32| (((v - min) * id + 0.5) as u8).min(31);
    q5_pack(b, d, Some(min), q, out);
}

fn q5_pack(b: &[f32], d: f32, m: Option<f32>, q: impl Fn(f32) -> u8, out: &mut Vec<u8>) {
    out.extend(f16::from_f32(d).to_le_bytes());
    if let Some(m) = m {
        out.extend(f16::from_f32(m).to_le_bytes());
    }
    let mut qh = 0u32;
    let mut qs = [0u8; 16];
    for j in 0..16 {
        let (x0, x1) = (q(b[j]), q(b[j + 16]));
        qs[j] = (x0 & 0xF) | ((x1 & 0xF) << 4);
        qh |= ((x0 as u32 & 0x10) >> 4) << j;
        qh |= ((x1 as u32 & 0x10) >> 4) << (j + 16);
    }
    out.extend(qh.to_le_bytes());
    out.extend(qs);
}

/// Per sub-block affine fit `v ≈ s·q − m` with `q` in `0..=qmax` and the minimum clamped to
/// ≤ 0 (the K-quants store non-negative mins): (scales, mins) of each `len`-element sub-block.
fn affine_fit(x: &[f32], len: usize, qmax: f32) -> (Vec<f32>, Vec<f32>) {
    x.chunks_exact(len)
        .map(|s| {
            let lo = s.iter().cloned().fold(f32::INFINITY, f32::min).min(0.0);
            let hi = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            ((hi - lo) / qmax, -lo)
        })
        .unzip()
}

/// Quantize non-negative sub-block values against a super-block scale: (f16 scale, levels).
fn super_scale(v: &[f32], levels: f32) -> (f16, Vec<u8>) {
    let d = f16::from_f32(v.iter().cloned().fold(0f32, f32::max) / levels);
    let q = v
        .iter()
        .map(|s| {
            if d.to_f32() > 0.0 {
                (s / d.to_f32()).round().clamp(0.0, levels) as u8
            } else {
                0
            }
        })
        .collect();
    (d, q)
}

/// The integer value of `v` at step `ds` and offset `dm`, clamped to `0..=qmax`.
fn level(v: f32, ds: f32, dm: f32, qmax: f32) -> u8 {
    if ds > 0.0 {
        ((v + dm) / ds).round().clamp(0.0, qmax) as u8
    } else {
        0
    }
}

/// The 12 scale bytes of Q4_K/Q5_K (`get_scale_min_k4`'s inverse) for 6-bit scales and mins.
pub(crate) fn pack_k4_scales(ls: &[u8], lm: &[u8]) -> [u8; 12] {
    let mut sc = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            sc[j] = ls[j];
            sc[j + 4] = lm[j];
        } else {
            sc[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            sc[j - 4] |= (ls[j] >> 4) << 6;
            sc[j] |= (lm[j] >> 4) << 6;
        }
    }
    sc
}

/// Per-element values of a K-quant super-block with 32-element sub-blocks (Q4_K/Q5_K):
/// (d, dmin, 12 scale bytes, 256 levels in `0..=qmax`).
fn k_sub32(sb: &[f32], qmax: f32) -> (f16, f16, [u8; 12], [u8; 256]) {
    let (scales, mins) = affine_fit(sb, 32, qmax);
    let (d, ls) = super_scale(&scales, 63.0);
    let (dmin, lm) = super_scale(&mins, 63.0);
    let mut q = [0u8; 256];
    for (j, s) in sb.chunks_exact(32).enumerate() {
        let (ds, dm) = (d.to_f32() * ls[j] as f32, dmin.to_f32() * lm[j] as f32);
        for (l, &v) in s.iter().enumerate() {
            q[32 * j + l] = level(v, ds, dm, qmax);
        }
    }
    (d, dmin, pack_k4_scales(&ls, &lm), q)
}

/// Q4_K: `k_sub32` with 16 levels; `qs[32c + l]` holds sub-blocks 2c (low) and 2c+1 (high).
fn q4_k(sb: &[f32], out: &mut Vec<u8>) {
    let (d, dmin, sc, q) = k_sub32(sb, 15.0);
    out.extend(d.to_le_bytes());
    out.extend(dmin.to_le_bytes());
    out.extend(sc);
    for k in 0..4 {
        for l in 0..32 {
            out.push(q[64 * k + l] | (q[64 * k + 32 + l] << 4));
        }
    }
}

/// Q5_K: `k_sub32` with 32 levels; nibbles as Q4_K, the 5th bit of sub-block `s`, element `l`
/// at bit `s` of `qh[l]`.
fn q5_k(sb: &[f32], out: &mut Vec<u8>) {
    let (d, dmin, sc, q) = k_sub32(sb, 31.0);
    out.extend(d.to_le_bytes());
    out.extend(dmin.to_le_bytes());
    out.extend(sc);
    let mut qh = [0u8; 32];
    for (e, v) in q.iter().enumerate() {
        qh[e % 32] |= (v >> 4) << (e / 32);
    }
    out.extend(qh);
    for k in 0..4 {
        for l in 0..32 {
            out.push((q[64 * k + l] & 0xF) | ((q[64 * k + 32 + l] & 0xF) << 4));
        }
    }
}

/// The `qs[64]` of Q2_K/Q3_K from 256 2-bit values (`kquants::q2k_value`'s inverse).
fn pack_2bit(q: &[u8; 256]) -> [u8; 64] {
    let mut qs = [0u8; 64];
    for (e, v) in q.iter().enumerate() {
        let (half, r) = (e / 128, e % 128);
        qs[32 * half + r % 32] |= (v & 3) << (2 * (r / 32));
    }
    qs
}

/// Q2_K: per 16 elements an affine fit with 4-bit scale and min.
fn q2_k(sb: &[f32], out: &mut Vec<u8>) {
    let (scales, mins) = affine_fit(sb, 16, 3.0);
    let (d, ls) = super_scale(&scales, 15.0);
    let (dmin, lm) = super_scale(&mins, 15.0);
    let mut q = [0u8; 256];
    for (j, s) in sb.chunks_exact(16).enumerate() {
        let (ds, dm) = (d.to_f32() * ls[j] as f32, dmin.to_f32() * lm[j] as f32);
        for (l, &v) in s.iter().enumerate() {
            q[16 * j + l] = level(v, ds, dm, 3.0);
        }
    }
    out.extend((0..16).map(|j| ls[j] | (lm[j] << 4)));
    out.extend(pack_2bit(&q));
    out.extend(d.to_le_bytes());
    out.extend(dmin.to_le_bytes());
}

/// Signed per-16 absmax fit `v ≈ d·sc·(q − bias)`: (d, signed scales, levels in `0..2·bias`).
fn signed_fit(sb: &[f32], bias: f32, scale_max: f32) -> (f16, Vec<i32>, [u8; 256]) {
    let sub: Vec<f32> = sb
        .chunks_exact(16)
        .map(|s| {
            let m = s
                .iter()
                .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
            // The value of largest magnitude maps to −bias (as ggml's Q4_0/Q5_0 do).
            -m / bias
        })
        .collect();
    let amax = sub.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = f16::from_f32(amax / scale_max);
    let mut sc = vec![0i32; 16];
    let mut q = [0u8; 256];
    for (j, s) in sb.chunks_exact(16).enumerate() {
        if d.to_f32() > 0.0 {
            sc[j] = (sub[j] / d.to_f32())
                .round()
                .clamp(-scale_max - 1.0, scale_max) as i32;
        }
        let ds = d.to_f32() * sc[j] as f32;
        for (l, &v) in s.iter().enumerate() {
            q[16 * j + l] = if ds != 0.0 {
                ((v / ds).round() + bias).clamp(0.0, 2.0 * bias - 1.0) as u8
            } else {
                bias as u8
            };
        }
    }
    (d, sc, q)
}

/// Q3_K: per 16 elements a signed 6-bit scale, values −4..=3.
fn q3_k(sb: &[f32], out: &mut Vec<u8>) {
    let (d, sc, q) = signed_fit(sb, 4.0, 31.0);
    let mut hmask = [0u8; 32];
    for (e, v) in q.iter().enumerate() {
        hmask[e % 32] |= (v >> 2) << (e / 32);
    }
    let mut scales = [0u8; 12];
    for (j, s) in sc.iter().enumerate() {
        let l = (s + 32) as u8;
        if j < 8 {
            scales[j] = l & 0xF;
        } else {
            scales[j - 8] |= (l & 0xF) << 4;
        }
        scales[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
    }
    out.extend(hmask);
    out.extend(pack_2bit(&q));
    out.extend(scales);
    out.extend(d.to_le_bytes());
}

/// Q6_K: per 16 elements a signed 8-bit scale, values −32..=31.
fn q6_k(sb: &[f32], out: &mut Vec<u8>) {
    let (d, sc, q) = signed_fit(sb, 32.0, 127.0);
    let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
    for (e, v) in q.iter().enumerate() {
        let (half, r) = (e / 128, e % 128);
        let (k, l) = (r / 32, r % 32);
        ql[64 * half + l + 32 * (k % 2)] |= (v & 0xF) << (4 * (k / 2));
        qh[32 * half + l] |= (v >> 4) << (2 * k);
    }
    out.extend(ql);
    out.extend(qh);
    out.extend(sc.iter().map(|s| *s as i8 as u8));
    out.extend(d.to_le_bytes());
}
