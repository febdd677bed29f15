//! `llada`: run LLMs on small machines. A thin front-end over the `llada` library: each
//! subcommand's file parses its options, calls the library and prints.
//!
//! Subcommands: `generate` (one prompt), `chat` (interactive), `serve` (OpenAI-compatible HTTP), `fetch` (download a model by
//! alias), `info` (what a model file holds), `bench` (speed against the machine's memory
//! floor), `convert` / `quantize` (to GGUF), `synth`, `train`, `eval`, the drafts' trainers and
//! `sim` (trace replay on device profiles).

mod bench;
mod cmd;
mod progress;
mod util;

pub(crate) use llada::models;
pub(crate) use util::*;

use clap::{Parser, Subcommand};

/// mimalloc instead of the system allocator: training and long prefills allocate and free
/// tens-of-megabyte tensors every step, which glibc serves with fresh `mmap`s (page faults on
/// every touch); measured on 12 steps of `llada train --preset smollm2-draft --batch 16`:
/// 30.1 s → 22.2 s wall, system time 22.5 s → 8.6 s.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "llada",
    version,
    about = "On-device LLM inference: autoregressive, diffusion and speculative decoding.",
    long_about = "llada runs GGUF files and Hugging Face directories (LLaMA, Qwen2, LLaDA, Dream) on CPUs.\n\n\
Quick start:\n  llada generate \"The capital of France is\"        # fetches the default model (smollm2) on first use\n  \
llada chat                                          # talk to it\n  llada info smollm2                                  # what is inside a model file\n  \
llada bench smollm2                                 # tokens/s against the memory-bandwidth floor"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate text from one prompt (streams to stdout).
    Generate(Box<cmd::generate::GenerateArgs>),
    /// Interactive chat with the model's chat template (/reset clears, /exit quits).
    Chat(cmd::chat::ChatArgs),
    /// Serve models over HTTP: OpenAI-compatible API (completions, chat, streaming), continuous
    /// batching of concurrent requests, a playground page at /.
    Serve(cmd::serve::ServeArgs),
    /// Download a model by alias into the cache (`llada fetch smollm2`); prints its path.
    ///
    /// A model already cached whose size and sha256 match is kept (the check is remembered,
    /// so a second fetch reads nothing); `--force` downloads it again.
    Fetch {
        /// Alias to fetch; `--list` shows them.
        name: Option<String>,
        /// List known aliases.
        #[arg(long)]
        list: bool,
        /// Download again even when the cached copy is intact.
        #[arg(long)]
        force: bool,
    },
    /// Show a model's architecture, parameter count, tensor types and bytes.
    Info {
        /// Alias, GGUF file or HF directory.
        model: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Measure prefill/decode speed, memory bandwidth and matmul throughput.
    ///
    /// Quantized matmuls run on the best path this CPU has (AVX-512 VNNI, else AVX2, else
    /// portable); `LLADA_KERNEL_ISA=avx512-vnni|avx2|portable` selects another for the whole
    /// process, e.g. to compare them.
    Bench(bench::BenchArgs),
    /// Write a GGUF with a real model's shapes (LLaDA-8B, Dream-7B, LLaMA-3-8B) and random
    /// quantized weights, for speed and memory measurements without a download.
    Synth(cmd::synth::SynthArgs),
    /// Convert a Hugging Face checkpoint (LLaMA, Qwen2, LLaDA, Dream) to GGUF in llama.cpp's
    /// layout: f16, bf16, q8_0, q4_k_m, … (one tensor at a time; memory stays bounded).
    Convert(cmd::convert::ConvertArgs),
    /// Requantize a GGUF file to another type (q4_k_m, q8_0, f16, …) with llama.cpp's rules.
    Quantize(cmd::quantize::QuantizeArgs),
    /// Train a tiny model of the zoo (`--preset tiny-llada-tasks`, …), saved as an HF directory.
    Train(cmd::train::TrainArgs),
    /// Evaluate a model: exact match per task (diffusion task models), held-out NLL (prose
    /// models), or top-1 agreement and accepted length against a target (drafts, `--target`).
    Eval(cmd::eval::EvalArgs),
    /// Calibrate a draft's early-exit verification probe against its target (writes
    /// probe.json next to the draft; used by `--early-exit` and `bench spec`).
    TrainProbe(cmd::train_probe::TrainProbeArgs),
    /// Fit the head of the early-exit self-drafter (`--draft self`): the target's first
    /// layers plus a ridge-regression adapter onto its final hidden state.
    TrainSelfDraft(cmd::train_self_draft::TrainSelfDraftArgs),
    /// Train the feature drafter (`--draft feature`): a small network that drafts from the
    /// target's own final features (no layer of the target, no KV cache; docs/speculative.md).
    TrainFeatureDraft(cmd::train_feature_draft::TrainFeatureDraftArgs),
    /// Replay an operator trace on a device profile (phone NPU/CPU, PIM, UFS flash): predicted
    /// latency and energy, or a paper's experiment (docs/sim.md).
    Sim(Box<cmd::sim::SimArgs>),
}

/// candle's CPU matmul asks `candle_core::utils::get_num_threads()` for its thread count on
/// every call, and without `RAYON_NUM_THREADS` that re-reads `/proc/cpuinfo` each time (measured:
/// ≈ 8 % of a diffusion benchmark's CPU time went to formatting and parsing that file). Pinning
/// the variable to the value candle would compute keeps candle's choice and makes the lookup an
/// environment read. It runs first in `main`, before any thread exists.
fn pin_matmul_threads() {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let n = candle_core::utils::get_num_threads();
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    }
}

fn main() {
    // A closed pipe (`llada generate … | head -c 1`) ends the process as it ends `cat`, instead
    // of failing every later write. SAFETY: sets a signal's action before any thread starts.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // `println!` panics when stdout fails (a full disk): say so as an error, not a panic.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let p = info.payload();
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") {
            eprintln!("error: {msg}");
            std::process::exit(1);
        }
        default_hook(info)
    }));
    pin_matmul_threads();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("LLADA_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Generate(a) => cmd::generate::run(*a),
        Cmd::Chat(a) => cmd::chat::run(a),
        Cmd::Serve(a) => cmd::serve::run(a),
        Cmd::Fetch { name, list, force } => cmd::fetch::run(name, list, force),
        Cmd::Info { model, json } => cmd::info::run(&model, json),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Synth(a) => cmd::synth::run(a),
        Cmd::Convert(a) => cmd::convert::run(a),
        Cmd::Quantize(a) => cmd::quantize::run(a),
        Cmd::Train(a) => cmd::train::run(a),
        Cmd::Eval(a) => cmd::eval::run(a),
        Cmd::TrainProbe(a) => cmd::train_probe::run(a),
        Cmd::TrainSelfDraft(a) => cmd::train_self_draft::run(a),
        Cmd::TrainFeatureDraft(a) => cmd::train_feature_draft::run(a),
        Cmd::Sim(a) => cmd::sim::run(*a),
    };
    if let Err(e) = r {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
