//! What a replay predicts: total time against the trace's own, time per lane and per operator
//! kind (predicted beside measured), busy time and energy per unit.
//!
//! Energy = Σ units (busy s × busy W + idle s × idle W + operations × pJ/op) + bytes over the
//! shared bus × DRAM pJ/B + bytes inside PIM × its pJ/B + flash bytes × flash pJ/B + flash
//! busy/idle power. The parts are reported and sum to the total.

use crate::profile::Profile;
use crate::replay::Replay;
use crate::trace::{OpExt, Trace};
use serde::Serialize;
use std::collections::BTreeMap;

/// Predicted beside measured, seconds.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Pair {
    pub predicted_s: f64,
    pub measured_s: f64,
}

/// One unit's share.
#[derive(Debug, Clone, Serialize)]
pub struct UnitReport {
    pub unit: String,
    pub busy_s: f64,
    pub utilisation: f64,
    pub energy_j: f64,
}

/// Energy by part, joules.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Energy {
    pub busy_j: f64,
    pub idle_j: f64,
    pub ops_j: f64,
    pub dram_j: f64,
    pub in_memory_j: f64,
    pub flash_j: f64,
    pub total_j: f64,
}

/// The result of one replay.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub profile: String,
    pub model_shape: Option<String>,
    pub lanes: BTreeMap<String, String>,
    pub predicted_total_s: f64,
    pub measured_total_s: f64,
    pub ratio: f64,
    pub operators: usize,
    pub passes: usize,
    /// Host work replayed between operators (lead time on the critical path or not), s.
    pub host_work_s: f64,
    pub per_lane: BTreeMap<String, Pair>,
    pub per_op: BTreeMap<String, Pair>,
    pub units: Vec<UnitReport>,
    pub energy: Energy,
    pub padded_rows: u64,
    pub graph_switches: u64,
    /// Operators re-costed at their traced size (unknown to the shape model).
    pub kept_at_traced_cost: Vec<String>,
    /// Profile constants without a public source.
    pub unsourced: Vec<String>,
}

/// Summarise a replay of `trace` on `p`.
pub fn report(trace: &Trace, r: &Replay, p: &Profile, shape: Option<&str>) -> Report {
    let tl = &r.timeline;
    let mut per_lane: BTreeMap<String, Pair> = BTreeMap::new();
    let mut per_op: BTreeMap<String, Pair> = BTreeMap::new();
    for (i, o) in r.ops.iter().enumerate() {
        let d = tl.end[i] - tl.start[i];
        per_lane.entry(o.lane.clone()).or_default().predicted_s += d;
        per_op.entry(o.op.clone()).or_default().predicted_s += d;
    }
    for o in trace.ops.iter().filter(|o| !o.is_span()) {
        per_lane.entry(o.lane.clone()).or_default().measured_s += o.dur_s();
        per_op.entry(o.op.clone()).or_default().measured_s += o.dur_s();
    }
    let mut passes: Vec<(String, u64)> = r.ops.iter().map(|o| (o.lane.clone(), o.pass)).collect();
    passes.sort();
    passes.dedup();

    let mut e = Energy::default();
    let mut units = Vec::new();
    let mut ops_by_unit = vec![0.0; r.units.len()];
    let mut bytes_by_unit = vec![0.0; r.units.len()];
    for (i, t) in r.tasks.iter().enumerate() {
        ops_by_unit[t.unit] += r.work_ops[i];
        bytes_by_unit[t.unit] += t.mem_bytes;
    }
    let span = tl.makespan;
    for (ui, name) in r.units.iter().enumerate() {
        let busy = tl.busy[ui];
        let idle = (span - busy).max(0.0);
        let mut ej = 0.0;
        match p.units.get(name) {
            Some(u) => {
                let (b, id, op) = (
                    busy * u.busy_w.value,
                    idle * u.idle_w.value,
                    ops_by_unit[ui] * u.pj_per_op.value * 1e-12,
                );
                let mem = match &u.in_memory_pj_per_byte {
                    Some(pj) => {
                        let j = bytes_by_unit[ui] * pj.value * 1e-12;
                        e.in_memory_j += j;
                        j
                    }
                    None => {
                        let j = bytes_by_unit[ui] * p.dram.pj_per_byte.value * 1e-12;
                        e.dram_j += j;
                        j
                    }
                };
                e.busy_j += b;
                e.idle_j += id;
                e.ops_j += op;
                ej = b + id + op + mem;
            }
            None if busy > 0.0 => {
                let f = &p.flash;
                let j = bytes_by_unit[ui] * f.pj_per_byte.value * 1e-12
                    + busy * f.busy_w.value
                    + idle * f.idle_w.value;
                e.flash_j += j;
                ej = j;
            }
            None => {}
        }
        units.push(UnitReport {
            unit: name.clone(),
            busy_s: busy,
            utilisation: if span > 0.0 { busy / span } else { 0.0 },
            energy_j: ej,
        });
    }
    e.total_j = e.busy_j + e.idle_j + e.ops_j + e.dram_j + e.in_memory_j + e.flash_j;
    let measured = trace.measured_total_s();
    Report {
        profile: p.name.clone(),
        model_shape: shape.map(String::from),
        lanes: p.lanes.clone(),
        predicted_total_s: span,
        measured_total_s: measured,
        ratio: if measured > 0.0 { span / measured } else { 0.0 },
        operators: r.ops.len(),
        passes: passes.len(),
        host_work_s: r.tasks.iter().map(|t| t.lead_s).sum(),
        per_lane,
        per_op,
        units,
        energy: e,
        padded_rows: r
            .ops
            .iter()
            .zip(&r.padded_rows)
            .map(|(o, p)| p.saturating_sub(o.rows()))
            .sum(),
        graph_switches: r.graph_switches,
        kept_at_traced_cost: Vec::new(),
        unsourced: p.unsourced(),
    }
}

impl Report {
    /// A Markdown summary.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let shape = self.model_shape.as_deref().unwrap_or("as traced");
        s += &format!(
            "profile {} · model shape {} · {} operators in {} passes\n\n",
            self.profile, shape, self.operators, self.passes
        );
        s += &format!(
            "predicted total {:.4} s · measured (trace wall time) {:.4} s · ratio {:.3}\n",
            self.predicted_total_s, self.measured_total_s, self.ratio
        );
        s += &format!(
            "energy {:.4} J (busy {:.4}, idle {:.4}, ops {:.4}, DRAM {:.4}, in-memory {:.4}, flash {:.4}) · host work {:.4} s · padded rows {} · graph switches {}\n\n",
            self.energy.total_j, self.energy.busy_j, self.energy.idle_j, self.energy.ops_j,
            self.energy.dram_j, self.energy.in_memory_j, self.energy.flash_j,
            self.host_work_s, self.padded_rows, self.graph_switches
        );
        s += "| lane | unit | predicted s | measured s |\n|---|---|---|---|\n";
        for (l, p) in &self.per_lane {
            let u = self.lanes.get(l).or_else(|| self.lanes.get("*"));
            s += &format!(
                "| {l} | {} | {:.4} | {:.4} |\n",
                u.map_or("?", |u| u.as_str()),
                p.predicted_s,
                p.measured_s
            );
        }
        s += "\n| operator | predicted s | measured s | ratio |\n|---|---|---|---|\n";
        for (o, p) in &self.per_op {
            let r = if p.measured_s > 0.0 {
                p.predicted_s / p.measured_s
            } else {
                0.0
            };
            s += &format!(
                "| {o} | {:.4} | {:.4} | {r:.2} |\n",
                p.predicted_s, p.measured_s
            );
        }
        s += "\n| unit | busy s | utilisation | energy J |\n|---|---|---|---|\n";
        for u in &self.units {
            s += &format!(
                "| {} | {:.4} | {:.1} % | {:.4} |\n",
                u.unit,
                u.busy_s,
                100.0 * u.utilisation,
                u.energy_j
            );
        }
        if !self.kept_at_traced_cost.is_empty() {
            s += &format!(
                "\nkept at traced cost: {}\n",
                self.kept_at_traced_cost.join(", ")
            );
        }
        if !self.unsourced.is_empty() {
            s += &format!(
                "\nunsourced profile constants: {}\n",
                self.unsourced.join(", ")
            );
        }
        s
    }
}
