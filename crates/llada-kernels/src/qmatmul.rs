//! Batched quantized matmul: `Y[M×N] = X[M×K] · W[N×K]ᵀ` with `W` in a GGML block format.
//!
//! Scheme (the same arithmetic as llama.cpp's CPU backend, different blocking):
//! 1. the activations `X` are quantized once per call to 8-bit blocks of 32 ([`QuantizedActs`]:
//!    an f32 scale `d`, 32 int8 values and `s = d·Σq` per block);
//! 2. every weight format is viewed as 32-element sub-blocks `w = scale·q + offset` with `q` 4- or
//!    8-bit integers, so one sub-block dot product is
//!    `scale·d·Σ(q·qx) + offset·s` — an integer dot product plus two scalar terms;
//! 3. register tiles of `NR` weight rows × `MR` activation rows are computed together, so every
//!    weight block that is loaded and unpacked serves `MR` activation rows; this is what makes the
//!    kernel scale with M (candle's does not);
//! 4. the N dimension is split across rayon's worker threads.
//!
//! On x86-64 with AVX2+FMA+F16C the tile kernel uses `_mm256_maddubs_epi16`; elsewhere a portable
//! scalar path computes the same sums (NEON is not written yet).

use crate::dequant::q4k_scale_min;
use crate::types::GgmlType;
use half::f16;
use rayon::prelude::*;
use std::sync::Arc;

/// Owner of the bytes behind a [`QMatrix`] (an mmapped file, or a `Vec`).
pub type ByteOwner = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// A weight matrix `[rows × cols]` (row-major: `rows` outputs, `cols` inputs) in a quantized
/// GGML block format. Rows are whole blocks.
#[derive(Clone)]
pub struct QMatrix {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    owner: ByteOwner,
    offset: usize,
}

/// Errors building a [`QMatrix`].
#[derive(Debug, thiserror::Error)]
pub enum QMatrixError {
    #[error("type {0} has no quantized matmul kernel")]
    UnsupportedType(GgmlType),
    #[error("{ty} needs the input dimension to be a multiple of {block}, got {cols}")]
    BadCols {
        ty: GgmlType,
        block: usize,
        cols: usize,
    },
    #[error("expected {expected} bytes for a {rows}x{cols} {ty} matrix, have {have}")]
    BadLength {
        ty: GgmlType,
        rows: usize,
        cols: usize,
        expected: usize,
        have: usize,
    },
}

impl QMatrix {
    /// Types with a kernel.
    pub fn supports(ty: GgmlType) -> bool {
        matches!(
            ty,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 | GgmlType::Q4K
        )
    }

    /// Wrap `owner[offset..]` as a `rows × cols` matrix of type `ty`.
    pub fn new(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        owner: ByteOwner,
        offset: usize,
    ) -> Result<Self, QMatrixError> {
        if !Self::supports(ty) {
            return Err(QMatrixError::UnsupportedType(ty));
        }
        if cols % ty.block_elems() != 0 || cols == 0 {
            return Err(QMatrixError::BadCols {
                ty,
                block: ty.block_elems(),
                cols,
            });
        }
        let expected = rows * cols / ty.block_elems() * ty.block_bytes();
        let have = (*owner).as_ref().len().saturating_sub(offset);
        if have < expected {
            return Err(QMatrixError::BadLength {
                ty,
                rows,
                cols,
                expected,
                have,
            });
        }
        Ok(Self {
            ty,
            rows,
            cols,
            owner,
            offset,
        })
    }

    /// Quantize a dense row-major `rows × cols` f32 matrix.
    pub fn quantize(ty: GgmlType, rows: usize, cols: usize, w: &[f32]) -> Result<Self, QMatrixError> {
        assert_eq!(w.len(), rows * cols);
        if !Self::supports(ty) {
            return Err(QMatrixError::UnsupportedType(ty));
        }
        if cols % ty.block_elems() != 0 {
            return Err(QMatrixError::BadCols {
                ty,
                block: ty.block_elems(),
                cols,
            });
        }
        let bytes = crate::dequant::quantize(ty, w).ok_or(QMatrixError::UnsupportedType(ty))?;
        Self::new(ty, rows, cols, Arc::new(bytes), 0)
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_elems() * self.ty.block_bytes()
    }
    /// All bytes of the matrix.
    pub fn bytes(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.offset..self.offset + self.rows * self.row_bytes()]
    }
    /// Bytes of row `r`.
    pub fn row(&self, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.bytes()[r * rb..(r + 1) * rb]
    }
    /// Dequantize row `r` into `out` (length `cols`).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        crate::dequant::dequantize(self.ty, self.row(r), out)
    }

    /// `out[M×rows] = x[M×cols] · selfᵀ`.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) {
        let acts = QuantizedActs::quantize(x, m, self.cols);
        self.matmul_q(&acts, out)
    }

    /// Same as [`QMatrix::matmul`] with activations already quantized (reuse them across the
    /// matrices that read the same input, e.g. q/k/v or gate/up).
    pub fn matmul_q(&self, x: &QuantizedActs, out: &mut [f32]) {
        assert_eq!(x.k, self.cols, "matmul: inner dimensions differ");
        assert_eq!(out.len(), x.m * self.rows, "matmul: output has the wrong size");
        let n = self.rows;
        let threads = rayon::current_num_threads().max(1);
        // Enough chunks to balance two to a few threads, each a whole number of row pairs.
        let chunk = (n.div_ceil(threads * 4)).next_multiple_of(8).max(8);
        let out_ptr = SendPtr(out.as_mut_ptr());
        let work = x.m * n * self.cols;
        let run = |c0: usize| {
            let c1 = (c0 + chunk).min(n);
            // SAFETY: chunks write disjoint column ranges [c0, c1) of `out`.
            unsafe { self.tile_range(x, c0, c1, out_ptr) };
        };
        if threads == 1 || work < 1 << 16 {
            (0..n).step_by(chunk).for_each(run);
        } else {
            (0..n).into_par_iter().step_by(chunk).for_each(run);
        }
    }

    /// Compute output columns `[n0, n1)` for all activation rows.
    ///
    /// # Safety
    /// `out` points to an `x.m × self.rows` buffer and no other thread writes columns `[n0, n1)`.
    unsafe fn tile_range(&self, x: &QuantizedActs, n0: usize, n1: usize, out: SendPtr) {
        #[cfg(target_arch = "x86_64")]
        {
            if simd::available() {
                match self.ty {
                    GgmlType::Q4_0 => simd::range::<0>(self, x, n0, n1, out.0),
                    GgmlType::Q4_1 => simd::range::<1>(self, x, n0, n1, out.0),
                    GgmlType::Q8_0 => simd::range::<2>(self, x, n0, n1, out.0),
                    GgmlType::Q4K => simd::range::<3>(self, x, n0, n1, out.0),
                    _ => unreachable!("QMatrix::new rejects types without a kernel"),
                }
                return;
            }
        }
        portable_range(self, x, n0, n1, out.0)
    }
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

/// Activations quantized to 8-bit blocks of 32: for row `i`, block `b`:
/// `x[i, 32b + l] ≈ d[i, b] · qs[i, 32b + l]`, and `s[i, b] = d[i, b] · Σ_l qs[i, 32b + l]`.
pub struct QuantizedActs {
    pub m: usize,
    pub k: usize,
    pub qs: Vec<i8>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
    /// `s / 8`, so SIMD kernels can spread the offset term over 8 lanes.
    pub s8: Vec<f32>,
}

impl QuantizedActs {
    /// Quantize a row-major `m × k` matrix (`k` a multiple of 32).
    pub fn quantize(x: &[f32], m: usize, k: usize) -> Self {
        assert_eq!(x.len(), m * k);
        assert!(k % 32 == 0, "activation width must be a multiple of 32");
        let nb = k / 32;
        let mut qs = vec![0i8; m * k];
        let mut d = vec![0f32; m * nb];
        let mut s = vec![0f32; m * nb];
        for (bi, (xb, qb)) in x.chunks_exact(32).zip(qs.chunks_exact_mut(32)).enumerate() {
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
            let dd = amax / 127.0;
            let id = if dd > 0.0 { 1.0 / dd } else { 0.0 };
            let mut sum = 0i32;
            for (q, v) in qb.iter_mut().zip(xb) {
                let qi = (v * id).round() as i32;
                *q = qi as i8;
                sum += qi;
            }
            d[bi] = dd;
            s[bi] = dd * sum as f32;
        }
        let s8 = s.iter().map(|v| v * 0.125).collect();
        Self { m, k, qs, d, s, s8 }
    }
}

/// Scale and offset of 32-element sub-block `b` of a weight row, and its integer values.
#[inline(always)]
fn f16_at(b: &[u8], o: usize) -> f32 {
    f16::from_le_bytes([b[o], b[o + 1]]).to_f32()
}

/// Portable path: decode each weight sub-block to integers and use the same integer dot product.
unsafe fn portable_range(w: &QMatrix, x: &QuantizedActs, n0: usize, n1: usize, out: *mut f32) {
    let nb = w.cols / 32;
    let mut q = [0i32; 32];
    for n in n0..n1 {
        let row = w.row(n);
        for i in 0..x.m {
            let mut acc = 0f32;
            for b in 0..nb {
                let (scale, offset) = decode_portable(w.ty, row, b, &mut q);
                let xq = &x.qs[i * w.cols + 32 * b..i * w.cols + 32 * b + 32];
                let dot: i32 = q.iter().zip(xq).map(|(a, &c)| a * c as i32).sum();
                acc += scale * x.d[i * nb + b] * dot as f32 + offset * x.s[i * nb + b];
            }
            *out.add(i * w.rows + n) = acc;
        }
    }
}

fn decode_portable(ty: GgmlType, row: &[u8], b: usize, q: &mut [i32; 32]) -> (f32, f32) {
    match ty {
        GgmlType::Q4_0 => {
            let blk = &row[18 * b..18 * b + 18];
            for j in 0..16 {
                q[j] = (blk[2 + j] & 0xF) as i32;
                q[j + 16] = (blk[2 + j] >> 4) as i32;
            }
            let d = f16_at(blk, 0);
            (d, -8.0 * d)
        }
        GgmlType::Q4_1 => {
            let blk = &row[20 * b..20 * b + 20];
            for j in 0..16 {
                q[j] = (blk[4 + j] & 0xF) as i32;
                q[j + 16] = (blk[4 + j] >> 4) as i32;
            }
            (f16_at(blk, 0), f16_at(blk, 2))
        }
        GgmlType::Q8_0 => {
            let blk = &row[34 * b..34 * b + 34];
            for j in 0..32 {
                q[j] = blk[2 + j] as i8 as i32;
            }
            (f16_at(blk, 0), 0.0)
        }
        GgmlType::Q4K => {
            let (sb, j) = (b / 8, b % 8);
            let blk = &row[144 * sb..144 * sb + 144];
            let (sc, mn) = q4k_scale_min(j, &blk[4..16]);
            let qs = &blk[16 + 32 * (j / 2)..16 + 32 * (j / 2) + 32];
            let shift = 4 * (j % 2);
            for l in 0..32 {
                q[l] = ((qs[l] >> shift) & 0xF) as i32;
            }
            (f16_at(blk, 0) * sc as f32, -f16_at(blk, 2) * mn as f32)
        }
        _ => unreachable!(),
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{q4k_scale_min, QMatrix, QuantizedActs};
    use std::arch::x86_64::*;

    pub fn available() -> bool {
        use std::sync::OnceLock;
        static OK: OnceLock<bool> = OnceLock::new();
        *OK.get_or_init(|| {
            is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
        })
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn h2f(p: *const u8) -> f32 {
        let h = (p as *const u16).read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack16(p: *const u8) -> __m256i {
        let q = _mm_loadu_si128(p as *const __m128i);
        let m4 = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(q, m4);
        let hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
        _mm256_set_m128i(hi, lo)
    }

    /// Weight sub-block `b` of `row` as (32 values, scale, offset, signed?).
    /// T: 0 = Q4_0, 1 = Q4_1, 2 = Q8_0, 3 = Q4_K.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode<const T: u8>(row: *const u8, b: usize) -> (__m256i, f32, f32) {
        match T {
            0 => {
                let p = row.add(18 * b);
                let d = h2f(p);
                (unpack16(p.add(2)), d, -8.0 * d)
            }
            1 => {
                let p = row.add(20 * b);
                (unpack16(p.add(4)), h2f(p), h2f(p.add(2)))
            }
            2 => {
                let p = row.add(34 * b);
                (_mm256_loadu_si256(p.add(2) as *const __m256i), h2f(p), 0.0)
            }
            _ => {
                let (sb, j) = (b / 8, b % 8);
                let p = row.add(144 * sb);
                let scales = std::slice::from_raw_parts(p.add(4), 12);
                let (sc, mn) = q4k_scale_min(j, scales);
                let q = _mm256_loadu_si256(p.add(16 + 32 * (j / 2)) as *const __m256i);
                let q = if j % 2 == 0 { q } else { _mm256_srli_epi16(q, 4) };
                let q = _mm256_and_si256(q, _mm256_set1_epi8(0x0F));
                (q, h2f(p) * sc as f32, -h2f(p.add(2)) * mn as f32)
            }
        }
    }

    /// One `NR × MR` tile: weight rows `n..n+NR`, activation rows `i..i+MR`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const T: u8, const NR: usize, const MR: usize>(
        w: &QMatrix,
        x: &QuantizedActs,
        n: usize,
        i: usize,
        out: *mut f32,
    ) {
        let k = w.cols;
        let nb = k / 32;
        let rb = w.row_bytes();
        let base = w.bytes().as_ptr();
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); MR]; NR];
        let xq = x.qs.as_ptr();
        for b in 0..nb {
            let mut wv = [_mm256_setzero_si256(); NR];
            let mut wa = [_mm256_setzero_si256(); NR];
            let mut ws = [_mm256_setzero_ps(); NR];
            let mut wo = [_mm256_setzero_ps(); NR];
            for r in 0..NR {
                let (v, s, o) = decode::<T>(base.add((n + r) * rb), b);
                wv[r] = v;
                wa[r] = if T == 2 { _mm256_sign_epi8(v, v) } else { v };
                ws[r] = _mm256_set1_ps(s);
                wo[r] = _mm256_set1_ps(o);
            }
            for c in 0..MR {
                let row = i + c;
                let xv = _mm256_loadu_si256(xq.add(row * k + 32 * b) as *const __m256i);
                let dx = _mm256_set1_ps(*x.d.get_unchecked(row * nb + b));
                // s/8 in every lane: the horizontal sum of the 8 lanes adds `offset · s` once.
                let sx = _mm256_set1_ps(*x.s8.get_unchecked(row * nb + b));
                for r in 0..NR {
                    let xs = if T == 2 { _mm256_sign_epi8(xv, wv[r]) } else { xv };
                    let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(wa[r], xs), ones);
                    acc[r][c] = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(dot),
                        _mm256_mul_ps(ws[r], dx),
                        acc[r][c],
                    );
                    if T != 2 {
                        acc[r][c] = _mm256_fmadd_ps(wo[r], sx, acc[r][c]);
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

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// Weight rows per cache block: a block of rows stays in L2 while all activation rows pass.
    const ROW_BLOCK: usize = 32;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn range<const T: u8>(
        w: &QMatrix,
        x: &QuantizedActs,
        n0: usize,
        n1: usize,
        out: *mut f32,
    ) {
        const NR: usize = 2;
        const MR: usize = 4;
        let mut nb0 = n0;
        while nb0 < n1 {
            let nb1 = (nb0 + ROW_BLOCK).min(n1);
            let mut i = 0;
            while i < x.m {
                let mr = (x.m - i).min(MR);
                let mut n = nb0;
                while n + NR <= nb1 {
                    match mr {
                        4 => tile::<T, NR, 4>(w, x, n, i, out),
                        3 => tile::<T, NR, 3>(w, x, n, i, out),
                        2 => tile::<T, NR, 2>(w, x, n, i, out),
                        _ => tile::<T, NR, 1>(w, x, n, i, out),
                    }
                    n += NR;
                }
                if n < nb1 {
                    match mr {
                        4 => tile::<T, 1, 4>(w, x, n, i, out),
                        3 => tile::<T, 1, 3>(w, x, n, i, out),
                        2 => tile::<T, 1, 2>(w, x, n, i, out),
                        _ => tile::<T, 1, 1>(w, x, n, i, out),
                    }
                }
                i += mr;
            }
            nb0 = nb1;
        }
    }
}

/// Plain f32 matmul `out[M×N] = x[M×K] · w[N×K]ᵀ`, used for reference checks and small dense
/// weights (large dense weights go through candle).
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

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn check(ty: GgmlType, m: usize, n: usize, k: usize) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let w: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0..1.0)).collect();
        let x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0..1.0)).collect();
        let q = QMatrix::quantize(ty, n, k, &w).unwrap();
        // Reference: dequantized weights × exact activations in f64.
        let mut wd = vec![0f32; n * k];
        for r in 0..n {
            q.dequantize_row(r, &mut wd[r * k..(r + 1) * k]);
        }
        let mut got = vec![0f32; m * n];
        q.matmul(&x, m, &mut got);
        let mut max_err = 0f64;
        let mut max_ref = 0f64;
        for i in 0..m {
            for j in 0..n {
                let r: f64 = (0..k).map(|l| x[i * k + l] as f64 * wd[j * k + l] as f64).sum();
                max_err = max_err.max((r - got[i * n + j] as f64).abs());
                max_ref = max_ref.max(r.abs());
            }
        }
        // 8-bit activations: relative error of a K-term dot product stays around 1%.
        assert!(
            max_err / max_ref < 0.02,
            "{ty} m={m} n={n} k={k}: max err {max_err} vs max {max_ref}"
        );
        // The portable path must agree with the SIMD path.
        let acts = QuantizedActs::quantize(&x, m, k);
        let mut port = vec![0f32; m * n];
        unsafe { portable_range(&q, &acts, 0, n, port.as_mut_ptr()) };
        for (a, b) in port.iter().zip(&got) {
            assert!((a - b).abs() <= 1e-3 * (1.0 + a.abs()), "{ty}: portable {a} vs simd {b}");
        }
    }

    #[test]
    fn qmatmul_matches_dequantized_reference() {
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4K] {
            for (m, n) in [(1, 3), (3, 17), (4, 8), (9, 33), (13, 64)] {
                check(ty, m, n, 512);
            }
        }
    }

    #[test]
    fn rejects_bad_shapes() {
        assert!(QMatrix::quantize(GgmlType::Q4K, 2, 64, &vec![0.0; 128]).is_err());
        let err = QMatrix::new(GgmlType::Q8_0, 4, 32, Arc::new(vec![0u8; 10]), 0);
        assert!(matches!(err, Err(QMatrixError::BadLength { .. })));
        assert!(QMatrix::new(GgmlType::F16, 4, 32, Arc::new(vec![0u8; 1000]), 0).is_err());
    }
}
