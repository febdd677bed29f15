use llada_kernels::{GgmlType, QMatrix};
use std::time::Instant;
fn main() {
    let (n, k) = (4096, 4096);
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 2654435761usize) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    for ty in [
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4K,
    ] {
        let q = QMatrix::quantize(ty, n, k, &w).unwrap();
        for m in [1usize, 8, 32, 128] {
            let x: Vec<f32> = (0..m * k).map(|i| (i % 17) as f32 / 8.0 - 1.0).collect();
            let mut out = vec![0f32; m * n];
            q.matmul(&x, m, &mut out);
            let reps = (200 / m).max(3);
            let mut ts = vec![];
            for _ in 0..reps {
                let t = Instant::now();
                q.matmul(&x, m, &mut out);
                ts.push(t.elapsed().as_secs_f64());
            }
            ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
            let t = ts[ts.len() / 2];
            println!(
                "{ty} M={m}: {:.3} ms {:.1} GFLOP/s",
                t * 1e3,
                2.0 * (m * n * k) as f64 / t / 1e9
            );
        }
    }
}
