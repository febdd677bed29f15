//! The three papers' experiments as replays of recorded traces, each printed beside the
//! paper's figure.
//!
//! Every experiment reads traces recorded by `scripts/sim_traces.sh` into one directory (file
//! names below), re-costs them at the papers' model sizes and replays them on the profiles;
//! a row is a ratio of two replays (speed-up, energy ratio), the paper's figure (a range when
//! the paper gives one) and simulated / paper (1 inside a range). Nothing here is fitted to
//! the papers: the profiles are the same files `llada sim --profile` uses.

use crate::error::{Result, SimError};
use crate::{simulate, Options, Profile, Report, Trace};
use serde::Serialize;
use std::path::Path;

/// The experiments.
pub const NAMES: &[&str] = &["llada-cpp", "lever", "ahasd"];

/// One comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub label: String,
    /// The paper's figure: one value, or a range `[lo, hi]`.
    pub paper: Option<[f64; 2]>,
    pub simulated: f64,
    /// simulated / paper (1 inside the paper's range; the nearer end outside it).
    pub ratio: Option<f64>,
    pub note: String,
}

/// An experiment's result.
#[derive(Debug, Clone, Serialize)]
pub struct Experiment {
    pub name: String,
    pub rows: Vec<Row>,
    /// Each replay: label → (predicted s, energy J, tokens).
    pub replays: Vec<(String, f64, f64, u64)>,
}

impl Experiment {
    pub fn markdown(&self) -> String {
        let mut s = format!("experiment {}\n\n| comparison | paper | simulated | sim / paper | note |\n|---|---|---|---|---|\n", self.name);
        for r in &self.rows {
            let paper = match r.paper {
                Some([a, b]) if a == b => format!("{a:.2}x"),
                Some([a, b]) => format!("{a:.2}–{b:.2}x"),
                None => "–".into(),
            };
            let ratio = r.ratio.map_or("–".into(), |x| format!("{x:.2}"));
            s += &format!(
                "| {} | {paper} | {:.2}x | {ratio} | {} |\n",
                r.label, r.simulated, r.note
            );
        }
        s += "\n| replay | predicted s | energy J | tokens | ms / token |\n|---|---|---|---|---|\n";
        for (l, t, e, n) in &self.replays {
            s += &format!(
                "| {l} | {t:.3} | {e:.3} | {n} | {:.2} |\n",
                1e3 * t / (*n).max(1) as f64
            );
        }
        s
    }
}

struct Ctx<'a> {
    dir: &'a Path,
    replays: Vec<(String, f64, f64, u64)>,
}

/// What one replay gave.
#[derive(Clone, Copy)]
struct Out {
    s_per_token: f64,
    j_per_token: f64,
}

impl Ctx<'_> {
    fn run(&mut self, label: &str, file: &str, profile: &str, o: Options) -> Result<Out> {
        let path = self.dir.join(file);
        let trace = Trace::load(&path).map_err(|e| match e {
            SimError::Io { .. } => SimError::Schedule(format!(
                "{}: missing; record the experiment's traces with scripts/sim_traces.sh {}",
                path.display(),
                self.dir.display()
            )),
            e => e,
        })?;
        let p = Profile::load(profile)?;
        let r: Report = simulate(&trace, &p, &o)?;
        let tokens = trace.header["generated_tokens"]
            .as_u64()
            .unwrap_or(1)
            .max(1);
        self.replays.push((
            format!("{label} ({profile})"),
            r.predicted_total_s,
            r.energy.total_j,
            tokens,
        ));
        Ok(Out {
            s_per_token: r.predicted_total_s / tokens as f64,
            j_per_token: r.energy.total_j / tokens as f64,
        })
    }
}

fn row(label: &str, paper: Option<[f64; 2]>, sim: f64, note: &str) -> Row {
    let ratio = paper.map(|[a, b]| {
        if sim < a {
            sim / a
        } else if sim > b {
            sim / b
        } else {
            1.0
        }
    });
    Row {
        label: label.into(),
        paper,
        simulated: sim,
        ratio,
        note: note.into(),
    }
}

fn opts(shape: &str, draft: Option<&str>, map: Option<&str>) -> Options {
    Options {
        model_shape: Some(shape.into()),
        draft_shape: draft.map(String::from),
        weight_bits: Some(4.5),
        map: map.map(String::from),
    }
}

/// Run experiment `name` on the traces in `dir`.
pub fn run(name: &str, dir: &Path) -> Result<Experiment> {
    let mut c = Ctx {
        dir,
        replays: Vec::new(),
    };
    let rows = match name {
        "llada-cpp" => llada_cpp(&mut c)?,
        "lever" => lever(&mut c)?,
        "ahasd" => ahasd(&mut c)?,
        _ => {
            return Err(SimError::Schedule(format!(
                "unknown experiment '{name}' (known: {})",
                NAMES.join(", ")
            )))
        }
    };
    Ok(Experiment {
        name: name.into(),
        rows,
        replays: c.replays,
    })
}

/// llada.cpp: the full strategy on NPU + CPU against CPU-only prefix-cache decoding (one token
/// per step), LLaDA-8B and Dream-7B on three SoCs; against autoregressive Llama-3-8B; energy
/// per request; the ablation.
fn llada_cpp(c: &mut Ctx) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    let cpu = Some("dense=cpu,sparse=cpu");
    for soc in ["sm8650", "sm8750", "sm8850"] {
        for shape in ["llada-8b", "dream-7b"] {
            let base = c.run(
                &format!("{shape} prefix cache, CPU"),
                "diffusion-prefix.jsonl",
                soc,
                opts(shape, None, cpu),
            )?;
            let full = c.run(
                &format!("{shape} full, NPU+CPU"),
                "diffusion-full.jsonl",
                soc,
                opts(shape, None, None),
            )?;
            rows.push(row(
                &format!("{soc} {shape}: full (NPU+CPU) vs CPU prefix cache, latency"),
                Some([17.0, 42.0]),
                base.s_per_token / full.s_per_token,
                "",
            ));
            rows.push(row(
                &format!("{soc} {shape}: energy per request, CPU prefix / full"),
                None,
                base.j_per_token / full.j_per_token,
                "the paper reports lower power and energy, no single figure",
            ));
        }
        let ar = c.run(
            "llama-3-8b AR, NPU",
            "ar.jsonl",
            soc,
            opts("llama-3-8b", None, None),
        )?;
        let full = c.run(
            "llada-8b full, NPU+CPU",
            "diffusion-full.jsonl",
            soc,
            opts("llada-8b", None, None),
        )?;
        let paper = (soc != "sm8650").then_some([1.0, 3.9]);
        rows.push(row(
            &format!("{soc}: llada-8b full vs Llama-3-8B AR (NPU), per token"),
            paper,
            ar.s_per_token / full.s_per_token,
            "paper: up to 3.9x on SM8750/SM8850",
        ));
    }
    // Ablation on the middle SoC, LLaDA-8B: each strategy against the prefix-cache baseline.
    for (label, file) in [
        ("multi-block alone", "diffusion-multi-block.jsonl"),
        ("revision alone", "diffusion-revision.jsonl"),
        ("both (full)", "diffusion-full.jsonl"),
    ] {
        let base = c.run(
            "llada-8b prefix, NPU",
            "diffusion-prefix.jsonl",
            "sm8750",
            opts("llada-8b", None, None),
        )?;
        let s = c.run(
            &format!("llada-8b {label}"),
            file,
            "sm8750",
            opts("llada-8b", None, None),
        )?;
        rows.push(row(
            &format!("sm8750 llada-8b ablation: {label} vs prefix cache (both on NPU)"),
            None,
            base.s_per_token / s.s_per_token,
            "the paper's ablation is on accuracy; its latency split is not given",
        ));
    }
    Ok(rows)
}

/// Lever: a flash-streamed Llama-3-8B target (the traces' memory budget) with a Llama-3.2-1B
/// draft in DRAM: AR, chain, Lever tree, tree + early exit.
fn lever(c: &mut Ctx) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for soc in ["sm8650", "sm8750", "sm8850"] {
        let o = || opts("llama-3-8b", Some("llama-3.2-1b"), None);
        let ar = c.run("AR, streamed", "lever-ar.jsonl", soc, o())?;
        let chain = c.run("chain", "lever-chain.jsonl", soc, o())?;
        let tree = c.run("Lever tree", "lever-tree.jsonl", soc, o())?;
        let ee = c.run("Lever tree + early exit", "lever-ee.jsonl", soc, o())?;
        let best = tree.s_per_token.min(ee.s_per_token);
        rows.push(row(
            &format!("{soc}: Lever vs flash-offloaded AR"),
            Some([2.93, 2.93]),
            ar.s_per_token / best,
            "",
        ));
        rows.push(row(
            &format!("{soc}: Lever vs chain (server-style) speculation"),
            Some([1.5, 1.5]),
            chain.s_per_token / best,
            "",
        ));
        rows.push(row(
            &format!("{soc}: early exit vs tree"),
            None,
            tree.s_per_token / ee.s_per_token,
            "",
        ));
    }
    Ok(rows)
}

/// AHASD: GPU-only, NPU-only lock-step, NPU+PIM lock-step, + async, + EDC, + TVC; throughput
/// and energy efficiency against GPU-only.
fn ahasd(c: &mut Ctx) -> Result<Vec<Row>> {
    let o = |map: Option<&str>| opts("llama-3-8b", Some("llama-3.2-1b"), map);
    let gpu = c.run(
        "GPU-only, lock-step",
        "ahasd-sync.jsonl",
        "gpu-only",
        o(None),
    )?;
    let npu = c.run(
        "NPU-only, lock-step",
        "ahasd-sync.jsonl",
        "ahasd",
        o(Some("draft=npu")),
    )?;
    let pim = c.run("NPU+PIM, lock-step", "ahasd-sync.jsonl", "ahasd", o(None))?;
    let asy = c.run("NPU+PIM, async", "ahasd-async.jsonl", "ahasd", o(None))?;
    let attn = c.run(
        "+ target attention in PIM",
        "ahasd-async.jsonl",
        "ahasd",
        o(Some("dense.attention=pim")),
    )?;
    let edc = c.run("+ EDC", "ahasd-edc.jsonl", "ahasd", o(None))?;
    let tvc = c.run("+ EDC + TVC", "ahasd-tvc.jsonl", "ahasd", o(None))?;
    let sp = |x: Out| gpu.s_per_token / x.s_per_token;
    let en = |x: Out| gpu.j_per_token / x.j_per_token;
    Ok(vec![
        row(
            "NPU-only lock-step vs GPU-only, throughput",
            None,
            sp(npu),
            "",
        ),
        row(
            "NPU+PIM lock-step vs GPU-only, throughput",
            None,
            sp(pim),
            "",
        ),
        row(
            "async vs GPU-only, throughput",
            Some([2.2, 2.2]),
            sp(asy),
            "paper's async step includes NPU+PIM",
        ),
        row(
            "+ attention in PIM vs GPU-only, throughput",
            Some([2.7, 2.7]),
            sp(attn),
            "the target's attention on the PIM unit (dense.attention=pim)",
        ),
        row(
            "+ EDC vs GPU-only, throughput",
            Some([3.4, 3.4]),
            sp(edc),
            "EDC, attention on the NPU",
        ),
        row(
            "+ TVC vs GPU-only, throughput",
            Some([3.8, 4.2]),
            sp(tvc),
            "paper: 3.8x ladder, up to 4.2x best case",
        ),
        row(
            "+ TVC vs GPU-only, energy efficiency",
            Some([5.6, 5.6]),
            en(tvc),
            "",
        ),
        row(
            "+ TVC vs NPU+PIM lock-step (prior NPU-PIM designs)",
            Some([1.5, 1.5]),
            pim.s_per_token / tvc.s_per_token,
            "paper compares against SpecPIM",
        ),
    ])
}

/// One trace of a calibration run.
#[derive(Debug, Clone, Serialize)]
pub struct CalRow {
    pub trace: String,
    pub predicted_total_s: f64,
    pub measured_total_s: f64,
    pub ratio: f64,
    /// Operator kinds whose predicted time is within ±25 % of the measured, of those that take
    /// at least 1 % of the measured operator time.
    pub ops_within_25: usize,
    pub ops_counted: usize,
    /// The kind furthest off and its predicted / measured ratio.
    pub worst_op: String,
    pub worst_ratio: f64,
}

/// Replay every `*.jsonl` trace in `dir` (bench traces aside) on `profile` (default:
/// `dir/host.json` when it exists, else the built-in `host`).
pub fn calibration(dir: &Path, profile: Option<&str>) -> Result<(String, Vec<CalRow>)> {
    let own = dir.join("host.json");
    let name = match profile {
        Some(p) => p.to_string(),
        None if own.exists() => own.display().to_string(),
        None => "host".into(),
    };
    let p = Profile::load(&name)?;
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| SimError::Io {
            path: dir.display().to_string(),
            source: e,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|f| f.extension().is_some_and(|x| x == "jsonl"))
        .filter(|f| {
            !f.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("bench"))
        })
        .collect();
    files.sort();
    let mut rows = Vec::new();
    for f in files {
        let t = Trace::load(&f)?;
        let r = simulate(&t, &p, &Options::default())?;
        let total: f64 = r.per_op.values().map(|x| x.measured_s).sum();
        let mut counted = 0;
        let mut within = 0;
        let (mut worst, mut worst_r) = (String::new(), 1.0f64);
        for (k, x) in &r.per_op {
            if x.measured_s < 0.01 * total {
                continue;
            }
            counted += 1;
            let q = x.predicted_s / x.measured_s;
            if (0.75..=1.25).contains(&q) {
                within += 1;
            }
            if (q.ln()).abs() > worst_r.ln().abs() {
                (worst, worst_r) = (k.clone(), q);
            }
        }
        rows.push(CalRow {
            trace: f
                .file_name()
                .map_or(String::new(), |n| n.to_string_lossy().into()),
            predicted_total_s: r.predicted_total_s,
            measured_total_s: r.measured_total_s,
            ratio: r.ratio,
            ops_within_25: within,
            ops_counted: counted,
            worst_op: worst,
            worst_ratio: worst_r,
        });
    }
    Ok((name, rows))
}

/// The calibration table in Markdown.
pub fn calibration_markdown(profile: &str, rows: &[CalRow]) -> String {
    let mut s = format!("calibration on {profile}\n\n| trace | predicted s | measured s | ratio | op kinds within ±25 % | furthest kind (ratio) |\n|---|---|---|---|---|---|\n");
    for r in rows {
        s += &format!(
            "| {} | {:.4} | {:.4} | {:.3} | {}/{} | {} ({:.2}) |\n",
            r.trace,
            r.predicted_total_s,
            r.measured_total_s,
            r.ratio,
            r.ops_within_25,
            r.ops_counted,
            r.worst_op,
            r.worst_ratio
        );
    }
    s
}
