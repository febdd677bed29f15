//! `llada`: run LLMs on small machines.
//!
//! Subcommands: `generate` (one prompt), `chat` (interactive), `fetch` (download a model by
//! alias), `info` (what a model file holds), `bench` (speed against the machine's memory floor).

mod bench;
mod bench_diffusion;
mod models;
mod spec;
mod synth;
mod zoo;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use llada_decode::{generate, GenerateConfig, SamplingParams};
use llada_formats::tokenizer::{ChatTemplate, Message};
use llada_model::{LoadOptions, Model};
use llada_runtime::{Lane, Tracer};
use std::io::Write;
use std::path::PathBuf;

/// mimalloc instead of the system allocator: training and long prefills allocate and free
/// tens-of-megabyte tensors every step, which glibc serves with fresh `mmap`s (page faults on
/// every touch); measured on 12 steps of `llada train --preset smollm2-draft --batch 16`:
/// 30.1 s → 22.2 s wall, system time 22.5 s → 8.6 s.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc (v3) option index of `mi_option_purge_delay` (`mimalloc.h`, `enum mi_option_e`);
/// libmimalloc-sys names only the v2 indices.
pub(crate) const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// [`Model::load`] with freed memory returned to the OS as it is freed. Loading builds and drops
/// large transients (the tokenizer's JSON document and text, every streamed unit once for
/// validation); mimalloc v3 keeps freed pages for a second by default, so they stacked under the
/// weights and the load was the process's RSS peak (SmolLM2-135M at `--mem-budget 25%`: peak
/// RSS 123–125 MB against ≈ 80 MB while decoding; 88–90 MB with this). Afterwards the previous
/// delay comes back: decoding reuses its buffers, and purging at once slowed resident decoding
/// by 10–15 % (docs/architecture.md, "Weight store").
pub(crate) fn load_model(path: &std::path::Path, opts: &LoadOptions) -> Result<Model> {
    // SAFETY: reads and sets process-wide allocator options and asks mimalloc to return freed
    // pages; none of these touch live allocations.
    let before = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
    let m = Model::load(path, opts).load_context(path);
    unsafe {
        libmimalloc_sys::mi_collect(true);
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, before);
    }
    m
}

/// Adds "loading PATH" to a model-loading error, unless its message already names the path
/// (the format errors do: saying it twice read "loading /x: /x: …").
pub(crate) trait LoadContext<T> {
    fn load_context(self, path: &std::path::Path) -> Result<T>;
}

impl<T> LoadContext<T> for std::result::Result<T, llada_model::ModelError> {
    fn load_context(self, path: &std::path::Path) -> Result<T> {
        self.map_err(|e| {
            let p = path.display().to_string();
            let m = e.to_string();
            if m.starts_with(&format!("{p}:")) || m.starts_with(&format!("{p}/")) {
                anyhow::Error::new(e)
            } else {
                anyhow::Error::new(e).context(format!("loading {p}"))
            }
        })
    }
}

/// Most worker threads a lane may have: far above any core count this runs on, far below a
/// count whose thread creation alone stalls the process (`--threads 100000` did).
const MAX_THREADS: usize = 1024;

/// Commands that decode left to right (generate in AR or speculative mode, chat, `bench`,
/// `bench spec`, the train-* commands) refuse a diffusion model: `who` names it (its path, or
/// the option and path), `hint` says what to run instead.
pub(crate) fn left_to_right(model: &Model, who: &str, hint: &str) -> Result<()> {
    if model.config.arch.is_diffusion() {
        bail!(
            "{who} is a diffusion model ({:?}): {hint}",
            model.config.arch
        );
    }
    Ok(())
}

/// A plot's drawing area: an SVG rendered into a string ([`write_svg`]).
pub(crate) type SvgArea<'a> =
    plotters::drawing::DrawingArea<plotters::prelude::SVGBackend<'a>, plotters::coord::Shift>;

/// Render a `size`-pixel SVG plot with `draw` into a string, then write it to `path`
/// atomically: a failing or interrupted run never leaves half a plot over a previous one.
pub(crate) fn write_svg(
    path: &std::path::Path,
    size: (u32, u32),
    draw: impl for<'a, 'b> FnOnce(&'b SvgArea<'a>) -> Result<()>,
) -> Result<()> {
    use plotters::prelude::IntoDrawingArea;
    let mut svg = String::new();
    {
        let root = plotters::prelude::SVGBackend::with_string(&mut svg, size).into_drawing_area();
        draw(&root)?;
        root.present()?;
    }
    llada_formats::atomic::write(path, svg.as_bytes())?;
    Ok(())
}

/// The thread count `--threads` asks for ([`threads_or_all`]), checked: 1 ..= [`MAX_THREADS`].
/// Without `--threads`, the default (every core, or `RAYON_NUM_THREADS`) is capped instead.
pub(crate) fn threads(opt: Option<usize>) -> Result<usize> {
    let Some(n) = opt else {
        return Ok(threads_or_all(None).clamp(1, MAX_THREADS));
    };
    if n == 0 {
        bail!("--threads must be at least 1");
    }
    if n > MAX_THREADS {
        bail!(
            "--threads {n}: at most {MAX_THREADS} (this machine reports {} cores)",
            threads_or_all(None)
        );
    }
    Ok(n)
}

/// `--storage-bw` (GB/s), checked: a finite rate of at least 1 MB/s (slower flash than any
/// phone's; a smaller value would make one read sleep for years).
pub(crate) fn check_storage_bw(gbps: f64) -> Result<()> {
    if !(gbps.is_finite() && gbps >= 1e-3) {
        bail!("--storage-bw {gbps:?}: give the emulated storage bandwidth in GB/s, at least 0.001");
    }
    Ok(())
}

/// An output file's path, checked before the work whose result it will hold: not a
/// directory, in a directory that exists.
pub(crate) fn check_output_file(path: &std::path::Path, flag: &str) -> Result<()> {
    if path.is_dir() {
        bail!("{flag} {}: is a directory", path.display());
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    if !parent.is_dir() {
        bail!(
            "{flag} {}: the directory {} does not exist",
            path.display(),
            parent.display()
        );
    }
    Ok(())
}

/// An output directory's path (created later if missing), checked before the work: it must
/// not be an existing file.
pub(crate) fn check_output_dir(path: &std::path::Path, flag: &str) -> Result<()> {
    if path.exists() && !path.is_dir() {
        bail!("{flag} {}: exists and is not a directory", path.display());
    }
    Ok(())
}

/// Print `s` and a newline on stdout: a full disk is an error, not a panic (a closed pipe ends
/// the process quietly: `main` restores SIGPIPE's default action).
pub(crate) fn out_line(s: impl std::fmt::Display) -> Result<()> {
    let mut o = std::io::stdout().lock();
    writeln!(o, "{s}")
        .and_then(|_| o.flush())
        .context("writing to stdout")
}

/// Generated text streamed to stdout piece by piece: a failed write (a full disk) stops the
/// generation ([`StdoutStream::write`] returns `false`, the generator's "stop") and is the run's
/// error ([`StdoutStream::finish`]).
struct StdoutStream {
    out: std::io::Stdout,
    err: Option<std::io::Error>,
}

impl StdoutStream {
    fn new() -> Self {
        Self {
            out: std::io::stdout(),
            err: None,
        }
    }
    /// Write and flush `piece`; `false` once a write failed.
    fn write(&mut self, piece: &str) -> bool {
        match self
            .out
            .write_all(piece.as_bytes())
            .and_then(|_| self.out.flush())
        {
            Ok(()) => true,
            Err(e) => {
                self.err = Some(e);
                false
            }
        }
    }
    fn finish(self) -> Result<()> {
        match self.err {
            Some(e) => Err(e).context("writing to stdout"),
            None => Ok(()),
        }
    }
}

/// `threads`, or (when not given) `RAYON_NUM_THREADS`, or every core the OS reports; at least 1.
pub(crate) fn threads_or_all(threads: Option<usize>) -> usize {
    threads.unwrap_or_else(|| {
        // RAYON_NUM_THREADS, as for the global pool (e.g. two jobs sharing the cores).
        if let Some(n) = std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
        {
            return n;
        }
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    })
}

/// A progress bar of `len` steps on stderr. It is drawn with `--json` too (stdout carries the
/// result, stderr the progress): a long command shows that it runs.
pub(crate) fn progress_bar(len: u64) -> indicatif::ProgressBar {
    indicatif::ProgressBar::new(len)
}

/// A user's prompt as ids: characters the vocabulary cannot represent are refused (the error
/// names them); those its unknown token stands for are named in a warning on stderr.
pub(crate) fn encode_prompt(
    tok: &llada_formats::tokenizer::Tokenizer,
    text: &str,
) -> Result<Vec<u32>> {
    let (ids, unknown) = tok.encode_prompt(text).map_err(anyhow::Error::msg)?;
    if !unknown.is_empty() {
        let list: Vec<String> = unknown.iter().map(|c| format!("{c:?}")).collect();
        eprintln!(
            "warning: the model reads {} as its unknown token",
            list.join(" ")
        );
    }
    Ok(ids)
}

/// Write the operator records collected so far to `path` (JSONL after `header`).
fn write_trace_file(path: &std::path::Path, header: &serde_json::Value) -> Result<()> {
    let recs = Tracer::global().drain();
    llada_formats::atomic::write_with(path, |w| Tracer::write_jsonl(w, header, &recs))
        .with_context(|| format!("writing trace {}", path.display()))?;
    eprintln!(
        "trace: {} operator records written to {}",
        recs.len(),
        path.display()
    );
    Ok(())
}

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
    Generate(Box<GenerateArgs>),
    /// Interactive chat with the model's chat template (/reset clears, /exit quits).
    Chat(ChatArgs),
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
    /// Quantized matmuls run on AVX2 by default; `LLADA_KERNEL_ISA=avx512-vnni` (on CPUs that
    /// have it) or `portable` selects another path for the whole process, e.g. to compare them.
    Bench(bench::BenchArgs),
    /// Write a GGUF with a real model's shapes (LLaDA-8B, Dream-7B, LLaMA-3-8B) and random
    /// quantized weights, for speed and memory measurements without a download.
    Synth(synth::SynthArgs),
    /// Train a tiny model of the zoo (`--preset tiny-llada-tasks`, …), saved as an HF directory.
    Train(zoo::TrainArgs),
    /// Evaluate a model: exact match per task (diffusion task models), held-out NLL (prose
    /// models), or top-1 agreement and accepted length against a target (drafts, `--target`).
    Eval(zoo::EvalArgs),
    /// Calibrate a draft's early-exit verification probe against its target (writes
    /// probe.json next to the draft; used by `--early-exit` and `bench spec`).
    TrainProbe(spec::TrainProbeArgs),
    /// Fit the head of the early-exit self-drafter (`--draft self`): the target's first
    /// layers plus a ridge-regression adapter onto its final hidden state.
    TrainSelfDraft(spec::TrainSelfDraftArgs),
    /// Train the feature drafter (`--draft feature`): a small network that drafts from the
    /// target's own final features (no layer of the target, no KV cache; docs/speculative.md).
    TrainFeatureDraft(spec::TrainFeatureDraftArgs),
}

#[derive(Args, Clone)]
struct ModelArgs {
    /// Alias (`smollm2`), GGUF file, or HF directory (config.json + safetensors + tokenizer.json).
    #[arg(long, short = 'm', default_value = "smollm2")]
    model: String,
    /// Worker threads of the dense lane (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Requantize all matrices at load: q8_0, q4_0, q4_1 or q4_k (useful for f16/bf16 checkpoints).
    #[arg(long)]
    quantize: Option<String>,
    /// Dequantize all weights to f32 at load (reference precision: no 8-bit activations; slow).
    #[arg(long, conflicts_with = "quantize")]
    dequantize: bool,
    /// Write an operator trace (JSON Lines: op, shape, bytes, lane, start/end ns) to FILE.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Memory budget for weights (bytes, 512M, 2G, or a percentage of the weights, 25%): what
    /// does not fit is streamed from the model file for every forward pass.
    #[arg(long, value_name = "BYTES|PCT")]
    mem_budget: Option<String>,
    /// EMULATION: cap the read bandwidth of streamed weights at this many GB/s (a phone's
    /// flash on a faster disk).
    #[arg(long, value_name = "GB/s")]
    storage_bw: Option<f64>,
}

/// Sampling defaults of `generate` and `chat` (autoregressive and speculative modes): those of
/// llama.cpp's and ollama's CLIs, so that a model behaves here as users know it there.
pub mod sampling_defaults {
    pub const TEMPERATURE: f32 = 0.8;
    pub const TOP_K: usize = 40;
    pub const TOP_P: f32 = 0.95;
    pub const MIN_P: f32 = 0.05;
    pub const REPEAT_PENALTY: f32 = 1.1;
    pub const REPEAT_LAST_N: usize = 64;
}

#[derive(Args, Clone)]
#[command(next_help_heading = "Sampling")]
pub struct SamplingArgs {
    /// Maximum number of tokens to generate.
    #[arg(long, short = 'n', default_value_t = 128)]
    pub max_tokens: usize,
    /// Sampling temperature [default: 0.8; diffusion: 0, and --ahasd: 0]. 0 = greedy: the
    /// most likely token every time (exact and reproducible; no penalty unless given).
    #[arg(long, short = 't')]
    pub temperature: Option<f32>,
    /// Keep only the k most likely tokens (0 = off) [default: 40].
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Nucleus sampling: keep the smallest set reaching this probability (1 = off)
    /// [default: 0.95].
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Drop tokens less likely than this share of the most likely one (0 = off)
    /// [default: 0.05].
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Penalise tokens seen in the last --repeat-last-n tokens (prompt included): a positive
    /// logit is divided by it, a negative one multiplied (1 = off) [default: 1.1 when
    /// sampling, 1 with -t 0].
    #[arg(long)]
    pub repeat_penalty: Option<f32>,
    /// How many of the latest tokens the repeat penalty looks at [default: 64].
    #[arg(long)]
    pub repeat_last_n: Option<usize>,
    /// Random seed: the same seed gives the same text [default: random, printed with the
    /// timings and in --json].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop when this string appears (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
}

impl SamplingArgs {
    /// The options that only token-by-token sampling uses (named, for the error of a mode
    /// that does not take them).
    pub fn ar_only_options(&self) -> Vec<&'static str> {
        [
            (self.top_k.is_some(), "--top-k"),
            (self.top_p.is_some(), "--top-p"),
            (self.min_p.is_some(), "--min-p"),
            (self.repeat_penalty.is_some(), "--repeat-penalty"),
            (self.repeat_last_n.is_some(), "--repeat-last-n"),
        ]
        .into_iter()
        .filter_map(|(given, name)| given.then_some(name))
        .collect()
    }

    /// The sampling parameters asked for, defaults filled in ([`sampling_defaults`]; greedy
    /// when `greedy_default` and no temperature is given), checked.
    pub fn params(&self, greedy_default: bool) -> Result<SamplingParams> {
        use sampling_defaults as d;
        let default_t = if greedy_default { 0.0 } else { d::TEMPERATURE };
        let temperature = self.temperature.unwrap_or(default_t);
        let greedy = temperature <= 0.0;
        let p = SamplingParams {
            temperature,
            top_k: self.top_k.unwrap_or(d::TOP_K),
            top_p: self.top_p.unwrap_or(d::TOP_P),
            min_p: self.min_p.unwrap_or(d::MIN_P),
            // Greedy decoding is exact argmax unless a penalty is asked for.
            repeat_penalty: self.repeat_penalty.unwrap_or(if greedy {
                1.0
            } else {
                d::REPEAT_PENALTY
            }),
            repeat_last_n: self.repeat_last_n.unwrap_or(d::REPEAT_LAST_N),
            seed: self.seed.unwrap_or_else(|| {
                if greedy {
                    0
                } else {
                    u64::from(rand::random::<u32>())
                }
            }),
        };
        p.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(p)
    }
}

#[derive(Args)]
struct GenerateArgs {
    /// The prompt (wrapped in the model's chat template unless --raw).
    prompt: String,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Decoding mode: ar (autoregressive), speculative (a drafter proposes token trees the
    /// model verifies; output identical to ar), or diffusion (LLaDA/Dream models).
    #[arg(long, default_value = "ar", value_parser = ["ar", "speculative", "diffusion"])]
    mode: String,
    #[command(flatten)]
    diffusion: zoo::DiffusionArgs,
    #[command(flatten)]
    spec: spec::SpecArgs,
    /// Use the prompt as is, without the chat template.
    #[arg(long)]
    raw: bool,
    /// System prompt for the chat template.
    #[arg(long)]
    system: Option<String>,
    /// Print one JSON object (text, tokens, timings) instead of streaming.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// System prompt.
    #[arg(long)]
    system: Option<String>,
}

/// A requantization type named on the command line (`flag` names the option in the error).
pub(crate) fn parse_quant(flag: &str, s: Option<&str>) -> Result<Option<llada_kernels::GgmlType>> {
    match s {
        None => Ok(None),
        Some(s) => {
            let t = llada_kernels::GgmlType::from_name(s)
                .filter(|t| llada_kernels::QMatrix::supports(*t));
            match t {
                Some(t) => Ok(Some(t)),
                None => bail!("{flag} {s}: choose one of q8_0, q4_0, q4_1, q4_k"),
            }
        }
    }
}

/// The load options `args` ask for (memory budget, storage emulation, quantization), checked.
/// Every subcommand that loads a model through [`ModelArgs`] goes through here, so no mode
/// silently ignores an option.
pub(crate) fn load_options(args: &ModelArgs) -> Result<LoadOptions> {
    if let Some(bw) = args.storage_bw {
        check_storage_bw(bw)?;
        if args.mem_budget.is_none() {
            bail!("--storage-bw emulates the storage of streamed weights: it needs --mem-budget");
        }
    }
    Ok(LoadOptions {
        quantize: parse_quant("--quantize", args.quantize.as_deref())?,
        no_tokenizer: false,
        dequantize: args.dequantize,
        mem_budget: args
            .mem_budget
            .as_deref()
            .map(llada_model::store::Budget::parse)
            .transpose()
            .map_err(anyhow::Error::msg)?,
        storage_bw: args.storage_bw.map(|g| g * 1e9),
    })
}

fn load(args: &ModelArgs, quiet: bool) -> Result<(Model, Lane)> {
    let threads = crate::threads(args.threads)?;
    let opts = load_options(args)?;
    let path = models::resolve(&args.model, quiet)?;
    let model = load_model(&path, &opts)?;
    // Left to right, a diffusion model predicts nothing useful (its first token is often EOS).
    left_to_right(
        &model,
        &path.display().to_string(),
        "run it with `llada generate --mode diffusion`",
    )?;
    let lane = Lane::new("dense", threads)?;
    if args.trace.is_some() {
        Tracer::global().enable(true);
    }
    Ok((model, lane))
}

/// Memory and streaming figures of a run (a JSON object), and a one-line summary for stderr
/// when weights were streamed. `rss_before_load` is the process's RSS just before the model
/// was loaded.
pub(crate) fn memory_report(
    model: &Model,
    rss_before_load: Option<u64>,
) -> (serde_json::Value, Option<String>) {
    use std::sync::atomic::Ordering::Relaxed;
    let peak = llada_model::store::peak_rss_bytes();
    let weights_peak = llada_kernels::weight_memory::peak();
    let mb = |b: u64| b as f64 / 1e6;
    let Some(st) = &model.store else {
        return (
            serde_json::json!({"rss_before_load_bytes": rss_before_load, "peak_rss_bytes": peak,
                "weights_peak_bytes": weights_peak}),
            None,
        );
    };
    let p = &st.plan;
    let j = serde_json::json!({
        "rss_before_load_bytes": rss_before_load,
        "peak_rss_bytes": peak,
        "weights_peak_bytes": weights_peak,
        "budget_bytes": p.budget,
        "resident_weight_bytes": p.resident_bytes(),
        "staging_bytes": p.staging_bytes(),
        "streamed_bytes_per_pass": p.streamed_bytes(),
        "bytes_read": st.stats.bytes_read.load(Relaxed),
        "units_read": st.stats.units_read.load(Relaxed),
        "storage_busy_s": st.stats.read_ns.load(Relaxed) as f64 / 1e9,
        "repack_busy_s": st.stats.build_ns.load(Relaxed) as f64 / 1e9,
        "dense_wait_s": st.stats.wait_ns.load(Relaxed) as f64 / 1e9,
        // `--storage-bw`: the reads were throttled to this; null when they ran at the disk's speed.
        "storage_bw_emulated_gbps": st.storage_bw.map(|b| b / 1e9),
    });
    let emulated = st.storage_bw.map_or(String::new(), |b| {
        format!(" at an EMULATED {:.2} GB/s", b / 1e9)
    });
    let line = format!(
        "[memory: budget {:.1} MB, resident weights {:.1} MB, staging {:.1} MB; weights peak {:.1} MB; peak RSS {:.1} MB ({:.1} MB before load); streamed {:.1} MB/pass{emulated}, reading {:.2}s, repacking {:.2}s, dense lane waited {:.2}s]",
        mb(p.budget.unwrap_or(0)),
        mb(p.resident_bytes()),
        mb(p.staging_bytes()),
        mb(weights_peak),
        mb(peak.unwrap_or(0)),
        mb(rss_before_load.unwrap_or(0)),
        mb(p.streamed_bytes()),
        st.stats.read_ns.load(Relaxed) as f64 / 1e9,
        st.stats.build_ns.load(Relaxed) as f64 / 1e9,
        st.stats.wait_ns.load(Relaxed) as f64 / 1e9,
    );
    (j, Some(line))
}

fn write_trace(args: &ModelArgs, model: &Model) -> Result<()> {
    if let Some(p) = &args.trace {
        let header = serde_json::json!({
            "llada_trace": 1,
            "model": model.path.display().to_string(),
            "arch": model.config.arch.name(),
        });
        write_trace_file(p, &header)?;
    }
    Ok(())
}

/// The generation options `s` ask for; `greedy_default`: no temperature given means greedy
/// (the AHASD pipeline, which verifies greedily).
fn gen_config(s: &SamplingArgs, greedy_default: bool) -> Result<GenerateConfig> {
    let sampling = s.params(greedy_default)?;
    if s.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    if s.stop.iter().any(|x| x.is_empty()) {
        bail!("--stop: an empty stop string would stop at once");
    }
    Ok(GenerateConfig {
        max_tokens: s.max_tokens,
        sampling,
        stop_strings: s.stop.clone(),
        stop_at_eos: !s.ignore_eos,
        ..Default::default()
    })
}

/// What the timing line says of the sampling: "greedy" or the seed that reproduces the run.
fn sampling_note(p: &SamplingParams) -> String {
    if p.is_greedy() {
        "greedy".into()
    } else {
        format!("seed {}", p.seed)
    }
}

fn run_generate(a: GenerateArgs) -> Result<()> {
    if let Some(t) = &a.model.trace {
        check_output_file(t, "--trace")?;
    }
    // Options of another mode would be ignored without a word: say so instead.
    let s = &a.spec;
    if a.mode != "speculative"
        && (s.draft != "ngram" || s.tree != "lever" || s.early_exit || s.ahasd.is_some())
    {
        bail!(
            "--draft, --tree, --early-exit and --ahasd apply to --mode speculative (this run is --mode {})",
            a.mode
        );
    }
    if a.mode != "diffusion" && a.diffusion.strategy.is_some() {
        bail!(
            "--strategy applies to --mode diffusion (this run is --mode {})",
            a.mode
        );
    }
    let ar_only = a.sampling.ar_only_options();
    if a.mode == "diffusion" && !ar_only.is_empty() {
        bail!(
            "{} appl{} to --mode ar and speculative: diffusion decoding commits the most \
             confident tokens (its options: --temperature, --seed, --strategy, --threshold, …)",
            ar_only.join(", "),
            if ar_only.len() == 1 { "ies" } else { "y" }
        );
    }
    if a.mode == "diffusion" {
        if a.model.trace.is_some() {
            Tracer::global().enable(true);
        }
        zoo::generate_diffusion(
            &a.prompt,
            &a.model,
            a.raw,
            a.json,
            &a.sampling,
            &a.diffusion,
        )?;
        if let Some(p) = &a.model.trace {
            let header =
                serde_json::json!({"llada_trace": 1, "model": a.model.model, "mode": "diffusion"});
            write_trace_file(p, &header)?;
        }
        return Ok(());
    }
    let cfg = gen_config(&a.sampling, a.spec.ahasd.is_some())?;
    let rss_before_load = llada_model::store::rss_bytes();
    let (model, lane) = load(&a.model, a.json)?;
    let tok = model
        .tokenizer
        .as_ref()
        .context("this model has no tokenizer")?;
    let text = if a.raw || tok.template == ChatTemplate::Raw {
        a.prompt.clone()
    } else {
        let mut msgs = vec![];
        if let Some(s) = &a.system {
            msgs.push(Message::new("system", s));
        }
        msgs.push(Message::new("user", &a.prompt));
        tok.template.render(&msgs, true)
    };
    let ids = encode_prompt(tok, &text)?;
    let json = a.json;
    if a.mode == "speculative" {
        let out = spec::run_generate(&model, &lane, &ids, &cfg, &a.spec)?;
        let text = tok.decode(&out.tokens);
        if json {
            out_line(
                serde_json::json!({"model": model.path.display().to_string(), "mode": "speculative",
                    "draft": a.spec.draft, "tree": a.spec.tree, "ahasd": a.spec.ahasd, "text": text, "tokens": out.tokens,
                    "prompt_tokens": ids.len(), "generated_tokens": out.tokens.len(), "sampling": cfg.sampling,
                    "verify_passes": out.verify_passes, "mean_accepted": out.mean_accepted(),
                    "tree_nodes": out.tree_nodes, "tvc_gated": out.tvc_gated, "preverified": out.preverified,
                    "timings": {"total_s": out.total_s, "prefill_s": out.prefill_s,
                        "draft_s": out.draft_s, "verify_s": out.verify_s},
                    "memory": memory_report(&model, rss_before_load).0}),
            )?;
        } else {
            out_line(&text)?;
            eprintln!(
                "[{} tokens in {:.3}s ({:.1} tok/s); {} verify passes, {:.2} draft tokens accepted per pass; draft {}, {}; {}]",
                out.tokens.len(),
                out.total_s - out.prefill_s,
                out.tokens.len() as f64 / (out.total_s - out.prefill_s).max(1e-9),
                out.verify_passes,
                out.mean_accepted(),
                a.spec.draft,
                match &a.spec.ahasd {
                    Some(m) => format!(
                        "AHASD {m}{}{}",
                        if a.spec.edc { " + EDC" } else { "" },
                        if a.spec.tvc { " + TVC" } else { "" }
                    ),
                    None => format!("tree {}", a.spec.tree),
                },
                sampling_note(&cfg.sampling)
            );
            if let Some(why) = &out.tvc_gated {
                eprintln!("[TVC pre-verified nothing: {why}; --tvc-shared runs it anyway]");
            }
            if let Some(line) = memory_report(&model, rss_before_load).1 {
                eprintln!("{line}");
            }
        }
        return write_trace(&a.model, &model);
    }
    let mut stdout = StdoutStream::new();
    let out = generate(&model, &lane, &ids, &cfg, |piece| {
        json || stdout.write(piece)
    })?;
    stdout.finish()?;
    if json {
        let j = serde_json::json!({
            "model": model.path.display().to_string(),
            "text": out.text,
            "tokens": out.tokens,
            "prompt_ids": ids,
            "prompt_tokens": out.prompt_tokens,
            "generated_tokens": out.generated_tokens,
            "forward_passes": out.forward_passes,
            "stop_reason": out.stop_reason,
            "sampling": cfg.sampling,
            "timings": {"total_s": out.total_s, "prefill_s": out.prefill_s, "decode_s": out.decode_s},
            "memory": memory_report(&model, rss_before_load).0,
        });
        out_line(j)?;
    } else {
        out_line("")?;
        eprintln!(
            "[{} prompt tokens in {:.3}s ({:.1} tok/s); {} generated in {:.3}s ({:.1} tok/s); stop: {:?}; {}]",
            out.prompt_tokens,
            out.prefill_s,
            out.prompt_tokens as f64 / out.prefill_s.max(1e-9),
            out.generated_tokens,
            out.decode_s,
            out.generated_tokens as f64 / out.decode_s.max(1e-9),
            out.stop_reason,
            sampling_note(&cfg.sampling)
        );
        if let Some(line) = memory_report(&model, rss_before_load).1 {
            eprintln!("{line}");
        }
    }
    write_trace(&a.model, &model)
}

fn run_chat(a: ChatArgs) -> Result<()> {
    let cfg = gen_config(&a.sampling, false)?;
    if let Some(t) = &a.model.trace {
        check_output_file(t, "--trace")?;
    }
    let (model, lane) = load(&a.model, false)?;
    let tok = model
        .tokenizer
        .as_ref()
        .context("this model has no tokenizer")?;
    let mut history: Vec<Message> = a.system.iter().map(|s| Message::new("system", s)).collect();
    eprintln!(
        "chatting with {} — /reset clears the conversation, /exit quits",
        model.path.display()
    );
    let mut stdin = std::io::stdin().lock();
    loop {
        eprint!("> ");
        let _ = std::io::stderr().flush();
        let mut bytes = vec![];
        if std::io::BufRead::read_until(&mut stdin, b'\n', &mut bytes).context("reading stdin")?
            == 0
        {
            break;
        }
        let Ok(line) = String::from_utf8(bytes) else {
            eprintln!("(that line is not valid UTF-8: nothing sent; type it again)");
            continue;
        };
        let line = line.trim();
        match line {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                history.retain(|m| m.role == "system");
                eprintln!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        history.push(Message::new("user", line));
        let ids = match encode_prompt(tok, &tok.template.render(&history, true)) {
            Ok(ids) => ids,
            Err(e) => {
                eprintln!("error: {e:#}");
                history.pop();
                continue;
            }
        };
        let mut stdout = StdoutStream::new();
        let out = generate(&model, &lane, &ids, &cfg, |p| stdout.write(p));
        stdout.finish()?;
        out_line("")?;
        match out {
            Ok(o) => history.push(Message::new("assistant", o.text.trim())),
            Err(e) => {
                eprintln!("error: {e}");
                history.pop();
            }
        }
    }
    write_trace(&a.model, &model)
}

fn run_info(model: &str, json: bool) -> Result<()> {
    let path = models::resolve(model, json)?;
    // The tokenizer is not reported: models without one (e.g. GGUFs written by other tools
    // without tokenizer metadata) load too.
    let m = Model::load(
        &path,
        &LoadOptions {
            no_tokenizer: true,
            ..Default::default()
        },
    )
    .load_context(&path)?;
    let c = &m.config;
    let total: u64 = m.tensor_types.iter().map(|t| t.2).sum();
    if json {
        let types: serde_json::Map<String, serde_json::Value> = m
            .tensor_types
            .iter()
            .map(|(t, n, b)| (t.clone(), serde_json::json!({"tensors": n, "bytes": b})))
            .collect();
        let j = serde_json::json!({
            "path": path.display().to_string(),
            "format": format!("{:?}", m.format),
            "architecture": c.arch.name(),
            "parameters": c.param_count(),
            "layers": c.n_layers, "d_model": c.d_model, "heads": c.n_heads, "kv_heads": c.n_kv_heads,
            "head_dim": c.head_dim, "ffn": c.ffn, "vocab": c.vocab, "context": c.max_ctx,
            "rope_theta": c.rope_theta, "rms_eps": c.rms_eps, "tied_embeddings": c.tied_embeddings,
            "shift_logits": c.shift_logits, "mask_id": c.mask_id,
            "tensor_types": types, "bytes": total, "bytes_per_token": m.bytes_per_token(),
        });
        println!("{}", serde_json::to_string_pretty(&j)?);
        return Ok(());
    }
    println!("{}", path.display());
    println!("  format        {:?}", m.format);
    println!(
        "  architecture  {}{}",
        c.arch.name(),
        if c.arch.is_diffusion() {
            " (diffusion LM)"
        } else {
            ""
        }
    );
    println!("  parameters    {:.1} M", c.param_count() as f64 / 1e6);
    println!(
        "  layers        {}  d_model {}  ffn {}",
        c.n_layers, c.d_model, c.ffn
    );
    println!(
        "  heads         {} ({} KV, head dim {})",
        c.n_heads, c.n_kv_heads, c.head_dim
    );
    println!("  vocab         {}  context {}", c.vocab, c.max_ctx);
    println!("  rope theta    {}  rms eps {:e}", c.rope_theta, c.rms_eps);
    println!(
        "  tied head     {}  shifted logits {}  mask id {:?}",
        c.tied_embeddings, c.shift_logits, c.mask_id
    );
    println!("  tensors:");
    for (t, n, b) in &m.tensor_types {
        println!(
            "    {t:<6} {n:>5} tensors {:>10.2} MiB",
            *b as f64 / (1 << 20) as f64
        );
    }
    println!(
        "  total         {:.2} MiB; read per decoded token {:.2} MiB",
        total as f64 / (1 << 20) as f64,
        m.bytes_per_token() as f64 / (1 << 20) as f64
    );
    Ok(())
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
        Cmd::Generate(a) => run_generate(*a),
        Cmd::Chat(a) => run_chat(a),
        Cmd::Fetch { name, list, force } => {
            if list || name.is_none() {
                for a in models::ALIASES {
                    println!("{:<10} {}  [{}]", a.name, a.description, a.package);
                }
                Ok(())
            } else {
                let name = name.unwrap_or_default();
                models::alias(&name)
                    .and_then(|a| models::fetch(a, false, force))
                    .map(|p| println!("{}", p.display()))
            }
        }
        Cmd::Info { model, json } => run_info(&model, json),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Synth(a) => synth::run(a),
        Cmd::Train(a) => zoo::train(a),
        Cmd::Eval(a) => zoo::eval(a),
        Cmd::TrainProbe(a) => spec::train_probe(a),
        Cmd::TrainSelfDraft(a) => spec::train_self_draft(a),
        Cmd::TrainFeatureDraft(a) => spec::train_feature_draft(a),
    };
    if let Err(e) = r {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
