//! Operator traces.
//!
//! When enabled, every operator the engine executes appends an [`OpRecord`]: what ran (op name,
//! shape, element type), what it moved (bytes read and written) and did (FLOPs), where (lane and
//! thread), when (start/end in ns since the trace began), and in which forward pass and layer.
//! The trace is written as JSON Lines (`--trace FILE`): a header object, then one record per
//! line. When disabled, recording costs one relaxed atomic load.

use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// One executed operator.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OpRecord {
    pub op: String,
    pub lane: String,
    /// Forward pass number (0 when outside a pass).
    pub pass: u64,
    /// Layer index, or -1 for whole-model operators.
    pub layer: i32,
    /// Logical shape, e.g. `[M, N, K]` for a matmul.
    pub shape: Vec<u64>,
    /// Element type of the weights involved ("Q4_1", "F32", …).
    pub dtype: String,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub flops: u64,
    /// Rows of the batch that are padding (static-shape windows).
    #[serde(default)]
    pub padded_rows: u64,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// The process-wide trace collector.
pub struct Tracer {
    enabled: AtomicBool,
    epoch: Instant,
    pass: AtomicU64,
    records: Mutex<Vec<OpRecord>>,
}

thread_local! {
    static LANE: RefCell<String> = RefCell::new("main".to_string());
}

/// Name the lane the current thread belongs to (set by [`crate::Lane`] workers).
pub fn set_thread_lane(name: &str) {
    LANE.with(|l| *l.borrow_mut() = name.to_string());
}

/// The lane of the current thread.
pub fn thread_lane() -> String {
    LANE.with(|l| l.borrow().clone())
}

impl Tracer {
    /// The global tracer.
    pub fn global() -> &'static Tracer {
        static T: OnceLock<Tracer> = OnceLock::new();
        T.get_or_init(|| Tracer {
            enabled: AtomicBool::new(false),
            epoch: Instant::now(),
            pass: AtomicU64::new(0),
            records: Mutex::new(Vec::new()),
        })
    }
    pub fn enable(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }
    #[inline]
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }
    /// Nanoseconds since the trace epoch.
    pub fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
    /// Start a new forward pass; returns its number.
    pub fn next_pass(&self) -> u64 {
        self.pass.fetch_add(1, Ordering::Relaxed) + 1
    }
    pub fn current_pass(&self) -> u64 {
        self.pass.load(Ordering::Relaxed)
    }
    /// Append a record (no-op when disabled).
    pub fn record(&self, r: OpRecord) {
        if self.enabled() {
            if let Ok(mut v) = self.records.lock() {
                v.push(r);
            }
        }
    }
    /// Take all records collected so far.
    pub fn drain(&self) -> Vec<OpRecord> {
        self.records
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }
    /// Write `records` as JSON Lines after a header line into `w` (callers hand it the buffered
    /// writer of an atomic file write, so an interrupted run leaves no partial trace).
    pub fn write_jsonl<W: std::io::Write>(
        w: &mut W,
        header: &serde_json::Value,
        records: &[OpRecord],
    ) -> std::io::Result<()> {
        writeln!(w, "{}", header)?;
        for r in records {
            writeln!(w, "{}", serde_json::to_string(r).unwrap_or_default())?;
        }
        w.flush()
    }
}

/// Times an operator and records it on drop (when tracing is enabled).
pub struct OpSpan {
    rec: Option<OpRecord>,
}

impl OpSpan {
    /// Begin an operator record.
    #[inline]
    pub fn begin(op: &str, layer: i32, shape: &[u64], dtype: &str) -> Self {
        let t = Tracer::global();
        if !t.enabled() {
            return Self { rec: None };
        }
        Self {
            rec: Some(OpRecord {
                op: op.to_string(),
                lane: thread_lane(),
                pass: t.current_pass(),
                layer,
                shape: shape.to_vec(),
                dtype: dtype.to_string(),
                bytes_read: 0,
                bytes_written: 0,
                flops: 0,
                padded_rows: 0,
                start_ns: t.now_ns(),
                end_ns: 0,
            }),
        }
    }
    /// Set the traffic and work of this operator.
    #[inline]
    pub fn cost(mut self, bytes_read: u64, bytes_written: u64, flops: u64) -> Self {
        if let Some(r) = &mut self.rec {
            r.bytes_read = bytes_read;
            r.bytes_written = bytes_written;
            r.flops = flops;
        }
        self
    }
    /// Mark padding rows.
    #[inline]
    pub fn padded(mut self, rows: u64) -> Self {
        if let Some(r) = &mut self.rec {
            r.padded_rows = rows;
        }
        self
    }
}

impl Drop for OpSpan {
    fn drop(&mut self) {
        if let Some(mut r) = self.rec.take() {
            let t = Tracer::global();
            r.end_ns = t.now_ns();
            t.record(r);
        }
    }
}
