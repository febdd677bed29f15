//! Tests of the quantized matmul: repacking, arenas, and every instruction set this CPU has
//! against the dequantized reference, the portable kernel and one-row decoding.

use super::portable::portable_range;
use super::repack::{layout, repack_row};
use super::*;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

fn random_quantized(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let w: Vec<f32> = (0..rows * cols)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    crate::dequant::quantize(ty, &w).unwrap()
}

#[test]
fn repacked_rows_ignore_old_bytes() {
    // Widths whose block counts need padding (3 blocks: values padded to 4, scales to 8);
    // Q4_K comes in whole super-blocks.
    for (ty, cols) in [
        (GgmlType::Q4_0, 96),
        (GgmlType::Q4_1, 96),
        (GgmlType::Q8_0, 96),
        (GgmlType::Q5_0, 96),
        (GgmlType::Q5_1, 96),
        (GgmlType::Q2K, 256),
        (GgmlType::Q3K, 256),
        (GgmlType::Q4K, 256),
        (GgmlType::Q5K, 256),
        (GgmlType::Q6K, 256),
    ] {
        let raw = random_quantized(ty, 1, cols, 3);
        let lay = layout(ty, cols);
        let mut clean = vec![0u8; lay.stride];
        let mut dirty = vec![0xA5u8; lay.stride];
        repack_row(&lay, &raw, &mut clean);
        repack_row(&lay, &raw, &mut dirty);
        assert_eq!(clean, dirty, "{ty}: a recycled buffer's old bytes leaked");
    }
}

#[test]
fn stacked_repack_equals_concatenated_parts() {
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
        let (a, b) = (
            random_quantized(ty, 5, 96, 1),
            random_quantized(ty, 3, 96, 2),
        );
        let (a, b): (ByteOwner, ByteOwner) = (Arc::new(a), Arc::new(b));
        let qa = QMatrix::new(ty, 5, 96, a.clone(), 0).unwrap();
        let qb = QMatrix::new(ty, 3, 96, b.clone(), 0).unwrap();
        let cat = QMatrix::concat_rows(&[&qa, &qb]).unwrap();
        let st = QMatrix::new_stacked(ty, 96, &[(5, a, 0), (3, b, 0)]).unwrap();
        assert_eq!(st.rows(), 8);
        assert_eq!(&st.data[..], &cat.data[..]);
    }
    // A part shorter than its rows say is an error, not a panic.
    let short: ByteOwner = Arc::new(vec![0u8; 10]);
    assert!(QMatrix::new_stacked(GgmlType::Q8_0, 32, &[(2, short, 0)]).is_err());
}

#[test]
fn arenas_are_recycled_and_stay_counted() {
    // A size no other test uses, so the pooled arena is this test's.
    const N: usize = 3 * 4096 + 64 * 7;
    let _pool = recycle::reserve(1 << 24);
    let raw: ByteOwner = Arc::new(random_quantized(GgmlType::Q8_0, 4, 64, 5));
    let build = || recycle::in_arena(N, || QMatrix::new(GgmlType::Q8_0, 4, 64, raw.clone(), 0));
    let (q, need) = recycle::measure(|| build().unwrap());
    assert!(need > 0 && need <= N);
    // (Pool bytes, not `weight_memory::live`: other tests allocate weights concurrently,
    // but none uses arenas.)
    let pooled = recycle::pooled_bytes();
    drop(q);
    // The arena went back to the pool (where it stays counted as weight memory) ...
    assert_eq!(recycle::pooled_bytes(), pooled + N as u64);
    // ... and the next unit is built in it.
    let again = build().unwrap();
    assert_eq!(
        recycle::pooled_bytes(),
        pooled,
        "a pooled arena was not reused"
    );
    let fresh = QMatrix::new(GgmlType::Q8_0, 4, 64, raw.clone(), 0).unwrap();
    assert_eq!(&again.data[..], &fresh.data[..]);
    // When the reservation goes (its store dropped), so does what the pool kept for it.
    drop(again);
    assert_eq!(recycle::pooled_bytes(), pooled + N as u64);
    drop(_pool);
    assert_eq!(recycle::pooled_bytes(), 0);
}

fn check(ty: GgmlType, m: usize, n: usize, k: usize) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let w: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0..1.0)).collect();
    let x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0..1.0)).collect();
    let raw = crate::dequant::quantize(ty, &w).unwrap();
    let q = QMatrix::new(ty, n, k, Arc::new(raw.clone()), 0).unwrap();
    // The packed layout dequantizes exactly like ggml's reference dequantizer.
    let mut wd = vec![0f32; n * k];
    dequantize(ty, &raw, &mut wd);
    let mut row = vec![0f32; k];
    for r in 0..n {
        q.dequantize_row(r, &mut row);
        for (a, b) in row.iter().zip(&wd[r * k..(r + 1) * k]) {
            assert!(
                (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                "{ty}: packed {a} vs ggml {b}"
            );
        }
    }
    let mut got = vec![0f32; m * n];
    q.matmul(&x, m, &mut got);
    let mut max_err = 0f64;
    let mut max_ref = 0f64;
    for i in 0..m {
        for j in 0..n {
            let r: f64 = (0..k)
                .map(|l| x[i * k + l] as f64 * wd[j * k + l] as f64)
                .sum();
            max_err = max_err.max((r - got[i * n + j] as f64).abs());
            max_ref = max_ref.max(r.abs());
        }
    }
    // 8-bit activations: relative error of a K-term dot product stays around 1%.
    assert!(
        max_err / max_ref < 0.02,
        "{ty} m={m} n={n} k={k}: max err {max_err} vs max {max_ref}"
    );
    // Every instruction set this CPU has computes the same sums from the same quantized
    // activations: the portable path, and AVX2 and AVX-512 VNNI where present (the
    // AVX-512 Q8_0 kernel reads values as w + 128 and subtracts 128·Σx in f32, so its
    // rounding differs slightly).
    let acts = QuantizedActs::quantize(&x, m, k, q.act_layout());
    let mut port = vec![0f32; m * n];
    unsafe { portable_range(&q, &acts, 0, n, port.as_mut_ptr()) };
    for isa in [Isa::Avx512Vnni, Isa::Avx2] {
        if isa < best_isa() {
            eprintln!("{ty}: this CPU lacks {isa}; its kernel is not checked here");
            continue;
        }
        // Columns split as the threads split them: ranges that start mid-matrix and end in
        // partial tiles (7), and ranges longer than a row block (45).
        for chunk in [7, 45] {
            let mut simd = vec![0f32; m * n];
            for n0 in (0..n).step_by(chunk) {
                let ptr = SendPtr(simd.as_mut_ptr());
                unsafe { q.range_on(isa, &acts, n0, (n0 + chunk).min(n), ptr) };
            }
            for (a, b) in port.iter().zip(&simd) {
                assert!(
                    (a - b).abs() <= 1e-3 * (1.0 + a.abs()),
                    "{ty} m={m} n={n} k={k}: portable {a} vs {isa} {b}"
                );
            }
            // Batch invariance: each activation row alone gives its row of the batch bit
            // for bit (speculative verification reproduces one-row decoding).
            for i in 0..m {
                let one = QuantizedActs::quantize(&x[i * k..(i + 1) * k], 1, k, q.act_layout());
                let mut row = vec![0f32; n];
                unsafe { q.range_on(isa, &one, 0, n, SendPtr(row.as_mut_ptr())) };
                assert!(
                    row.iter()
                        .zip(&simd[i * n..(i + 1) * n])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{ty} m={m} n={n} k={k} {isa}: row {i} alone differs from the batch"
                );
            }
        }
    }
}

#[test]
fn qmatmul_matches_dequantized_reference() {
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
    ] {
        // k = 32·odd exercises the zero-padded last pair and partial scale groups.
        for (m, n, k) in [
            (1, 3, 96),
            (2, 70, 192),
            (3, 17, 576),
            (4, 8, 512),
            (9, 33, 160),
            (13, 64, 512),
            (1, 40, 1536),
        ] {
            check(ty, m, n, k);
        }
    }
    for ty in [
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
    ] {
        for (m, n, k) in [
            (1, 5, 512),
            (5, 9, 256),
            (8, 16, 512),
            (3, 33, 1536),
            (6, 7, 768),
        ] {
            check(ty, m, n, k);
        }
    }
}

#[test]
fn rejects_bad_shapes() {
    assert!(QMatrix::quantize(GgmlType::Q4K, 2, 64, &[0.0; 128]).is_err());
    let err = QMatrix::new(GgmlType::Q8_0, 4, 32, Arc::new(vec![0u8; 10]), 0);
    assert!(matches!(err, Err(QMatrixError::BadLength { .. })));
    assert!(QMatrix::new(GgmlType::F16, 4, 32, Arc::new(vec![0u8; 1000]), 0).is_err());
    // K-quant rows come in whole super-blocks; truncated tensors are errors.
    for ty in [GgmlType::Q2K, GgmlType::Q3K, GgmlType::Q5K, GgmlType::Q6K] {
        let one = ty.block_bytes();
        assert!(matches!(
            QMatrix::new(ty, 1, 128, Arc::new(vec![0u8; one]), 0),
            Err(QMatrixError::BadCols { .. })
        ));
        assert!(matches!(
            QMatrix::new(ty, 2, 256, Arc::new(vec![0u8; 2 * one - 1]), 0),
            Err(QMatrixError::BadLength { .. })
        ));
    }
}

// ---------------------------------------------------------------------------------------------
// NEON (aarch64): `cargo test --release -p llada-kernels --target aarch64-unknown-linux-gnu`
// runs these under qemu on other hosts (.cargo/config.toml, scripts/test.sh).
// ---------------------------------------------------------------------------------------------

#[test]
fn isa_requests_for_other_architectures_fall_back_to_the_best() {
    use super::isa::choose;
    let best = best_isa();
    assert_eq!(choose(Isa::Portable), Isa::Portable);
    assert_eq!(choose(best), best);
    let foreign: &[Isa] = if cfg!(target_arch = "aarch64") {
        &[Isa::Avx512Vnni, Isa::Avx2]
    } else {
        &[Isa::NeonDot, Isa::Neon]
    };
    for &isa in foreign {
        assert_eq!(choose(isa), best, "{isa} requested on another architecture");
    }
    if cfg!(target_arch = "aarch64") {
        // NEON is baseline on aarch64; only `sdot` depends on the CPU.
        assert!(matches!(best, Isa::NeonDot | Isa::Neon), "best is {best}");
        assert_eq!(choose(Isa::Neon), Isa::Neon);
        assert_eq!(choose(Isa::NeonDot), best);
    }
}

/// The ISA the kernels run on is the one the runner promises (`LLADA_EXPECT_ISA`, set by the
/// qemu runner of .cargo/config.toml to `neon-dot` for `-cpu max`), and never portable on
/// aarch64: a silent fall back would leave the NEON kernels untested.
#[cfg(target_arch = "aarch64")]
#[test]
fn neon_is_selected_on_aarch64() {
    let best = best_isa();
    assert_ne!(best, Isa::Portable);
    if let Ok(want) = std::env::var("LLADA_EXPECT_ISA") {
        assert_eq!(
            best.name(),
            want,
            "the CPU (emulator) offers {best}, not {want}"
        );
    }
    if std::env::var_os("LLADA_KERNEL_ISA").is_none() {
        assert_eq!(isa(), best, "the default is not the best NEON path");
    }
}

/// Random GGML rows with the whole integer range of each type: random bytes (every value,
/// high-bit, scale and min code) with the f16 fields (d: ±0.05; m, dmin: ±0.5) replaced by
/// finite values of either sign.
#[cfg(target_arch = "aarch64")]
fn random_raw(ty: GgmlType, rows: usize, cols: usize, rng: &mut impl Rng) -> Vec<u8> {
    let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
    // Byte offsets of the f16 fields in a block: (d, m or dmin).
    let (d, m) = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => (0, None),
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => (0, Some(2)),
        GgmlType::Q6K => (208, None),
        GgmlType::Q3K => (108, None),
        GgmlType::Q2K => (80, Some(82)),
        _ => unreachable!("{ty} has no kernel"),
    };
    let bb = ty.block_bytes();
    let mut raw: Vec<u8> = (0..rows * cols / ty.block_elems() * bb)
        .map(|_| rng.random())
        .collect();
    for blk in raw.chunks_exact_mut(bb) {
        blk[d..d + 2].copy_from_slice(&f16(rng.random_range(-0.05..0.05)));
        if let Some(m) = m {
            blk[m..m + 2].copy_from_slice(&f16(rng.random_range(-0.5..0.5)));
        }
    }
    raw
}

/// Per output, the sum of the magnitudes of the portable kernel's block terms
/// (`a·d_x·sc·Σq_wq_x`, `a·d_x·sc·bias·Σq_x`, `off·d_x·mn·Σq_x`): the scale of the rounding
/// error any summation order of them may make.
#[cfg(target_arch = "aarch64")]
fn term_magnitudes(q: &QMatrix, acts: &QuantizedActs) -> Vec<f64> {
    let (m, n) = (acts.m, q.rows);
    let mut mag = vec![0f64; m * n];
    let mut vals = [0i32; 32];
    for j in 0..n {
        let row = q.row(j);
        for b in 0..q.nb {
            let t = q.block(row, b, &mut vals);
            for i in 0..m {
                let dx = acts.d[i * acts.nbp + b] as f64;
                for h in 0..2 {
                    let dot: i64 = (16 * h..16 * h + 16)
                        .map(|l| (vals[l] * acts.q(i, b, l)) as i64)
                        .sum();
                    let xs = acts.half_sum(i, b, h) as f64;
                    let (a, sc, mn) = (t.a as f64, t.sc[h] as f64, t.mn[h] as f64);
                    mag[i * n + j] += (a * dx * sc * dot as f64).abs()
                        + (a * dx * sc * t.bias as f64 * xs).abs()
                        + (t.off as f64 * dx * mn * xs).abs();
                }
            }
        }
    }
    mag
}

/// Both NEON paths (`sdot` where the CPU has it, and plain NEON) against the portable kernel for
/// each type of `types` and each `(rows, width)` of `shapes`: the same integer sums (float
/// accumulation order differs: lanes, FMA), every M from 1 to 9 and 16, 33, 64 (every
/// register-tile shape and remainder), column ranges split as the threads split them. The two
/// paths agree bit for bit, and each activation row alone gives its row of the batch bit for bit
/// (speculative verification reproduces one-row decoding).
#[cfg(target_arch = "aarch64")]
fn check_neon_against_portable(types: &[GgmlType], shapes: &[(usize, usize)], seed: u64) {
    use super::isa::choose;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let isas: Vec<Isa> = [Isa::NeonDot, Isa::Neon]
        .into_iter()
        .filter(|&isa| {
            let ok = choose(isa) == isa;
            if !ok {
                eprintln!("this CPU lacks {isa}; its kernels are not checked here");
            }
            ok
        })
        .collect();
    assert!(isas.contains(&Isa::Neon));
    let ms: Vec<usize> = (1..=9).chain([16, 33, 64]).collect();
    for &ty in types {
        for &(n, k) in shapes {
            let q = QMatrix::new(ty, n, k, Arc::new(random_raw(ty, n, k, &mut rng)), 0).unwrap();
            for &m in &ms {
                // Activations with outliers, so that some blocks reach ±127.
                let x: Vec<f32> = (0..m * k)
                    .map(|_| {
                        let v: f32 = rng.random_range(-1.0..1.0);
                        if rng.random_range(0..50) == 0 {
                            v * 40.0
                        } else {
                            v
                        }
                    })
                    .collect();
                let acts = QuantizedActs::quantize(&x, m, k, q.act_layout());
                let mag = term_magnitudes(&q, &acts);
                let mut port = vec![0f32; m * n];
                unsafe { portable_range(&q, &acts, 0, n, port.as_mut_ptr()) };
                let mut first: Option<Vec<f32>> = None;
                for &isa in &isas {
                    for chunk in [n, 7, 45] {
                        let mut got = vec![f32::NAN; m * n];
                        for n0 in (0..n).step_by(chunk) {
                            let ptr = SendPtr(got.as_mut_ptr());
                            unsafe { q.range_on(isa, &acts, n0, (n0 + chunk).min(n), ptr) };
                        }
                        for (j, ((a, b), t)) in port.iter().zip(&got).zip(&mag).enumerate() {
                            assert!(
                                ((a - b).abs() as f64) <= 1e-5 * t + 1e-30,
                                "{ty} {isa} m={m} n={n} k={k} chunk={chunk} out {j}: \
                                 portable {a} vs {b} (terms {t})"
                            );
                        }
                        match &first {
                            None => first = Some(got),
                            Some(f) => assert!(
                                f.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
                                "{ty} {isa} m={m} n={n} k={k} chunk={chunk}: differs bitwise \
                                 from {}",
                                isas[0]
                            ),
                        }
                    }
                    let batch = first.as_ref().unwrap();
                    for i in 0..m {
                        let one =
                            QuantizedActs::quantize(&x[i * k..(i + 1) * k], 1, k, q.act_layout());
                        let mut row = vec![f32::NAN; n];
                        unsafe { q.range_on(isa, &one, 0, n, SendPtr(row.as_mut_ptr())) };
                        assert!(
                            row.iter()
                                .zip(&batch[i * n..(i + 1) * n])
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{ty} m={m} n={n} k={k} {isa}: row {i} alone differs from the batch"
                        );
                    }
                }
            }
        }
    }
}

/// Q4_0, Q4_1 and Q8_0: widths of 3, 5, 7, 18 and 28 blocks (odd block counts, partial groups
/// of 4), odd row counts.
#[cfg(target_arch = "aarch64")]
#[test]
fn neon_kernels_match_portable() {
    check_neon_against_portable(
        &[GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0],
        &[(37, 96), (5, 160), (9, 224), (37, 576), (21, 896)],
        65,
    );
}

/// Q5_0 and Q5_1 (nibble and bit planes): widths of 3, 5, 18 and 28 blocks (a zero-padded last
/// pair, partial groups of 4 and 8), odd row counts.
#[cfg(target_arch = "aarch64")]
#[test]
fn neon_q5_kernels_match_portable() {
    check_neon_against_portable(
        &[GgmlType::Q5_0, GgmlType::Q5_1],
        &[(37, 96), (5, 160), (9, 576), (21, 896)],
        66,
    );
}

/// The K-quants: one to six super-blocks, odd row counts; random scale and min bytes cover
/// Q6_K's signed scales, Q3_K's 6-bit ones and every Q4_K/Q5_K/Q2_K scale and min.
#[cfg(target_arch = "aarch64")]
#[test]
fn neon_kquant_kernels_match_portable() {
    check_neon_against_portable(
        &[
            GgmlType::Q4K,
            GgmlType::Q6K,
            GgmlType::Q5K,
            GgmlType::Q3K,
            GgmlType::Q2K,
        ],
        &[(37, 256), (5, 512), (21, 768), (9, 1536)],
        67,
    );
}

/// Every packed kind has a kernel on both NEON paths, and none on other ISAs: on aarch64 no kind
/// falls back to the portable kernel.
#[cfg(target_arch = "aarch64")]
#[test]
fn every_kind_has_neon_kernels() {
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q3K,
        GgmlType::Q2K,
    ] {
        let kind = repack::Kind::of(ty).unwrap();
        for isa in [Isa::NeonDot, Isa::Neon] {
            assert!(arm::kernel(kind, isa).is_some(), "{ty} has no {isa} kernel");
        }
        for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512Vnni] {
            assert!(arm::kernel(kind, isa).is_none(), "{ty}: {isa} on aarch64");
        }
    }
}
