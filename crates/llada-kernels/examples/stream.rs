//! Decode-like streaming: many small matrices used once each (weights come from DRAM).
use llada_kernels::{GgmlType, QMatrix};
use std::time::Instant;
fn main() {
    for (ty, n, k) in [
        (GgmlType::Q4_1, 3072, 576),
        (GgmlType::Q4_1, 576, 1536),
        (GgmlType::Q8_0, 49152, 576),
    ] {
        let copies = (200 << 20) / (n * k / 2);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 2654435761usize) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let q = QMatrix::quantize(ty, n, k, &w).unwrap();
        let mats: Vec<QMatrix> = (0..copies.max(1))
            .map(|_| QMatrix::concat_rows(&[&q]).unwrap())
            .collect();
        let x: Vec<f32> = (0..k).map(|i| (i % 17) as f32 / 8.0 - 1.0).collect();
        let mut out = vec![0f32; n];
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut best = 0f64;
            for _ in 0..3 {
                let t = Instant::now();
                pool.install(|| {
                    for m in &mats {
                        m.matmul(&x, 1, &mut out)
                    }
                });
                let s = t.elapsed().as_secs_f64();
                best = best.max((mats.len() * q.stored_bytes()) as f64 / s / 1e9);
            }
            println!(
                "{ty} {n}x{k} x{} threads={threads}: {best:.1} GB/s, {:.1} us/call",
                mats.len(),
                (mats.len() * q.stored_bytes()) as f64 / best / 1e3 / mats.len() as f64
            );
        }
    }
}
