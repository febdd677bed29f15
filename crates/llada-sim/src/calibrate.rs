//! A `host` profile measured in the same minute as the traces it will replay: this machine's
//! speed drifts with other load (±30 % between runs), so `scripts/sim_traces.sh` measures
//! `llada bench --json` (matmul table, bandwidth) and a bench decode trace beside the traces
//! it records, and `llada sim --calibrate-host` turns them into `DIR/host.json`.
//!
//! Taken from the bench: the matmul GFLOP/s by rows for `dtype`; from the bench's decode trace:
//! each non-matmul operator kind's throughput (FLOPs / time), the bandwidth its LM head
//! product streams at (the largest read of a pass; the bench's own bandwidth figure when the
//! trace has none), and the median `rmsnorm` duration (the fixed cost of one traced operator);
//! from an optional streamed trace, the storage read rate. Everything else is the built-in
//! `host` profile's.

use crate::error::{Result, SimError};
use crate::profile::{Profile, Sourced};
use crate::trace::{OpExt, Trace};

/// The built-in host profile with the bench's figures.
pub fn host_from_bench(
    bench: &serde_json::Value,
    trace: &Trace,
    stream: Option<&Trace>,
    dtype: &str,
) -> Result<Profile> {
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
    let mut per_op: std::collections::BTreeMap<String, (f64, f64, f64)> = Default::default();
    let (mut head_bytes, mut head_s) = (0.0, 0.0);
    let mut norms: Vec<f64> = Vec::new();
    for o in &trace.ops {
        if crate::shape::is_matmul(&o.op) {
            if o.op == "lm_head" {
                head_bytes += o.bytes_read as f64;
                head_s += o.dur_s();
            }
        } else if o.flops > 0 {
            let e = per_op.entry(o.op.clone()).or_default();
            e.0 += o.flops as f64;
            e.1 += o.dur_s();
            e.2 += 1.0;
        }
        if o.op == "rmsnorm" {
            norms.push(o.dur_s() * 1e6);
        }
    }
    if norms.is_empty() {
        return Err(bad("the bench trace has no rmsnorm records".into()));
    }
    norms.sort_by(|a, b| a.total_cmp(b));
    let overhead_us = norms[norms.len() / 2];
    // A kind's rate excludes the fixed cost every operator pays (counted once, as overhead).
    let op_gflops: std::collections::BTreeMap<String, f64> = per_op
        .into_iter()
        .map(|(k, (f, t, n))| (k, f, (t - n * overhead_us * 1e-6).max(0.1 * t)))
        .filter(|(_, _, t)| *t > 0.0)
        .map(|(k, f, t)| (k, f / t / 1e9))
        .collect();
    let Some(&attn) = op_gflops.get("attention") else {
        return Err(bad("the bench trace has no attention records".into()));
    };
    let (bw, bw_src) = if head_s > 0.0 {
        (
            head_bytes / head_s / 1e9,
            "LM head bytes / time in the bench's decode trace",
        )
    } else {
        (bw, "`llada bench --json` measured_bw_gbs")
    };
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
        source: src(bw_src),
    };
    cpu.vector_gflops = Sourced {
        value: attn,
        source: src("attention FLOPs / time in the bench's decode trace (kinds not measured)"),
    };
    cpu.op_gflops = Some(Sourced {
        value: op_gflops,
        source: src("each operator kind's FLOPs / (time - operators x op_overhead_us) in the bench's decode trace"),
    });
    cpu.op_overhead_us = Sourced {
        value: overhead_us,
        source: src("median rmsnorm duration in the bench's decode trace"),
    };
    p.dram.shared_gbs = Sourced {
        value: bw,
        source: src(bw_src),
    };
    if let Some(st) = stream {
        let (b, t) = st
            .ops
            .iter()
            .filter(|o| o.op == "storage_read")
            .fold((0.0, 0.0), |(b, t), o| {
                (b + o.bytes_read as f64, t + o.dur_s())
            });
        if t > 0.0 {
            p.flash.read_gbs = Sourced {
                value: b / t / 1e9,
                source: src("storage_read bytes / time in a streamed calibration trace"),
            };
        }
    }
    p.description =
        "This machine, measured beside the traces it replays (llada sim --calibrate-host).".into();
    Ok(p)
}
