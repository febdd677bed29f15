//! Quantized matmul timings: `cargo run --release -p llada-kernels --example qmm [N K [TYPES]]`
//! (default 4096 × 4096, every quantized type; `LLADA_KERNEL_ISA` picks the path). Prints the
//! median time and GFLOP/s per type and M (`QMM_M=1,64` picks the Ms), the weight bytes the
//! kernel streams, and the repack rate.
use llada_kernels::qmatmul::recycle;
use llada_kernels::{isa, GgmlType, QMatrix};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(4096);
    let k: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(4096);
    let types: Vec<GgmlType> = match args.get(2) {
        Some(s) => s.split(',').filter_map(GgmlType::from_name).collect(),
        None => GgmlType::all()
            .iter()
            .copied()
            .filter(|t| t.is_quantized())
            .collect(),
    };
    println!("isa {}, N {n}, K {k}", isa());
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 2654435761usize) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    for ty in types {
        if !k.is_multiple_of(ty.block_elems()) {
            continue;
        }
        let raw = std::sync::Arc::new(llada_kernels::dequant::quantize(ty, &w).unwrap());
        // Into a pooled arena, as a streamed layer is rebuilt on every pass; best of 5 (the
        // first pays the fresh mapping's page faults, as a warm arena does not).
        let (_, bytes) = recycle::measure(|| QMatrix::new(ty, n, k, raw.clone(), 0).unwrap());
        let _pool = recycle::reserve(2 * bytes as u64);
        let mut t = f64::INFINITY;
        for _ in 0..5 {
            let t0 = Instant::now();
            let q = recycle::in_arena(bytes, || QMatrix::new(ty, n, k, raw.clone(), 0).unwrap());
            t = t.min(t0.elapsed().as_secs_f64());
            drop(q);
        }
        let q = QMatrix::new(ty, n, k, raw.clone(), 0).unwrap();
        println!(
            "{ty:5} repack: {:.2} ms, {:.2} GB/s of file bytes",
            t * 1e3,
            raw.len() as f64 / t / 1e9
        );
        for m in std::env::var("QMM_M")
            .ok()
            .map(|s| {
                s.split(',')
                    .filter_map(|v| v.parse().ok())
                    .collect::<Vec<usize>>()
            })
            .unwrap_or(vec![1, 8, 16, 32, 64, 128])
        {
            let x: Vec<f32> = (0..m * k).map(|i| (i % 17) as f32 / 8.0 - 1.0).collect();
            let mut out = vec![0f32; m * n];
            q.matmul(&x, m, &mut out);
            let reps = (400 / m).max(5);
            let mut ts = vec![];
            for _ in 0..reps {
                let t = Instant::now();
                q.matmul(&x, m, &mut out);
                ts.push(t.elapsed().as_secs_f64());
            }
            ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
            let t = ts[ts.len() / 2];
            println!(
                "{ty:5} M={m:3}: {:8.3} ms {:6.1} GFLOP/s {:6.2} GB/s weights ({} B)",
                t * 1e3,
                2.0 * (m * n * k) as f64 / t / 1e9,
                q.stored_bytes() as f64 / t / 1e9,
                q.stored_bytes()
            );
        }
    }
}
