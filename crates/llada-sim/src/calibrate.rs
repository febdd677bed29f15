//! A `host` profile measured in the same minute as the traces it will replay: this machine's
//! speed drifts with other load (±30 % between runs), so `scripts/sim_traces.sh` measures
//! `llada bench --json` and a few calibration traces beside the traces it records, and
//! `llada sim --calibrate-host` turns them into `DIR/host.json`.
//!
//! Taken from the bench: the matmul GFLOP/s by rows for `dtype`. From the calibration traces
//! (a decode, a prefill and a streamed run; never the traces under test): the median `rmsnorm`
//! duration (the fixed cost of one traced operator); each non-matmul operator kind's throughput
//! by rows (FLOPs / (time − operators × that cost), in power-of-two row buckets); the
//! bandwidth the single-row LM head product streams at (the largest read of a decode pass; the
//! bench's bandwidth figure when there is none); the storage read rate. Everything else is the
//! built-in `host` profile's.

use crate::error::{Result, SimError};
use crate::profile::{Profile, Sourced};
use crate::trace::{OpExt, Trace};
use std::collections::BTreeMap;

/// The built-in host profile with the bench's and the calibration traces' figures.
pub fn host_from_bench(
    bench: &serde_json::Value,
    traces: &[Trace],
    dtype: &str,
) -> Result<Profile> {
    let bad = |m: String| SimError::Profile {
        name: "host (calibrated)".into(),
        msg: m,
    };
    let mut p = Profile::load("host")?;
    let table = bench["matmul"].as_array().ok_or_else(|| {
        bad(
            "the bench JSON has no matmul table (run llada bench --json without --no-matmul)"
                .into(),
        )
    })?;
    let mut pts: Vec<[f64; 2]> = table
        .iter()
        .filter(|m| m["dtype"] == dtype)
        .filter_map(|m| Some([m["m"].as_f64()?, m["ours_gflops"].as_f64()?]))
        .filter(|p| p[0] >= 1.0 && p[1] > 0.0)
        .collect();
    pts.sort_by(|a, b| a[0].total_cmp(&b[0]));
    if pts.is_empty() {
        return Err(bad(format!("the bench's matmul table has no {dtype} rows")));
    }
    let ops = || traces.iter().flat_map(|t| t.ops.iter());
    let mut norms: Vec<f64> = ops()
        .filter(|o| o.op == "rmsnorm")
        .map(|o| o.dur_s() * 1e6)
        .collect();
    if norms.is_empty() {
        return Err(bad("the calibration traces have no rmsnorm records".into()));
    }
    norms.sort_by(|a, b| a.total_cmp(b));
    let overhead_us = norms[norms.len() / 2];
    // Per (kind, row bucket): FLOPs, time, operators, rows.
    let mut per: BTreeMap<(String, u32), [f64; 4]> = BTreeMap::new();
    let (mut head_bytes, mut head_s, mut read_bytes, mut read_s) = (0.0, 0.0, 0.0, 0.0);
    for o in ops() {
        if o.op == "lm_head" && o.rows() == 1 {
            head_bytes += o.bytes_read as f64;
            head_s += o.dur_s();
        } else if o.op == "storage_read" {
            read_bytes += o.bytes_read as f64;
            read_s += o.dur_s();
        } else if !crate::shape::is_matmul(&o.op) && o.flops > 0 {
            let e = per.entry((o.op.clone(), o.rows().ilog2())).or_default();
            e[0] += o.flops as f64;
            e[1] += o.dur_s();
            e[2] += 1.0;
            e[3] += o.rows() as f64;
        }
    }
    let mut op_gflops: BTreeMap<String, Vec<[f64; 2]>> = BTreeMap::new();
    for ((k, _), [f, t, n, rows]) in per {
        let t = (t - n * overhead_us * 1e-6).max(0.1 * t);
        if t > 0.0 {
            op_gflops
                .entry(k)
                .or_default()
                .push([rows / n, f / t / 1e9]);
        }
    }
    let attn = op_gflops
        .get("attention")
        .and_then(|v| v.first())
        .map(|p| p[1])
        .ok_or_else(|| bad("the calibration traces have no attention records".into()))?;
    let (bw, bw_src) = if head_s > 0.0 {
        (
            head_bytes / head_s / 1e9,
            "single-row LM head bytes / time in the calibration traces",
        )
    } else {
        let b = bench["measured_bw_gbs"].as_f64().filter(|b| *b > 0.0);
        (
            b.ok_or_else(|| bad("no LM head records and no measured_bw_gbs".into()))?,
            "`llada bench --json` measured_bw_gbs",
        )
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
        source: src("single-row attention rate of the calibration traces (kinds not measured)"),
    };
    cpu.op_gflops = Some(Sourced {
        value: op_gflops,
        source: src("each operator kind's FLOPs / (time - operators x op_overhead_us) by rows in the calibration traces"),
    });
    cpu.op_overhead_us = Sourced {
        value: overhead_us,
        source: src("median rmsnorm duration in the calibration traces"),
    };
    p.dram.shared_gbs = Sourced {
        value: bw,
        source: src(bw_src),
    };
    if read_s > 0.0 {
        p.flash.read_gbs = Sourced {
            value: read_bytes / read_s / 1e9,
            source: src("storage_read bytes / time in the streamed calibration trace"),
        };
    }
    p.description =
        "This machine, measured beside the traces it replays (llada sim --calibrate-host).".into();
    Ok(p)
}
