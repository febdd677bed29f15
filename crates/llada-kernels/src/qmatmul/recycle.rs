//! Recycling of streamed weight buffers.
//!
//! A model streamed under a memory budget rebuilds the same units on every forward pass.
//! Allocating their buffers fresh cost more CPU than reading the bytes: page faults, the kernel
//! zeroing every new page and `munmap` on drop took ≈ 60 % of the storage thread's time on
//! SmolLM2-135M at a 25 % budget (perf), and that thread, not the storage device, bounded a
//! pass. So a streamed unit is built inside one **arena** ([`in_arena`]): every matrix it
//! repacks is carved from it, and when the unit's last matrix drops, the arena goes back to a
//! pool for the next unit; read buffers ([`StagingBytes`](super::StagingBytes)) are pooled
//! likewise. The pool holds at most what live [`Reservation`]s allow (none by default: nothing
//! is kept; when the last weight store goes, its pooled buffers are freed), and a request it
//! cannot serve first frees idle buffers until those lent out, those pooled and the new one fit
//! the cap (`make_room`; not when the buffers in use alone exceed it, two passes streaming at
//! once, where freeing could not reach the cap). Arenas and pooled buffers are counted in
//! [`weight_memory`]: they are memory the process holds.

use super::weight_memory;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Carved allocations start on this boundary (the kernels' vector loads).
const ALIGN: usize = 64;

/// One block of memory that a streamed unit's matrices are carved from. Carved ranges are
/// disjoint, and each is written only by the [`super::WeightBuf`] that owns it.
pub struct Arena {
    map: Option<memmap2::MmapMut>,
    base: *mut u8,
    len: usize,
}

// SAFETY: the arena's memory is only reached through disjoint carved ranges, each owned by
// one `WeightBuf` (mutated while it is built, before it is shared, then read-only).
unsafe impl Send for Arena {}
unsafe impl Sync for Arena {}

impl Arena {
    /// The carved range `[off, off + len)`.
    ///
    /// # Safety
    /// `off + len <= self.len`, and no other live slice overlaps the range mutably.
    pub(crate) unsafe fn slice(&self, off: usize, len: usize) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.base.add(off), len) }
    }
    /// # Safety
    /// As [`Self::slice`], and the caller is the range's only user.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut(&self, off: usize, len: usize) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.base.add(off), len) }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        if let Some(map) = self.map.take() {
            let len = map.len();
            give_back(len);
            if !keep(Buf::Map(map)) {
                weight_memory::sub(len);
            }
        }
    }
}

pub(crate) enum Buf {
    Map(memmap2::MmapMut),
    Bytes(Vec<u8>),
}

impl Buf {
    fn bytes(&self) -> usize {
        match self {
            Buf::Map(m) => m.len(),
            Buf::Bytes(v) => v.capacity(),
        }
    }
}

struct Pool {
    bytes: u64,
    free: Vec<Buf>,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    bytes: 0,
    free: Vec::new(),
});
static CAP: AtomicU64 = AtomicU64::new(0);
/// Bytes of recyclable buffers (arenas, staging reads) in use now: taken from the pool or
/// freshly allocated, not yet dropped.
static LENT: AtomicU64 = AtomicU64::new(0);
/// Bytes of idle buffers [`make_room`] has freed since the process started.
static EVICTED: AtomicU64 = AtomicU64::new(0);

pub(crate) fn lend(n: usize) {
    LENT.fetch_add(n as u64, Ordering::Relaxed);
}

pub(crate) fn give_back(n: usize) {
    LENT.fetch_sub(n as u64, Ordering::Relaxed);
}

/// Before a fresh allocation of `n` bytes that the pool could not serve: free idle pooled
/// buffers (oldest first) while what is in use, what is pooled and the new buffer together
/// exceed the cap. Pooled buffers of shapes the current work does not take — left by a
/// pass that needed more or other buffers (AHASD's TVC streams two passes at once) — would
/// otherwise stay allocated beside the fresh ones; in a steady state nothing misses and
/// nothing is freed. When what is in use and the new buffer alone exceed the cap (two
/// passes streaming at once), freeing cannot reach it and would only throw away buffers the
/// next requests take: nothing is freed then.
pub(crate) fn make_room(n: usize) {
    let cap = CAP.load(Ordering::Relaxed);
    if cap == 0 {
        return;
    }
    let lent = LENT.load(Ordering::Relaxed);
    if lent + n as u64 > cap {
        return;
    }
    let freed: Vec<Buf> = match POOL.lock() {
        Ok(mut p) => {
            let mut k = 0;
            let mut pooled = p.bytes;
            while k < p.free.len() && lent + pooled + n as u64 > cap {
                pooled -= p.free[k].bytes() as u64;
                k += 1;
            }
            p.bytes = pooled;
            p.free.drain(..k).collect()
        }
        Err(_) => vec![],
    };
    for b in freed {
        EVICTED.fetch_add(b.bytes() as u64, Ordering::Relaxed);
        weight_memory::sub(b.bytes());
    }
}

/// Bytes of idle pooled buffers freed to make room for a fresh one, since the process
/// started: zero growth in a steady state (every request served from the pool).
pub fn evicted_bytes() -> u64 {
    EVICTED.load(Ordering::Relaxed)
}

/// Bytes of recyclable buffers in use now (not pooled).
pub fn lent_bytes() -> u64 {
    LENT.load(Ordering::Relaxed)
}

thread_local! {
    /// The arena of the unit this thread is building, and its next free offset.
    static CURRENT: RefCell<Option<(Arc<Arena>, usize)>> = const { RefCell::new(None) };
}

/// Keep up to `bytes` more of dropped arenas and read buffers for reuse, while the returned
/// reservation lives (a weight store holds one for its staging memory). Dropping it lowers
/// the cap again and frees what the pool holds beyond it: a model that is gone leaves no
/// pooled memory behind.
pub fn reserve(bytes: u64) -> Reservation {
    CAP.fetch_add(bytes, Ordering::Relaxed);
    Reservation(bytes)
}

/// A share of the pool's cap ([`reserve`]).
#[must_use = "the pool keeps buffers only while the reservation lives"]
pub struct Reservation(u64);

impl Drop for Reservation {
    fn drop(&mut self) {
        let cap = CAP.fetch_sub(self.0, Ordering::Relaxed) - self.0;
        let freed: Vec<Buf> = match POOL.lock() {
            Ok(mut p) => {
                let mut out = vec![];
                while p.bytes > cap {
                    let Some(b) = p.free.pop() else { break };
                    p.bytes -= b.bytes() as u64;
                    out.push(b);
                }
                out
            }
            Err(_) => vec![],
        };
        for b in freed {
            weight_memory::sub(b.bytes());
        }
    }
}

/// Bytes held in the pool now.
pub fn pooled_bytes() -> u64 {
    POOL.lock().map(|p| p.bytes).unwrap_or(0)
}

/// A fresh anonymous mapping of `len` bytes (at least one page), counted.
pub(crate) fn fresh_map(len: usize) -> memmap2::MmapMut {
    let len = len.max(1);
    let map = memmap2::MmapMut::map_anon(len)
        .unwrap_or_else(|e| panic!("cannot allocate {len} bytes for weights: {e}"));
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    weight_memory::add(map.len());
    map
}

/// Offer a dropped buffer to the pool; `false` if it was not kept (the caller frees it).
pub(crate) fn keep(b: Buf) -> bool {
    let cap = CAP.load(Ordering::Relaxed);
    if cap == 0 {
        return false;
    }
    let Ok(mut p) = POOL.lock() else {
        return false;
    };
    let n = b.bytes() as u64;
    if p.bytes + n > cap {
        return false;
    }
    p.bytes += n;
    p.free.push(b);
    true
}

/// Take the first pooled buffer that `fits`.
fn take(fits: impl Fn(&Buf) -> bool) -> Option<Buf> {
    let mut p = POOL.lock().ok()?;
    let i = p.free.iter().position(fits)?;
    // `remove`, not `swap_remove`: the pool stays in the order buffers came back, which
    // `make_room` frees oldest first (a few dozen entries at most).
    let b = p.free.remove(i);
    p.bytes -= b.bytes() as u64;
    Some(b)
}

/// A pooled read buffer with room for `len` bytes.
pub(crate) fn take_bytes(len: usize) -> Option<Vec<u8>> {
    match take(|b| matches!(b, Buf::Bytes(v) if v.capacity() >= len))? {
        Buf::Bytes(v) => Some(v),
        Buf::Map(_) => None,
    }
}

/// A pooled arena mapping of exactly `len` bytes.
fn take_map(len: usize) -> Option<memmap2::MmapMut> {
    match take(|b| matches!(b, Buf::Map(m) if m.len() == len))? {
        Buf::Map(m) => Some(m),
        Buf::Bytes(_) => None,
    }
}

/// Run `f` with an arena of `bytes` (pooled, or fresh) as this thread's allocator of
/// packed weights: matrices built inside are carved from it while it has room (then from
/// fresh mappings). The arena returns to the pool when the last of them drops.
pub fn in_arena<R>(bytes: usize, f: impl FnOnce() -> R) -> R {
    let bytes = bytes.max(1);
    let mut map = take_map(bytes).unwrap_or_else(|| {
        make_room(bytes);
        fresh_map(bytes)
    });
    lend(map.len());
    let base = map.as_mut_ptr();
    let arena = Arc::new(Arena {
        map: Some(map),
        base,
        len: bytes,
    });
    let before = CURRENT.with(|c| c.borrow_mut().replace((arena, 0)));
    let r = f();
    CURRENT.with(|c| *c.borrow_mut() = before);
    r
}

/// Carve `len` bytes from this thread's arena, if one is set and has room.
pub(crate) fn carve(len: usize) -> Option<(Arc<Arena>, usize)> {
    CURRENT.with(|c| {
        let mut c = c.borrow_mut();
        let (arena, next) = c.as_mut()?;
        let off = next.next_multiple_of(ALIGN);
        if len == 0 || off + len > arena.len {
            return None;
        }
        *next = off + len;
        Some((arena.clone(), off))
    })
}

/// Bytes an arena needs to hold everything `f` allocates (run once per unit at load).
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, usize) {
    MEASURE.with(|m| m.set(Some(0)));
    let r = f();
    let n = MEASURE.with(|m| m.take()).unwrap_or(0);
    (r, n)
}

thread_local! {
    static MEASURE: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Account an allocation of `len` bytes to a running [`measure`].
pub(crate) fn note(len: usize) {
    MEASURE.with(|m| {
        if let Some(n) = m.get() {
            m.set(Some(n.next_multiple_of(ALIGN) + len));
        }
    });
}
