//! Reference dequantisation (block bytes → f32) and quantisation (f32 → block bytes) for every
//! supported GGML type. Layouts follow ggml's `block_*` structs; these scalar routines are the
//! ground truth the SIMD kernels are tested against (and are themselves tested against the
//! independent numpy dequantizers of `tests/reference/gguf_io.py`).
//!
//! Files: this one (dispatch, float and 32-element types), `kquants` (Q5_0/Q5_1 and the
//! K-quants: also the per-element accessors the repacker uses), `quantize` (f32 → blocks).

pub(crate) mod kquants;
mod quantize;

pub use quantize::quantize;

use crate::types::GgmlType;
use half::{bf16, f16};

#[inline]
pub(crate) fn f16_at(b: &[u8], o: usize) -> f32 {
    f16::from_le_bytes([b[o], b[o + 1]]).to_f32()
}

/// Scale and min of sub-block `j` of a Q4_K block (ggml's `get_scale_min_k4`).
#[inline]
pub fn q4k_scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Dequantize `out.len()` elements of type `ty` from `src` (which must hold exactly those bytes).
///
/// Panics only on a length mismatch, which callers rule out when they validate tensor shapes.
pub fn dequantize(ty: GgmlType, src: &[u8], out: &mut [f32]) {
    let n = out.len();
    assert_eq!(
        Some(src.len() as u64),
        ty.bytes_for(n as u64),
        "dequantize: byte length does not match element count"
    );
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::Q4_0 => {
            for (y, b) in out.chunks_exact_mut(32).zip(src.chunks_exact(18)) {
                let d = f16_at(b, 0);
                for j in 0..16 {
                    y[j] = ((b[2 + j] & 0xF) as i32 - 8) as f32 * d;
                    y[j + 16] = ((b[2 + j] >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
        GgmlType::Q4_1 => {
            for (y, b) in out.chunks_exact_mut(32).zip(src.chunks_exact(20)) {
                let d = f16_at(b, 0);
                let m = f16_at(b, 2);
                for j in 0..16 {
                    y[j] = (b[4 + j] & 0xF) as f32 * d + m;
                    y[j + 16] = (b[4 + j] >> 4) as f32 * d + m;
                }
            }
        }
        GgmlType::Q8_0 => {
            for (y, b) in out.chunks_exact_mut(32).zip(src.chunks_exact(34)) {
                let d = f16_at(b, 0);
                for j in 0..32 {
                    y[j] = (b[2 + j] as i8) as f32 * d;
                }
            }
        }
        GgmlType::Q5_0 => kquants::q5_0(src, out),
        GgmlType::Q5_1 => kquants::q5_1(src, out),
        GgmlType::Q2K => kquants::q2_k(src, out),
        GgmlType::Q3K => kquants::q3_k(src, out),
        GgmlType::Q5K => kquants::q5_k(src, out),
        GgmlType::Q4K => {
            for (y, b) in out.chunks_exact_mut(256).zip(src.chunks_exact(144)) {
                let d = f16_at(b, 0);
                let dmin = f16_at(b, 2);
                let scales = &b[4..16];
                let qs = &b[16..144];
                for k in 0..4 {
                    let (s1, m1) = q4k_scale_min(2 * k, scales);
                    let (s2, m2) = q4k_scale_min(2 * k + 1, scales);
                    let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
                    let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
                    let q = &qs[32 * k..32 * k + 32];
                    for l in 0..32 {
                        y[64 * k + l] = d1 * (q[l] & 0xF) as f32 - m1;
                        y[64 * k + 32 + l] = d2 * (q[l] >> 4) as f32 - m2;
                    }
                }
            }
        }
        GgmlType::Q6K => {
            for (y, b) in out.chunks_exact_mut(256).zip(src.chunks_exact(210)) {
                let d = f16_at(b, 208);
                for half_ in 0..2 {
                    let ql = &b[64 * half_..64 * half_ + 64];
                    let qh = &b[128 + 32 * half_..128 + 32 * half_ + 32];
                    let sc = &b[192 + 8 * half_..192 + 8 * half_ + 8];
                    let y = &mut y[128 * half_..128 * half_ + 128];
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                        let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                        y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                        y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                        y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                        y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_error_is_small() {
        let x: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        for (ty, tol) in [
            (GgmlType::Q8_0, 0.02),
            (GgmlType::Q4_0, 0.3),
            (GgmlType::Q4_1, 0.15),
            (GgmlType::Q4K, 0.2),
            (GgmlType::Q5_0, 0.15),
            (GgmlType::Q5_1, 0.08),
            (GgmlType::Q5K, 0.1),
            (GgmlType::Q6K, 0.08),
            (GgmlType::Q3K, 0.6),
            (GgmlType::Q2K, 0.8),
            (GgmlType::F16, 1e-3),
        ] {
            let q = quantize(ty, &x).unwrap();
            let mut y = vec![0f32; x.len()];
            dequantize(ty, &q, &mut y);
            let err = x
                .iter()
                .zip(&y)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(err < tol, "{ty}: max error {err}");
        }
    }
}
