//! `llada bench diffusion-frontier`: the speed/accuracy frontier of the `full` strategy's
//! settings (window, threshold, lookahead, revision) on the task models, by default on the
//! **tuning** split — training-side prompts, none held out — so that defaults chosen from it
//! are not chosen on the held-out examples the reported figures come from. One point per
//! setting, model and answer layout: exact match against answer positions decoded per second;
//! `vanilla` is the reference. Writes frontier.csv, frontier.svg and frontier.json.

use crate::progress::Bar;
use anyhow::{bail, Context, Result};
use clap::Args;
use llada_decode::strategy::{DiffusionLanes, Strategy, StrategyOptions};
use llada_model::{LoadOptions, Model};
use llada_zoo::bench::split_accuracy::{layout_examples_in, SplitAccuracy};
use llada_zoo::eval::{
    decode_examples, parse_answer_region, parse_split, AnswerRegion, Layout, Split,
};
use llada_zoo::Progress;
use std::path::PathBuf;

#[derive(Args)]
pub struct FrontierArgs {
    /// Task models.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "models/tiny-llada-tasks,models/tiny-dream-tasks"
    )]
    models: Vec<PathBuf>,
    /// `tuning` (training-side prompts, for choosing settings) or `eval` (the held-out split).
    #[arg(long, default_value = "tuning", value_parser = parse_split)]
    split: Split,
    /// Examples per task in `auto` (a fixed region draws as many in all from the tasks that
    /// fit it).
    #[arg(long, default_value_t = 50)]
    per_task: usize,
    /// Answer layouts (as `llada eval --answer-region`).
    #[arg(long, value_delimiter = ',', default_value = "auto,64", value_parser = parse_answer_region)]
    answer_regions: Vec<AnswerRegion>,
    /// Settings, each `vanilla` or `full` options joined by `:` — `wN` window, `tX`
    /// threshold, `lN` lookahead, `sX` stable-on-commit (`soff`: every commit probed).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "vanilla,w8:t0.9,w8:t0.95,w16:t0.9,w16:t0.95,w32:t0.8,w32:t0.9,w32:t0.95,w32:t0.99,w64:t0.95"
    )]
    settings: Vec<String>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    #[arg(long, default_value = "bench-out/frontier")]
    out_dir: PathBuf,
}

/// The strategy options of a setting (`vanilla`, or `full` with `wN:tX:lN:sX` changes).
pub fn setting(spec: &str) -> Result<StrategyOptions> {
    let mut o = StrategyOptions {
        strategy: Strategy::Full,
        ..Default::default()
    };
    if spec == "vanilla" {
        o.strategy = Strategy::Vanilla;
        return Ok(o);
    }
    for part in spec.split(':') {
        let bad = || format!("setting '{spec}': bad part '{part}' (wN, tX, lN, sX or soff)");
        let (k, v) = part.split_at(part.len().min(1));
        match k {
            "w" => o.window = v.parse().with_context(bad)?,
            "t" => o.threshold = Some(v.parse().with_context(bad)?),
            "l" => o.lookahead = v.parse().with_context(bad)?,
            "s" if v == "off" => o.stable_on_commit = None,
            "s" => o.stable_on_commit = Some(v.parse().with_context(bad)?),
            _ => bail!(bad()),
        }
    }
    o.config()?;
    Ok(o)
}

pub fn run(a: FrontierArgs) -> Result<()> {
    let threads = crate::threads(a.threads)?;
    crate::check_output_dir(&a.out_dir, "--out-dir")?;
    std::fs::create_dir_all(&a.out_dir)?;
    let settings = a
        .settings
        .iter()
        .map(|s| Ok((s.clone(), setting(s)?)))
        .collect::<Result<Vec<_>>>()?;
    let block = StrategyOptions::default().block_length;
    let mut points: Vec<SplitAccuracy> = vec![];
    let pb = Bar::new(0);
    for path in &a.models {
        let path = &crate::models::locate(path);
        let model = Model::load(path, &LoadOptions::default())
            .with_context(|| format!("loading {}", path.display()))?;
        let mname = path
            .file_name()
            .map_or("model".into(), |s| s.to_string_lossy().to_string());
        for &region in &a.answer_regions {
            let examples = layout_examples_in(a.split, region, block, a.per_task)?;
            let layout = Layout { region, block };
            for (name, opts) in &settings {
                pb.status(&format!("{mname}, region {}: {name}", region.label(block)));
                let cfg_for = |gen: usize| {
                    StrategyOptions {
                        gen_length: gen,
                        ..opts.clone()
                    }
                    .config()
                    .map_err(|e| llada_zoo::Error::Invalid(e.to_string()))
                };
                let lanes = DiffusionLanes::new(threads, &cfg_for(block)?, false)?;
                let r = decode_examples(&model, &lanes, &examples, layout, &cfg_for, 0, &pb)?;
                points.push(SplitAccuracy::of(&r, &mname, name, layout));
            }
        }
    }
    pb.finish();
    let mut csv =
        String::from("model,region,setting,examples,accuracy,char_accuracy,tokens_per_s\n");
    for p in &points {
        csv.push_str(&format!(
            "{},{},{},{},{},{},{}\n",
            p.model, p.region, p.strategy, p.examples, p.accuracy, p.char_accuracy, p.tokens_per_s
        ));
    }
    llada_formats::atomic::write(&a.out_dir.join("frontier.csv"), csv.as_bytes())?;
    llada_formats::atomic::write(
        &a.out_dir.join("frontier.json"),
        serde_json::to_string_pretty(&serde_json::json!({
            "split": a.split.name(), "per_task": a.per_task, "threads": threads, "points": points,
        }))?
        .as_bytes(),
    )?;
    crate::write_svg(&a.out_dir.join("frontier.svg"), (900, 700), |root| {
        draw(&points, root)
    })?;
    print!("{csv}");
    eprintln!(
        "written: {}/{{frontier.csv,frontier.json,frontier.svg}}",
        a.out_dir.display()
    );
    Ok(())
}

/// One panel per model and layout: exact match (%) against answer positions per second (log),
/// each point labelled with its setting.
fn draw(points: &[SplitAccuracy], root: &crate::SvgArea<'_>) -> Result<()> {
    use plotters::prelude::*;
    root.fill(&WHITE)?;
    let mut panels: Vec<(String, String)> = points
        .iter()
        .map(|p| (p.model.clone(), p.region.clone()))
        .collect();
    panels.dedup();
    let cols = 2usize;
    let rows = panels.len().div_ceil(cols).max(1);
    let areas = root.split_evenly((rows, cols));
    for ((model, region), area) in panels.iter().zip(areas.iter()) {
        let pts: Vec<&SplitAccuracy> = points
            .iter()
            .filter(|p| &p.model == model && &p.region == region)
            .collect();
        let xs = pts.iter().map(|p| p.tokens_per_s.max(1e-3));
        let (xmin, xmax) = xs.fold((f64::INFINITY, 0.0f64), |(a, b), x| (a.min(x), b.max(x)));
        let ys = pts.iter().map(|p| 100.0 * p.accuracy);
        let (ymin, ymax) = ys.fold((100.0f64, 0.0f64), |(a, b), y| (a.min(y), b.max(y)));
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{model}, region {region}"), ("sans-serif", 15))
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(45)
            .build_cartesian_2d(
                (xmin * 0.7..xmax * 1.6).log_scale(),
                (ymin - 1.0).max(0.0)..(ymax + 0.6).min(100.5),
            )?;
        chart
            .configure_mesh()
            .x_desc("answer positions / s (log)")
            .y_desc("exact match %")
            .draw()?;
        chart.draw_series(pts.iter().map(|p| {
            let c = if p.strategy == "vanilla" { RED } else { BLUE };
            EmptyElement::at((p.tokens_per_s.max(1e-3), 100.0 * p.accuracy))
                + Circle::new((0, 0), 3, c.filled())
                + Text::new(p.strategy.clone(), (4, -10), ("sans-serif", 10))
        }))?;
    }
    Ok(())
}
