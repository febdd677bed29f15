//! Reading an operator trace (`llada generate --trace FILE`): a header line
//! (`{"llada_trace": 1, ...}`), then one JSON object per executed operator.
//!
//! Invariants after [`Trace::parse`]: the header's version is 1; every record has its required
//! fields, `end_ns >= start_ns`, every shape dimension is at most 2^32 and the FLOPs at most
//! 10^18 (larger values are corruption, not a model); at least one record. Errors name the line.

use crate::error::{Result, SimError};
use std::io::BufRead;

/// The trace format version this crate reads.
pub const TRACE_VERSION: u64 = 1;
const MAX_DIM: u64 = 1 << 32;
const MAX_FLOPS: u64 = 1_000_000_000_000_000_000;

/// One executed operator: the engine's own record type.
pub use llada_runtime::OpRecord as Op;

/// What the simulator asks of a record.
pub trait OpExt {
    /// Measured duration, seconds.
    fn dur_s(&self) -> f64;
    /// Rows of the batch (the first shape dimension; 1 when the shape is empty).
    fn rows(&self) -> u64;
    /// A wrapper span around a whole pass (not work of its own).
    fn is_span(&self) -> bool;
}

impl OpExt for Op {
    fn dur_s(&self) -> f64 {
        self.end_ns.saturating_sub(self.start_ns) as f64 * 1e-9
    }
    fn rows(&self) -> u64 {
        self.shape.first().copied().unwrap_or(1).max(1)
    }
    fn is_span(&self) -> bool {
        self.op == "dense_window"
    }
}

/// A parsed trace.
#[derive(Debug, Clone)]
pub struct Trace {
    pub header: serde_json::Value,
    /// Operators in the order of their start times.
    pub ops: Vec<Op>,
}

impl Trace {
    /// Read a trace file.
    pub fn load(path: &std::path::Path) -> Result<Self> {
        let f = std::fs::File::open(path).map_err(|e| SimError::Io {
            path: path.display().to_string(),
            source: e,
        })?;
        Self::parse(std::io::BufReader::new(f))
    }

    /// Parse a trace from JSON Lines.
    pub fn parse<R: BufRead>(r: R) -> Result<Self> {
        let mut header = None;
        let mut ops = Vec::new();
        for (i, line) in r.lines().enumerate() {
            let n = i + 1;
            let line = line.map_err(|e| SimError::Trace {
                line: n,
                msg: format!("unreadable: {e}"),
            })?;
            if line.trim().is_empty() {
                continue;
            }
            if header.is_none() {
                header = Some(parse_header(&line, n)?);
                continue;
            }
            let op: Op = serde_json::from_str(&line).map_err(|e| SimError::Trace {
                line: n,
                msg: format!("not an operator record: {e}"),
            })?;
            check_op(&op, n)?;
            ops.push(op);
        }
        let header = header.ok_or_else(|| SimError::EmptyTrace("no header line".into()))?;
        if ops.is_empty() {
            return Err(SimError::EmptyTrace("no operator records".into()));
        }
        ops.sort_by_key(|o| (o.start_ns, o.end_ns));
        Ok(Self { header, ops })
    }

    /// The trace's own wall time: first start to last end, seconds.
    pub fn measured_total_s(&self) -> f64 {
        let t0 = self.ops.iter().map(|o| o.start_ns).min().unwrap_or(0);
        let t1 = self.ops.iter().map(|o| o.end_ns).max().unwrap_or(0);
        (t1 - t0) as f64 * 1e-9
    }

    /// The lanes named in the trace, in order of first appearance.
    pub fn lanes(&self) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        for o in &self.ops {
            if !v.contains(&o.lane) {
                v.push(o.lane.clone());
            }
        }
        v
    }
}

fn parse_header(line: &str, n: usize) -> Result<serde_json::Value> {
    let h: serde_json::Value = serde_json::from_str(line).map_err(|e| SimError::Trace {
        line: n,
        msg: format!("the header is not JSON: {e}"),
    })?;
    match h.get("llada_trace").and_then(|v| v.as_u64()) {
        Some(TRACE_VERSION) => Ok(h),
        Some(v) => Err(SimError::Trace {
            line: n,
            msg: format!("trace version {v}; this simulator reads version {TRACE_VERSION}"),
        }),
        None => Err(SimError::Trace {
            line: n,
            msg: "the first line must be the header {\"llada_trace\": 1, ...} (is this a llada trace?)"
                .into(),
        }),
    }
}

fn check_op(o: &Op, n: usize) -> Result<()> {
    let bad = |msg: String| Err(SimError::Trace { line: n, msg });
    if o.end_ns < o.start_ns {
        return bad(format!(
            "'{}' ends before it starts ({} < {} ns)",
            o.op, o.end_ns, o.start_ns
        ));
    }
    if let Some(d) = o.shape.iter().find(|d| **d > MAX_DIM) {
        return bad(format!("'{}' has an absurd shape dimension {d}", o.op));
    }
    if o.flops > MAX_FLOPS {
        return bad(format!("'{}' claims {} FLOPs", o.op, o.flops));
    }
    if o.op.is_empty() || o.lane.is_empty() {
        return bad("empty op or lane name".into());
    }
    Ok(())
}
