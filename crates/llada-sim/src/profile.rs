//! Device profiles: what each unit of a system-on-chip can do, as data files
//! (`profiles/*.json`, built in; or any file given by path).
//!
//! Every constant is a [`Sourced`] value: `{"value": …, "source": "…"}`. A profile whose
//! constant has an empty source is refused; a source that starts with `UNSOURCED` marks a
//! value no public figure was found for (listed in every report, never hidden). Invariants
//! after [`Profile::load`]: every lane maps to a declared unit, the default lane `*` exists,
//! every number is finite and non-negative, bandwidths and throughputs are positive.

use crate::error::{Result, SimError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A constant with the public source it was taken from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Sourced<T> {
    pub value: T,
    pub source: String,
}

/// What kind of unit a lane runs on.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum UnitKind {
    Cpu,
    Npu,
    Gpu,
    /// Processing in memory: bank-parallel GEMV, no GEMM (a batch of rows re-reads the weights
    /// once per row).
    Pim,
}

/// One compute unit.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unit {
    pub kind: UnitKind,
    /// Sustained matmul throughput (GFLOP/s, 1 MAC = 2 FLOPs) by batch rows: points
    /// `[rows, gflops]`, interpolated in log2(rows) and clamped at the ends.
    pub gflops: Sourced<Vec<[f64; 2]>>,
    /// Throughput of the other operators (attention, norms, activations), GFLOP/s.
    pub vector_gflops: Sourced<f64>,
    /// Measured throughput of named operator kinds by rows (`[rows, gflops]` points,
    /// interpolated as `gflops`), instead of `vector_gflops`.
    #[serde(default)]
    pub op_gflops: Option<Sourced<BTreeMap<String, Vec<[f64; 2]>>>>,
    /// The DRAM read bandwidth this unit reaches alone, GB/s.
    pub mem_gbs: Sourced<f64>,
    /// Fixed cost per operator (dispatch, synchronisation), µs.
    pub op_overhead_us: Sourced<f64>,
    /// Fixed cost per forward pass (graph launch), µs.
    #[serde(default)]
    pub pass_launch_us: Option<Sourced<f64>>,
    /// Compiled static shapes (rows): a pass is padded to the smallest that holds it.
    #[serde(default)]
    pub static_shapes: Option<Sourced<Vec<u64>>>,
    /// Loading another compiled graph when a pass needs a different static shape, µs.
    #[serde(default)]
    pub graph_switch_us: Option<Sourced<f64>>,
    /// Power while busy and while idle, W.
    pub busy_w: Sourced<f64>,
    pub idle_w: Sourced<f64>,
    /// Dynamic energy per operation, pJ.
    pub pj_per_op: Sourced<f64>,
    /// Memory inside the unit (processing in memory): its bytes are read from the banks at
    /// `mem_gbs` without crossing the shared bus, at this energy per byte.
    #[serde(default)]
    pub in_memory_pj_per_byte: Option<Sourced<f64>>,
}

/// Main memory shared by every unit.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dram {
    /// Total bandwidth the units share, GB/s (what they reach together).
    pub shared_gbs: Sourced<f64>,
    pub pj_per_byte: Sourced<f64>,
}

/// Storage the streamed weights are read from.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Flash {
    pub read_gbs: Sourced<f64>,
    pub request_latency_us: Sourced<f64>,
    pub pj_per_byte: Sourced<f64>,
    /// Power while reading (beyond the per-byte energy) and idle, W.
    pub busy_w: Sourced<f64>,
    pub idle_w: Sourced<f64>,
}

/// A device profile.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub name: String,
    pub description: String,
    /// Lane name → unit name (`flash` for storage reads); `*` is every other lane;
    /// `LANE.OP` moves one operator kind of a lane (`dense.attention`: attention in PIM).
    pub lanes: BTreeMap<String, String>,
    pub units: BTreeMap<String, Unit>,
    pub dram: Dram,
    pub flash: Flash,
    /// Host work between operators (sampling, scheduling) replays at the trace's measured
    /// duration times this factor.
    pub host_work_scale: Sourced<f64>,
}

/// The profiles built into the binary.
pub const BUILTIN: &[(&str, &str)] = &[
    ("host", include_str!("../profiles/host.json")),
    ("sm8650", include_str!("../profiles/sm8650.json")),
    ("sm8750", include_str!("../profiles/sm8750.json")),
    ("sm8850", include_str!("../profiles/sm8850.json")),
    ("ahasd", include_str!("../profiles/ahasd.json")),
    ("gpu-only", include_str!("../profiles/gpu-only.json")),
];

impl Profile {
    /// A built-in profile by name, or a JSON file by path.
    pub fn load(name: &str) -> Result<Self> {
        if let Some((_, text)) = BUILTIN.iter().find(|(n, _)| *n == name) {
            return Self::parse(name, text);
        }
        let p = std::path::Path::new(name);
        if p.extension().is_some_and(|e| e == "json") || p.exists() {
            let text = std::fs::read_to_string(p).map_err(|e| SimError::Io {
                path: name.into(),
                source: e,
            })?;
            return Self::parse(name, &text);
        }
        let known: Vec<&str> = BUILTIN.iter().map(|(n, _)| *n).collect();
        Err(SimError::UnknownProfile(name.into(), known.join(", ")))
    }

    /// Parse and check a profile's JSON text.
    pub fn parse(name: &str, text: &str) -> Result<Self> {
        let bad = |msg: String| SimError::Profile {
            name: name.into(),
            msg,
        };
        let p: Profile = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        p.check().map_err(bad)?;
        Ok(p)
    }

    fn check(&self) -> std::result::Result<(), String> {
        if !self.lanes.contains_key("*") {
            return Err("lanes must map the default lane \"*\"".into());
        }
        for (lane, unit) in &self.lanes {
            if unit != "flash" && !self.units.contains_key(unit) {
                return Err(format!("lane '{lane}' maps to unknown unit '{unit}'"));
            }
        }
        for (key, value, source) in self.constants() {
            if source.trim().is_empty() {
                return Err(format!("{key} has no source"));
            }
            if !value.is_finite() || value < 0.0 {
                return Err(format!("{key} = {value} is not a non-negative number"));
            }
        }
        for (n, u) in &self.units {
            if u.gflops.value.is_empty() || u.gflops.value.iter().any(|p| p[0] < 1.0 || p[1] <= 0.0)
            {
                return Err(format!(
                    "units.{n}.gflops needs points [rows >= 1, gflops > 0]"
                ));
            }
            if u.mem_gbs.value <= 0.0 || u.vector_gflops.value <= 0.0 {
                return Err(format!(
                    "units.{n}: bandwidth and throughput must be positive"
                ));
            }
        }
        if self.dram.shared_gbs.value <= 0.0 || self.flash.read_gbs.value <= 0.0 {
            return Err("dram.shared_gbs and flash.read_gbs must be positive".into());
        }
        Ok(())
    }

    /// Every constant: (key, value, source); table points flattened.
    pub fn constants(&self) -> Vec<(String, f64, String)> {
        let mut v = Vec::new();
        let mut put = |k: String, s: &Sourced<f64>| v.push((k, s.value, s.source.clone()));
        for (n, u) in &self.units {
            put(format!("units.{n}.vector_gflops"), &u.vector_gflops);
            put(format!("units.{n}.mem_gbs"), &u.mem_gbs);
            put(format!("units.{n}.op_overhead_us"), &u.op_overhead_us);
            put(format!("units.{n}.busy_w"), &u.busy_w);
            put(format!("units.{n}.idle_w"), &u.idle_w);
            put(format!("units.{n}.pj_per_op"), &u.pj_per_op);
            if let Some(s) = &u.pass_launch_us {
                put(format!("units.{n}.pass_launch_us"), s);
            }
            if let Some(s) = &u.graph_switch_us {
                put(format!("units.{n}.graph_switch_us"), s);
            }
            if let Some(s) = &u.in_memory_pj_per_byte {
                put(format!("units.{n}.in_memory_pj_per_byte"), s);
            }
        }
        put("dram.shared_gbs".into(), &self.dram.shared_gbs);
        put("dram.pj_per_byte".into(), &self.dram.pj_per_byte);
        put("flash.read_gbs".into(), &self.flash.read_gbs);
        put(
            "flash.request_latency_us".into(),
            &self.flash.request_latency_us,
        );
        put("flash.pj_per_byte".into(), &self.flash.pj_per_byte);
        put("flash.busy_w".into(), &self.flash.busy_w);
        put("flash.idle_w".into(), &self.flash.idle_w);
        put("host_work_scale".into(), &self.host_work_scale);
        for (n, u) in &self.units {
            for p in &u.gflops.value {
                v.push((
                    format!("units.{n}.gflops@{}", p[0]),
                    p[1],
                    u.gflops.source.clone(),
                ));
            }
            if let Some(s) = &u.op_gflops {
                for (k, pts) in &s.value {
                    for p in pts {
                        let key = format!("units.{n}.op_gflops.{k}@{}", p[0]);
                        v.push((key, p[1], s.source.clone()));
                    }
                }
            }
            if let Some(s) = &u.static_shapes {
                for r in &s.value {
                    v.push((
                        format!("units.{n}.static_shapes"),
                        *r as f64,
                        s.source.clone(),
                    ));
                }
            }
        }
        v
    }

    /// Keys whose source says `UNSOURCED`.
    pub fn unsourced(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .constants()
            .into_iter()
            .filter(|(_, _, s)| s.trim_start().starts_with("UNSOURCED"))
            .map(|(k, _, _)| k)
            .collect();
        v.dedup();
        v
    }

    /// The unit an operator kind of a lane runs on: `LANE.OP` (e.g. `dense.attention`), else
    /// `LANE`, else `*`; `flash` is the storage.
    pub fn unit_of(&self, lane: &str, op: &str) -> &str {
        self.lanes
            .get(&format!("{lane}.{op}"))
            .or_else(|| self.lanes.get(lane))
            .or_else(|| self.lanes.get("*"))
            .map(String::as_str)
            .unwrap_or("cpu")
    }

    /// Remap lanes (`dense=cpu,draft=pim`, `dense.attention=pim`), checking the units exist.
    pub fn remap(&mut self, spec: &str) -> Result<()> {
        for kv in spec.split(',').filter(|s| !s.trim().is_empty()) {
            let (lane, unit) = kv.split_once('=').ok_or_else(|| SimError::Profile {
                name: self.name.clone(),
                msg: format!("--map wants LANE=UNIT pairs, got '{kv}'"),
            })?;
            let (lane, unit) = (lane.trim(), unit.trim());
            if unit != "flash" && !self.units.contains_key(unit) {
                let known: Vec<&String> = self.units.keys().collect();
                return Err(SimError::Profile {
                    name: self.name.clone(),
                    msg: format!("--map {lane}={unit}: no unit '{unit}' (units: {known:?})"),
                });
            }
            self.lanes.insert(lane.into(), unit.into());
        }
        Ok(())
    }
}

impl Unit {
    /// Matmul throughput at `rows` rows, FLOP/s.
    pub fn matmul_flops(&self, rows: u64) -> f64 {
        interpolate(&self.gflops.value, rows) * 1e9
    }

    /// Throughput of a non-matmul operator kind at `rows` rows, FLOP/s.
    pub fn vector_flops(&self, op: &str, rows: u64) -> f64 {
        let g = self.op_gflops.as_ref().and_then(|m| m.value.get(op));
        match g.filter(|p| !p.is_empty()) {
            Some(pts) => interpolate(pts, rows) * 1e9,
            None => self.vector_gflops.value * 1e9,
        }
    }

    /// The static shape a pass of `rows` rows runs in (itself when shapes are dynamic or the
    /// pass is larger than every compiled shape).
    pub fn padded_rows(&self, rows: u64) -> u64 {
        match &self.static_shapes {
            Some(s) => s
                .value
                .iter()
                .copied()
                .filter(|r| *r >= rows)
                .min()
                .unwrap_or(rows),
            None => rows,
        }
    }
}

/// `[rows, gflops]` points (sorted by rows) at `rows`: linear in log2(rows), clamped at the ends.
fn interpolate(pts: &[[f64; 2]], rows: u64) -> f64 {
    let x = (rows.max(1) as f64).log2();
    let at = |p: &[f64; 2]| (p[0].max(1.0).log2(), p[1]);
    let Some(first) = pts.first().map(at) else {
        return 1.0;
    };
    if x <= first.0 || pts.len() == 1 {
        return first.1;
    }
    for w in pts.windows(2) {
        let (a, b) = (at(&w[0]), at(&w[1]));
        if x <= b.0 {
            let t = (x - a.0) / (b.0 - a.0).max(1e-12);
            return a.1 + t * (b.1 - a.1);
        }
    }
    pts[pts.len() - 1][1]
}
