//! `llada synth`: write a GGUF with a real model's shapes and random quantized weights
//! ([`llada_zoo::synth`]).

use crate::progress::Bar;
use anyhow::Result;
use clap::Args;
use llada_zoo::synth::SynthRequest;
use std::path::PathBuf;

#[derive(Args)]
pub struct SynthArgs {
    /// Shape to copy: llada-8b (d 4096, 32 layers, 32 heads, MLP 12288, vocab 126464),
    /// dream-7b (d 3584, 28 layers, 28 heads / 4 KV heads, MLP 18944, vocab 152064, q/k/v biases)
    /// or llama-8b (autoregressive; d 4096, 32 layers, 32 heads / 8 KV heads, MLP 14336, vocab
    /// 128256: LLaMA-3-8B's shapes).
    #[arg(long, default_value = "llada-8b")]
    shape: String,
    /// Keep only the first N layers (same width, cheaper; e.g. for quick checks).
    #[arg(long)]
    layers: Option<usize>,
    /// Weight type of the matrices: q4_0, q4_1 or q8_0.
    #[arg(long, default_value = "q4_0")]
    quant: String,
    /// Output GGUF file.
    #[arg(long, short = 'o')]
    out: PathBuf,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// The bar of a synthesis: weight bytes written.
pub(crate) fn bar() -> Bar {
    Bar::styled(
        0,
        "{bar:30} {bytes}/{total_bytes} [{elapsed_precise} < {eta_precise}] {msg}",
    )
}

pub fn run(a: SynthArgs) -> Result<()> {
    let req = SynthRequest {
        shape: a.shape,
        layers: a.layers,
        quant: a.quant,
        out: a.out,
        seed: a.seed,
    };
    llada_zoo::synth::write(&req, &bar())?;
    Ok(())
}
