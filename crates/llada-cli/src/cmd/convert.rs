//! `llada convert`: a Hugging Face checkpoint to GGUF in llama.cpp's layout
//! ([`llada_convert::plan_convert`]); also the plan printing and writing `llada quantize` shares.

use crate::progress::Bar;
use anyhow::Result;
use clap::Args;
use llada_convert::{Plan, Target};
use std::path::{Path, PathBuf};

const TYPES: &str = "f32, f16, bf16, q8_0, q6_k, q5_k_m, q4_k_m, q5_0, q5_1, q4_0, q4_1";

/// A `--type` value.
pub(crate) fn parse_type(s: &str) -> Result<Target, String> {
    Target::parse(s).ok_or_else(|| format!("unknown type '{s}' (one of: {TYPES})"))
}

#[derive(Args)]
#[command(after_help = "Examples:\n  \
llada convert ~/LLaDA-8B-Instruct -o llada-8b-f16.gguf                 # lossless for bf16 weights up to f16 rounding\n  \
llada convert ~/LLaDA-8B-Instruct -o llada-8b-q4_k_m.gguf --type q4_k_m # 16 GB of bf16 → about 5 GB\n  \
llada convert models/tiny-llada-prose -o prose.gguf --dry-run          # the per-tensor plan, nothing written\n\n\
Type recipes follow llama.cpp's llama-quantize: norms and biases stay F32; for quantized types the LM head\n\
(and a tied embedding) takes Q6_K; q4_k_m / q5_k_m give attn_v and ffn_down of the first and last eighth of\n\
the layers and every third layer between Q6_K; rows not a multiple of 256 fall back (Q4_K→Q5_0, Q5_K→Q5_1,\n\
Q6_K→Q8_0, then F16). See docs/convert.md.")]
pub struct ConvertArgs {
    /// Hugging Face directory: config.json, model.safetensors (or shards with
    /// model.safetensors.index.json), tokenizer.json. LLaMA, Qwen2, LLaDA or Dream.
    dir: PathBuf,
    /// Output GGUF file (written atomically: a failed run leaves no file under this name).
    #[arg(long, short = 'o')]
    out: PathBuf,
    /// File type: f32, f16, bf16, q8_0, q6_k, q5_k_m, q4_k_m, q5_0, q5_1, q4_0, q4_1.
    #[arg(long = "type", short = 't', default_value = "f16", value_parser = parse_type)]
    ty: Target,
    /// Print the per-tensor plan and the output size; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print the plan (and, when written, the time taken) as JSON on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(a: ConvertArgs) -> Result<()> {
    let plan = llada_convert::plan_convert(&a.dir, a.ty)?;
    execute(&plan, &a.dir, &a.out, a.dry_run, a.json)
}

/// Print the plan (`dry_run`), or write it with a progress bar and say what was written.
pub(crate) fn execute(
    plan: &Plan,
    input: &Path,
    out: &Path,
    dry_run: bool,
    json: bool,
) -> Result<()> {
    let secs = if dry_run {
        None
    } else {
        let bar = Bar::styled(
            plan.tensor_bytes(),
            "{bar:30} {bytes}/{total_bytes} {bytes_per_sec} [{elapsed_precise} < {eta_precise}]",
        );
        let t0 = std::time::Instant::now();
        plan.write(out, &|n| bar.0.inc(n))?;
        bar.0.finish_and_clear();
        Some(t0.elapsed().as_secs_f64())
    };
    if json {
        let tensors: Vec<_> = plan
            .tensors
            .iter()
            .map(|t| {
                serde_json::json!({"name": t.name, "shape": t.shape, "from": t.src.ty.name(),
                    "to": t.ty.name(), "bytes": t.out_bytes(), "note": t.note})
            })
            .collect();
        let v = serde_json::json!({"input": input, "output": out, "type": plan.target.name(),
            "file_bytes": plan.file_bytes(), "written": !dry_run, "seconds": secs,
            "tensors": tensors});
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if dry_run {
        println!(
            "{:<36} {:<16} {:>6} {:>6} {:>12}  note",
            "tensor", "shape", "from", "to", "bytes"
        );
        for t in &plan.tensors {
            let shape: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
            println!(
                "{:<36} {:<16} {:>6} {:>6} {:>12}  {}",
                t.name,
                shape.join("x"),
                t.src.ty.name(),
                t.ty.name(),
                t.out_bytes(),
                t.note.as_deref().unwrap_or("")
            );
        }
    }
    let mut by_type = std::collections::BTreeMap::<&str, (usize, u64)>::new();
    for t in &plan.tensors {
        let e = by_type.entry(t.ty.name()).or_default();
        e.0 += 1;
        e.1 += t.out_bytes();
    }
    let mix: Vec<String> = by_type
        .iter()
        .map(|(ty, (n, b))| format!("{n} {ty} ({:.1} MB)", *b as f64 / 1e6))
        .collect();
    let verb = if dry_run { "would write" } else { "wrote" };
    let time = secs.map_or(String::new(), |s| format!(" in {s:.1} s"));
    eprintln!(
        "{verb} {} ({}, {:.1} MB: {}){time}",
        out.display(),
        plan.target,
        plan.file_bytes() as f64 / 1e6,
        mix.join(", ")
    );
    Ok(())
}
