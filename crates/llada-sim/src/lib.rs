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
    let mut ops = trace.ops.clone();
    let mut kept = Vec::new();
    if let Some(name) = &o.model_shape {
        let s = shape::shape(name)?;
        let t = Trace {
            header: trace.header.clone(),
            ops,
        };
        let (v, k) = shape::recost(&t, TARGET_LANES, &s, o.weight_bits);
        ops = v;
        kept.extend(k);
    }
    if let Some(name) = &o.draft_shape {
        let s = shape::shape(name)?;
        let t = Trace {
            header: trace.header.clone(),
            ops,
        };
        let (v, k) = shape::recost(&t, &["draft"], &s, o.weight_bits);
        ops = v;
        kept.extend(k);
    }
    let r = replay::replay(&ops, &p)?;
    let mut rep = report::report(trace, &r, &p, o.model_shape.as_deref());
    kept.sort();
    kept.dedup();
    rep.kept_at_traced_cost = kept;
    Ok((rep, r))
}
