//! Weight store with a memory budget.
//!
//! The planner decides which layers (and whether the LM head) stay resident; the rest stay in
//! the model file and are streamed for every forward pass. Every unit is read once per pass
//! (equal reuse), so the plan maximises resident bytes under the budget: the LM head first (it
//! is the largest single read of a small model's pass and the last one, so streaming it cannot
//! overlap with later compute), then layers in order. The token embedding is never made
//! resident: a pass reads only its rows, through the file mapping.
//!
//! Streaming is double-buffered: a prefetch thread reads and repacks streamed unit `i + 1`
//! (into its staging buffers) while the dense lane computes unit `i`; a rendezvous channel
//! bounds the staging memory to two units. After a unit is built its file range is dropped from
//! the mapping and the page cache (`MADV_DONTNEED` + `POSIX_FADV_DONTNEED`), so the next pass
//! reads storage again — the reads are real. An optional bandwidth emulates a phone's flash
//! (`--storage-bw`): a read of `b` bytes takes at least `b / bw` seconds.

use crate::load::Recipe;
use crate::weights::{Layer, Linear};
use crate::{ModelConfig, ModelError};
use llada_formats::{TensorSource, TensorView};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::time::{Duration, Instant};

/// A weight memory budget: absolute, or a fraction of the model's weight bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
    Bytes(u64),
    Fraction(f64),
}

impl Budget {
    /// Parse `123456`, `512M`, `2G`, `50%`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let f: f64 = p
                .trim()
                .parse()
                .map_err(|_| format!("bad percentage '{s}'"))?;
            if !(f > 0.0 && f <= 100.0) {
                return Err(format!("budget percentage must be in (0, 100], got '{s}'"));
            }
            return Ok(Budget::Fraction(f / 100.0));
        }
        let (num, mul) = match t.chars().last() {
            Some('K' | 'k') => (&t[..t.len() - 1], 1u64 << 10),
            Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
            Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
            _ => (t, 1),
        };
        let v: f64 = num
            .trim()
            .parse()
            .map_err(|_| format!("bad memory budget '{s}' (e.g. 512M, 2G, 25%)"))?;
        if v.is_nan() || v < 0.0 {
            return Err(format!("bad memory budget '{s}'"));
        }
        Ok(Budget::Bytes((v * mul as f64) as u64))
    }
    /// The budget in bytes for a model of `total` weight bytes.
    pub fn bytes(self, total: u64) -> u64 {
        match self {
            Budget::Bytes(b) => b,
            Budget::Fraction(f) => (total as f64 * f) as u64,
        }
    }
}

/// What stays resident.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub resident_layers: Vec<bool>,
    pub resident_head: bool,
    pub layer_bytes: Vec<u64>,
    pub head_bytes: u64,
    pub budget: Option<u64>,
}

impl Plan {
    pub fn all_resident(layer_bytes: &[u64], head_bytes: u64) -> Self {
        Self {
            resident_layers: vec![true; layer_bytes.len()],
            resident_head: true,
            layer_bytes: layer_bytes.to_vec(),
            head_bytes,
            budget: None,
        }
    }
    pub fn streams_nothing(&self) -> bool {
        self.resident_head && self.resident_layers.iter().all(|r| *r)
    }
    pub fn resident_bytes(&self) -> u64 {
        self.layer_bytes
            .iter()
            .zip(&self.resident_layers)
            .filter(|(_, r)| **r)
            .map(|(b, _)| b)
            .sum::<u64>()
            + if self.resident_head {
                self.head_bytes
            } else {
                0
            }
    }
    /// Weight bytes read from storage per forward pass.
    pub fn streamed_bytes(&self) -> u64 {
        self.total_bytes() - self.resident_bytes()
    }
    pub fn total_bytes(&self) -> u64 {
        self.layer_bytes.iter().sum::<u64>() + self.head_bytes
    }
    /// Largest streamed unit (one staging buffer).
    pub fn largest_streamed(&self) -> u64 {
        self.layer_bytes
            .iter()
            .zip(&self.resident_layers)
            .filter(|(_, r)| !**r)
            .map(|(b, _)| *b)
            .chain((!self.resident_head).then_some(self.head_bytes))
            .max()
            .unwrap_or(0)
    }
}

/// Plan residency for `budget` bytes of weights.
pub fn plan(layer_bytes: &[u64], head_bytes: u64, budget: u64) -> Plan {
    let mut left = budget;
    let resident_head = head_bytes <= left;
    if resident_head {
        left -= head_bytes;
    }
    let resident_layers = layer_bytes
        .iter()
        .map(|&b| {
            if b <= left {
                left -= b;
                true
            } else {
                false
            }
        })
        .collect();
    Plan {
        resident_layers,
        resident_head,
        layer_bytes: layer_bytes.to_vec(),
        head_bytes,
        budget: Some(budget),
    }
}

/// Counters of the streaming path (since load).
#[derive(Debug, Default)]
pub struct StreamStats {
    pub bytes_read: AtomicU64,
    pub units_read: AtomicU64,
    /// Time the dense lane waited for a streamed unit (ns).
    pub wait_ns: AtomicU64,
    /// Time the prefetch thread spent reading + repacking (ns), including emulated throttling.
    pub read_ns: AtomicU64,
}

/// A tensor source that reads each tensor with one `pread` into its own staging buffer (and
/// drops the file's pages from the page cache afterwards, so every pass reads storage),
/// instead of faulting it in page by page through the mapping.
pub(crate) struct StagedSource {
    inner: std::sync::Arc<dyn TensorSource + Send + Sync>,
    files: std::sync::Mutex<std::collections::HashMap<std::path::PathBuf, std::fs::File>>,
}

impl StagedSource {
    pub(crate) fn new(inner: std::sync::Arc<dyn TensorSource + Send + Sync>) -> Self {
        Self {
            inner,
            files: Default::default(),
        }
    }
}

impl TensorSource for StagedSource {
    fn get(&self, name: &str) -> Option<TensorView> {
        let v = self.inner.get(name)?;
        let mut buf = vec![0u8; v.len];
        let ok = (|| -> std::io::Result<()> {
            use std::os::unix::fs::FileExt;
            let mut files = self
                .files
                .lock()
                .map_err(|_| std::io::Error::other("file table poisoned"))?;
            if !files.contains_key(&v.file) {
                files.insert(v.file.clone(), std::fs::File::open(&v.file)?);
            }
            let f = files
                .get(&v.file)
                .ok_or_else(|| std::io::Error::other("file vanished"))?;
            f.read_exact_at(&mut buf, v.offset as u64)?;
            #[cfg(target_os = "linux")]
            {
                use std::os::fd::AsRawFd;
                // SAFETY: valid descriptor; advisory only.
                unsafe {
                    libc::posix_fadvise(
                        f.as_raw_fd(),
                        v.offset as libc::off_t,
                        v.len as libc::off_t,
                        libc::POSIX_FADV_DONTNEED,
                    );
                }
            }
            Ok(())
        })();
        // The mapping's own view is the fallback when the file cannot be read directly (e.g.
        // a source that is not a plain file): the numbers are the same.
        if ok.is_err() {
            return Some(v);
        }
        let owner: llada_kernels::ByteOwner = std::sync::Arc::new(buf);
        Some(TensorView {
            owner,
            offset: 0,
            ..v
        })
    }
    fn names(&self) -> Vec<String> {
        self.inner.names()
    }
    fn path(&self) -> &std::path::Path {
        self.inner.path()
    }
    fn release(&self, name: &str) {
        self.inner.release(name)
    }
}

/// Streaming state of a model loaded under a budget.
pub struct WeightStore {
    pub(crate) recipe: Recipe,
    pub plan: Plan,
    /// Emulated storage bandwidth (bytes/s).
    pub storage_bw: Option<f64>,
    pub stats: StreamStats,
}

/// One streamed unit, built by the prefetch thread.
pub(crate) enum Unit {
    Layer(Box<Layer>),
    Head(Linear),
}

impl WeightStore {
    pub(crate) fn new(recipe: Recipe, plan: Plan, storage_bw: Option<f64>) -> Self {
        Self {
            recipe,
            plan,
            storage_bw,
            stats: StreamStats::default(),
        }
    }

    /// The streamed units of one pass, in the order the pass needs them: `(layer index or
    /// None for the head)`.
    fn order(&self) -> Vec<Option<usize>> {
        let mut v: Vec<Option<usize>> = self
            .plan
            .resident_layers
            .iter()
            .enumerate()
            .filter(|(_, r)| !**r)
            .map(|(i, _)| Some(i))
            .collect();
        if !self.plan.resident_head {
            v.push(None);
        }
        v
    }

    fn build(&self, c: &ModelConfig, unit: Option<usize>) -> Result<Unit, ModelError> {
        let t = Instant::now();
        let (u, names, bytes) = match unit {
            Some(i) => (
                Unit::Layer(Box::new(self.recipe.build_layer(c, i)?)),
                self.recipe.layer_tensors(c, i),
                self.plan.layer_bytes[i],
            ),
            None => (
                Unit::Head(self.recipe.build_head(c)?),
                vec![self.recipe.head(c).0.to_string()],
                self.plan.head_bytes,
            ),
        };
        for n in &names {
            self.recipe.src.release(n);
        }
        if let Some(bw) = self.storage_bw {
            let want = Duration::from_secs_f64(bytes as f64 / bw);
            let took = t.elapsed();
            if want > took {
                std::thread::sleep(want - took);
            }
        }
        self.stats.bytes_read.fetch_add(bytes, Ordering::Relaxed);
        self.stats.units_read.fetch_add(1, Ordering::Relaxed);
        self.stats
            .read_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(u)
    }

    /// Start the prefetch thread of one pass inside `scope`; units arrive in pass order.
    pub(crate) fn start<'s, 'e: 's>(
        &'e self,
        scope: &'s std::thread::Scope<'s, 'e>,
        c: &'e ModelConfig,
    ) -> Receiver<Result<Unit, ModelError>> {
        // Rendezvous: the thread builds unit i+1 while unit i computes and then waits, so at
        // most two units are staged.
        let (tx, rx): (SyncSender<_>, Receiver<_>) = std::sync::mpsc::sync_channel(0);
        scope.spawn(move || {
            llada_runtime::trace::set_thread_lane("storage");
            for u in self.order() {
                let r = self.build(c, u);
                let failed = r.is_err();
                if tx.send(r).is_err() || failed {
                    return;
                }
            }
        });
        rx
    }

    /// Receive the next unit, accounting the wait.
    pub(crate) fn next(&self, rx: &Receiver<Result<Unit, ModelError>>) -> Result<Unit, ModelError> {
        let t = Instant::now();
        let r = rx
            .recv()
            .map_err(|_| ModelError::Other("the weight prefetch thread stopped".into()))?;
        self.stats
            .wait_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }
}

/// This process's peak resident set size (bytes), from /proc (Linux; `None` elsewhere).
pub fn peak_rss_bytes() -> Option<u64> {
    status_kb("VmHWM:")
}

/// Current resident set size (Linux `VmRSS`).
pub fn rss_bytes() -> Option<u64> {
    status_kb("VmRSS:")
}

fn status_kb(key: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse() {
        assert_eq!(Budget::parse("25%"), Ok(Budget::Fraction(0.25)));
        assert_eq!(Budget::parse("2G"), Ok(Budget::Bytes(2 << 30)));
        assert_eq!(Budget::parse("1000"), Ok(Budget::Bytes(1000)));
        assert!(Budget::parse("0%").is_err());
        assert!(Budget::parse("lots").is_err());
        assert_eq!(Budget::Fraction(0.5).bytes(100), 50);
    }

    #[test]
    fn planner_fills_the_budget() {
        let layers = [10u64, 10, 10, 10];
        let p = plan(&layers, 15, 40);
        assert!(p.resident_head);
        assert_eq!(p.resident_layers, vec![true, true, false, false]);
        assert_eq!(p.resident_bytes(), 35);
        assert_eq!(p.streamed_bytes(), 20);
        assert_eq!(p.largest_streamed(), 10);
        // A budget smaller than the head streams it too.
        let p = plan(&layers, 15, 12);
        assert!(!p.resident_head);
        assert_eq!(p.resident_layers, vec![true, false, false, false]);
        assert_eq!(p.largest_streamed(), 15);
        assert!(plan(&layers, 15, 1000).streams_nothing());
    }
}
