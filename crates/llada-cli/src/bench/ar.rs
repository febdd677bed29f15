//! `llada bench MODEL`: prefill and decode speed, the memory-bandwidth floor measured in the same
//! run, and quantized matmul throughput (ours vs candle's) for the model's quant types
//! (measured by [`llada_zoo::bench::ar`]).

use super::BenchArgs;
use crate::progress::Bar;
use crate::LoadContext;
use anyhow::{bail, Result};
use llada_model::{LoadOptions, Model};
use llada_runtime::{Lane, Tracer};
use llada_zoo::bench::ar::{
    bench_matmul, decode_speeds, matmul_types, measure_bandwidth, median, prefill_speeds,
    synthetic_prompt,
};
use llada_zoo::Progress;

/// Largest matmul rows and size `llada bench` measures (a 16384² f32 weight is 1 GB, built
/// once per quantized type).
const MAX_MATMUL: usize = 16384;

pub fn run(a: BenchArgs) -> Result<()> {
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
    let types = matmul_types(&model);
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
    let pb = Bar::styled(steps as u64, "{bar:30} {pos}/{len} {msg}");

    pb.status("memory bandwidth");
    let bw = measure_bandwidth(&lane);
    pb.inc(1);

    let prompt = synthetic_prompt(&model, a.prompt_tokens);
    let prefill = prefill_speeds(&model, &lane, &prompt, reps, &pb)?;
    if a.trace.is_some() {
        Tracer::global().enable(true);
    }
    let decode_prompt = &prompt[..8.min(prompt.len())];
    let decode = decode_speeds(&model, &lane, decode_prompt, a.gen_tokens, reps, &pb)?;
    if let Some(p) = &a.trace {
        let recs = Tracer::global().drain();
        Tracer::global().enable(false);
        let header = serde_json::json!({"llada_trace": 1, "model": path.display().to_string(), "bench": "decode"});
        llada_formats::atomic::write_with(p, |w| Tracer::write_jsonl(w, &header, &recs))?;
    }
    let mut matmul = vec![];
    if !a.no_matmul {
        pb.status("matmul");
        for &t in &types {
            matmul.extend(bench_matmul(&lane, t, &a.matmul_m, a.matmul_size)?);
        }
        pb.inc(1);
    }
    pb.finish();

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
            "decode_tokens": a.gen_tokens,
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
        a.gen_tokens
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
