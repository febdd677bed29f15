//! Every block type against the independent numpy dequantizers (`tests/reference/gguf_io.py`,
//! written from ggml's block layouts; `quant_cases.json` from `make_fixtures.py`): the scalar
//! dequantizer, the repacked matrix read back, and the quantized matmul of the blocks.

use llada_kernels::{dequant::dequantize, GgmlType, QMatrix};
use std::path::PathBuf;
use std::sync::Arc;

fn cases() -> Vec<serde_json::Value> {
    let dir = std::env::var_os("LLADA_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures"));
    let p = dir.join("quant_cases.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run `python3 tests/reference/make_fixtures.py tests/fixtures`",
            p.display()
        )
    });
    let v: serde_json::Value = serde_json::from_str(&text).expect("quant_cases.json parses");
    v["cases"].as_array().expect("cases").clone()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn close(a: f32, b: f32) -> bool {
    (a - b).abs() <= 1e-6 * (1.0 + b.abs())
}

#[test]
fn every_type_matches_the_numpy_dequantizer() {
    let mut seen = Vec::new();
    for c in cases() {
        let ty = GgmlType::from_id(c["ggml_type"].as_u64().unwrap() as u32).expect("known type");
        let raw = hex(c["hex"].as_str().unwrap());
        let want: Vec<f32> = c["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let mut got = vec![0f32; want.len()];
        dequantize(ty, &raw, &mut got);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(close(*a, *b), "{ty} element {i}: rust {a} vs numpy {b}");
        }
        if ty.is_quantized() {
            // The repacked layout reads back the same values ...
            let q = QMatrix::new(ty, 1, want.len(), Arc::new(raw.clone()), 0).unwrap();
            let mut row = vec![0f32; want.len()];
            q.dequantize_row(0, &mut row);
            for (i, (a, b)) in row.iter().zip(&want).enumerate() {
                assert!(close(*a, *b), "{ty} packed element {i}: {a} vs numpy {b}");
            }
            // ... and the kernel's dot products with 8-bit activations stay within their
            // resolution of the exact dot product with numpy's values.
            let k = want.len();
            let x: Vec<f32> = (0..3 * k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                .collect();
            let mut y = vec![0f32; 3];
            q.matmul(&x, 3, &mut y);
            for (r, y) in y.iter().enumerate() {
                let exact: f64 = (0..k).map(|l| x[r * k + l] as f64 * want[l] as f64).sum();
                let scale: f64 = (0..k)
                    .map(|l| (x[r * k + l] as f64 * want[l] as f64).abs())
                    .sum();
                assert!(
                    (*y as f64 - exact).abs() <= 0.01 * scale,
                    "{ty} row {r}: kernel {y} vs exact {exact} (Σ|terms| {scale})"
                );
            }
        }
        seen.push(ty);
    }
    for ty in GgmlType::all() {
        if *ty != GgmlType::F32 {
            assert!(seen.contains(ty), "quant_cases.json has no {ty} case");
        }
    }
}

#[test]
fn nan_and_infinite_scales_propagate_without_a_panic() {
    // A block whose f16 scale is NaN or ∞ (a corrupt file) yields NaN/∞ outputs: garbage in,
    // visibly garbage out, never a crash or an out-of-bounds read.
    for ty in [GgmlType::Q5_0, GgmlType::Q4_0, GgmlType::Q8_0] {
        let mut raw = vec![0x11u8; ty.block_bytes() * 2];
        raw[0..2].copy_from_slice(&0x7e00u16.to_le_bytes()); // f16 NaN
        let q = QMatrix::new(ty, 1, 64, Arc::new(raw), 0).unwrap();
        let mut y = [0f32; 1];
        q.matmul(&[0.5; 64], 1, &mut y);
        assert!(y[0].is_nan(), "{ty}: {}", y[0]);
    }
    for (ty, d_at) in [
        (GgmlType::Q6K, 208),
        (GgmlType::Q3K, 108),
        (GgmlType::Q2K, 80),
        (GgmlType::Q5K, 0),
    ] {
        let mut raw = vec![0x5Au8; ty.block_bytes()];
        raw[d_at..d_at + 2].copy_from_slice(&0x7c00u16.to_le_bytes()); // f16 +∞
        let q = QMatrix::new(ty, 1, 256, Arc::new(raw), 0).unwrap();
        let mut y = [0f32; 1];
        q.matmul(&[0.25; 256], 1, &mut y);
        assert!(!y[0].is_finite(), "{ty}: {}", y[0]);
    }
}
