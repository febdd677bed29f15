//! Counters and histograms for `GET /metrics`, in Prometheus' text format.
//!
//! Invariant: every counter only grows; gauges (queue depth, active sequences) are the worker's
//! last report; histogram buckets are cumulative, as Prometheus reads them.

use crate::api::Usage;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A histogram over fixed bucket bounds.
struct Hist {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    n: u64,
}

impl Hist {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            n: 0,
        }
    }
    fn observe(&mut self, v: f64) {
        for (c, b) in self.counts.iter_mut().zip(self.bounds) {
            if v <= *b {
                *c += 1;
            }
        }
        self.sum += v;
        self.n += 1;
    }
    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (c, b) in self.counts.iter().zip(self.bounds) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.n);
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", self.sum, self.n);
    }
}

const PASS_SECONDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];
const ROWS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

/// The server's metrics.
pub struct Metrics {
    requests: AtomicU64,
    rejected: AtomicU64,
    failed: AtomicU64,
    cancelled: AtomicU64,
    completed: AtomicU64,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    queue: AtomicU64,
    active: AtomicU64,
    passes: Mutex<(Hist, Hist)>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            requests: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
            queue: AtomicU64::new(0),
            active: AtomicU64::new(0),
            passes: Mutex::new((Hist::new(PASS_SECONDS), Hist::new(ROWS))),
        }
    }
}

fn add(c: &AtomicU64, v: u64) {
    c.fetch_add(v, Ordering::Relaxed);
}

impl Metrics {
    /// A request reached a generation endpoint.
    pub fn request(&self) {
        add(&self.requests, 1);
    }
    /// A request was refused before it was queued (4xx, 503).
    pub fn rejected(&self) {
        add(&self.rejected, 1);
    }
    pub fn failed(&self) {
        add(&self.failed, 1);
    }
    pub fn cancelled(&self) {
        add(&self.cancelled, 1);
    }
    pub fn done(&self, u: &Usage) {
        add(&self.completed, 1);
        add(&self.prompt_tokens, u.prompt as u64);
        add(&self.completion_tokens, u.completion as u64);
    }
    pub fn set_load(&self, queued: usize, active: usize) {
        self.queue.store(queued as u64, Ordering::Relaxed);
        self.active.store(active as u64, Ordering::Relaxed);
    }
    /// A shared forward pass of `rows` rows took `secs`.
    pub fn pass(&self, secs: f64, rows: usize) {
        if let Ok(mut p) = self.passes.lock() {
            p.0.observe(secs);
            p.1.observe(rows as f64);
        }
    }

    /// The Prometheus text.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        for (name, kind, help, v) in [
            (
                "llada_requests_total",
                "counter",
                "Generation requests received.",
                get(&self.requests),
            ),
            (
                "llada_requests_rejected_total",
                "counter",
                "Requests refused before queueing (bad request, full queue).",
                get(&self.rejected),
            ),
            (
                "llada_requests_completed_total",
                "counter",
                "Generations finished.",
                get(&self.completed),
            ),
            (
                "llada_requests_failed_total",
                "counter",
                "Generations that ended in an error.",
                get(&self.failed),
            ),
            (
                "llada_requests_cancelled_total",
                "counter",
                "Generations cancelled by their client.",
                get(&self.cancelled),
            ),
            (
                "llada_prompt_tokens_total",
                "counter",
                "Prompt tokens of finished generations.",
                get(&self.prompt_tokens),
            ),
            (
                "llada_completion_tokens_total",
                "counter",
                "Tokens generated by finished generations.",
                get(&self.completion_tokens),
            ),
            (
                "llada_queue_depth",
                "gauge",
                "Requests waiting for a slot.",
                get(&self.queue),
            ),
            (
                "llada_active_sequences",
                "gauge",
                "Sequences decoding in the shared passes.",
                get(&self.active),
            ),
        ] {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        }
        if let Ok(p) = self.passes.lock() {
            p.0.write(
                &mut s,
                "llada_pass_seconds",
                "Time of one shared forward pass.",
            );
            p.1.write(
                &mut s,
                "llada_pass_rows",
                "Rows (tokens) per shared forward pass.",
            );
        }
        s
    }
}
