//! `llada bench diffusion`: every diffusion strategy and ablation on the same held-out prompts,
//! in one run (so ratios are meaningful on a noisy machine), plus the window sweep — the time
//! of one forward pass versus window tokens over a cached prefix — that shows which window size
//! pays on the device (a full window where a pass costs the same up to its shape, the smallest
//! where a pass costs its rows, as on a CPU).

use crate::zoo::Lanes;
use crate::LoadContext;
use anyhow::{bail, Context, Result};
use clap::Args;
use llada_decode::diffusion::{CacheMode, DiffusionConfig, MultiBlock, Revision};
use llada_model::{AttnMask, ForwardRequest, KvWrite, LoadOptions, LogitRows, Model};
use llada_runtime::Lane;
use llada_train::tasks::{held_out_subset, Example, Score};
use llada_train::vocab::{CharVocab, BOS};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args)]
pub struct DiffusionBenchArgs {
    /// Models to run the strategies on (task models report accuracy; others latency only).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "models/tiny-llada-tasks,models/tiny-dream-tasks,models/tiny-llada-prose"
    )]
    models: Vec<PathBuf>,
    /// Held-out long-answer examples per task model (answers of ≥ --min-answer characters from
    /// sort and multi).
    #[arg(long, default_value_t = 12)]
    examples: usize,
    /// Shortest answer counted as long.
    #[arg(long, default_value_t = 48)]
    min_answer: usize,
    /// Answer length for task models (≥ 128 for the long-answer setting; five-question answers
    /// are 139 characters and need room for their EOS tail).
    #[arg(long, default_value_t = 160)]
    gen_length: usize,
    /// Answer length for prose models.
    #[arg(long, default_value_t = 256)]
    prose_gen_length: usize,
    /// Prompts for prose models.
    #[arg(long, default_value_t = 2)]
    prose_prompts: usize,
    /// Block length of every strategy.
    #[arg(long, default_value_t = 32)]
    block_length: usize,
    /// Confidence threshold of the parallel strategies.
    #[arg(long, default_value_t = 0.9)]
    threshold: f32,
    /// Multi-block execution window (a static shape; 8 is the fastest on a CPU, see
    /// docs/diffusion.md).
    #[arg(long, default_value_t = 8)]
    window: usize,
    /// Multi-block: look ahead into future blocks when the current block has fewer masked
    /// tokens than this (as `generate --lookahead`).
    #[arg(long, default_value_t = 8)]
    lookahead: usize,
    /// Revision: a commit at this confidence or more becomes stable without a probe (`off`:
    /// every commit is probed).
    #[arg(long, default_value = "0.99", value_parser = crate::zoo::parse_stable_on_commit)]
    stable_on_commit: crate::zoo::StableOnCommit,
    /// Revision: probes after which a token becomes stable regardless.
    #[arg(long, default_value_t = Revision::default().max_probes)]
    max_probes: u8,
    /// Strategies to run (default: all): vanilla, prefix, dual+threshold, multi-block, full,
    /// full-one-lane (full with the sparse pass after the dense one, on all threads),
    /// full-sparse-pool (full with the sparse lane on a one-thread pool of its own),
    /// full-refresh (full with the whole cached prefix recomputed at each block start, as
    /// Fast-dLLM does), revision-only. Any cached strategy takes a `+everyN` suffix
    /// (`revision-only+every2`): every N-th step of a block recomputes every row
    /// (`--refresh-every N` of `llada eval`/`generate`).
    #[arg(long, value_delimiter = ',')]
    strategies: Vec<String>,
    /// Window sizes of the sweep.
    #[arg(long, value_delimiter = ',', default_value = "8,16,32,64,128,256")]
    sweep: Vec<usize>,
    /// Extra models for the sweep only: model paths, or `synth:SHAPE` (llada-8b, dream-7b) — the
    /// `llada synth` GGUF of that shape with random 4-bit weights, written once into the cache
    /// (≈ 4.5 GB for llada-8b, no download); `none` for none.
    #[arg(long, value_delimiter = ',', default_value = "synth:llada-8b")]
    sweep_models: Vec<String>,
    /// Cached prefix length of the sweep.
    #[arg(long, default_value_t = 64)]
    sweep_prefix: usize,
    /// Skip the window sweep.
    #[arg(long)]
    no_sweep: bool,
    /// Directory for runs.csv, sweep.csv, sweep.svg, report.md and report.json.
    #[arg(long, default_value = "bench-out/diffusion")]
    out_dir: PathBuf,
    /// Worker threads of the dense lane (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Passes over the prompts. Within a pass the strategies take turns on each prompt, so the
    /// machine's slow stretches hit every strategy alike; latencies are medians over passes and
    /// speed-ups the median of the per-pass ratios.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    repeats: u32,
    /// Print the JSON report on stdout.
    #[arg(long)]
    json: bool,
}

/// The strategies and ablations, in report order.
pub const STRATEGIES: [&str; 9] = [
    "vanilla",
    "prefix",
    "dual+threshold",
    "multi-block",
    "full",
    "full-one-lane",
    "full-sparse-pool",
    "full-refresh",
    "revision-only",
];

fn strategy(name: &str, a: &DiffusionBenchArgs, gen: usize) -> Result<DiffusionConfig> {
    let mut c = DiffusionConfig::one_per_step(gen, a.block_length);
    // `NAME+everyN`: NAME with an interval refresh of its cache every N steps.
    let name = match name.rsplit_once("+every") {
        Some((base, n)) => {
            c.refresh_every = n
                .parse()
                .ok()
                .filter(|&n: &usize| n > 0)
                .with_context(|| format!("'{name}': expected +everyN with N ≥ 1"))?;
            base
        }
        None => name,
    };
    let mb = MultiBlock {
        window: a.window,
        lookahead: a.lookahead,
    };
    match name {
        "vanilla" => {}
        "prefix" => c.cache = CacheMode::Prefix,
        "dual+threshold" => {
            c.cache = CacheMode::Dual;
            c.threshold = Some(a.threshold);
        }
        "multi-block" => {
            c.cache = CacheMode::Dual;
            c.threshold = Some(a.threshold);
            c.multi_block = Some(mb);
        }
        // `full-one-lane`: the same decoder with the sparse pass run after the dense pass on
        // the dense lane's threads — what the concurrent lanes cost or save on these cores;
        // `full-sparse-pool`: the sparse lane on a one-thread pool of its own;
        // `full-refresh`: the whole prefix recomputed at each block start (Fast-dLLM's
        // refresh), what it costs and buys against full's appended prefix.
        "full" | "full-one-lane" | "full-sparse-pool" | "full-refresh" => {
            c.refresh_prefix = name == "full-refresh";
            c.cache = CacheMode::Dual;
            c.threshold = Some(a.threshold);
            c.multi_block = Some(mb);
            c.revision = Some(Revision {
                concurrent: name != "full-one-lane",
                stable_on_commit: a.stable_on_commit.0,
                max_probes: a.max_probes,
                ..Revision::default()
            });
        }
        "revision-only" => {
            c.cache = CacheMode::Dual;
            c.threshold = Some(a.threshold);
            c.revision = Some(Revision {
                stable_on_commit: a.stable_on_commit.0,
                max_probes: a.max_probes,
                ..Revision::default()
            });
        }
        other => bail!("unknown strategy '{other}' ({})", STRATEGIES.join(", ")),
    }
    c.validate().map_err(anyhow::Error::msg)?;
    Ok(c)
}

/// One (strategy, model) record.
#[derive(Serialize, Clone)]
pub struct Run {
    pub strategy: String,
    pub model: String,
    pub gen_length: usize,
    pub samples: usize,
    /// End-to-end latency per sample: the median over passes of the per-pass mean.
    pub latency_s: f64,
    /// Mean latency per sample in each interleaved pass (`--repeats`).
    pub latency_passes_s: Vec<f64>,
    pub tokens_per_s: f64,
    /// Mean dense forward passes per sample.
    pub forwards: f64,
    pub tokens_per_forward: f64,
    pub padded_rows: usize,
    pub revised: usize,
    pub sparse_rows: usize,
    /// Fraction of the sparse lane's time that overlapped the dense lane.
    pub lane_overlap: Option<f64>,
    pub accuracy: Option<f64>,
    /// Characters in place over the long answers (`tasks::char_score`): finer than exact match.
    pub char_accuracy: Option<f64>,
}

#[derive(Serialize, Clone)]
pub struct SweepPoint {
    pub model: String,
    pub window: usize,
    pub ms: f64,
    pub ms_per_token: f64,
}

/// The tasks with long answers (single sums and running sums stop at 11 and 16 digits):
/// sorts of 24–32 digits (47–63 characters) and five-question answers (139).
const LONG_TASKS: [&str; 2] = ["sort", "multi"];

/// Long-answer held-out examples that fit `gen` (answer + at least one EOS).
fn long_examples(n: usize, min: usize, gen: usize) -> Vec<Example> {
    let pool = held_out_subset(4 * n + 16, &LONG_TASKS, 1.0);
    let mut by_task: Vec<Vec<Example>> = vec![vec![]; LONG_TASKS.len()];
    for e in pool {
        if e.answer.len() >= min && e.answer.len() < gen {
            let k = LONG_TASKS.iter().position(|t| *t == e.task).unwrap_or(0);
            by_task[k].push(e);
        }
    }
    // Round-robin over tasks so every task is represented.
    let mut out = vec![];
    let mut i = 0;
    while out.len() < n && by_task.iter().any(|v| i < v.len()) {
        for v in &by_task {
            if let Some(e) = v.get(i) {
                if out.len() < n {
                    out.push(e.clone());
                }
            }
        }
        i += 1;
    }
    out
}

/// Prompt ids and, for task models, the expected answer.
type Prompt = (Vec<u32>, Option<String>);

const PROSE_PROMPTS: [&str; 4] = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune,",
    "And God said unto Moses, Go in unto Pharaoh, and tell him,",
    "Elizabeth walked on, thinking of what her sister had said about",
    "Blessed are they that mourn: for they shall be comforted. Blessed are",
];

/// What one strategy accumulates over the interleaved passes of a model's prompts.
struct Tally {
    name: String,
    cfg: DiffusionConfig,
    lanes: Lanes,
    /// Summed latency of each pass over the prompts.
    pass_s: Vec<f64>,
    fw: usize,
    pad: usize,
    rev: usize,
    srows: usize,
    sparse_s: f64,
    overlap_s: f64,
    score: Score,
}

/// Every strategy on every prompt, `repeats` times, interleaved: within a pass each prompt is
/// decoded by each strategy in turn, so a slow stretch of this noisy machine hits all of them
/// alike. Counts and accuracy come from the first pass (decoding is deterministic); latency is
/// the median over passes of the per-pass mean.
fn run_interleaved(
    model: &Model,
    strategies: &[(String, DiffusionConfig)],
    prompts: &[Prompt],
    repeats: usize,
    threads: usize,
    model_name: &str,
    pb: &indicatif::ProgressBar,
) -> Result<Vec<Run>> {
    let mut tallies = strategies
        .iter()
        .map(|(name, cfg)| {
            Ok(Tally {
                name: name.clone(),
                cfg: cfg.clone(),
                lanes: Lanes::new(threads, cfg, name == "full-sparse-pool")?,
                pass_s: vec![0.0; repeats.max(1)],
                fw: 0,
                pad: 0,
                rev: 0,
                srows: 0,
                sparse_s: 0.0,
                overlap_s: 0.0,
                score: Score::default(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    for rep in 0..repeats.max(1) {
        for (p, want) in prompts {
            for t in tallies.iter_mut() {
                pb.set_message(format!("{model_name}: pass {} · {}", rep + 1, t.name));
                let clock = Instant::now();
                let out = t.lanes.generate(model, p, &t.cfg, None)?;
                t.pass_s[rep] += clock.elapsed().as_secs_f64();
                if rep == 0 {
                    t.fw += out.forward_passes;
                    t.pad += out.padded_rows;
                    t.rev += out.revised;
                    t.srows += out.sparse_rows;
                    t.sparse_s += out.sparse_s;
                    t.overlap_s += out.overlap_s;
                    if let Some(w) = want {
                        t.score.add(w, &CharVocab::decode(&out.tokens));
                    }
                }
            }
            pb.inc(1);
        }
    }
    let n = prompts.len().max(1) as f64;
    Ok(tallies
        .into_iter()
        .map(|t| {
            let per_pass: Vec<f64> = t.pass_s.iter().map(|s| s / n).collect();
            let lat = median(&per_pass);
            let gen = t.cfg.gen_length as f64;
            Run {
                strategy: t.name,
                model: model_name.to_string(),
                gen_length: t.cfg.gen_length,
                samples: prompts.len(),
                latency_s: lat,
                latency_passes_s: per_pass,
                tokens_per_s: gen / lat.max(1e-12),
                forwards: t.fw as f64 / n,
                tokens_per_forward: gen * n / (t.fw.max(1) as f64),
                padded_rows: t.pad,
                revised: t.rev,
                sparse_rows: t.srows,
                lane_overlap: (t.sparse_s > 0.0).then(|| t.overlap_s / t.sparse_s),
                accuracy: t.score.exact_rate(),
                char_accuracy: t.score.char_rate(),
            }
        })
        .collect())
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        k if k % 2 == 1 => s[k / 2],
        k => 0.5 * (s[k / 2 - 1] + s[k / 2]),
    }
}

/// Speed-up of `fast` over `base`: the median over passes of the per-pass latency ratio (both
/// strategies decoded the same prompts, interleaved, in each pass).
fn paired_speedup(base: &Run, fast: &Run) -> Option<f64> {
    let r: Vec<f64> = base
        .latency_passes_s
        .iter()
        .zip(&fast.latency_passes_s)
        .filter(|(_, f)| **f > 0.0)
        .map(|(b, f)| b / f)
        .collect();
    (!r.is_empty()).then(|| median(&r))
}

/// Time of one forward pass of `w` window rows over a cached prefix of `prefix` rows.
pub fn sweep_model(
    model: &Model,
    lane: &Lane,
    windows: &[usize],
    prefix: usize,
    name: &str,
    reps: usize,
) -> Result<Vec<SweepPoint>> {
    let mask = model.config.mask_id.unwrap_or(0);
    let mut cache = model.new_cache();
    let max_w = windows.iter().copied().max().unwrap_or(8);
    if prefix + max_w > model.config.max_ctx {
        bail!(
            "{name}: prefix {prefix} + window {max_w} exceeds the context {}",
            model.config.max_ctx
        );
    }
    let toks: Vec<u32> = (0..prefix as u32)
        .map(|i| 3 + i % (model.config.vocab as u32 - 3).max(1))
        .collect();
    let pos: Vec<u32> = (0..prefix as u32).collect();
    lane.run(|| {
        model.forward(
            &ForwardRequest {
                tokens: &toks,
                positions: &pos,
                mask: AttnMask::Bidirectional,
                kv_write: KvWrite::Append,
                logits: LogitRows::None,
            },
            &mut cache,
        )
    })?;
    let mut out = vec![];
    for &w in windows {
        let toks = vec![mask; w];
        let pos: Vec<u32> = (prefix as u32..(prefix + w) as u32).collect();
        let mut times = vec![];
        for _ in 0..reps.max(1) {
            let t = Instant::now();
            lane.run(|| {
                model.forward(
                    &ForwardRequest {
                        tokens: &toks,
                        positions: &pos,
                        mask: AttnMask::Bidirectional,
                        kv_write: KvWrite::None,
                        logits: LogitRows::All,
                    },
                    &mut cache,
                )
            })?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let ms = median(&times);
        out.push(SweepPoint {
            model: name.to_string(),
            window: w,
            ms,
            ms_per_token: ms / w as f64,
        });
    }
    Ok(out)
}

fn model_name(p: &Path) -> String {
    p.file_name()
        .map(|s| s.to_string_lossy().trim_end_matches(".gguf").to_string())
        .unwrap_or_else(|| p.display().to_string())
}

/// The sweep's plot: time per window and per window token against the window (written
/// atomically by [`crate::write_svg`]).
fn plot(sweep: &[SweepPoint], path: &Path) -> Result<()> {
    crate::write_svg(path, (900, 420), |root| draw_sweep(sweep, root))
}

fn draw_sweep(sweep: &[SweepPoint], root: &crate::SvgArea<'_>) -> Result<()> {
    use plotters::prelude::*;
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(450);
    let models: Vec<String> = {
        let mut m: Vec<String> = sweep.iter().map(|p| p.model.clone()).collect();
        m.dedup();
        m
    };
    let wmax = sweep.iter().map(|p| p.window).max().unwrap_or(256) as f64;
    for (area, per_token) in [(&left, false), (&right, true)] {
        let val = |p: &SweepPoint| if per_token { p.ms_per_token } else { p.ms };
        let ymax = sweep.iter().map(val).fold(0.0, f64::max) * 1.1;
        let ymin = sweep
            .iter()
            .map(val)
            .fold(f64::INFINITY, f64::min)
            .max(1e-4)
            * 0.8;
        let mut chart = ChartBuilder::on(area)
            .caption(
                if per_token {
                    "ms per window token (log)"
                } else {
                    "ms per forward pass (log)"
                },
                ("sans-serif", 16),
            )
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d((4.0f64..wmax * 1.3).log_scale(), (ymin..ymax).log_scale())?;
        chart.configure_mesh().x_desc("window tokens").draw()?;
        for (i, m) in models.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    sweep
                        .iter()
                        .filter(|p| &p.model == m)
                        .map(|p| (p.window as f64, val(p))),
                    color,
                ))?
                .label(m.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    Ok(())
}

pub fn run(a: DiffusionBenchArgs) -> Result<()> {
    let threads = crate::threads(a.threads)?;
    if a.examples == 0 {
        bail!("--examples must be at least 1");
    }
    if !a.no_sweep && a.sweep.contains(&0) {
        bail!("--sweep: window widths must be at least 1");
    }
    crate::check_output_dir(&a.out_dir, "--out-dir")?;
    let names: Vec<String> = if a.strategies.is_empty() {
        STRATEGIES.iter().map(|s| s.to_string()).collect()
    } else {
        a.strategies.clone()
    };
    std::fs::create_dir_all(&a.out_dir)
        .with_context(|| format!("creating {}", a.out_dir.display()))?;
    let mut runs: Vec<Run> = vec![];
    let mut sweep: Vec<SweepPoint> = vec![];
    let mut total = 0;
    eprintln!(
        "benchmarking {} diffusion strategies on {} model(s){}",
        names.len(),
        a.models.len(),
        if a.no_sweep {
            ""
        } else {
            ", then the window sweep"
        }
    );
    let pb = crate::progress_bar(0);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}] {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let dense_lane = Lane::new("dense", threads)?;
    for path in &a.models {
        let path = &crate::models::locate(path);
        let model = Model::load(path, &LoadOptions::default())
            .with_context(|| format!("loading {} (train it with `llada train`)", path.display()))?;
        let mname = model_name(path);
        let task_model = model.config.vocab == CharVocab::size();
        let (gen, prompts): (usize, Vec<Prompt>) = if task_model {
            let ex = long_examples(a.examples, a.min_answer, a.gen_length);
            if ex.is_empty() {
                bail!(
                    "no held-out example has an answer of {} to {} characters",
                    a.min_answer,
                    a.gen_length
                );
            }
            (
                a.gen_length,
                ex.iter()
                    .map(|e| {
                        let mut p = vec![BOS];
                        p.extend(CharVocab::encode(&e.prompt));
                        (p, Some(e.answer.clone()))
                    })
                    .collect(),
            )
        } else {
            let tok = model
                .tokenizer
                .as_ref()
                .context("a prose model needs its tokenizer")?;
            let mut ps = vec![];
            for text in PROSE_PROMPTS.iter().take(a.prose_prompts.max(1)) {
                let mut ids = tok.encode(text).map_err(anyhow::Error::msg)?;
                if let Some(b) = model.config.bos_id {
                    ids.insert(0, b);
                }
                ps.push((ids, None));
            }
            (a.prose_gen_length, ps)
        };
        let strategies = names
            .iter()
            .map(|name| Ok((name.clone(), strategy(name, &a, gen)?)))
            .collect::<Result<Vec<_>>>()?;
        total += a.repeats as usize * prompts.len();
        pb.set_length(total as u64);
        runs.extend(run_interleaved(
            &model,
            &strategies,
            &prompts,
            a.repeats as usize,
            threads,
            &mname,
            &pb,
        )?);
        if !a.no_sweep {
            pb.set_message(format!("{mname}: window sweep"));
            sweep.extend(sweep_model(
                &model,
                &dense_lane,
                &a.sweep,
                a.sweep_prefix,
                &mname,
                3,
            )?);
        }
    }
    if !a.no_sweep {
        for spec in a
            .sweep_models
            .iter()
            .filter(|s| !s.is_empty() && *s != "none")
        {
            let path = match spec.strip_prefix("synth:") {
                Some(shape) => {
                    pb.set_message(format!("{spec}: synthesising"));
                    crate::synth::cached(shape)?
                }
                None => PathBuf::from(spec),
            };
            let path = &path;
            pb.set_message(format!("{}: window sweep", path.display()));
            let model = Model::load(
                path,
                &LoadOptions {
                    no_tokenizer: true,
                    ..Default::default()
                },
            )
            .load_context(path)?;
            sweep.extend(sweep_model(
                &model,
                &dense_lane,
                &a.sweep,
                a.sweep_prefix,
                &model_name(path),
                1,
            )?);
        }
    }
    pb.finish_and_clear();

    // Summary: the full strategy against both baselines on the first task model.
    let primary = runs
        .iter()
        .find(|r| r.accuracy.is_some())
        .map(|r| r.model.clone());
    let get = |s: &str| {
        runs.iter()
            .find(|r| Some(&r.model) == primary.as_ref() && r.strategy == s)
    };
    let ratio = |base: &str| match (get(base), get("full")) {
        (Some(b), Some(f)) => paired_speedup(b, f),
        _ => None,
    };
    let delta_of = |acc: fn(&Run) -> Option<f64>| match (get("full"), get("vanilla")) {
        (Some(f), Some(v)) => match (acc(f), acc(v)) {
            (Some(fa), Some(va)) => Some(100.0 * (fa - va)),
            _ => None,
        },
        _ => None,
    };
    let delta = delta_of(|r| r.accuracy);
    let char_delta = delta_of(|r| r.char_accuracy);
    let report = serde_json::json!({
        "runs": runs,
        "speedup_vs_prefix_cache": ratio("prefix"),
        "speedup_vs_vanilla": ratio("vanilla"),
        "accuracy_delta_pts": delta,
        "char_accuracy_delta_pts": char_delta,
        "summary_model": primary,
        "window_sweep": sweep,
        "threads": threads,
        "repeats": a.repeats,
        "settings": {
            "block_length": a.block_length,
            "threshold": a.threshold,
            "window": a.window,
            "lookahead": a.lookahead,
            "max_probes": a.max_probes,
        },
    });

    // Markdown, CSV, plot.
    let mut md = String::from("| model | strategy | gen | latency s (passes: min–max) | tok/s | forwards | tok/forward | padded rows | revised | lane overlap | accuracy | chars in place |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let mut csv = String::from("model,strategy,gen_length,samples,latency_s,tokens_per_s,forwards,tokens_per_forward,padded_rows,revised,sparse_rows,lane_overlap,accuracy,char_accuracy\n");
    let opt = |v: Option<f64>, pct: bool| match v {
        Some(x) if pct => format!("{:.1}%", 100.0 * x),
        Some(x) => format!("{x:.3}"),
        None => "–".into(),
    };
    for r in &runs {
        md.push_str(&format!(
            "| {} | {} | {} | {:.3} ({:.3}–{:.3}) | {:.1} | {:.1} | {:.2} | {} | {} | {} | {} | {} |\n",
            r.model,
            r.strategy,
            r.gen_length,
            r.latency_s,
            r.latency_passes_s.iter().copied().fold(f64::INFINITY, f64::min),
            r.latency_passes_s.iter().copied().fold(0.0, f64::max),
            r.tokens_per_s,
            r.forwards,
            r.tokens_per_forward,
            r.padded_rows,
            r.revised,
            opt(r.lane_overlap, true),
            opt(r.accuracy, true),
            opt(r.char_accuracy, true)
        ));
        csv.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
            r.model,
            r.strategy,
            r.gen_length,
            r.samples,
            r.latency_s,
            r.tokens_per_s,
            r.forwards,
            r.tokens_per_forward,
            r.padded_rows,
            r.revised,
            r.sparse_rows,
            r.lane_overlap.map(|v| v.to_string()).unwrap_or_default(),
            r.accuracy.map(|v| v.to_string()).unwrap_or_default(),
            r.char_accuracy.map(|v| v.to_string()).unwrap_or_default()
        ));
    }
    let fmt_ratio = |v: Option<f64>| v.map_or("–".into(), |x| format!("{x:.2}x"));
    md.push_str(&format!(
        "\nfull strategy on {}: {} faster than prefix cache, {} faster than vanilla (medians of {} interleaved passes' ratios), accuracy {} pts vs vanilla (chars in place {} pts)\n",
        primary.as_deref().unwrap_or("–"),
        fmt_ratio(ratio("prefix")),
        fmt_ratio(ratio("vanilla")),
        a.repeats,
        delta.map_or("–".into(), |d| format!("{d:+.1}")),
        char_delta.map_or("–".into(), |d| format!("{d:+.1}"))
    ));
    md.push_str(&format!(
        "
settings: block {}, threshold {}, multi-block window {} (lookahead below {} masks), max probes {}, {} threads
",
        a.block_length, a.threshold, a.window, a.lookahead, a.max_probes, threads
    ));
    if !sweep.is_empty() {
        md.push_str("\n| model | window | ms / forward | ms / token |\n|---|---|---|---|\n");
        let mut scsv = String::from("model,window,ms,ms_per_token\n");
        for p in &sweep {
            md.push_str(&format!(
                "| {} | {} | {:.2} | {:.3} |\n",
                p.model, p.window, p.ms, p.ms_per_token
            ));
            scsv.push_str(&format!(
                "{},{},{},{}\n",
                p.model, p.window, p.ms, p.ms_per_token
            ));
        }
        llada_formats::atomic::write(&a.out_dir.join("sweep.csv"), scsv.as_bytes())?;
        plot(&sweep, &a.out_dir.join("sweep.svg"))?;
    }
    llada_formats::atomic::write(&a.out_dir.join("runs.csv"), csv.as_bytes())?;
    llada_formats::atomic::write(&a.out_dir.join("report.md"), md.as_bytes())?;
    llada_formats::atomic::write(
        &a.out_dir.join("report.json"),
        serde_json::to_string_pretty(&report)?.as_bytes(),
    )?;
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("{md}");
        eprintln!(
            "written: {}/{{report.md,report.json,runs.csv,sweep.csv,sweep.svg}}",
            a.out_dir.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: DiffusionBenchArgs,
    }

    #[test]
    fn every_suffix_sets_the_refresh_interval() {
        let a = Cli::parse_from(["bench"]).a;
        let c = strategy("revision-only+every2", &a, 64).unwrap();
        assert_eq!(c.refresh_every, 2);
        assert!(c.revision.is_some() && c.cache == CacheMode::Dual);
        assert_eq!(strategy("revision-only", &a, 64).unwrap().refresh_every, 0);
        assert!(
            strategy("full-refresh+every4", &a, 64)
                .unwrap()
                .refresh_prefix
        );
        for bad in [
            "full+every0",
            "full+everyx",
            "vanilla+every2",
            "nope+every2",
        ] {
            assert!(strategy(bad, &a, 64).is_err(), "{bad}");
        }
    }
}
