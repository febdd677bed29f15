//! `llada bench`: a model's left-to-right speed ([`ar`]), and the subcommands `bench
//! diffusion` ([`diffusion`]), `bench diffusion-frontier` ([`frontier`]) and `bench spec`
//! ([`spec`]). Each parses its options, calls the
//! measurements of [`llada_zoo::bench`] and writes the report (tables, JSON, plots).

pub mod ar;
pub mod diffusion;
pub mod frontier;
pub mod spec;

use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    /// `llada bench diffusion` compares the diffusion strategies; without a subcommand, a
    /// model's prefill/decode speed is measured.
    #[command(subcommand)]
    pub sub: Option<BenchCmd>,
    /// Alias, GGUF file or HF directory.
    #[arg(default_value = "smollm2")]
    pub(crate) model: String,
    /// Threads (default: all cores).
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Prompt length for the prefill measurement.
    #[arg(long, default_value_t = 64)]
    pub(crate) prompt_tokens: usize,
    /// Tokens to decode for the decode measurement.
    #[arg(long, default_value_t = 128)]
    pub(crate) gen_tokens: usize,
    /// Repetitions (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub(crate) reps: usize,
    /// Skip the matmul table.
    #[arg(long)]
    pub(crate) no_matmul: bool,
    /// Matmul rows to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,128")]
    pub(crate) matmul_m: Vec<usize>,
    /// Matmul weight size N = K.
    #[arg(long, default_value_t = 4096)]
    pub(crate) matmul_size: usize,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// Write an operator trace of the decode run to FILE.
    #[arg(long, value_name = "FILE")]
    pub(crate) trace: Option<PathBuf>,
    /// Measure llama.cpp beside us (llama-bench on the same GGUF file and thread count,
    /// interleaved rounds; built by scripts/peer/llama_cpp.sh, docs/peer.md).
    #[arg(long)]
    pub(crate) peer: bool,
    /// The peer's binary directory (default: $LLADA_PEER_DIR, else the cache's peer/).
    #[arg(long, value_name = "DIR", requires = "peer")]
    pub(crate) peer_dir: Option<PathBuf>,
}

#[derive(clap::Subcommand)]
pub enum BenchCmd {
    /// Every diffusion strategy and ablation on the tiny zoo, plus the window sweep (Markdown,
    /// CSV, SVG plot, --json).
    Diffusion(diffusion::DiffusionBenchArgs),
    /// The speed/accuracy frontier of the `full` strategy's settings on the task models (by
    /// default on the tuning split, disjoint from the held-out one): CSV, JSON, SVG plot.
    DiffusionFrontier(frontier::FrontierArgs),
    /// Speculative decoding configurations against the AR baseline (greedy; checks that every
    /// output is identical to AR). AR runs before and after each budget's configurations and
    /// the table reports their pooled rate (this machine's speed drifts within minutes).
    Spec(spec::SpecBenchArgs),
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    match a.sub {
        Some(BenchCmd::Diffusion(d)) => diffusion::run(d),
        Some(BenchCmd::DiffusionFrontier(f)) => frontier::run(f),
        Some(BenchCmd::Spec(s)) => spec::run(s),
        None => ar::run(a),
    }
}
