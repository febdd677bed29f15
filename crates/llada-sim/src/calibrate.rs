//! A `host` profile measured in the same minute as the traces it will replay: this machine's
//! speed drifts with other load (±30 % between runs), so `scripts/sim_traces.sh` measures
//! `llada bench --json` (matmul table, bandwidth) and a bench decode trace beside the traces
//! it records, and `llada sim --calibrate-host` turns them into `DIR/host.json`.
//!
//! Taken from the bench: the matmul GFLOP/s by rows for `dtype`, the measured bandwidth; from
//! the bench's decode trace: the attention throughput and the median `rmsnorm` duration (the
//! fixed cost of one traced operator). Everything else is the built-in `host` profile's.

use crate::error::{Result, SimError};
use crate::profile::{Profile, Sourced};
use crate::trace::{OpExt, Trace};

/// The built-in host profile with the bench's figures.
pub fn host_from_bench(bench: &serde_json::Value, trace: &Trace, dtype: &str) -> Result<Profile> {
    let bad = |m: String| SimError::Profile {
        name: "host (calibrated)".into(),
        msg: m,
    };
    let mut p = Profile::load("host")?;
    let mut pts: Vec<[f64; 2]> = bench["matmul"]
        .as_array()
        .ok_or_else(|| {
            bad(
                "the bench JSON has no matmul table (run llada bench --json without --no-matmul)"
                    .into(),
            )
        })?
        .iter()
        .filter(|m| m["dtype"] == dtype)
        .filter_map(|m| Some([m["m"].as_f64()?, m["ours_gflops"].as_f64()?]))
        .filter(|p| p[0] >= 1.0 && p[1] > 0.0)
        .collect();
    pts.sort_by(|a, b| a[0].total_cmp(&b[0]));
    if pts.is_empty() {
        return Err(bad(format!("the bench's matmul table has no {dtype} rows")));
    }
    let bw = bench["measured_bw_gbs"]
        .as_f64()
        .filter(|b| *b > 0.0)
        .ok_or_else(|| bad("the bench JSON has no measured_bw_gbs".into()))?;
    let (mut fl, mut secs) = (0.0, 0.0);
    let mut norms: Vec<f64> = Vec::new();
    for o in &trace.ops {
        if o.op == "attention" {
            fl += o.flops as f64;
            secs += o.dur_s();
        }
        if o.op == "rmsnorm" {
            norms.push(o.dur_s() * 1e6);
        }
    }
    if secs <= 0.0 || norms.is_empty() {
        return Err(bad(
            "the bench trace has no attention or rmsnorm records".into()
        ));
    }
    norms.sort_by(|a, b| a.total_cmp(b));
    let src = |what: &str| format!("measured with the traces: {what}");
    let cpu = p
        .units
        .get_mut("cpu")
        .ok_or_else(|| bad("the host profile has no cpu".into()))?;
    cpu.gflops = Sourced {
        value: pts,
        source: src(&format!(
            "`llada bench --json` matmul table, {dtype}, ours_gflops"
        )),
    };
    cpu.mem_gbs = Sourced {
        value: bw,
        source: src("`llada bench --json` measured_bw_gbs"),
    };
    cpu.vector_gflops = Sourced {
        value: fl / secs / 1e9,
        source: src("attention FLOPs / time in the bench's decode trace"),
    };
    cpu.op_overhead_us = Sourced {
        value: norms[norms.len() / 2],
        source: src("median rmsnorm duration in the bench's decode trace"),
    };
    p.dram.shared_gbs = Sourced {
        value: bw,
        source: src("`llada bench --json` measured_bw_gbs"),
    };
    p.description =
        "This machine, measured beside the traces it replays (llada sim --calibrate-host).".into();
    Ok(p)
}
