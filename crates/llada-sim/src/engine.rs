//! The discrete-event core: tasks on exclusive units, with dependencies and a shared memory
//! bus.
//!
//! Tasks are placed in list order (a topological order: a task may depend only on tasks
//! before it). A task starts when its unit is free and every dependency has ended, plus its
//! `lead_s` (host work between them); it lasts `max(compute_s, mem_bytes / bandwidth) +
//! fixed_s`, where the bandwidth is the unit's own, shared with the units whose placed tasks
//! move memory at the task's start (the bus divides evenly; a unit alone gets
//! `min(own, shared)`). Invariants, checked by the tests: a unit never runs two tasks at once;
//! no task starts before its dependencies end; each unit's busy time is the sum of its tasks'
//! durations; tasks on different units overlap whenever dependencies allow it.

use crate::error::{Result, SimError};

/// One unit of work.
#[derive(Debug, Clone, Default)]
pub struct Task {
    pub unit: usize,
    pub deps: Vec<usize>,
    /// Delay after the last dependency ends (host work), seconds.
    pub lead_s: f64,
    pub compute_s: f64,
    pub mem_bytes: f64,
    /// Fixed cost (dispatch, launch, graph switch), seconds.
    pub fixed_s: f64,
    /// Whether its bytes cross the shared memory bus (false for storage reads).
    pub on_bus: bool,
}

/// A unit's capacity.
#[derive(Debug, Clone)]
pub struct UnitSpec {
    pub name: String,
    /// Its own bandwidth, bytes/s.
    pub bw: f64,
}

/// Where each task ran.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    pub start: Vec<f64>,
    pub end: Vec<f64>,
    /// Busy seconds per unit.
    pub busy: Vec<f64>,
    pub makespan: f64,
}

/// Place `tasks` on `units` sharing a bus of `shared_bw` bytes/s.
pub fn run(units: &[UnitSpec], shared_bw: f64, tasks: &[Task]) -> Result<Timeline> {
    let n = tasks.len();
    let mut tl = Timeline {
        start: vec![0.0; n],
        end: vec![0.0; n],
        busy: vec![0.0; units.len()],
        makespan: 0.0,
    };
    let mut free = vec![0.0f64; units.len()];
    // Per unit: placed intervals that move memory over the bus (start, end), in order.
    let mut bus: Vec<Vec<(f64, f64)>> = vec![Vec::new(); units.len()];
    for (i, t) in tasks.iter().enumerate() {
        if t.unit >= units.len() {
            return Err(SimError::Schedule(format!("task {i}: no unit {}", t.unit)));
        }
        let mut ready = 0.0f64;
        for &d in &t.deps {
            if d >= i {
                return Err(SimError::Schedule(format!(
                    "task {i} depends on task {d}, which is not before it"
                )));
            }
            ready = ready.max(tl.end[d]);
        }
        let start = (ready + t.lead_s.max(0.0)).max(free[t.unit]);
        let others = if t.on_bus && t.mem_bytes > 0.0 {
            (0..units.len())
                .filter(|&u| u != t.unit && active(&bus[u], start))
                .count()
        } else {
            0
        };
        let own = units[t.unit].bw;
        let bw = if t.on_bus {
            own.min(shared_bw / (others + 1) as f64)
        } else {
            own
        };
        let mem_s = if t.mem_bytes > 0.0 {
            t.mem_bytes / bw.max(1.0)
        } else {
            0.0
        };
        let dur = t.compute_s.max(mem_s).max(0.0) + t.fixed_s.max(0.0);
        let end = start + dur;
        tl.start[i] = start;
        tl.end[i] = end;
        tl.busy[t.unit] += dur;
        free[t.unit] = end;
        if t.on_bus && t.mem_bytes > 0.0 && dur > 0.0 {
            bus[t.unit].push((start, end));
        }
        tl.makespan = tl.makespan.max(end);
    }
    Ok(tl)
}

/// Is one of these (ordered, disjoint) intervals running at `t`?
fn active(iv: &[(f64, f64)], t: f64) -> bool {
    let k = iv.partition_point(|(s, _)| *s <= t);
    k > 0 && iv[k - 1].1 > t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn units(n: usize) -> Vec<UnitSpec> {
        (0..n)
            .map(|i| UnitSpec {
                name: format!("u{i}"),
                bw: 10.0,
            })
            .collect()
    }
    fn task(unit: usize, compute_s: f64, deps: Vec<usize>) -> Task {
        Task {
            unit,
            deps,
            compute_s,
            ..Default::default()
        }
    }

    #[test]
    fn independent_lanes_overlap_and_dependencies_serialise() {
        // a(u0, 2s) and b(u1, 3s) are independent: they overlap; c(u0) waits for both.
        let t = vec![
            task(0, 2.0, vec![]),
            task(1, 3.0, vec![]),
            task(0, 1.0, vec![0, 1]),
        ];
        let tl = run(&units(2), 100.0, &t).unwrap();
        assert_eq!((tl.start[0], tl.start[1]), (0.0, 0.0));
        assert_eq!(tl.start[2], 3.0);
        assert_eq!(tl.makespan, 4.0);
        assert_eq!(tl.busy, vec![3.0, 3.0]);
    }

    #[test]
    fn one_unit_never_does_two_things_at_once() {
        let t = vec![
            task(0, 2.0, vec![]),
            task(0, 1.0, vec![]),
            task(1, 1.0, vec![]),
        ];
        let tl = run(&units(2), 100.0, &t).unwrap();
        assert_eq!(tl.start[1], 2.0);
        assert_eq!(tl.start[2], 0.0);
    }

    #[test]
    fn lead_time_and_fixed_costs_add() {
        let mut b = task(0, 1.0, vec![0]);
        b.lead_s = 0.5;
        b.fixed_s = 0.25;
        let tl = run(&units(1), 100.0, &[task(0, 1.0, vec![]), b]).unwrap();
        assert_eq!(tl.start[1], 1.5);
        assert_eq!(tl.end[1], 2.75);
    }

    #[test]
    fn the_bus_is_shared_between_units() {
        // Alone: 20 bytes at min(10 own, 16 shared) = 2 s. Beside a busy unit: 16 / 2 = 8 B/s.
        let mem = |unit| Task {
            unit,
            mem_bytes: 20.0,
            on_bus: true,
            ..Default::default()
        };
        let tl = run(&units(2), 16.0, &[mem(0)]).unwrap();
        assert_eq!(tl.makespan, 2.0);
        let tl = run(&units(2), 16.0, &[mem(0), mem(1)]).unwrap();
        assert_eq!(tl.end[1], 2.5);
    }

    #[test]
    fn a_forward_dependency_is_an_error() {
        let e = run(
            &units(1),
            1.0,
            &[task(0, 1.0, vec![1]), task(0, 1.0, vec![])],
        );
        assert!(e.is_err());
    }
}
