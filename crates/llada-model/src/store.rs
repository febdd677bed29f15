//! Weight store with a memory budget.
//!
//! The planner decides which layers (and whether the LM head) stay resident; the rest stay in
//! the model file and are streamed for every forward pass. Every unit is read once per pass
//! (equal reuse), so the plan maximises resident bytes under the budget: the LM head first (it
//! is the largest single read of a small model's pass and the last one, so streaming it cannot
//! overlap with later compute), then layers in order. The token embedding is never made
//! resident: a pass reads only its rows, through the file mapping.
//!
//! Streaming is a three-stage pipeline: a reader thread reads streamed unit `i + 2` (a layer's
//! tensors with one `pread` into a staging buffer), a builder thread repacks unit `i + 1` into
//! a recycled arena ([`llada_kernels::recycle`]: no page faults or zeroing per pass), and the
//! dense lane computes unit `i`; rendezvous channels bound the staging memory to two read
//! buffers and two arenas ([`Plan::staging_bytes`]). A streamed LM head
//! is read in row chunks of at most a layer's bytes (at least four), each multiplied as it
//! lands, so no staging buffer is larger than a layer and the head's reads overlap its own
//! product. Every weight buffer is counted ([`llada_kernels::weight_memory`]): the weight
//! memory a budget governs is measured exactly, apart from RSS. A unit's file range is dropped
//! from the page cache as soon as it is read (`POSIX_FADV_DONTNEED`; the mapping's pages with
//! `MADV_DONTNEED` after the build), so the next pass reads storage again — the reads are
//! real. An optional bandwidth emulates a phone's flash
//! (`--storage-bw`): a read of `b` bytes takes at least `b / bw` seconds.

use crate::layer_builder::Recipe;
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
    /// A streamed head is read in this many row chunks (each about one layer's bytes), so it
    /// needs no staging buffer larger than a layer's and its reads overlap its own compute.
    pub head_chunks: usize,
    /// In-memory (repacked) bytes of the largest streamed unit, measured when the units are
    /// validated at load; 0 until then.
    pub unit_mem_bytes: u64,
    /// Bytes of the arena a streamed unit is built in (its packed matrices and the
    /// intermediates of fusing them), measured at load; 0 until then.
    pub unit_arena_bytes: u64,
    pub budget: Option<u64>,
}

impl Plan {
    pub fn all_resident(layer_bytes: &[u64], head_bytes: u64) -> Self {
        Self {
            resident_layers: vec![true; layer_bytes.len()],
            resident_head: true,
            layer_bytes: layer_bytes.to_vec(),
            head_bytes,
            head_chunks: 1,
            unit_mem_bytes: 0,
            unit_arena_bytes: 0,
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
            .chain(
                (!self.resident_head).then_some(self.head_bytes.div_ceil(self.head_chunks as u64)),
            )
            .max()
            .unwrap_or(0)
    }
    /// Weight staging memory of the stream: two unit arenas (the unit in use and the next one
    /// being built, [`llada_kernels::recycle`]) and two read buffers (the unit being built and
    /// the one being read, a unit's file bytes each: [`WeightStore::start`]). Before load
    /// measures the arenas, each counts as the largest unit's file bytes.
    pub fn staging_bytes(&self) -> u64 {
        if self.streams_nothing() {
            0
        } else {
            let arena = if self.unit_arena_bytes == 0 {
                self.unit_mem_bytes.max(self.largest_streamed())
            } else {
                self.unit_arena_bytes.max(self.unit_mem_bytes)
            };
            2 * arena + 2 * self.largest_streamed()
        }
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
    // A streamed head is split into chunks of at most the largest layer, and at least four (so
    // that reading chunk j + 1 overlaps the product with chunk j).
    let unit = layer_bytes.iter().copied().max().unwrap_or(0).max(1);
    let head_chunks = if resident_head {
        1
    } else {
        (head_bytes.div_ceil(unit) as usize).max(4)
    };
    Plan {
        resident_layers,
        resident_head,
        layer_bytes: layer_bytes.to_vec(),
        head_bytes,
        head_chunks,
        unit_mem_bytes: 0,
        unit_arena_bytes: 0,
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
    /// Time the reader spent reading streamed units (ns), including emulated throttling.
    pub read_ns: AtomicU64,
    /// Time the builder spent repacking them (ns).
    pub build_ns: AtomicU64,
}

/// A tensor source that reads with `pread` into staging buffers — a layer's adjacent tensors
/// with one read ([`StagedSource::stage_span`]), else each tensor with its own — and drops the
/// file's pages from the page cache afterwards, so every pass reads storage, instead of
/// faulting them in page by page through the mapping. Read buffers all have the store's
/// largest unit's size, so the pool can hand any of them to any read.
pub(crate) struct StagedSource {
    inner: std::sync::Arc<dyn TensorSource + Send + Sync>,
    /// Size of the read buffers (the plan's largest streamed unit, set by the store).
    pub(crate) read_size: std::sync::atomic::AtomicUsize,
    files: std::sync::Mutex<std::collections::HashMap<std::path::PathBuf, std::fs::File>>,
}

impl StagedSource {
    pub(crate) fn new(inner: std::sync::Arc<dyn TensorSource + Send + Sync>) -> Self {
        Self {
            inner,
            read_size: Default::default(),
            files: Default::default(),
        }
    }
}

impl StagedSource {
    /// Read `v`'s bytes with one `pread` into a counted staging buffer and drop them from the
    /// page cache; `v` itself (the mapping's view) when the file cannot be read directly (e.g.
    /// a source that is not a plain file): the numbers are the same.
    fn stage(&self, v: TensorView) -> TensorView {
        let mut buf = llada_kernels::StagingBytes::for_read(v.len, self.read_size());
        // Views of a mapped file own the whole file: their offset is the file offset.
        let ok = self.read_at(&v.file, v.offset as u64, buf.as_mut_slice());
        if ok.is_err() {
            return v;
        }
        let owner: llada_kernels::ByteOwner = std::sync::Arc::new(buf);
        TensorView {
            owner,
            offset: 0,
            ..v
        }
    }
}

impl StagedSource {
    /// Read the tensors `names` — adjacent in one file, as a layer's are — with one `pread`
    /// into one staging buffer (and drop them from the page cache), and serve them from it.
    /// `None` when they are not adjacent or the file cannot be read directly: the caller then
    /// reads tensor by tensor. Absent names are simply not served (the build reports them).
    pub(crate) fn stage_span(&self, names: &[String]) -> Option<SpanSource> {
        let views: Vec<TensorView> = names.iter().filter_map(|n| self.inner.get(n)).collect();
        let file = views.first()?.file.clone();
        if views.iter().any(|v| v.file != file) {
            return None;
        }
        let lo = views.iter().map(|v| v.offset).min()?;
        let hi = views.iter().map(|v| v.offset + v.len).max()?;
        let sum: usize = views.iter().map(|v| v.len).sum();
        // Gaps of other tensors would be read for nothing: fall back past a quarter more.
        if hi - lo > sum + sum / 4 {
            return None;
        }
        let mut buf = llada_kernels::StagingBytes::for_read(hi - lo, self.read_size());
        self.read_at(&file, lo as u64, buf.as_mut_slice()).ok()?;
        let owner: llada_kernels::ByteOwner = std::sync::Arc::new(buf);
        let views = views
            .into_iter()
            .map(|v| {
                let offset = v.offset - lo;
                (
                    v.name.clone(),
                    TensorView {
                        owner: owner.clone(),
                        offset,
                        ..v
                    },
                )
            })
            .collect();
        Some(SpanSource {
            views,
            path: self.inner.path().to_path_buf(),
        })
    }

    fn read_size(&self) -> usize {
        self.read_size.load(Ordering::Relaxed)
    }

    /// `pread` `buf.len()` bytes of `file` at `at`, then drop them from the page cache.
    fn read_at(&self, file: &std::path::Path, at: u64, buf: &mut [u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let mut files = self
            .files
            .lock()
            .map_err(|_| std::io::Error::other("file table poisoned"))?;
        if !files.contains_key(file) {
            files.insert(file.to_path_buf(), std::fs::File::open(file)?);
        }
        let f = files
            .get(file)
            .ok_or_else(|| std::io::Error::other("file vanished"))?;
        f.read_exact_at(buf, at)?;
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            // SAFETY: valid descriptor; advisory only.
            unsafe {
                libc::posix_fadvise(
                    f.as_raw_fd(),
                    at as libc::off_t,
                    buf.len() as libc::off_t,
                    libc::POSIX_FADV_DONTNEED,
                );
            }
        }
        Ok(())
    }
}

/// Tensors served from one staging buffer ([`StagedSource::stage_span`]).
pub(crate) struct SpanSource {
    views: std::collections::HashMap<String, TensorView>,
    path: std::path::PathBuf,
}

impl TensorSource for SpanSource {
    fn get(&self, name: &str) -> Option<TensorView> {
        self.views.get(name).cloned()
    }
    fn names(&self) -> Vec<String> {
        self.views.keys().cloned().collect()
    }
    fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl TensorSource for StagedSource {
    fn get(&self, name: &str) -> Option<TensorView> {
        let v = self.inner.get(name)?;
        Some(self.stage(v))
    }
    fn get_rows(&self, name: &str, r0: usize, r1: usize) -> Option<TensorView> {
        let v = self.inner.get(name)?.rows(r0, r1)?;
        Some(self.stage(v))
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

/// Streaming state of a model loaded under a budget: the shared part ([`StoreCore`]: what is
/// streamed and how) and the persistent read-ahead stream of its passes
/// ([`crate::stream`]). Derefs to its core.
pub struct WeightStore {
    pub(crate) core: std::sync::Arc<StoreCore>,
    pub(crate) ahead: std::sync::Mutex<Option<crate::stream::Ahead>>,
}

impl std::ops::Deref for WeightStore {
    type Target = StoreCore;
    fn deref(&self) -> &StoreCore {
        &self.core
    }
}

/// What a weight store streams and how: the recipe, the plan, the counters.
pub struct StoreCore {
    pub(crate) recipe: Recipe,
    /// The recipe's source, for reading a layer's tensors with one `pread`.
    pub(crate) staged: Option<std::sync::Arc<StagedSource>>,
    pub plan: Plan,
    /// Emulated storage bandwidth (bytes/s).
    pub storage_bw: Option<f64>,
    pub stats: StreamStats,
    /// This store's share of the buffer pool (released with the store).
    _pool: llada_kernels::recycle::Reservation,
}

/// One streamed unit as read, before it is built.
pub(crate) enum StagedUnit {
    /// Layer `i`, its tensors in one staging buffer (`None`: not adjacent in the file; the
    /// build reads them one by one).
    Layer(usize, Option<SpanSource>),
    /// Rows `[r0, r1)` of the LM head.
    HeadRows(usize, usize, TensorView),
}

/// One streamed unit, built by the prefetch thread.
pub(crate) enum Unit {
    Layer(Box<Layer>),
    /// Rows `[r0, r0 + rows)` of the LM head.
    HeadRows(usize, Linear),
}

/// What one streamed unit is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Part {
    Layer(usize),
    HeadRows(usize, usize),
}

impl WeightStore {
    pub(crate) fn new(
        recipe: Recipe,
        staged: Option<std::sync::Arc<StagedSource>>,
        plan: Plan,
        storage_bw: Option<f64>,
    ) -> Self {
        Self {
            core: std::sync::Arc::new(StoreCore::new(recipe, staged, plan, storage_bw)),
            ahead: std::sync::Mutex::new(None),
        }
    }
}

impl StoreCore {
    /// A second share of the buffer pool, for as long as the returned reservation lives: for a
    /// caller that streams two passes at once (AHASD's TVC pre-verifies beside the verifier),
    /// so that the second pass's units are recycled rather than freed and re-allocated.
    pub fn reserve_second_pass(&self) -> llada_kernels::recycle::Reservation {
        llada_kernels::recycle::reserve(self.plan.staging_bytes())
    }

    fn new(
        recipe: Recipe,
        staged: Option<std::sync::Arc<StagedSource>>,
        plan: Plan,
        storage_bw: Option<f64>,
    ) -> Self {
        // Every pass rebuilds the streamed units with the same sizes: keep their arenas and
        // read buffers between them instead of faulting fresh pages in for every unit.
        let pool = llada_kernels::recycle::reserve(plan.staging_bytes());
        if let Some(st) = &staged {
            st.read_size.store(
                plan.largest_streamed() as usize,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        Self {
            recipe,
            staged,
            plan,
            storage_bw,
            stats: StreamStats::default(),
            _pool: pool,
        }
    }

    /// The streamed units of one pass, in the order the pass needs them.
    pub(crate) fn order(&self, c: &ModelConfig) -> Vec<Part> {
        let mut v: Vec<Part> = self
            .plan
            .resident_layers
            .iter()
            .enumerate()
            .filter(|(_, r)| !**r)
            .map(|(i, _)| Part::Layer(i))
            .collect();
        if !self.plan.resident_head {
            v.extend(head_chunks(c.embedding_rows(), self.plan.head_chunks));
        }
        v
    }

    /// Read one unit's bytes (the storage side of a unit): a layer's tensors with one `pread`
    /// into a staging buffer, or rows of the head; throttled to `--storage-bw` when set.
    pub(crate) fn read(&self, c: &ModelConfig, part: Part) -> Result<StagedUnit, ModelError> {
        let t = Instant::now();
        // Traced as `storage_read` (the reader thread's lane is `storage`): layer index (-1:
        // head rows), shape `[bytes]`; `llada sim` replays it on a flash profile (docs/sim.md).
        let (layer, span_bytes) = match part {
            Part::Layer(i) => (i as i32, self.plan.layer_bytes[i]),
            Part::HeadRows(r0, r1) => (
                -1,
                self.plan.head_bytes * (r1 - r0) as u64 / c.embedding_rows().max(1) as u64,
            ),
        };
        let _span =
            llada_runtime::trace::OpSpan::begin("storage_read", layer, &[span_bytes], "bytes")
                .cost(span_bytes, span_bytes, 0);
        let (staged, bytes) = match part {
            Part::Layer(i) => {
                let names = self.recipe.layer_tensors(c, i);
                let span = self.staged.as_ref().and_then(|s| s.stage_span(&names));
                (StagedUnit::Layer(i, span), self.plan.layer_bytes[i])
            }
            Part::HeadRows(r0, r1) => {
                // A staged source reads just these rows, into a staging buffer.
                let v = self.recipe.head_rows(c, r0, r1)?;
                (
                    StagedUnit::HeadRows(r0, r1, v),
                    self.plan.head_bytes * (r1 - r0) as u64 / c.embedding_rows().max(1) as u64,
                )
            }
        };
        // A rate no caller should pass (the CLI checks ≥ 1 MB/s) sleeps at most an hour a
        // read rather than panicking or sleeping for years.
        if let Some(want) = self.storage_bw.map(|bw| {
            Duration::try_from_secs_f64(bytes as f64 / bw).map_or(Duration::from_secs(3600), |w| {
                w.min(Duration::from_secs(3600))
            })
        }) {
            let took = t.elapsed();
            if want > took {
                std::thread::sleep(want - took);
            }
        }
        self.stats.bytes_read.fetch_add(bytes, Ordering::Relaxed);
        self.stats
            .read_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(staged)
    }

    /// Build a read unit (the compute side): repack its matrices into a recycled arena.
    pub(crate) fn build(&self, c: &ModelConfig, staged: StagedUnit) -> Result<Unit, ModelError> {
        let t = Instant::now();
        // Traced as `weight_build` on lane `storage_build` (the repack of a read unit).
        let (layer, bytes) = match &staged {
            StagedUnit::Layer(i, _) => (*i as i32, self.plan.layer_bytes[*i]),
            StagedUnit::HeadRows(..) => (-1, 0),
        };
        let _span = llada_runtime::trace::OpSpan::begin("weight_build", layer, &[bytes], "bytes")
            .cost(bytes, bytes, 0);
        let arena = self.plan.unit_arena_bytes as usize;
        let (u, names) = match staged {
            StagedUnit::Layer(i, span) => {
                let layer = llada_kernels::recycle::in_arena(arena, || match &span {
                    Some(span) => self.recipe.build_layer_from(span, c, i),
                    // Not adjacent in the file: read tensor by tensor while building.
                    None => self.recipe.build_layer(c, i),
                })?;
                (
                    Unit::Layer(Box::new(layer)),
                    self.recipe.layer_tensors(c, i),
                )
            }
            // Each chunk's pages were dropped as it was read; the mapping (which the embedding
            // lookup of a tied head touches) is released once per pass, after the last chunk.
            StagedUnit::HeadRows(r0, r1, v) => (
                Unit::HeadRows(
                    r0,
                    llada_kernels::recycle::in_arena(arena, || {
                        self.recipe.build_head_view(c, &v, r1 - r0)
                    })?,
                ),
                if r1 == c.embedding_rows() {
                    vec![self.recipe.head_name(c).to_string()]
                } else {
                    vec![]
                },
            ),
        };
        for n in &names {
            self.recipe.src.release(n);
        }
        self.stats.units_read.fetch_add(1, Ordering::Relaxed);
        self.stats
            .build_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(u)
    }

    /// Start the streaming threads of one pass inside `scope`; units arrive in pass order.
    ///
    /// Two stages: a reader reads unit `i + 2` while a builder repacks unit `i + 1` and the
    /// dense lane computes unit `i` (rendezvous channels, so at most two read buffers and two
    /// unit arenas are live: [`Plan::staging_bytes`]). Reading and repacking are both CPU work
    /// for a page-cache read (the kernel's copy, the repack), so on two cores the split keeps
    /// the storage side from being one thread's worth of CPU per pass.
    pub(crate) fn start<'s, 'e: 's>(
        &'e self,
        scope: &'s std::thread::Scope<'s, 'e>,
        c: &'e ModelConfig,
    ) -> Receiver<Result<Unit, ModelError>> {
        let (tx, rx): (SyncSender<_>, Receiver<_>) = std::sync::mpsc::sync_channel(0);
        let (stx, srx): (SyncSender<_>, Receiver<_>) = std::sync::mpsc::sync_channel(0);
        scope.spawn(move || {
            llada_runtime::trace::set_thread_lane("storage");
            for u in self.order(c) {
                let r = self.read(c, u);
                let failed = r.is_err();
                if stx.send(r).is_err() || failed {
                    return;
                }
            }
        });
        scope.spawn(move || {
            llada_runtime::trace::set_thread_lane("storage_build");
            for r in srx {
                let r = r.and_then(|staged| self.build(c, staged));
                let failed = r.is_err();
                if tx.send(r).is_err() || failed {
                    return;
                }
            }
        });
        rx
    }
}

/// `n` row ranges covering `rows` (the head's chunks), in order.
pub(crate) fn head_chunks(rows: usize, n: usize) -> impl Iterator<Item = Part> {
    let n = n.clamp(1, rows.max(1));
    (0..n).map(move |k| Part::HeadRows(k * rows / n, (k + 1) * rows / n))
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
        // ... in at least four chunks of at most a layer's bytes.
        assert_eq!(p.head_chunks, 4);
        assert_eq!(p.largest_streamed(), 10);
        // Two arenas and two read buffers; before load measures the arenas, a unit's file bytes.
        assert_eq!(p.staging_bytes(), 40);
        let mut measured = p.clone();
        measured.unit_arena_bytes = 12;
        assert_eq!(measured.staging_bytes(), 2 * 12 + 2 * 10);
        assert!(plan(&layers, 15, 1000).streams_nothing());
        assert_eq!(plan(&layers, 15, 1000).staging_bytes(), 0);
    }

    #[test]
    fn head_chunks_cover_the_rows_once_in_order() {
        for (rows, n) in [(10, 3), (49152, 14), (5, 8), (7, 1)] {
            let parts: Vec<Part> = head_chunks(rows, n).collect();
            assert_eq!(parts.len(), n.min(rows));
            let mut next = 0;
            for p in parts {
                let Part::HeadRows(r0, r1) = p else {
                    panic!("not a head chunk")
                };
                assert_eq!(r0, next);
                assert!(r1 > r0);
                next = r1;
            }
            assert_eq!(next, rows);
        }
    }
}
