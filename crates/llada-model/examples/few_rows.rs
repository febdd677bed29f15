//! Times `x · Wᵀ` for dense f32 weights through candle's gemm and through
//! [`llada_model::weights::dense_few_rows`] at pass widths 1 … 128, for the shapes of the tiny
//! task models and of SmolLM2-135M: the measurement behind `weights::SMALL_M`.
//!
//! `cargo run --release -p llada-model --example few_rows` (medians of 7 runs, µs per call).
use candle_core::{Device, Tensor};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    // Inside a pool, as the engine's lanes call it (a call from outside pays a thread wake-up).
    rayon::ThreadPoolBuilder::new().build()?.install(run)
}

fn run() -> anyhow::Result<()> {
    println!(
        "{:>5} {:>5} {:>4} {:>10} {:>10} {:>7}",
        "n", "k", "m", "gemm µs", "rows µs", "ratio"
    );
    for (n, k) in [(384usize, 128usize), (128, 384), (1536, 576), (576, 1536)] {
        let wv: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let w = Tensor::from_vec(wv, (n, k), &Device::Cpu)?;
        for m in [1usize, 4, 8, 16, 24, 32, 48, 64, 96, 128] {
            let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.11).cos()).collect();
            let reps = (200_000_000 / (2 * m * n * k)).clamp(3, 2000);
            let (mut tg, mut tr) = (vec![], vec![]);
            for _ in 0..7 {
                let t = Instant::now();
                for _ in 0..reps {
                    let xt = Tensor::from_slice(&x, (m, k), &Device::Cpu)?;
                    let y = xt.matmul(&w.t()?)?;
                    std::hint::black_box(y.flatten_all()?.to_vec1::<f32>()?);
                }
                tg.push(t.elapsed().as_secs_f64() * 1e6 / reps as f64);
                let t = Instant::now();
                for _ in 0..reps {
                    std::hint::black_box(llada_model::weights::dense_few_rows(&w, &x, m, n, k)?);
                }
                tr.push(t.elapsed().as_secs_f64() * 1e6 / reps as f64);
            }
            let (g, r) = (median(tg), median(tr));
            println!("{n:>5} {k:>5} {m:>4} {g:>10.1} {r:>10.1} {:>6.2}x", g / r);
        }
    }
    Ok(())
}
