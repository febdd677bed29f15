//! Outputs of a replay: a Chrome trace-event file (opens in Perfetto or chrome://tracing; one
//! track per unit, one slice per operator) and an SVG Gantt chart of the units' busy time, as
//! text (the caller writes files atomically).

use crate::error::{Result, SimError};
use crate::replay::Replay;
use plotters::prelude::*;

/// The Chrome trace-event JSON of a replay (times in µs).
pub fn chrome_trace(r: &Replay) -> serde_json::Value {
    let mut ev = Vec::with_capacity(r.ops.len() + r.units.len());
    for (i, u) in r.units.iter().enumerate() {
        ev.push(serde_json::json!({
            "name": "thread_name", "ph": "M", "pid": 1, "tid": i,
            "args": {"name": u}
        }));
    }
    for (i, o) in r.ops.iter().enumerate() {
        let t = &r.tasks[i];
        ev.push(serde_json::json!({
            "name": o.op, "cat": o.lane, "ph": "X", "pid": 1, "tid": t.unit,
            "ts": r.timeline.start[i] * 1e6,
            "dur": (r.timeline.end[i] - r.timeline.start[i]) * 1e6,
            "args": {"lane": o.lane, "pass": o.pass, "layer": o.layer, "rows": r.padded_rows[i],
                     "shape": o.shape, "bytes": t.mem_bytes, "flops": r.work_ops[i]}
        }));
    }
    serde_json::json!({"traceEvents": ev, "displayTimeUnit": "ms"})
}

/// An SVG Gantt chart: one row per unit, one bar per operator, coloured by lane.
pub fn svg(r: &Replay, title: &str) -> Result<String> {
    let mut out = String::new();
    draw(r, title, &mut out).map_err(|msg| SimError::Output {
        path: "svg".into(),
        msg,
    })?;
    Ok(out)
}

fn draw(r: &Replay, title: &str, out: &mut String) -> std::result::Result<(), String> {
    let used: Vec<usize> = (0..r.units.len())
        .filter(|u| r.timeline.busy[*u] > 0.0)
        .collect();
    let span_ms = (r.timeline.makespan * 1e3).max(1e-6);
    let root =
        SVGBackend::with_string(out, (1200, 120 + 60 * used.len() as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(90)
        .build_cartesian_2d(0.0..span_ms, 0.0..used.len() as f64)
        .map_err(|e| e.to_string())?;
    let names: Vec<String> = used.iter().map(|u| r.units[*u].clone()).collect();
    chart
        .configure_mesh()
        .x_desc("ms")
        .y_labels(used.len().max(1))
        .y_label_formatter(&|y| {
            let k = y.floor() as usize;
            names.get(k).cloned().unwrap_or_default()
        })
        .disable_y_mesh()
        .draw()
        .map_err(|e| e.to_string())?;
    let mut lanes: Vec<&str> = Vec::new();
    for o in &r.ops {
        if !lanes.contains(&o.lane.as_str()) {
            lanes.push(&o.lane);
        }
    }
    let bars = r.ops.iter().enumerate().filter_map(|(i, o)| {
        let row = used.iter().position(|u| *u == r.tasks[i].unit)? as f64;
        let c = Palette99::pick(lanes.iter().position(|l| *l == o.lane).unwrap_or(0));
        let (a, b) = (r.timeline.start[i] * 1e3, r.timeline.end[i] * 1e3);
        Some(Rectangle::new(
            [(a, row + 0.15), (b.max(a), row + 0.85)],
            c.filled(),
        ))
    });
    chart.draw_series(bars).map_err(|e| e.to_string())?;
    for (k, l) in lanes.iter().enumerate() {
        let c = Palette99::pick(k);
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(0.0, 0.0), (0.0, 0.0)],
                c.filled(),
            )))
            .map_err(|e| e.to_string())?
            .label(*l)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], c.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}
