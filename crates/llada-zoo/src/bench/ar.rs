//! The left-to-right benchmark's measurements (`llada bench MODEL`): the machine's read
//! bandwidth, prefill and decode speed over synthetic prompts (single runs, for benchmarks that
//! interleave them with a peer's: [`prefill_speed`], [`decode_speed`]), and quantized matmul
//! throughput (ours vs candle's) for the quant types a model holds.

use crate::error::Result;
use crate::progress::Progress;
use candle_core::{Device, Module, Tensor};
use llada_decode::{generate, GenerateConfig};
use llada_kernels::{GgmlType, QMatrix};
use llada_model::Model;
use llada_runtime::Lane;
use rayon::prelude::*;
use serde::Serialize;
use std::time::Instant;

/// One matmul measurement: M rows times an N×K weight of `dtype`, ours and candle's.
#[derive(Serialize, Clone, Debug)]
pub struct MatmulRow {
    pub dtype: String,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub ours_ms: f64,
    pub ours_gflops: f64,
    pub candle_ms: f64,
    pub candle_gflops: f64,
}

/// The median (the upper one of an even count); `v` must not be empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Read bandwidth in GB/s: sum a 512 MiB buffer (far larger than any L3) with the lane's threads.
pub fn measure_bandwidth(lane: &Lane) -> f64 {
    let n: usize = 512 << 20 >> 3;
    let buf: Vec<u64> = lane.run(|| (0..n).into_par_iter().map(|i| i as u64).collect());

    let mut best = 0f64;
    for _ in 0..3 {
        let t = Instant::now();
        let s: u64 = lane.run(|| {
            // One contiguous slice per thread: each core streams sequentially, as a kernel would.
            buf.par_chunks(n.div_ceil(lane.threads()))
                .map(|c| {
                    let mut acc = [0u64; 8];
                    for ch in c.chunks_exact(8) {
                        for l in 0..8 {
                            acc[l] = acc[l].wrapping_add(ch[l]);
                        }
                    }
                    acc.iter().fold(0u64, |a, b| a.wrapping_add(*b))
                })
                .reduce(|| 0, |a, b| a.wrapping_add(b))
        });
        std::hint::black_box(s);
        best = best.max((n * 8) as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    best
}

pub fn bench_matmul(
    lane: &Lane,
    ty: GgmlType,
    ms: &[usize],
    size: usize,
) -> Result<Vec<MatmulRow>> {
    let (n, k) = (size, size);
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i.wrapping_mul(2654435761)) % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let ours = QMatrix::quantize(ty, n, k, &w).map_err(crate::error::msg)?;
    let cdt = match ty {
        GgmlType::Q4_0 => candle_core::quantized::GgmlDType::Q4_0,
        GgmlType::Q4_1 => candle_core::quantized::GgmlDType::Q4_1,
        GgmlType::Q8_0 => candle_core::quantized::GgmlDType::Q8_0,
        _ => candle_core::quantized::GgmlDType::Q4K,
    };
    let wt = Tensor::from_vec(w, (n, k), &Device::Cpu)?;
    let cq = candle_core::quantized::QMatMul::from_qtensor(
        candle_core::quantized::QTensor::quantize(&wt, cdt)?,
    )?;
    let mut rows = vec![];
    for &m in ms {
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let reps = (64 / m).clamp(3, 20);
        let mut out = vec![0f32; m * n];
        let t_ours = lane.run(|| {
            ours.matmul(&x, m, &mut out);
            median(
                (0..reps)
                    .map(|_| {
                        let t = Instant::now();
                        ours.matmul(&x, m, &mut out);
                        t.elapsed().as_secs_f64()
                    })
                    .collect(),
            )
        });
        let xt = Tensor::from_vec(x, (m, k), &Device::Cpu)?;
        let t_candle = lane.run(|| -> Result<f64> {
            cq.forward(&xt)?;
            let mut ts = vec![];
            for _ in 0..reps {
                let t = Instant::now();
                std::hint::black_box(cq.forward(&xt)?);
                ts.push(t.elapsed().as_secs_f64());
            }
            Ok(median(ts))
        })?;
        let flop = 2.0 * (m * n * k) as f64;
        rows.push(MatmulRow {
            dtype: ty.name().into(),
            m,
            n,
            k,
            ours_ms: t_ours * 1e3,
            ours_gflops: flop / t_ours / 1e9,
            candle_ms: t_candle * 1e3,
            candle_gflops: flop / t_candle / 1e9,
        });
    }
    Ok(rows)
}

/// The quantized types of `model`'s matrices that [`bench_matmul`] can measure, in the order
/// met.
pub fn matmul_types(model: &Model) -> Vec<GgmlType> {
    let mut types: Vec<GgmlType> = vec![];
    for l in model
        .weights
        .layers
        .iter()
        .flatten()
        .flat_map(|l| l.linears())
        .chain(model.weights.lm_head.as_ref())
    {
        let t = l.dtype();
        if QMatrix::supports(t) && !types.contains(&t) {
            types.push(t);
        }
    }
    types
}

/// A prompt of `n` ordinary ids (past the special ones at the start of a large vocabulary).
pub fn synthetic_prompt(model: &Model, n: usize) -> Vec<u32> {
    let vocab = model.config.vocab.max(1) as u32;
    let lo = if vocab > 200 { 100 } else { 0 };
    (0..n as u32)
        .map(|i| lo + (i * 37) % (vocab - lo))
        .collect()
}

fn prefill_config() -> GenerateConfig {
    GenerateConfig {
        max_tokens: 1,
        stop_at_eos: false,
        ..Default::default()
    }
}

/// One untimed run generating one token after `prompt` (first touches of the weights, the
/// thread pool's start).
pub fn warm_up(model: &Model, lane: &Lane, prompt: &[u32]) -> Result<()> {
    generate(model, lane, prompt, &prefill_config(), |_| true)?;
    Ok(())
}

/// Prefill speed (prompt tokens per second) of one run generating one token after `prompt`.
pub fn prefill_speed(model: &Model, lane: &Lane, prompt: &[u32]) -> Result<f64> {
    let o = generate(model, lane, prompt, &prefill_config(), |_| true)?;
    Ok(o.prompt_tokens as f64 / o.prefill_s)
}

/// Decode speed (tokens per second after the first) of one run generating `tokens` tokens
/// after `prompt`.
pub fn decode_speed(model: &Model, lane: &Lane, prompt: &[u32], tokens: usize) -> Result<f64> {
    let decode_cfg = GenerateConfig {
        max_tokens: tokens,
        stop_at_eos: false,
        ..Default::default()
    };
    let o = generate(model, lane, prompt, &decode_cfg, |_| true)?;
    // The first generated token comes from prefill; the rest each cost one forward pass.
    Ok((o.generated_tokens - 1) as f64 / o.decode_s)
}

/// Prefill speed (prompt tokens per second) of `reps` runs generating one token after
/// `prompt`, after one warm-up run; each run is a step of `progress` (the warm-up too).
pub fn prefill_speeds(
    model: &Model,
    lane: &Lane,
    prompt: &[u32],
    reps: usize,
    progress: &dyn Progress,
) -> Result<Vec<f64>> {
    progress.status("warm-up");
    warm_up(model, lane, prompt)?;
    progress.inc(1);
    let mut prefill = vec![];
    for _ in 0..reps {
        progress.status("prefill");
        prefill.push(prefill_speed(model, lane, prompt)?);
        progress.inc(1);
    }
    Ok(prefill)
}

/// Decode speed (tokens per second after the first) of `reps` runs generating `tokens` tokens
/// after `prompt`; each run is a step of `progress`.
pub fn decode_speeds(
    model: &Model,
    lane: &Lane,
    prompt: &[u32],
    tokens: usize,
    reps: usize,
    progress: &dyn Progress,
) -> Result<Vec<f64>> {
    let mut decode = vec![];
    for _ in 0..reps {
        progress.status("decode");
        decode.push(decode_speed(model, lane, prompt, tokens)?);
        progress.inc(1);
    }
    Ok(decode)
}
