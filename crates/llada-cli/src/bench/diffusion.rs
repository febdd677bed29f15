//! `llada bench diffusion`: every diffusion strategy and ablation on the same held-out prompts,
//! in one run, plus the window sweep (measured by [`llada_zoo::bench::diffusion`]); the report
//! as Markdown, CSV, an SVG plot and JSON.

use crate::cmd::decoding::{parse_stable_on_commit, StableOnCommit};
use crate::progress::Bar;
use crate::LoadContext;
use anyhow::{bail, Context, Result};
use clap::Args;
use llada_decode::diffusion::Revision;
use llada_decode::strategy::{StrategyOptions, DEFAULT_THRESHOLD};
use llada_model::{LoadOptions, Model};
use llada_runtime::Lane;
use llada_zoo::bench::diffusion::{
    paired_speedup, prompts_for, run_interleaved, strategy, sweep_model, Run, StrategySettings,
    SweepPoint, STRATEGIES,
};
use llada_zoo::bench::peer::{self, peer_ratios};
use llada_zoo::bench::split_accuracy::{
    layout_examples, split_accuracy, worst_delta, SplitAccuracy,
};
use llada_zoo::eval::{parse_answer_region, AnswerRegion, Layout};
use llada_zoo::Progress;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct DiffusionBenchArgs {
    /// Models to run the strategies on (task models report accuracy; others latency only).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "models/tiny-llada-tasks,models/tiny-dream-tasks,models/tiny-llada-prose"
    )]
    models: Vec<PathBuf>,
    /// Accuracy as users meet it: every strategy's exact match on the whole held-out eval
    /// split of each task model, this many examples per task (50: the split, 250 examples), in
    /// every layout of --answer-regions; 0 skips it. `accuracy_delta_pts` is full minus
    /// vanilla there, the worst over models and layouts.
    #[arg(long, default_value_t = 50)]
    eval_per_task: usize,
    /// Answer layouts of the eval-split accuracy: `auto` (the answer plus one EOS, rounded up to
    /// whole blocks) and fixed regions N (a user's `--gen-length N`; only the tasks whose
    /// longest answer fits, with more examples each so that the count is at least `auto`'s).
    #[arg(long, value_delimiter = ',', default_value = "auto,64", value_parser = parse_answer_region)]
    answer_regions: Vec<AnswerRegion>,
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
    #[arg(long, default_value_t = DEFAULT_THRESHOLD)]
    threshold: f32,
    /// Multi-block execution window (a static shape; the default is `llada generate`'s,
    /// docs/diffusion.md).
    #[arg(long, default_value_t = StrategyOptions::default().window)]
    window: usize,
    /// Multi-block: look ahead into future blocks when the current block has fewer masked
    /// tokens than this (as `generate --lookahead`).
    #[arg(long, default_value_t = StrategyOptions::default().lookahead)]
    lookahead: usize,
    /// Revision: a commit at this confidence or more becomes stable without a probe (`off`:
    /// every commit is probed).
    #[arg(long, default_value = "0.99", value_parser = parse_stable_on_commit)]
    stable_on_commit: StableOnCommit,
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
    /// Beside each extra sweep model (a GGUF), llama.cpp's pass over the same rows
    /// (`llama-bench -p W -n 0`, built by scripts/peer/llama_cpp.sh), window by window
    /// interleaved with ours; the report gives both and the ratio.
    #[arg(long)]
    peer: bool,
    /// Directory of the llama.cpp binaries (default: $LLADA_PEER_DIR, else the cache).
    #[arg(long)]
    peer_dir: Option<PathBuf>,
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

impl DiffusionBenchArgs {
    /// The settings every strategy shares.
    fn settings(&self) -> StrategySettings {
        StrategySettings {
            block_length: self.block_length,
            threshold: self.threshold,
            window: self.window,
            lookahead: self.lookahead,
            stable_on_commit: self.stable_on_commit.0,
            max_probes: self.max_probes,
        }
    }
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
    // Found before any model loads, so that a missing peer fails at once.
    let peer_dir = match a.peer && !a.no_sweep {
        true => Some(peer::find_bin_dir(a.peer_dir.as_deref())?),
        false => None,
    };
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
    let mut split_acc: Vec<SplitAccuracy> = vec![];
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
    let pb = Bar::styled(0, "{bar:30} {pos}/{len} [{elapsed_precise}] {msg}");
    let dense_lane = Lane::new("dense", threads)?;
    for path in &a.models {
        let path = &crate::models::locate(path);
        let model = Model::load(path, &LoadOptions::default())
            .with_context(|| format!("loading {} (train it with `llada train`)", path.display()))?;
        let mname = model_name(path);
        let (gen, prompts) = prompts_for(
            &model,
            a.examples,
            a.min_answer,
            a.gen_length,
            a.prose_gen_length,
            a.prose_prompts,
        )?;
        let settings = a.settings();
        let strategies = names
            .iter()
            .map(|name| Ok((name.clone(), strategy(name, &settings, gen)?)))
            .collect::<llada_zoo::Result<Vec<_>>>()?;
        total += a.repeats as usize * prompts.len();
        pb.set_len(total as u64);
        runs.extend(run_interleaved(
            &model,
            &strategies,
            &prompts,
            a.repeats as usize,
            threads,
            &mname,
            &pb,
        )?);
        if a.eval_per_task > 0 && prompts.iter().all(|(_, want)| want.is_some()) {
            for &region in &a.answer_regions {
                let examples = layout_examples(region, a.block_length, a.eval_per_task)?;
                let layout = Layout {
                    region,
                    block: a.block_length,
                };
                for name in &names {
                    pb.status(&format!(
                        "{mname}: eval split, region {}, {name}",
                        region.label(a.block_length)
                    ));
                    let cfg_for = |gen: usize| strategy(name, &settings, gen);
                    split_acc.push(split_accuracy(
                        &model, &mname, name, &cfg_for, &examples, layout, threads, &pb,
                    )?);
                }
            }
        }
        if !a.no_sweep {
            pb.status(&format!("{mname}: window sweep"));
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
                    pb.status(&format!("{spec}: synthesising"));
                    llada_zoo::synth::cached(shape, &crate::cmd::synth::bar())?
                }
                None => PathBuf::from(spec),
            };
            let path = &path;
            pb.status(&format!("{}: window sweep", path.display()));
            let model = Model::load(
                path,
                &LoadOptions {
                    no_tokenizer: true,
                    ..Default::default()
                },
            )
            .load_context(path)?;
            let name = model_name(path);
            match &peer_dir {
                None => sweep.extend(sweep_model(
                    &model,
                    &dense_lane,
                    &a.sweep,
                    a.sweep_prefix,
                    &name,
                    1,
                )?),
                // Window by window, ours then the peer's, so that the machine's drift
                // reaches both alike.
                Some(dir) => {
                    for &w in &a.sweep {
                        pb.status(&format!("{name}: window {w}, ours and llama.cpp's"));
                        let ours =
                            sweep_model(&model, &dense_lane, &[w], a.sweep_prefix, &name, 1)?;
                        let tok_s = peer::batch_pass(dir, path, threads, w)?;
                        sweep.extend(ours);
                        let ms = 1e3 * w as f64 / tok_s;
                        sweep.push(SweepPoint {
                            model: format!("llama.cpp {name}"),
                            window: w,
                            ms,
                            ms_per_token: ms / w as f64,
                        });
                    }
                }
            }
        }
    }
    pb.finish();

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
    // The same ratios on every model that ran full and the baselines.
    let mut models_seen: Vec<&str> = runs.iter().map(|r| r.model.as_str()).collect();
    models_seen.dedup();
    let per_model: Vec<serde_json::Value> = models_seen
        .iter()
        .map(|m| {
            let of = |s: &str| runs.iter().find(|r| r.model == *m && r.strategy == s);
            let vs = |base: &str| match (of(base), of("full")) {
                (Some(b), Some(f)) => paired_speedup(b, f),
                _ => None,
            };
            serde_json::json!({"model": m, "vs_prefix_cache": vs("prefix"), "vs_vanilla": vs("vanilla")})
        })
        .collect();
    let long_delta = delta_of(|r| r.accuracy);
    let long_char_delta = delta_of(|r| r.char_accuracy);
    let delta = worst_delta(&split_acc, "full", "vanilla", |s| s.accuracy);
    let char_delta = worst_delta(&split_acc, "full", "vanilla", |s| s.char_accuracy);
    let report = serde_json::json!({
        "runs": runs,
        "speedup_vs_prefix_cache": ratio("prefix"),
        "speedup_vs_vanilla": ratio("vanilla"),
        "full_speedups_by_model": per_model,
        "accuracy_delta_pts": delta,
        "char_accuracy_delta_pts": char_delta,
        "split_accuracy": split_acc,
        "long_answer_accuracy_delta_pts": long_delta,
        "long_answer_char_accuracy_delta_pts": long_char_delta,
        "summary_model": primary,
        "window_sweep": sweep,
        "window_vs_peer": peer_ratios(&sweep)
            .iter()
            .map(|(model, w, ours, theirs)| serde_json::json!({
                "model": model, "window": w, "ours_ms": ours, "peer_ms": theirs,
                "ratio": theirs / ours,
            }))
            .collect::<Vec<_>>(),
        "threads": threads,
        "repeats": a.repeats,
        "settings": {
            "block_length": a.block_length,
            "threshold": a.threshold,
            "window": a.window,
            "lookahead": a.lookahead,
            "max_probes": a.max_probes,
            "eval_per_task": a.eval_per_task,
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
    let pts = |d: Option<f64>| d.map_or("–".into(), |d| format!("{d:+.1}"));
    md.push_str(&format!(
        "\nfull strategy on {}: {} faster than prefix cache, {} faster than vanilla (medians of {} interleaved passes' ratios); on the long answers above, accuracy {} pts vs vanilla (chars in place {} pts)\n",
        primary.as_deref().unwrap_or("–"),
        fmt_ratio(ratio("prefix")),
        fmt_ratio(ratio("vanilla")),
        a.repeats,
        pts(long_delta),
        pts(long_char_delta)
    ));
    if !split_acc.is_empty() {
        md.push_str("\n| model | region | strategy | eval examples | exact | chars in place | tok/s (one pass) |\n|---|---|---|---|---|---|---|\n");
        for s in &split_acc {
            md.push_str(&format!(
                "| {} | {} | {} | {} | {:.1}% | {:.1}% | {:.0} |\n",
                s.model,
                s.region,
                s.strategy,
                s.examples,
                100.0 * s.accuracy,
                100.0 * s.char_accuracy,
                s.tokens_per_s
            ));
        }
        md.push_str(&format!(
            "\nfull vs vanilla on the eval split, worst model and layout: {} pts exact ({} pts chars in place)\n",
            pts(delta),
            pts(char_delta)
        ));
    }
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
        let vs_peer = peer_ratios(&sweep);
        if !vs_peer.is_empty() {
            md.push_str(
                "\n| model | window | ours ms | llama.cpp ms | ours vs llama.cpp |\n|---|---|---|---|---|\n",
            );
            for (model, w, ours, theirs) in &vs_peer {
                md.push_str(&format!(
                    "| {model} | {w} | {ours:.1} | {theirs:.1} | {:.2}x |\n",
                    theirs / ours
                ));
            }
        }
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
