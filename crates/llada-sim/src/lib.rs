//! `llada-sim`: replay the engine's operator traces on device profiles.
//!
//! The engine records what it executed (`llada generate --trace FILE`: operator, lane, pass,
//! layer, shape, bytes, FLOPs, times). This crate replays that record as a discrete-event
//! simulation on a profile of a system-on-chip (phone NPU, CPU clusters, GPU, PIM, LPDDR,
//! UFS flash; `profiles/*.json`, every constant with its public source) and predicts latency
//! and energy:
//!
//! ```no_run
//! let trace = llada_sim::Trace::load("t.jsonl".as_ref())?;
//! let profile = llada_sim::Profile::load("sm8750")?;
//! let report = llada_sim::simulate(&trace, &profile, &llada_sim::Options::default())?;
//! println!("{}", report.markdown());
//! # Ok::<(), llada_sim::SimError>(())
//! ```
//!
//! Modules: [`trace`] reads and checks traces, [`profile`] the device profiles ([`calibrate`]
//! measures a `host` one beside the traces), [`shape`]
//! re-costs a schedule at another model size, [`replay`] turns operators into tasks with
//! dependencies, [`engine`] places them, [`report`] sums time and energy, [`output`] writes
//! Chrome traces and SVG Gantt charts, [`experiment`] runs the papers' comparisons.

pub mod calibrate;
pub mod engine;
pub mod error;
pub mod experiment;
pub mod output;
pub mod profile;
pub mod replay;
pub mod report;
pub mod shape;
pub mod trace;

pub use error::{Result, SimError};
pub use profile::Profile;
pub use report::Report;
use trace::Op;
pub use trace::Trace;

/// How to replay.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Re-cost the target's lanes at this model's dimensions (`llada-8b`, …).
    pub model_shape: Option<String>,
    /// Re-cost the draft lane at this model's dimensions.
    pub draft_shape: Option<String>,
    /// Bits per weight of re-costed matrices (default: the trace's own).
    pub weight_bits: Option<f64>,
    /// Lane remapping, `dense=cpu,draft=pim`.
    pub map: Option<String>,
}

/// Lanes that run the target model.
pub const TARGET_LANES: &[&str] = &["dense", "sparse", "main", "storage", "storage_build"];

/// Replay `trace` on `profile`.
pub fn simulate(trace: &Trace, profile: &Profile, o: &Options) -> Result<Report> {
    Ok(simulate_full(trace, profile, o)?.0)
}

/// Replay and also return the placed tasks (for the Chrome trace and the Gantt chart).
pub fn simulate_full(
    trace: &Trace,
    profile: &Profile,
    o: &Options,
) -> Result<(Report, replay::Replay)> {
    let mut p = profile.clone();
    if let Some(m) = &o.map {
        p.remap(m)?;
    }
    // Which operators are the target's: its lanes, and passes of other lanes (the draft lane's
    // pre-verification) that run a model of the target's width.
    let target = target_ops(&trace.ops);
    let mut ops: Vec<(Op, bool)> = trace.ops.iter().cloned().zip(target).collect();
    let mut kept = Vec::new();
    for (name, want) in [(&o.model_shape, true), (&o.draft_shape, false)] {
        let Some(name) = name else { continue };
        let s = shape::shape(name)?;
        let t = Trace {
            header: trace.header.clone(),
            ops: ops.iter().map(|(op, _)| op.clone()).collect(),
        };
        // The target flag travels with each operator through the re-costing (a stable key:
        // the operator's measured start and lane, which re-costing keeps).
        let is_target: std::collections::HashMap<(u64, u64, String), bool> = ops
            .iter()
            .map(|(op, f)| ((op.start_ns, op.end_ns, op.lane.clone()), *f))
            .collect();
        let flag = |op: &Op| {
            is_target
                .get(&(op.start_ns, op.end_ns, op.lane.clone()))
                .copied()
                .unwrap_or(false)
        };
        let sel = |op: &Op| flag(op) == want && (want || op.lane == "draft");
        let (v, k) = shape::recost(&t, &sel, &s, o.weight_bits);
        ops = v
            .into_iter()
            .map(|op| {
                let f = flag(&op);
                (op, f)
            })
            .collect();
        kept.extend(k);
    }
    let ops: Vec<Op> = ops.into_iter().map(|(op, _)| op).collect();
    let r = replay::replay(&ops, &p)?;
    let mut rep = report::report(trace, &r, &p, o.model_shape.as_deref());
    kept.sort();
    kept.dedup();
    rep.kept_at_traced_cost = kept;
    Ok((rep, r))
}

/// Per operator: does it run the target model? Its lane is a target lane, or its pass (a
/// lane's run of one pass number) has normalisation rows of the target's width.
pub fn target_ops(ops: &[trace::Op]) -> Vec<bool> {
    let width = |o: &trace::Op| (o.op == "rmsnorm" && o.shape.len() == 2).then(|| o.shape[1]);
    let mut counts: std::collections::HashMap<u64, usize> = Default::default();
    for o in ops
        .iter()
        .filter(|o| TARGET_LANES.contains(&o.lane.as_str()))
    {
        if let Some(w) = width(o) {
            *counts.entry(w).or_default() += 1;
        }
    }
    let target_width = counts.into_iter().max_by_key(|(_, n)| *n).map(|(w, _)| w);
    let mut group_width: std::collections::HashMap<(&str, u64), u64> = Default::default();
    for o in ops {
        if let Some(w) = width(o) {
            group_width.entry((o.lane.as_str(), o.pass)).or_insert(w);
        }
    }
    ops.iter()
        .map(|o| {
            TARGET_LANES.contains(&o.lane.as_str())
                || (target_width.is_some()
                    && group_width.get(&(o.lane.as_str(), o.pass)).copied() == target_width)
        })
        .collect()
}
