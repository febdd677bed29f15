//! `llada generate`: one prompt in any mode, through the library's session API; the text
//! streams to stdout (or one JSON object with `--json`), timings and memory go to stderr.

use crate::cmd::decoding::{DiffusionArgs, SpecArgs};
use crate::util::{
    check_output_file, memory_report, out_line, parse_quant, warn_unknown, write_trace,
    write_trace_file, StdoutStream,
};
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use llada::{Engine, EngineOptions, Event, GenerateOptions, Generation, Mode, Prompt, Stats};
use llada_decode::diffusion::{StepView, TokenState};
use llada_decode::SamplingParams;
use llada_formats::tokenizer::{Message, Tokenizer};
use llada_runtime::Tracer;
use std::path::PathBuf;

/// `--mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    Ar,
    Speculative,
    Diffusion,
}

impl ModeArg {
    fn name(self) -> &'static str {
        match self {
            Self::Ar => "ar",
            Self::Speculative => "speculative",
            Self::Diffusion => "diffusion",
        }
    }
}

#[derive(Args, Clone)]
pub struct ModelArgs {
    /// Alias (`smollm2`), GGUF file, or HF directory (config.json + safetensors + tokenizer.json).
    #[arg(long, short = 'm', default_value = "smollm2")]
    pub model: String,
    /// Worker threads of the dense lane (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Requantize all matrices at load to a GGML block type: q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k,
    /// q4_k, q5_k or q6_k (useful for f16/bf16 checkpoints).
    #[arg(long)]
    pub quantize: Option<String>,
    /// Dequantize all weights to f32 at load (reference precision: no 8-bit activations; slow).
    #[arg(long, conflicts_with = "quantize")]
    pub dequantize: bool,
    /// Write an operator trace (JSON Lines: op, shape, bytes, lane, start/end ns) to FILE.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Memory budget for weights (bytes, 512M, 2G, or a percentage of the weights, 25%): what
    /// does not fit is streamed from the model file for every forward pass.
    #[arg(long, value_name = "BYTES|PCT")]
    pub mem_budget: Option<String>,
    /// EMULATION: cap the read bandwidth of streamed weights at this many GB/s (a phone's
    /// flash on a faster disk).
    #[arg(long, value_name = "GB/s")]
    pub storage_bw: Option<f64>,
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

    /// The sampling parameters asked for, defaults filled in (llama.cpp's: [`llada::sampling::defaults`]; greedy
    /// when `greedy_default` and no temperature is given), checked.
    pub fn params(&self, greedy_default: bool) -> Result<SamplingParams> {
        let choice = llada::SamplingChoice {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed: self.seed,
        };
        Ok(choice.resolve(greedy_default)?)
    }
}

#[derive(Args)]
pub struct GenerateArgs {
    /// The prompt (wrapped in the model's chat template unless --raw).
    prompt: String,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Decoding mode: ar (autoregressive), speculative (a drafter proposes token trees the
    /// model verifies; the same output as ar), or diffusion (LLaDA/Dream models).
    #[arg(long, value_enum, default_value_t = ModeArg::Ar)]
    mode: ModeArg,
    #[command(flatten)]
    diffusion: DiffusionArgs,
    #[command(flatten)]
    spec: SpecArgs,
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

/// The library's load options for `m` (`quiet`: no fetch progress).
pub(crate) fn engine_options(m: &ModelArgs, quiet: bool) -> Result<EngineOptions> {
    Ok(EngineOptions {
        threads: m.threads,
        mem_budget: m.mem_budget.clone(),
        storage_bw_gbps: m.storage_bw,
        quantize: parse_quant("--quantize", m.quantize.as_deref())?,
        dequantize: m.dequantize,
        quiet,
    })
}

/// The generation options `s` ask for; `greedy_default`: no temperature given means greedy
/// (the AHASD pipeline, which verifies greedily).
pub(crate) fn gen_options(s: &SamplingArgs, greedy_default: bool) -> Result<GenerateOptions> {
    let sampling = s.params(greedy_default)?;
    if s.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    if s.stop.iter().any(|x| x.is_empty()) {
        bail!("--stop: an empty stop string would stop at once");
    }
    Ok(GenerateOptions {
        max_tokens: s.max_tokens,
        sampling,
        stop: s.stop.clone(),
        stop_at_eos: !s.ignore_eos,
    })
}

/// What the timing line says of the sampling: "greedy" or the seed that reproduces the run.
pub(crate) fn sampling_note(p: &SamplingParams) -> String {
    if p.is_greedy() {
        "greedy".into()
    } else {
        format!("seed {}", p.seed)
    }
}

/// Options of another mode would be ignored without a word: say so instead.
fn check_mode_options(a: &GenerateArgs) -> Result<()> {
    let mode = a.mode.name();
    if a.mode != ModeArg::Speculative && a.spec.any_given() {
        bail!(
            "--draft, --tree, --early-exit, --ahasd, --edc and --tvc apply to --mode speculative \
             (this run is --mode {mode})"
        );
    }
    if a.mode != ModeArg::Diffusion && a.diffusion.strategy.is_some() {
        bail!("--strategy applies to --mode diffusion (this run is --mode {mode})");
    }
    let ar_only = a.sampling.ar_only_options();
    if a.mode == ModeArg::Diffusion && !ar_only.is_empty() {
        bail!(
            "{} appl{} to --mode ar and speculative: diffusion decoding commits the most \
             confident tokens (its options: --temperature, --seed, --strategy, --threshold, …)",
            ar_only.join(", "),
            if ar_only.len() == 1 { "ies" } else { "y" }
        );
    }
    if a.mode == ModeArg::Diffusion && !a.sampling.stop.is_empty() {
        bail!("--stop applies to --mode ar and speculative");
    }
    Ok(())
}

/// The messages of a chat prompt: the system prompt (if any) and the user's.
fn messages(a: &GenerateArgs) -> Vec<Message> {
    let mut msgs = vec![];
    if let Some(s) = &a.system {
        msgs.push(Message::new("system", s));
    }
    msgs.push(Message::new("user", &a.prompt));
    msgs
}

pub fn run(a: GenerateArgs) -> Result<()> {
    if let Some(t) = &a.model.trace {
        check_output_file(t, "--trace")?;
    }
    check_mode_options(&a)?;
    let diffusion = a.mode == ModeArg::Diffusion;
    let opts = gen_options(&a.sampling, a.spec.ahasd.is_some() || diffusion)?;
    let ahasd = a.spec.ahasd(opts.sampling.temperature)?;
    // Options are checked before the load (an 8B model takes seconds to load).
    let strategy = diffusion
        .then(|| {
            let o = a.diffusion.options(
                a.diffusion.gen_length,
                a.sampling.temperature.unwrap_or(0.0),
                a.sampling.seed.unwrap_or(0),
            );
            o.config().map_err(anyhow::Error::msg).map(|_| o)
        })
        .transpose()?;
    let rss_before_load = llada_model::store::rss_bytes();
    let model = if diffusion && a.model.model == "smollm2" {
        llada::models::default_diffusion_model()?
            .display()
            .to_string()
    } else {
        a.model.model.clone()
    };
    let engine = Engine::load(&model, &engine_options(&a.model, a.json)?)?;
    if a.model.trace.is_some() {
        Tracer::global().enable(true);
    }
    if engine.is_diffusion() != diffusion {
        let p = engine.path().display();
        if diffusion {
            bail!("{p} is not a diffusion model: run it with --mode ar or speculative");
        }
        bail!(
            "{p} is a diffusion model ({:?}): run it with `llada generate --mode diffusion`",
            engine.model().config.arch
        );
    }
    let msgs = messages(&a);
    let prompt = if a.raw {
        Prompt::Raw(&a.prompt)
    } else {
        Prompt::Chat(&msgs)
    };
    let tok = engine.tokenizer()?;
    let draft = match a.mode {
        ModeArg::Speculative => Some(engine.load_draft(
            a.spec.draft_name(),
            llada::draft::draft_quant(&a.spec.draft_quantize)?,
        )?),
        _ => None,
    };
    let mode = match (&draft, strategy) {
        (_, Some(options)) => Mode::Diffusion(llada::Diffusion {
            options,
            sparse_pool: a.diffusion.sparse_pool,
        }),
        (Some(d), None) => Mode::Speculative(llada::Speculative {
            draft: d,
            shape: a.spec.shape()?,
            early_exit: a.spec.exit_probe()?,
            ahasd,
        }),
        (None, None) => Mode::Ar,
    };
    let mut session = engine.session();
    let mut stdout = StdoutStream::new();
    let streams = a.mode == ModeArg::Ar && !a.json;
    let visual = a.diffusion.visual;
    let out = session.generate_streaming(&prompt, &mode, &opts, |e| match e {
        Event::Text(t) if streams => stdout.write(t),
        Event::Unknown(chars) => {
            warn_unknown(chars);
            true
        }
        Event::Step(v) if visual => {
            eprintln!("\x1b[2J\x1b[H{}\x1b[0m", canvas(tok, v));
            true
        }
        _ => true,
    });
    stdout.finish()?;
    let out = out?;
    report(&a, &engine, &out, &opts.sampling, rss_before_load)?;
    if diffusion {
        if let Some(p) = &a.model.trace {
            let header = serde_json::json!({"llada_trace": 1, "model": a.model.model,
                "mode": "diffusion", "generated_tokens": out.tokens.len()});
            write_trace_file(p, &header)?;
        }
        return Ok(());
    }
    write_trace(&a.model, engine.model(), Some(out.tokens.len()))
}

/// A diffusion step drawn for the terminal: masked positions as ░, committed tokens in
/// yellow, revised in magenta, stable in the default colour, EOS padding as a dot.
fn canvas(tok: &Tokenizer, v: &StepView) -> String {
    let mut line = String::new();
    for ((&t, st), &rev) in v.tokens.iter().zip(v.states).zip(v.revised) {
        let text = if t == v.mask_id {
            "░".to_string()
        } else {
            let s = tok.decode(&[t]).replace('\n', "⏎");
            if s.is_empty() {
                "·".to_string()
            } else {
                s
            }
        };
        let color = match (st, rev) {
            (TokenState::Invisible, _) => "\x1b[2m",
            (_, true) => "\x1b[35m",
            (TokenState::Visible, _) => "\x1b[33m",
            (TokenState::Stable, _) => "\x1b[0m",
        };
        line.push_str(color);
        line.push_str(&text);
    }
    line
}

/// The run's result: the text (already streamed in ar mode) or one JSON object on stdout, and
/// timings on stderr.
fn report(
    a: &GenerateArgs,
    engine: &Engine,
    out: &Generation,
    sampling: &SamplingParams,
    rss_before_load: Option<u64>,
) -> Result<()> {
    let (mem_json, mem_line) = memory_report(engine.model(), rss_before_load);
    let path = engine.path().display().to_string();
    let j = match &out.stats {
        Stats::Ar(o) => serde_json::json!({
            "model": path, "text": out.text, "tokens": out.tokens, "prompt_ids": out.prompt_ids,
            "prompt_tokens": o.prompt_tokens, "generated_tokens": o.generated_tokens,
            "forward_passes": o.forward_passes, "stop_reason": o.stop_reason, "sampling": sampling,
            "timings": {"total_s": o.total_s, "prefill_s": o.prefill_s, "decode_s": o.decode_s},
            "memory": mem_json,
        }),
        Stats::Speculative(o) => serde_json::json!({
            "model": path, "mode": "speculative", "draft": a.spec.draft_name(),
            "tree": a.spec.tree, "ahasd": a.spec.ahasd, "text": out.text, "tokens": out.tokens,
            "prompt_tokens": out.prompt_ids.len(), "generated_tokens": out.tokens.len(),
            "sampling": sampling, "verify_passes": o.verify_passes,
            "mean_accepted": o.mean_accepted(), "tree_nodes": o.tree_nodes,
            "tvc_gated": o.tvc_gated, "preverified": o.preverified,
            "timings": {"total_s": o.total_s, "prefill_s": o.prefill_s, "draft_s": o.draft_s,
                "verify_s": o.verify_s},
            "memory": mem_json,
        }),
        Stats::Diffusion(o) => serde_json::json!({
            "model": path, "mode": "diffusion", "strategy": a.diffusion.name(), "text": out.text,
            "tokens": o.tokens, "prompt_ids": out.prompt_ids, "prompt_tokens": out.prompt_ids.len(),
            "generated_tokens": out.tokens.len(), "forward_passes": o.forward_passes,
            "rows_computed": o.rows_computed, "timings": {"total_s": o.total_s},
            "memory": mem_json,
        }),
    };
    if a.json {
        return out_line(j);
    }
    match &out.stats {
        Stats::Ar(o) => {
            out_line("")?;
            eprintln!(
                "[{} prompt tokens in {:.3}s ({:.1} tok/s); {} generated in {:.3}s ({:.1} tok/s); stop: {:?}; {}]",
                o.prompt_tokens,
                o.prefill_s,
                o.prompt_tokens as f64 / o.prefill_s.max(1e-9),
                o.generated_tokens,
                o.decode_s,
                o.generated_tokens as f64 / o.decode_s.max(1e-9),
                o.stop_reason,
                sampling_note(sampling)
            );
        }
        Stats::Speculative(o) => {
            out_line(&out.text)?;
            eprintln!(
                "[{} tokens in {:.3}s ({:.1} tok/s); {} verify passes, {:.2} draft tokens accepted per pass; draft {}, {}; {}]",
                o.tokens.len(),
                o.total_s - o.prefill_s,
                o.tokens.len() as f64 / (o.total_s - o.prefill_s).max(1e-9),
                o.verify_passes,
                o.mean_accepted(),
                a.spec.draft_name(),
                a.spec.describe(),
                sampling_note(sampling)
            );
            if let Some(why) = &o.tvc_gated {
                eprintln!("[TVC pre-verified nothing: {why}; --tvc-shared runs it anyway]");
            }
        }
        Stats::Diffusion(o) => {
            out_line(&out.text)?;
            eprintln!(
                "[{} forward passes, {} rows, {:.3}s, strategy {}]",
                o.forward_passes,
                o.rows_computed,
                o.total_s,
                a.diffusion.name()
            );
        }
    }
    if let Some(line) = mem_line {
        eprintln!("{line}");
    }
    Ok(())
}
