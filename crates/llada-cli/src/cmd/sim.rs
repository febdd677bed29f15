//! `llada sim`: replay an operator trace on a device profile (the `llada-sim` crate), or run
//! one of the papers' experiments on a directory of recorded traces.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
#[command(
    long_about = "Replay an operator trace on a device profile and predict latency and energy.\n\n\
The engine records what it executed with `--trace FILE` (operators, lanes, passes, shapes, bytes, \
FLOPs, times). `llada sim` replays that record as a discrete-event simulation: each lane runs on a \
unit of the profile (NPU, CPU, GPU, PIM; storage reads on UFS flash), operators wait for their lane, \
for the passes of other lanes that had finished, and for the streamed weights they use; units share \
the DRAM bus. Every profile constant names its public source (`--show-profile P`).\n\n\
Examples:\n  \
llada generate --mode diffusion -m models/tiny-llada-tasks --raw \"sort:3 1 4=\" --strategy full --trace t.jsonl\n  \
llada sim --profile host t.jsonl                          # predicted vs measured on this machine\n  \
llada sim --profile sm8750 --model-shape llada-8b t.jsonl # the same schedule at LLaDA-8B size on a phone\n  \
llada sim --profile sm8750 --map dense=cpu t.jsonl        # every dense pass on the CPU instead\n  \
llada sim --profile sm8750 t.jsonl --chrome-trace t.json --svg t.svg\n  \
scripts/sim_traces.sh traces/ && llada sim --experiment llada-cpp --traces traces/\n\n\
Profiles: host, sm8650, sm8750, sm8850, ahasd (NPU + LPDDR5-PIM), gpu-only, or a JSON file. \
docs/sim.md describes the model, the profiles' sources and the experiments."
)]
pub struct SimArgs {
    /// The trace (JSON Lines from `--trace`).
    pub trace: Option<PathBuf>,
    /// Device profile: a built-in name or a JSON file.
    #[arg(long, short = 'p', default_value = "host")]
    pub profile: String,
    /// Re-cost the target's schedule at this model's size: llada-8b, dream-7b, llama-3-8b,
    /// llama-3.2-1b, qwen2.5-1.5b, qwen2.5-0.5b.
    #[arg(long)]
    pub model_shape: Option<String>,
    /// Re-cost the draft lane at this model's size.
    #[arg(long)]
    pub draft_shape: Option<String>,
    /// Bits per weight of re-costed matrices [default: the trace's own].
    #[arg(long)]
    pub weight_bits: Option<f64>,
    /// Run lanes on other units: `dense=cpu,draft=pim`.
    #[arg(long)]
    pub map: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Write the replay as a Chrome trace-event file (open in Perfetto).
    #[arg(long, value_name = "FILE")]
    pub chrome_trace: Option<PathBuf>,
    /// Write an SVG Gantt chart of the units.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Run a paper's experiment instead: llada-cpp, lever, ahasd; or `calibration` (every
    /// trace in --traces replayed on DIR/host.json, predicted beside measured).
    #[arg(long)]
    pub experiment: Option<String>,
    /// The experiment's traces (recorded by scripts/sim_traces.sh DIR).
    #[arg(long, default_value = "sim-traces")]
    pub traces: PathBuf,
    /// Print a profile's constants and their sources.
    #[arg(long, value_name = "PROFILE")]
    pub show_profile: Option<String>,
    /// Print a host profile (JSON) measured from `llada bench --json` output and calibration
    /// traces (a decode, a prefill, a streamed run), all recorded beside the traces to replay.
    #[arg(long, num_args = 2.., value_names = ["BENCH_JSON", "TRACE"])]
    pub calibrate_host: Option<Vec<PathBuf>>,
    /// The weight type whose matmul row `--calibrate-host` takes.
    #[arg(long, default_value = "Q4_1")]
    pub calibrate_dtype: String,
}

pub fn run(a: SimArgs) -> Result<()> {
    if let Some([bench, traces @ ..]) = a.calibrate_host.as_deref() {
        let text = std::fs::read_to_string(bench)
            .with_context(|| format!("reading {}", bench.display()))?;
        let bench: serde_json::Value =
            serde_json::from_str(&text).with_context(|| "the bench output is not JSON")?;
        let traces = traces
            .iter()
            .map(|t| llada_sim::Trace::load(t))
            .collect::<Result<Vec<_>, _>>()?;
        let p = llada_sim::calibrate::host_from_bench(&bench, &traces, &a.calibrate_dtype)?;
        println!("{}", serde_json::to_string_pretty(&p)?);
        return Ok(());
    }
    if let Some(name) = &a.show_profile {
        let p = llada_sim::Profile::load(name)?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&p)?);
            return Ok(());
        }
        println!(
            "{}: {}\n\n| constant | value | source |\n|---|---|---|",
            p.name, p.description
        );
        for (k, v, s) in p.constants() {
            println!("| {k} | {v} | {s} |");
        }
        return Ok(());
    }
    if a.experiment.as_deref() == Some("calibration") {
        let profile = (a.profile != "host").then_some(a.profile.as_str());
        let (p, rows) = llada_sim::experiment::calibration(&a.traces, profile)?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&rows)?);
        } else {
            print!("{}", llada_sim::experiment::calibration_markdown(&p, &rows));
        }
        return Ok(());
    }
    if let Some(name) = &a.experiment {
        let e = llada_sim::experiment::run(name, &a.traces)?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&e)?);
        } else {
            print!("{}", e.markdown());
        }
        return Ok(());
    }
    let Some(path) = &a.trace else {
        bail!("give a trace file (llada generate … --trace FILE), --experiment NAME or --show-profile NAME");
    };
    let trace =
        llada_sim::Trace::load(path).with_context(|| format!("reading {}", path.display()))?;
    let profile = llada_sim::Profile::load(&a.profile)?;
    let opts = llada_sim::Options {
        model_shape: a.model_shape.clone(),
        draft_shape: a.draft_shape.clone(),
        weight_bits: a.weight_bits,
        map: a.map.clone(),
    };
    let (report, replay) = llada_sim::simulate_full(&trace, &profile, &opts)?;
    if let Some(p) = &a.chrome_trace {
        let text = llada_sim::output::chrome_trace(&replay).to_string();
        llada_formats::atomic::write(p, text.as_bytes())
            .with_context(|| format!("writing {}", p.display()))?;
        eprintln!("chrome trace: {}", p.display());
    }
    if let Some(p) = &a.svg {
        let title = format!(
            "{} on {} ({})",
            path.file_name()
                .map_or("trace".into(), |f| f.to_string_lossy()),
            report.profile,
            report.model_shape.as_deref().unwrap_or("as traced")
        );
        let svg = llada_sim::output::svg(&replay, &title)?;
        llada_formats::atomic::write(p, svg.as_bytes())
            .with_context(|| format!("writing {}", p.display()))?;
        eprintln!("svg: {}", p.display());
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.markdown());
    }
    Ok(())
}
