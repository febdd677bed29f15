//! One-row (decoding) quantized matmuls on SmolLM2-135M's shapes, AVX2 against AVX-512 VNNI,
//! alternated: the Q8_0 head, and the 30 layers' gate/up and down matrices (copies, so the set
//! exceeds the caches as in decoding). Medians of 31 calls; GB/s of weights read.
//! `cargo run --release -p llada-kernels --example qmm_shapes` (docs/kernels.md).
use llada_kernels::{set_isa, GgmlType, Isa, QMatrix};
use std::time::Instant;
fn main() {
    for (ty, n, k, copies) in [
        (GgmlType::Q8_0, 49152usize, 576usize, 1usize),
        (GgmlType::Q4_1, 3072, 576, 30),
        (GgmlType::Q4_1, 576, 1536, 30),
    ] {
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 2654435761usize) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        // Several copies so that the set exceeds the caches, as in decoding.
        let qs: Vec<QMatrix> = (0..copies)
            .map(|_| QMatrix::quantize(ty, n, k, &w).unwrap())
            .collect();
        let bytes = qs[0].stored_bytes() * copies;
        for isa in [
            Isa::Avx2,
            Isa::Avx512Vnni,
            Isa::Avx2,
            Isa::Avx512Vnni,
            Isa::Avx2,
            Isa::Avx512Vnni,
        ] {
            set_isa(isa);
            let x: Vec<f32> = (0..k).map(|i| (i % 17) as f32 / 8.0 - 1.0).collect();
            let mut out = vec![0f32; n];
            let mut ts = vec![];
            for _ in 0..31 {
                let t = Instant::now();
                for q in &qs {
                    q.matmul(&x, 1, &mut out);
                }
                ts.push(t.elapsed().as_secs_f64());
            }
            ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
            let t = ts[ts.len() / 2];
            println!(
                "{ty} {n}x{k} x{copies} {isa}: {:.3} ms {:.1} GB/s",
                t * 1e3,
                bytes as f64 / t / 1e9
            );
        }
    }
}
