//! From a trace to tasks: which unit runs each operator, what it waits for, what it costs.
//!
//! Dependencies (the trace's structure, kept on any profile):
//! - *lane order*: an operator follows the previous operator of its lane;
//! - *passes*: the first operator of a pass (a lane's run of one pass number) waits for the
//!   last operator of every other lane's latest pass that had ended when it started in the
//!   trace. Passes that overlapped in the trace (dense ‖ sparse, draft ‖ verify) may overlap;
//!   passes that followed each other still do;
//! - *streamed weights*: a layer's first operator waits for its `storage_read` (and the
//!   `weight_build` of it); read `i` waits for the compute of the unit read two before it
//!   (two staging buffers), where the trace placed them in that order.
//!
//! Host work between operators (the trace's gaps) replays as lead time, scaled by the
//! profile's `host_work_scale`; inside a pass on an NPU the graph runs on the device and the
//! gaps are replaced by one `pass_launch_us`. Static shapes: an NPU pass is padded to its
//! compiled shape (rows), and a different shape from the unit's previous pass costs
//! `graph_switch_us`.

use crate::engine::{self, Task, Timeline, UnitSpec};
use crate::error::Result;
use crate::profile::{Profile, Unit, UnitKind};
use crate::shape::is_matmul;
use crate::trace::{Op, OpExt};
use std::collections::HashMap;

/// The storage lanes: reads of streamed weights and their repack.
pub const STORAGE_LANES: &[&str] = &["storage", "storage_build"];

/// Tasks built from operators, and their placement.
#[derive(Debug, Clone)]
pub struct Replay {
    /// The operators replayed (spans removed), in task order.
    pub ops: Vec<Op>,
    pub tasks: Vec<Task>,
    /// Unit names (the last is `flash`).
    pub units: Vec<String>,
    /// Rows each task computed after static-shape padding.
    pub padded_rows: Vec<u64>,
    /// Operations each task executed (padding included).
    pub work_ops: Vec<f64>,
    /// Graph switches charged.
    pub graph_switches: u64,
    pub timeline: Timeline,
}

#[derive(Clone)]
struct Group {
    pass: u64,
    last_task: usize,
    end_ns: u64,
}

/// Build and run the tasks of `ops` on `p`.
pub fn replay(ops: &[Op], p: &Profile) -> Result<Replay> {
    let ops: Vec<Op> = ops.iter().filter(|o| !o.is_span()).cloned().collect();
    let mut units: Vec<String> = p.units.keys().cloned().collect();
    units.push("flash".into());
    let flash = units.len() - 1;
    let unit_index = |name: &str| units.iter().position(|u| u == name).unwrap_or(flash);
    let scale = p.host_work_scale.value;

    let mut tasks = Vec::with_capacity(ops.len());
    let mut padded_rows = Vec::with_capacity(ops.len());
    let mut work_ops = Vec::with_capacity(ops.len());
    let mut groups: HashMap<&str, Vec<Group>> = HashMap::new();
    let mut last_on_lane: HashMap<&str, usize> = HashMap::new();
    // Per (pass, layer): the task that makes the layer's weights available; the streamed
    // units' order per pass; the last compute task per (pass, layer).
    let mut weights_ready: HashMap<(u64, i32), Vec<usize>> = HashMap::new();
    let mut reads: HashMap<u64, Vec<i32>> = HashMap::new();
    let mut layer_last: HashMap<(u64, i32), usize> = HashMap::new();
    let mut head_seen: HashMap<u64, usize> = HashMap::new();
    let mut layer_started: HashMap<(u64, i32, &str), bool> = HashMap::new();
    // Per NPU-like unit: the static shape of its previous pass; per group: its padded rows.
    let mut unit_shape: HashMap<usize, u64> = HashMap::new();
    let mut group_rows: HashMap<(&str, u64, usize), (u64, u64)> = HashMap::new();
    let mut graph_switches = 0;

    for (i, o) in ops.iter().enumerate() {
        let lane = o.lane.as_str();
        let uname = p.unit_of(lane, &o.op);
        let ui = unit_index(uname);
        let unit: Option<&Unit> = p.units.get(uname);
        let storage = STORAGE_LANES.contains(&lane);
        let mut t = Task {
            unit: ui,
            on_bus: true,
            ..Default::default()
        };
        let mut dep_end_ns = 0u64;
        let mut add_dep = |t: &mut Task, d: usize| {
            if d < i && !t.deps.contains(&d) {
                t.deps.push(d);
                dep_end_ns = dep_end_ns.max(ops[d].end_ns);
            }
        };
        // Lane order.
        let prev = last_on_lane.get(lane).copied();
        if let Some(d) = prev {
            add_dep(&mut t, d);
        }
        // A new pass on this lane: wait for the other lanes' passes that had ended.
        let lane_groups = groups.entry(lane).or_default();
        let new_group = lane_groups.last().is_none_or(|g| g.pass != o.pass);
        if new_group {
            let mut deps = Vec::new();
            for (other, gs) in groups.iter() {
                if *other == lane {
                    continue;
                }
                if let Some(g) = gs.iter().rev().find(|g| g.end_ns <= o.start_ns) {
                    deps.push(g.last_task);
                }
            }
            for d in deps {
                add_dep(&mut t, d);
            }
            groups.entry(lane).or_default().push(Group {
                pass: o.pass,
                last_task: i,
                end_ns: o.end_ns,
            });
        } else if let Some(g) = groups.get_mut(lane).and_then(|v| v.last_mut()) {
            g.last_task = i;
            g.end_ns = g.end_ns.max(o.end_ns);
        }
        // Streamed weights.
        if storage {
            if o.op == "storage_read" {
                let order = reads.entry(o.pass).or_default();
                if order.len() >= 2 {
                    let back = order[order.len() - 2];
                    if let Some(&d) = layer_last.get(&(o.pass, back)) {
                        add_dep(&mut t, d);
                    }
                }
                order.push(o.layer);
            } else if let Some(&d) = weights_ready.get(&(o.pass, o.layer)).and_then(|v| v.last()) {
                add_dep(&mut t, d); // the build of a read unit
            }
            weights_ready.entry((o.pass, o.layer)).or_default().push(i);
        } else if o.layer >= 0 || o.op == "lm_head" {
            let key = (o.pass, o.layer, lane);
            let first = !layer_started.contains_key(&key);
            if o.op == "lm_head" {
                // The k-th head product of a pass waits for the k-th head chunk.
                let k = head_seen.entry(o.pass).or_insert(0);
                let ready = weights_ready
                    .get(&(o.pass, -1))
                    .cloned()
                    .unwrap_or_default();
                let chunks: Vec<usize> = ready
                    .iter()
                    .copied()
                    .filter(|&d| ops[d].op == "weight_build")
                    .collect();
                let chunks = if chunks.is_empty() { ready } else { chunks };
                if let Some(&d) = chunks.get(*k) {
                    add_dep(&mut t, d);
                }
                *k += 1;
            } else if first {
                if let Some(&d) = weights_ready.get(&(o.pass, o.layer)).and_then(|v| v.last()) {
                    add_dep(&mut t, d);
                }
            }
            layer_started.insert(key, true);
            layer_last.insert((o.pass, o.layer), i);
        }
        // Host work before this operator (the trace's gap after its dependencies).
        let npu_in_pass = !new_group && unit.is_some_and(|u| u.kind != UnitKind::Cpu);
        if !storage && !npu_in_pass && !t.deps.is_empty() {
            t.lead_s = o.start_ns.saturating_sub(dep_end_ns) as f64 * 1e-9 * scale;
        }
        // Cost.
        let (rows, done) = match unit {
            None => {
                t.mem_bytes = o.bytes_read as f64;
                t.fixed_s = p.flash.request_latency_us.value * 1e-6;
                t.on_bus = false;
                (o.rows(), 0.0)
            }
            Some(u) => {
                let key = (lane, o.pass, ui);
                let m = o.rows();
                let m_pad = if o.op == "lm_head" || o.layer < 0 {
                    u.padded_rows(m)
                } else {
                    let (src, pad) = *group_rows.entry(key).or_insert((m, u.padded_rows(m)));
                    if src == m {
                        pad
                    } else {
                        u.padded_rows(m) // rows changed inside the pass (early exit)
                    }
                };
                if new_group && u.kind != UnitKind::Cpu {
                    if let Some(l) = &u.pass_launch_us {
                        t.fixed_s += l.value * 1e-6;
                    }
                    if u.static_shapes.is_some() {
                        let last = unit_shape.insert(ui, m_pad);
                        if last.is_some_and(|s| s != m_pad) {
                            graph_switches += 1;
                            t.fixed_s += u.graph_switch_us.as_ref().map_or(0.0, |g| g.value) * 1e-6;
                        }
                    }
                }
                let done = cost(&mut t, o, u, m_pad);
                (m_pad, done)
            }
        };
        tasks.push(t);
        padded_rows.push(rows);
        work_ops.push(done);
        last_on_lane.insert(lane, i);
    }
    let specs: Vec<UnitSpec> = units
        .iter()
        .map(|n| UnitSpec {
            name: n.clone(),
            bw: match p.units.get(n) {
                Some(u) => u.mem_gbs.value * 1e9,
                None => p.flash.read_gbs.value * 1e9,
            },
        })
        .collect();
    let timeline = engine::run(&specs, p.dram.shared_gbs.value * 1e9, &tasks)?;
    Ok(Replay {
        ops,
        tasks,
        units,
        padded_rows,
        work_ops,
        graph_switches,
        timeline,
    })
}

/// Fill `t`'s compute, memory and fixed costs for `o` on `u` at `m_pad` rows; returns the
/// operations executed.
fn cost(t: &mut Task, o: &Op, u: &Unit, m_pad: u64) -> f64 {
    let m = o.rows();
    let grow = m_pad as f64 / m as f64;
    t.fixed_s += u.op_overhead_us.value * 1e-6;
    t.on_bus = u.in_memory_pj_per_byte.is_none();
    let flops = o.flops as f64 * grow;
    if is_matmul(&o.op) && o.shape.len() == 3 {
        let (n, k) = (o.shape[1], o.shape[2]);
        let acts = (m * k * 4) as f64;
        let weights = (o.bytes_read as f64 - acts).max(0.0);
        let acts = (m_pad * (k + n) * 4) as f64;
        if u.kind == UnitKind::Pim {
            // GEMV only: every row streams the weights again.
            t.mem_bytes = weights * m_pad as f64 + acts;
            t.compute_s = flops / u.matmul_flops(1);
        } else {
            t.mem_bytes = weights + acts;
            t.compute_s = flops / u.matmul_flops(m_pad);
        }
    } else {
        let per_row = if o.op == "attention" { 1.0 } else { grow };
        t.mem_bytes = (o.bytes_read + o.bytes_written) as f64 * per_row;
        t.compute_s = flops / u.vector_flops(&o.op, m_pad);
    }
    flops
}
