//! `llada quantize`: a GGUF file to another file type with llama.cpp's mixing rules
//! ([`llada_convert::plan_quantize`]).

use anyhow::Result;
use clap::Args;
use llada_convert::Target;
use std::path::PathBuf;

#[derive(Args)]
#[command(after_help = "Examples:\n  \
llada quantize llada-8b-f16.gguf llada-8b-q4_k_m.gguf --type q4_k_m\n  \
llada quantize model.gguf out.gguf --type q8_0 --dry-run   # per-tensor plan and output size\n\n\
Any supported type to any other: quantized tensors are dequantized to f32 and requantized (as\n\
llama-quantize does; requantizing an already quantized file adds its error to the new one).\n\
Metadata is copied; norms and biases keep their type. See docs/convert.md for the recipes.")]
pub struct QuantizeArgs {
    /// Input GGUF file.
    input: PathBuf,
    /// Output GGUF file (written atomically).
    out: PathBuf,
    /// File type: f32, f16, bf16, q8_0, q6_k, q5_k_m, q4_k_m, q5_0, q5_1, q4_0, q4_1.
    #[arg(long = "type", short = 't', value_parser = super::convert::parse_type)]
    ty: Target,
    /// Print the per-tensor plan and the output size; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print the plan as JSON on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(a: QuantizeArgs) -> Result<()> {
    let plan = llada_convert::plan_quantize(&a.input, a.ty)?;
    super::convert::execute(&plan, &a.input, &a.out, a.dry_run, a.json)
}
