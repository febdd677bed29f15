//! Small f32 vector primitives (dot product, `y += a·x`) with AVX2+FMA dispatch at run time:
//! the crate is built for baseline x86-64 (SSE2 only), so without this the attention inner loops
//! would run 4-wide without FMA.

/// `Σ a[i]·b[i]`.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    {
        if avx2() {
            // SAFETY: the CPU supports AVX2 and FMA (checked once, cached).
            return unsafe { x86::dot(a, b) };
        }
    }
    let mut acc = [0f32; 8];
    let n8 = a.len() / 8 * 8;
    for (ca, cb) in a[..n8].chunks_exact(8).zip(b[..n8].chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += ca[l] * cb[l];
        }
    }
    acc.iter().sum::<f32>()
        + a[n8..]
            .iter()
            .zip(&b[n8..])
            .map(|(x, y)| x * y)
            .sum::<f32>()
}

/// `y[i] += a · x[i]`.
#[inline]
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    debug_assert_eq!(y.len(), x.len());
    #[cfg(target_arch = "x86_64")]
    {
        if avx2() {
            // SAFETY: as in `dot`.
            return unsafe { x86::axpy(y, a, x) };
        }
    }
    for (o, v) in y.iter_mut().zip(x) {
        *o += a * v;
    }
}

/// `out[f·m + i] = Σ_k w[f·k..][k] · x[i·k..][k]` for the `nf = w.len() / k` weight rows `f`
/// and the `m = x.len() / k` activation rows `i` (`out` is `nf × m`, feature-major): the
/// few-row product `x · Wᵀ` of diffusion windows, tree verification and draft steps.
///
/// Written by hand because the gemm candle uses packs the whole weight matrix on every call,
/// which for passes of up to a few dozen rows costs as much as the product (perf, dual-cache
/// diffusion: 23 % of the run in gemm's packing loops against 20 % in its microkernel). Here
/// the weights are read in place: register tiles of 4 activation rows × 2 weight rows (8
/// accumulators, 6 loads per 8 FMAs).
///
/// **Batch-invariant**: every output is one 8-lane FMA chain over `k` in steps of 8, reduced
/// as `((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))`, then the `k % 8` tail added in order, whatever
/// `m`, `nf` and the output's place in a tile. A row's result therefore does not depend on
/// which other rows share the pass, so a verification pass of any width reproduces the
/// one-row decode step bit for bit (lossless speculative decoding relies on it).
pub fn matmul_rows(w: &[f32], x: &[f32], k: usize, out: &mut [f32]) {
    if k == 0 {
        out.iter_mut().for_each(|o| *o = 0.0);
        return;
    }
    let (nf, m) = (w.len() / k, x.len() / k);
    assert!(
        w.len() == nf * k && x.len() == m * k && out.len() == nf * m,
        "matmul_rows: shapes"
    );
    #[cfg(target_arch = "x86_64")]
    {
        if avx2() {
            // SAFETY: AVX2 and FMA are present; the shapes are checked above.
            unsafe { x86::matmul_rows(w, x, k, out) };
            return;
        }
    }
    for f in 0..nf {
        for i in 0..m {
            out[f * m + i] = dot8_tree(&w[f * k..(f + 1) * k], &x[i * k..(i + 1) * k]);
        }
    }
}

/// The portable form of [`matmul_rows`]'s per-output order (8 lanes, tree reduction, tail).
fn dot8_tree(a: &[f32], b: &[f32]) -> f32 {
    let k8 = a.len() / 8 * 8;
    let mut l = [0f32; 8];
    for (ca, cb) in a[..k8].chunks_exact(8).zip(b[..k8].chunks_exact(8)) {
        for u in 0..8 {
            l[u] = ca[u].mul_add(cb[u], l[u]);
        }
    }
    let mut s = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    for (x, y) in a[k8..].iter().zip(&b[k8..]) {
        s += x * y;
    }
    s
}

/// Key/value rows of one attention head, read in place from two row-major buffers: the cache's
/// rows (`cache_k`, `cache_v`) and the current pass's rows (`new_k`, `new_v`), both with row
/// stride `stride`, the head's columns starting at `offset`. Key `j` of an index list is cache
/// row `j` when `j < split`, else new row `j − split`.
#[derive(Clone, Copy)]
pub struct KvRows<'a> {
    pub cache_k: &'a [f32],
    pub cache_v: &'a [f32],
    pub new_k: &'a [f32],
    pub new_v: &'a [f32],
    pub split: u32,
    pub stride: usize,
    pub offset: usize,
}

impl<'a> KvRows<'a> {
    /// Row `j` of the head's columns, from `cache` or `new` (see the type's doc).
    #[inline]
    fn row(&self, cache: &'a [f32], new: &'a [f32], j: u32, hd: usize) -> &'a [f32] {
        let (buf, r) = if j < self.split {
            (cache, j)
        } else {
            (new, j - self.split)
        };
        let o = r as usize * self.stride + self.offset;
        &buf[o..o + hd]
    }
    #[inline]
    fn k(&self, j: u32, hd: usize) -> &'a [f32] {
        self.row(self.cache_k, self.new_k, j, hd)
    }
    #[inline]
    fn v(&self, j: u32, hd: usize) -> &'a [f32] {
        self.row(self.cache_v, self.new_v, j, hd)
    }
}

/// One query head against the keys `idx` (in that order): `out = Σ_j softmax_j(scale · q·k_j) v_j`;
/// `out` is zero when `idx` is empty. `scores` is scratch of at least `idx.len()`.
///
/// Written by hand (rather than a gemm) because each query row sees its own key list (masks,
/// revised slots) and rows are few: the per-key `dot`/`axpy` calls this replaces spent more time
/// in call overhead and reloading `out` than in arithmetic. The arithmetic order is exactly
/// [`dot`]'s and a chain of [`axpy`]s, so results are bit-identical to those.
pub fn attend_head(
    q: &[f32],
    kv: &KvRows,
    idx: &[u32],
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let hd = q.len();
    let scores = &mut scores[..idx.len()];
    #[cfg(target_arch = "x86_64")]
    let fast = avx2() && hd.is_multiple_of(8);
    #[cfg(not(target_arch = "x86_64"))]
    let fast = false;
    if fast {
        // SAFETY: AVX2 and FMA are present (`avx2`); every row slice is bounds-checked by
        // `KvRows`.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            x86::scores(q, kv, idx, scale, scores)
        };
    } else {
        for (sc, &j) in scores.iter_mut().zip(idx) {
            *sc = dot(q, kv.k(j, hd)) * scale;
        }
    }
    let inv = softmax_in_place(scores);
    out.iter_mut().for_each(|o| *o = 0.0);
    let Some(inv) = inv else { return };
    if fast {
        // SAFETY: as above; `hd % 8 == 0`.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            x86::weighted_sum(kv, idx, scores, inv, out)
        };
    } else {
        for (p, &j) in scores.iter().zip(idx) {
            axpy(out, p * inv, kv.v(j, hd));
        }
    }
}

/// `s ← exp(s − max s)`; returns `1 / Σ s`, or `None` when the sum is not positive.
#[inline]
fn softmax_in_place(scores: &mut [f32]) -> Option<f32> {
    let mx = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    let mut sum = 0f32;
    for sc in scores.iter_mut() {
        *sc = (*sc - mx).exp();
        sum += *sc;
    }
    (sum > 0.0).then(|| 1.0 / sum)
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn avx2() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    static S: AtomicU8 = AtomicU8::new(0);
    match S.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let ok = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
            S.store(if ok { 1 } else { 2 }, Ordering::Relaxed);
            ok
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut s0 = _mm256_setzero_ps();
        let mut s1 = _mm256_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), s0);
            s1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 8)),
                _mm256_loadu_ps(pb.add(i + 8)),
                s1,
            );
            i += 16;
        }
        while i + 8 <= n {
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), s0);
            i += 8;
        }
        let mut r = hsum(s0, s1);
        while i < n {
            r += *pa.add(i) * *pb.add(i);
            i += 1;
        }
        r
    }

    #[inline(always)]
    unsafe fn hsum(s0: __m256, s1: __m256) -> f32 {
        let s = _mm256_add_ps(s0, s1);
        let h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        let h = _mm_add_ss(h, _mm_movehdup_ps(h));
        _mm_cvtss_f32(h)
    }

    /// `scores[t] = dot(q, k_idx[t]) · scale`, with [`dot`]'s summation order (`hd % 8 == 0`).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scores(
        q: &[f32],
        kv: &super::KvRows,
        idx: &[u32],
        scale: f32,
        scores: &mut [f32],
    ) {
        let n = q.len();
        for (sc, &j) in scores.iter_mut().zip(idx) {
            *sc = dot(q, kv.k(j, n)) * scale;
        }
    }

    /// `out += Σ_t (p[t] · inv) · v_idx[t]` in key order, 32 columns at a time held in
    /// registers (each FMA is the one [`axpy`] would do; `out.len() % 8 == 0`).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn weighted_sum(
        kv: &super::KvRows,
        idx: &[u32],
        p: &[f32],
        inv: f32,
        out: &mut [f32],
    ) {
        let hd = out.len();
        let po = out.as_mut_ptr();
        let mut c0 = 0;
        while c0 < hd {
            let w = ((hd - c0) / 8).min(4);
            let mut acc = [_mm256_setzero_ps(); 4];
            for (u, a) in acc.iter_mut().enumerate().take(w) {
                *a = _mm256_loadu_ps(po.add(c0 + 8 * u));
            }
            for (&pt, &j) in p.iter().zip(idx) {
                let va = _mm256_set1_ps(pt * inv);
                let pv = kv.v(j, hd).as_ptr().add(c0);
                for (u, a) in acc.iter_mut().enumerate().take(w) {
                    *a = _mm256_fmadd_ps(va, _mm256_loadu_ps(pv.add(8 * u)), *a);
                }
            }
            for (u, a) in acc.iter().enumerate().take(w) {
                _mm256_storeu_ps(po.add(c0 + 8 * u), *a);
            }
            c0 += 8 * w;
        }
    }

    /// Lanes of `v` summed as `((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))`.
    #[inline(always)]
    unsafe fn hsum_tree(v: __m256) -> f32 {
        let h = _mm256_hadd_ps(v, v);
        let h = _mm256_hadd_ps(h, h);
        _mm_cvtss_f32(_mm_add_ss(
            _mm256_castps256_ps128(h),
            _mm256_extractf128_ps(h, 1),
        ))
    }

    /// Eight accumulators reduced at once, each with [`hsum_tree`]'s order: lane `u` of the
    /// result is the sum of `a[u]`.
    #[inline(always)]
    unsafe fn hsum8_tree(a: &[__m256; 8]) -> __m256 {
        let h01 = _mm256_hadd_ps(a[0], a[1]);
        let h23 = _mm256_hadd_ps(a[2], a[3]);
        let h45 = _mm256_hadd_ps(a[4], a[5]);
        let h67 = _mm256_hadd_ps(a[6], a[7]);
        let h0 = _mm256_hadd_ps(h01, h23);
        let h1 = _mm256_hadd_ps(h45, h67);
        _mm256_add_ps(
            _mm256_permute2f128_ps(h0, h1, 0x20),
            _mm256_permute2f128_ps(h0, h1, 0x31),
        )
    }

    /// One output with [`super::matmul_rows`]'s order.
    #[inline(always)]
    unsafe fn dot_tree(pw: *const f32, px: *const f32, k: usize) -> f32 {
        let k8 = k / 8 * 8;
        let mut a = _mm256_setzero_ps();
        let mut j = 0;
        while j < k8 {
            a = _mm256_fmadd_ps(_mm256_loadu_ps(px.add(j)), _mm256_loadu_ps(pw.add(j)), a);
            j += 8;
        }
        add_tail(hsum_tree(a), pw, px, k8, k)
    }

    /// `s` plus the products of `k8..k` (the part of `k` past the last full 8 lanes), in order:
    /// the last step of every output of [`super::matmul_rows`].
    #[inline(always)]
    unsafe fn add_tail(mut s: f32, pw: *const f32, px: *const f32, k8: usize, k: usize) -> f32 {
        for j in k8..k {
            s += *pw.add(j) * *px.add(j);
        }
        s
    }

    /// See [`super::matmul_rows`].
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn matmul_rows(w: &[f32], x: &[f32], k: usize, out: &mut [f32]) {
        let (nf, m) = (w.len() / k, x.len() / k);
        let k8 = k / 8 * 8;
        let (pw, px, po) = (w.as_ptr(), x.as_ptr(), out.as_mut_ptr());
        // Weight rows in pairs (`nf2`), activation rows in fours; the rest below.
        let nf2 = nf / 2 * 2;
        let mut f = 0;
        while f < nf2 {
            let w0 = pw.add(f * k);
            let w1 = pw.add((f + 1) * k);
            let mut i = 0;
            while i + 4 <= m {
                let xr = [0, 1, 2, 3].map(|u| px.add((i + u) * k));
                // acc[2u + c]: activation row i + u, weight row f + c.
                let mut acc = [_mm256_setzero_ps(); 8];
                let mut j = 0;
                while j < k8 {
                    let a = _mm256_loadu_ps(w0.add(j));
                    let b = _mm256_loadu_ps(w1.add(j));
                    for u in 0..4 {
                        let v = _mm256_loadu_ps(xr[u].add(j));
                        acc[2 * u] = _mm256_fmadd_ps(v, a, acc[2 * u]);
                        acc[2 * u + 1] = _mm256_fmadd_ps(v, b, acc[2 * u + 1]);
                    }
                    j += 8;
                }
                let mut s = [0f32; 8];
                _mm256_storeu_ps(s.as_mut_ptr(), hsum8_tree(&acc));
                for u in 0..4 {
                    for (c, wr) in [w0, w1].into_iter().enumerate() {
                        *po.add((f + c) * m + i + u) = add_tail(s[2 * u + c], wr, xr[u], k8, k);
                    }
                }
                i += 4;
            }
            f += 2;
        }
        // The rows left over by the 4-row tiles (all of them for a one-row decode step) and
        // the odd weight row: one activation row against 8 weight rows (8 independent chains).
        let i0 = if nf >= 2 { m / 4 * 4 } else { 0 };
        for i in i0..m {
            let xi = px.add(i * k);
            let mut f = 0;
            while f + 8 <= nf {
                let wr = [0, 1, 2, 3, 4, 5, 6, 7].map(|c| pw.add((f + c) * k));
                let mut acc = [_mm256_setzero_ps(); 8];
                let mut j = 0;
                while j < k8 {
                    let v = _mm256_loadu_ps(xi.add(j));
                    for c in 0..8 {
                        acc[c] = _mm256_fmadd_ps(v, _mm256_loadu_ps(wr[c].add(j)), acc[c]);
                    }
                    j += 8;
                }
                let mut s = [0f32; 8];
                _mm256_storeu_ps(s.as_mut_ptr(), hsum8_tree(&acc));
                for c in 0..8 {
                    *po.add((f + c) * m + i) = add_tail(s[c], wr[c], xi, k8, k);
                }
                f += 8;
            }
            while f < nf {
                *po.add(f * m + i) = dot_tree(pw.add(f * k), xi, k);
                f += 1;
            }
        }
        if nf2 < nf {
            for i in 0..i0 {
                *po.add(nf2 * m + i) = dot_tree(pw.add(nf2 * k), px.add(i * k), k);
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
        let n = y.len();
        let (py, px) = (y.as_mut_ptr(), x.as_ptr());
        let va = _mm256_set1_ps(a);
        let mut i = 0;
        while i + 8 <= n {
            _mm256_storeu_ps(
                py.add(i),
                _mm256_fmadd_ps(va, _mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i))),
            );
            i += 8;
        }
        while i < n {
            *py.add(i) += a * *px.add(i);
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fused head is bit-identical to the `dot` / softmax / `axpy` chain it replaces, for
    /// head sizes on and off the AVX2 path and keys from both buffers in any order.
    #[test]
    fn attend_head_matches_dot_axpy_chain() {
        for hd in [8usize, 12, 32, 40, 64, 128] {
            let stride = hd * 3;
            let mk = |n: usize, f: f32| -> Vec<f32> {
                (0..n * stride).map(|i| ((i as f32) * f).sin()).collect()
            };
            let (ck, cv, nk, nv) = (mk(7, 0.13), mk(7, 0.29), mk(3, 0.31), mk(3, 0.17));
            let kv = KvRows {
                cache_k: &ck,
                cache_v: &cv,
                new_k: &nk,
                new_v: &nv,
                split: 7,
                stride,
                offset: hd,
            };
            let q: Vec<f32> = (0..hd).map(|i| (i as f32 * 0.7).cos()).collect();
            for idx in [vec![], vec![3u32], vec![0, 1, 2, 4, 6, 7, 9], vec![8, 0, 5]] {
                let scale = 1.0 / (hd as f32).sqrt();
                let mut want = vec![0f32; hd];
                let mut sc: Vec<f32> = idx.iter().map(|&j| dot(&q, kv.k(j, hd)) * scale).collect();
                if let Some(inv) = softmax_in_place(&mut sc) {
                    for (p, &j) in sc.iter().zip(&idx) {
                        axpy(&mut want, p * inv, kv.v(j, hd));
                    }
                }
                let mut got = vec![1f32; hd];
                let mut scratch = vec![0f32; idx.len()];
                attend_head(&q, &kv, &idx, scale, &mut scratch, &mut got);
                assert_eq!(got, want, "hd {hd}, idx {idx:?}");
            }
        }
    }

    /// Every output is close to an f64 reference, and bit-identical whatever the pass's width
    /// and the output's place in a register tile (rows computed alone vs. in a batch).
    #[test]
    fn matmul_rows_is_accurate_and_batch_invariant() {
        for k in [1usize, 7, 8, 13, 32, 128, 131] {
            for (nf, m) in [
                (1usize, 1usize),
                (2, 4),
                (3, 5),
                (5, 9),
                (8, 33),
                (4, 64),
                (9, 3),
                (16, 1),
                (17, 6),
            ] {
                let w: Vec<f32> = (0..nf * k).map(|i| (i as f32 * 0.37).sin()).collect();
                let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.11).cos()).collect();
                let mut got = vec![f32::NAN; nf * m];
                matmul_rows(&w, &x, k, &mut got);
                for f in 0..nf {
                    for i in 0..m {
                        let r: f64 = (0..k)
                            .map(|j| w[f * k + j] as f64 * x[i * k + j] as f64)
                            .sum();
                        let g = got[f * m + i];
                        assert!(
                            (g as f64 - r).abs() < 1e-4 * (1.0 + r.abs()),
                            "k {k} f {f} i {i}"
                        );
                        // Alone: one weight row, one activation row.
                        let mut one = [0f32];
                        matmul_rows(&w[f * k..(f + 1) * k], &x[i * k..(i + 1) * k], k, &mut one);
                        assert_eq!(
                            one[0].to_bits(),
                            g.to_bits(),
                            "k {k} nf {nf} m {m} f {f} i {i}"
                        );
                        assert_eq!(
                            dot8_tree(&w[f * k..(f + 1) * k], &x[i * k..(i + 1) * k]).to_bits(),
                            g.to_bits(),
                            "portable order, k {k} f {f} i {i}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn dot_and_axpy_match_scalar() {
        for n in [0, 1, 7, 8, 15, 16, 33, 64, 130] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let r: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot(&a, &b) as f64 - r).abs() < 1e-4, "n={n}");
            let mut y = b.clone();
            axpy(&mut y, 0.5, &a);
            for i in 0..n {
                assert!((y[i] - (b[i] + 0.5 * a[i])).abs() < 1e-6);
            }
        }
    }
}
