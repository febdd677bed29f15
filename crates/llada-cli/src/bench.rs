//! `llada bench MODEL`: prefill and decode speed, the memory-bandwidth floor measured in the same
//! run, and quantized matmul throughput (ours vs candle's) for the model's quant types.

use crate::LoadContext;
use anyhow::{bail, Result};
use candle_core::{Device, Module, Tensor};
use clap::Args;
use llada_decode::{generate, GenerateConfig};
use llada_kernels::{GgmlType, QMatrix};
use llada_model::{LoadOptions, Model};
use llada_runtime::{Lane, Tracer};
use rayon::prelude::*;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    /// `llada bench diffusion` compares the diffusion strategies; without a subcommand, a
    /// model's prefill/decode speed is measured.
    #[command(subcommand)]
    pub sub: Option<BenchCmd>,
    /// Alias, GGUF file or HF directory.
    #[arg(default_value = "smollm2")]
    model: String,
    /// Threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Prompt length for the prefill measurement.
    #[arg(long, default_value_t = 64)]
    prompt_tokens: usize,
    /// Tokens to decode for the decode measurement.
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// Repetitions (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Skip the matmul table.
    #[arg(long)]
    no_matmul: bool,
    /// Matmul rows to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,128")]
    matmul_m: Vec<usize>,
    /// Matmul weight size N = K.
    #[arg(long, default_value_t = 4096)]
    matmul_size: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Write an operator trace of the decode run to FILE.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
}

#[derive(clap::Subcommand)]
pub enum BenchCmd {
    /// Every diffusion strategy and ablation on the tiny zoo, plus the window sweep (Markdown,
    /// CSV, SVG plot, --json).
    Diffusion(crate::bench_diffusion::DiffusionBenchArgs),
    /// Speculative decoding configurations against the AR baseline (greedy; checks that every
    /// output is identical to AR). AR runs before and after each budget's configurations and
    /// the table reports their pooled rate (this machine's speed drifts within minutes).
    Spec(crate::spec::SpecBenchArgs),
}

#[derive(Serialize)]
struct MatmulRow {
    dtype: String,
    m: usize,
    n: usize,
    k: usize,
    ours_ms: f64,
    ours_gflops: f64,
    candle_ms: f64,
    candle_gflops: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
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

fn bench_matmul(lane: &Lane, ty: GgmlType, ms: &[usize], size: usize) -> Result<Vec<MatmulRow>> {
    let (n, k) = (size, size);
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i.wrapping_mul(2654435761)) % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let ours = QMatrix::quantize(ty, n, k, &w).map_err(anyhow::Error::msg)?;
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

/// Largest matmul rows and size `llada bench` measures (a 16384² f32 weight is 1 GB, built
/// once per quantized type).
const MAX_MATMUL: usize = 16384;

pub fn run(a: BenchArgs) -> Result<()> {
    match a.sub {
        Some(BenchCmd::Diffusion(d)) => return crate::bench_diffusion::run(d),
        Some(BenchCmd::Spec(s)) => return crate::spec::bench(s),
        None => {}
    }
    if a.reps == 0 || a.prompt_tokens == 0 {
        bail!("--reps and --prompt-tokens must be at least 1");
    }
    if a.gen_tokens < 2 {
        bail!("--gen-tokens must be at least 2 (the first token comes from the prefill)");
    }
    if !a.no_matmul {
        if let Some(m) = a.matmul_m.iter().find(|m| !(1..=MAX_MATMUL).contains(*m)) {
            bail!("--matmul-m {m}: rows must be between 1 and {MAX_MATMUL}");
        }
        // Its multiple is checked against the model's block sizes once the model is loaded.
        if !(32..=MAX_MATMUL).contains(&a.matmul_size) {
            bail!(
                "--matmul-size {}: between 32 and {MAX_MATMUL}",
                a.matmul_size
            );
        }
    }
    if let Some(t) = &a.trace {
        crate::check_output_file(t, "--trace")?;
    }
    let threads = crate::threads(a.threads)?;
    let path = crate::models::resolve(&a.model, a.json)?;
    // A line at once, whatever stderr is (the bar below draws only on a terminal).
    eprintln!(
        "benchmarking {}: memory bandwidth, {}prefill of {} tokens and decode of {} tokens, {} runs each",
        path.display(),
        if a.no_matmul { "" } else { "the matmul table, " },
        a.prompt_tokens,
        a.gen_tokens,
        a.reps
    );
    let model = Model::load(&path, &LoadOptions::default()).load_context(&path)?;
    // Prefill and one-token decode are left-to-right measures: a diffusion model decodes in
    // steps over a whole block, which `bench diffusion` times.
    crate::left_to_right(
        &model,
        &path.display().to_string(),
        "`llada bench diffusion` measures its decoding; `llada bench` times left-to-right prefill and decode",
    )?;
    // The prefill run generates one token after the prompt; the decode run continues the
    // prompt's first 8 tokens.
    let need = (a.prompt_tokens + 1).max(8.min(a.prompt_tokens) + a.gen_tokens);
    if need > model.config.max_ctx {
        bail!(
            "--prompt-tokens {} / --gen-tokens {} need {need} positions; the model's context is {}",
            a.prompt_tokens,
            a.gen_tokens,
            model.config.max_ctx
        );
    }
    // The quantized types the matmul table measures (the model's), and the size fits their blocks.
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
    if !a.no_matmul {
        if let Some(t) = types
            .iter()
            .find(|t| !a.matmul_size.is_multiple_of(t.block_elems()))
        {
            bail!(
                "--matmul-size {}: a multiple of {} for this model's {} weights",
                a.matmul_size,
                t.block_elems(),
                t.name()
            );
        }
    }
    let lane = Lane::new("dense", threads)?;
    let reps = a.reps;
    let steps = 2 + 2 * reps + if a.no_matmul { 0 } else { 1 };
    let pb = crate::progress_bar(steps as u64);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );

    pb.set_message("memory bandwidth");
    let bw = measure_bandwidth(&lane);
    pb.inc(1);

    // Ordinary ids (past the special ones at the start of a large vocabulary).
    let vocab = model.config.vocab.max(1) as u32;
    let lo = if vocab > 200 { 100 } else { 0 };
    let prompt: Vec<u32> = (0..a.prompt_tokens as u32)
        .map(|i| lo + (i * 37) % (vocab - lo))
        .collect();
    let prefill_cfg = GenerateConfig {
        max_tokens: 1,
        stop_at_eos: false,
        ..Default::default()
    };
    pb.set_message("warm-up");
    generate(&model, &lane, &prompt, &prefill_cfg, |_| true)?;
    pb.inc(1);
    let mut prefill = vec![];
    for _ in 0..reps {
        pb.set_message("prefill");
        let o = generate(&model, &lane, &prompt, &prefill_cfg, |_| true)?;
        prefill.push(o.prompt_tokens as f64 / o.prefill_s);
        pb.inc(1);
    }
    let decode_cfg = GenerateConfig {
        max_tokens: a.gen_tokens,
        stop_at_eos: false,
        ..Default::default()
    };
    let mut decode = vec![];
    if a.trace.is_some() {
        Tracer::global().enable(true);
    }
    for _ in 0..reps {
        pb.set_message("decode");
        let o = generate(
            &model,
            &lane,
            &prompt[..8.min(prompt.len())],
            &decode_cfg,
            |_| true,
        )?;
        // The first generated token comes from prefill; the rest each cost one forward pass.
        decode.push((o.generated_tokens - 1) as f64 / o.decode_s);
        pb.inc(1);
    }
    if let Some(p) = &a.trace {
        let recs = Tracer::global().drain();
        Tracer::global().enable(false);
        let header = serde_json::json!({"llada_trace": 1, "model": path.display().to_string(), "bench": "decode"});
        llada_formats::atomic::write_with(p, |w| Tracer::write_jsonl(w, &header, &recs))?;
    }
    let mut matmul = vec![];
    if !a.no_matmul {
        pb.set_message("matmul");
        for &t in &types {
            matmul.extend(bench_matmul(&lane, t, &a.matmul_m, a.matmul_size)?);
        }
        pb.inc(1);
    }
    pb.finish_and_clear();

    let bpt = model.bytes_per_token();
    let floor = bw * 1e9 / bpt as f64;
    let prefill_tok_s = median(prefill);
    let decode_tok_s = median(decode);
    if a.json {
        let j = serde_json::json!({
            "model": path.display().to_string(),
            "threads": threads,
            "kernel_isa": llada_kernels::qmatmul::isa().name(),
            "prefill_tokens": prompt.len(),
            "prefill_tok_s": prefill_tok_s,
            "decode_tokens": decode_cfg.max_tokens,
            "decode_tok_s": decode_tok_s,
            "measured_bw_gbs": bw,
            "bytes_per_token": bpt,
            "bw_floor_tok_s": floor,
            "decode_fraction_of_floor": decode_tok_s / floor,
            "matmul": matmul,
        });
        println!("{}", serde_json::to_string_pretty(&j)?);
        return Ok(());
    }
    println!("model            {}", path.display());
    println!("threads          {threads}");
    println!(
        "kernels          {} (LLADA_KERNEL_ISA=avx512-vnni|avx2|portable chooses; this CPU's best: {})",
        llada_kernels::qmatmul::isa(),
        llada_kernels::qmatmul::best_isa()
    );
    println!("memory bandwidth {bw:.1} GB/s (measured now)");
    println!("weights/token    {:.1} MiB", bpt as f64 / (1 << 20) as f64);
    println!(
        "prefill          {prefill_tok_s:.1} tok/s ({} tokens, median of {reps})",
        prompt.len()
    );
    println!(
        "decode           {decode_tok_s:.1} tok/s ({} tokens, median of {reps})",
        decode_cfg.max_tokens
    );
    println!(
        "bandwidth floor  {floor:.1} tok/s -> decode at {:.0}% of it",
        100.0 * decode_tok_s / floor
    );
    if !matmul.is_empty() {
        println!();
        println!(
            "| type | M | N×K | ours ms | ours GFLOP/s | candle ms | candle GFLOP/s | ratio |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        for r in &matmul {
            println!(
                "| {} | {} | {}×{} | {:.2} | {:.1} | {:.2} | {:.1} | {:.2}x |",
                r.dtype,
                r.m,
                r.n,
                r.k,
                r.ours_ms,
                r.ours_gflops,
                r.candle_ms,
                r.candle_gflops,
                r.candle_ms / r.ours_ms
            );
        }
    }
    Ok(())
}
