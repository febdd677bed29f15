//! Batched quantized matmul: `Y[M×N] = X[M×K] · W[N×K]ᵀ` with `W` quantized.
//!
//! Scheme (llama.cpp's arithmetic, our own layout and blocking):
//! 1. At load, weights are **repacked** from GGML's array-of-blocks into a per-row
//!    structure-of-arrays: the 4- or 8-bit values of the whole row, then the block scales (and
//!    offsets) as contiguous arrays. Scales of 8 blocks then convert/load with one instruction
//!    and the offset term of 8 blocks is one FMA. Q4_0, Q4_1 and Q4_K all become "4-bit values
//!    `w = d·q + m` per 32-element block" (Q4_K's per-sub-block scale and min are exact in f32);
//!    Q8_0 keeps signed 8-bit values with f16 scales. Repacking keeps the bytes per block.
//! 2. The activations are quantized once per call to 8-bit blocks of 32 ([`QuantizedActs`]),
//!    in the byte order the weight layout wants (4-bit kernels process two blocks per 256-bit
//!    register: low nibbles hold elements 0–15 of both blocks, high nibbles 16–31).
//! 3. Register tiles of `NR` weight rows × `MR` activation rows: each weight block that is
//!    loaded and unpacked serves `MR` activation rows — this is what makes the kernel scale with M
//!    (candle-core 0.11's quantized matmul does not: ≈ 20 GFLOP/s at every M on our 2-core
//!    machine, where llama.cpp reaches ≈ 98 at M = 32).
//! 4. The N dimension is split across the current rayon pool (the lane's threads).
//!
//! x86-64 with AVX2+FMA+F16C uses `_mm256_maddubs_epi16`; elsewhere a portable scalar path
//! computes the same sums from the same layout (NEON is not written yet).

use crate::dequant::{dequantize, q4k_scale_min};
use crate::types::GgmlType;
use half::f16;
use rayon::prelude::*;
use std::sync::Arc;

/// Owner of the bytes behind a stored tensor (an mmapped file, or a `Vec`).
pub type ByteOwner = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Packed weights live in an anonymous mapping advised for transparent huge pages: decoding
/// streams every weight once per token, and 4 KiB pages would cost a TLB miss every few rows.
/// A streamed unit's matrices are carved out of one recycled arena instead ([`recycle`]).
pub struct WeightBuf(Backing);

enum Backing {
    Own(memmap2::MmapMut),
    Carved {
        arena: Arc<recycle::Arena>,
        off: usize,
        len: usize,
    },
}

impl WeightBuf {
    /// `len` bytes: zero in a fresh mapping; in an arena ([`recycle::in_arena`]) the old bytes
    /// of a recycled one, so callers write every byte (the repack writes each row's padding
    /// too, [`zero_padding`]).
    fn alloc(len: usize) -> Self {
        recycle::note(len);
        if let Some((arena, off)) = recycle::carve(len) {
            return Self(Backing::Carved { arena, off, len });
        }
        Self(Backing::Own(recycle::fresh_map(len)))
    }
}

impl Drop for WeightBuf {
    fn drop(&mut self) {
        if let Backing::Own(map) = &self.0 {
            weight_memory::sub(map.len());
        }
    }
}

/// Bytes of weights held in memory by this process: packed weight buffers ([`WeightBuf`]) and
/// staging read buffers ([`StagingBytes`]), with a high-water mark. This is the memory a
/// `--mem-budget` governs, counted exactly (RSS also holds the KV cache, activations, logits,
/// the tokenizer and the allocator's slack).
pub mod weight_memory {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LIVE: AtomicU64 = AtomicU64::new(0);
    static PEAK: AtomicU64 = AtomicU64::new(0);
    pub(crate) fn add(n: usize) {
        let now = LIVE.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
    pub(crate) fn sub(n: usize) {
        LIVE.fetch_sub(n as u64, Ordering::Relaxed);
    }
    /// Weight bytes held now.
    pub fn live() -> u64 {
        LIVE.load(Ordering::Relaxed)
    }
    /// Highest [`live`] since the process started or the last [`reset_peak`].
    pub fn peak() -> u64 {
        PEAK.load(Ordering::Relaxed)
    }
    /// Restart the high-water mark from the bytes held now.
    pub fn reset_peak() {
        PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// A staging buffer for weight bytes read from storage (counted in [`weight_memory`]); its
/// allocation is recycled ([`recycle`]) while a pool is armed.
pub struct StagingBytes(Vec<u8>);

impl StagingBytes {
    /// `len` bytes to be overwritten by a read (zero, or old bytes of a recycled buffer), in a
    /// buffer of at least `size` bytes: a weight store gives every read its largest unit's
    /// size, so that any pooled buffer serves any read (a head chunk and a layer differ).
    pub fn for_read(len: usize, size: usize) -> Self {
        if let Some(mut v) = recycle::take_bytes(len) {
            // A recycled buffer keeps its length: shrinking writes nothing, growing zeroes
            // only the new tail (a read overwrites it all anyway).
            v.resize(len, 0);
            recycle::lend(v.capacity());
            return Self(v);
        }
        let cap = len.max(size);
        recycle::make_room(cap);
        let mut v = vec![0u8; cap];
        v.truncate(len);
        weight_memory::add(cap);
        recycle::lend(v.capacity());
        Self(v)
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

impl AsRef<[u8]> for StagingBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for StagingBytes {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.0);
        let cap = v.capacity();
        recycle::give_back(cap);
        if !recycle::keep(recycle::Buf::Bytes(v)) {
            weight_memory::sub(cap);
        }
    }
}

/// Recycling of streamed weight buffers.
///
/// A model streamed under a memory budget rebuilds the same units on every forward pass.
/// Allocating their buffers fresh cost more CPU than reading the bytes: page faults, the kernel
/// zeroing every new page and `munmap` on drop took ≈ 60 % of the storage thread's time on
/// SmolLM2-135M at a 25 % budget (perf), and that thread, not the storage device,
/// bounded a pass. So a streamed unit is built inside one **arena** ([`in_arena`]): every
/// matrix it repacks is carved from it, and when the unit's last matrix drops, the arena goes
/// back to a pool for the next unit; read buffers ([`StagingBytes`]) are pooled likewise. The
/// pool holds at most what live [`Reservation`]s allow (none by default: nothing is kept; when
/// the last weight store goes, its pooled buffers are freed), and a request it cannot serve
/// first frees idle buffers until those lent out, those pooled and the new one fit the cap
/// (`make_room`; not when the buffers in use alone exceed it, two passes streaming at once,
/// where freeing could not reach the cap). Arenas
/// and pooled buffers are counted in [`weight_memory`]: they are memory the process holds.
pub mod recycle {
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
}

impl std::ops::Deref for WeightBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Backing::Own(m) => m,
            // SAFETY: the range was carved for this buffer alone and lies inside the arena.
            Backing::Carved { arena, off, len } => unsafe { arena.slice(*off, *len) },
        }
    }
}

impl std::ops::DerefMut for WeightBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            Backing::Own(m) => m,
            // SAFETY: as above; `&mut self` makes this the range's only user.
            Backing::Carved { arena, off, len } => unsafe { arena.slice_mut(*off, *len) },
        }
    }
}

/// Packed kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// 4-bit values, f16 scale, offset −8·d (Q4_0).
    Q4D16,
    /// 4-bit values, f16 scale and f16 offset (Q4_1).
    Q4DM16,
    /// 4-bit values, f32 scale and f32 offset (Q4_K sub-blocks).
    Q4DM32,
    /// Signed 8-bit values, f16 scale (Q8_0).
    Q8D16,
}

impl Kind {
    fn is_q4(self) -> bool {
        self != Kind::Q8D16
    }
}

/// A weight matrix `[rows × cols]` (`rows` outputs, `cols` inputs), repacked for the kernels.
#[derive(Clone)]
pub struct QMatrix {
    ty: GgmlType,
    kind: Kind,
    rows: usize,
    cols: usize,
    /// Blocks of 32 per row.
    nb: usize,
    /// `nb` rounded up to 8 (scale arrays are padded to whole groups of 8 blocks).
    nbp: usize,
    /// Bytes of one packed row.
    stride: usize,
    data: Arc<WeightBuf>,
}

/// Errors building a [`QMatrix`].
#[derive(Debug, thiserror::Error)]
pub enum QMatrixError {
    #[error("type {0} has no quantized matmul kernel")]
    UnsupportedType(GgmlType),
    #[error("{ty} needs the input dimension to be a multiple of {block}, got {cols}")]
    BadCols {
        ty: GgmlType,
        block: usize,
        cols: usize,
    },
    #[error("expected {expected} bytes for a {rows}x{cols} {ty} matrix, have {have}")]
    BadLength {
        ty: GgmlType,
        rows: usize,
        cols: usize,
        expected: usize,
        have: usize,
    },
}

/// Packed layout of a `cols`-wide row of `ty`: kind, blocks, blocks rounded up to 2 (value
/// array) and to 8 (scale arrays), and the row's stride in bytes.
fn layout(ty: GgmlType, cols: usize) -> (Kind, usize, usize, usize, usize) {
    let kind = match ty {
        GgmlType::Q4_0 => Kind::Q4D16,
        GgmlType::Q4_1 => Kind::Q4DM16,
        GgmlType::Q4K => Kind::Q4DM32,
        _ => Kind::Q8D16,
    };
    let nb = cols / 32;
    let nbp = nb.next_multiple_of(8);
    let nbe = nb.next_multiple_of(2);
    let stride = match kind {
        Kind::Q4D16 => nbe * 16 + nbp * 2,
        Kind::Q4DM16 => nbe * 16 + nbp * 4,
        Kind::Q4DM32 => nbe * 16 + nbp * 8,
        Kind::Q8D16 => nb * 32 + nbp * 2,
    }
    .next_multiple_of(32);
    (kind, nb, nbe, nbp, stride)
}

/// Repack one GGML row `s` (`nb` blocks of the type `kind` packs) into the packed row `dst`
/// (layout of `kind`, module docs); every byte of `dst` is written.
fn repack_row(kind: Kind, nb: usize, nbe: usize, nbp: usize, s: &[u8], dst: &mut [u8]) {
    // Padding (block counts rounded up) must read as zero, and an arena holds old
    // bytes.
    zero_padding(kind, nb, nbe, nbp, dst);
    match kind {
        // Fixed-size copies (the block size as a constant): a streamed model repacks every
        // streamed layer on every pass; with runtime-length copies this loop repacked Q4_1 at
        // 5.2 GB/s instead of 6.0.
        Kind::Q4D16 => repack_q4::<18>(s, dst, nb, nbe, nbp, false),
        Kind::Q4DM16 => repack_q4::<20>(s, dst, nb, nbe, nbp, true),
        Kind::Q4DM32 => {
            let (qs, rest) = dst.split_at_mut(nbe * 16);
            for sb in 0..nb / 8 {
                let blk = &s[sb * 144..(sb + 1) * 144];
                let (d, dmin) = (h2f(blk, 0), h2f(blk, 2));
                for j in 0..8 {
                    let b = sb * 8 + j;
                    let (sc, mn) = q4k_scale_min(j, &blk[4..16]);
                    let q = &blk[16 + 32 * (j / 2)..16 + 32 * (j / 2) + 32];
                    let shift = 4 * (j % 2);
                    for l in 0..16 {
                        let lo = (q[l] >> shift) & 0xF;
                        let hi = (q[l + 16] >> shift) & 0xF;
                        qs[b * 16 + l] = lo | (hi << 4);
                    }
                    rest[4 * b..4 * b + 4].copy_from_slice(&(d * sc as f32).to_le_bytes());
                    let m = -(dmin * mn as f32);
                    rest[nbp * 4 + 4 * b..nbp * 4 + 4 * b + 4].copy_from_slice(&m.to_le_bytes());
                }
            }
        }
        Kind::Q8D16 => {
            let (qs, rest) = dst.split_at_mut(nb * 32);
            for b in 0..nb {
                let blk = &s[b * 34..(b + 1) * 34];
                qs[b * 32..b * 32 + 32].copy_from_slice(&blk[2..]);
                rest[2 * b..2 * b + 2].copy_from_slice(&blk[0..2]);
            }
        }
    }
}

/// Repack a row of `nb` 4-bit GGML blocks of `BB` bytes (scale, [offset,] 16 value bytes).
#[inline]
fn repack_q4<const BB: usize>(
    s: &[u8],
    dst: &mut [u8],
    nb: usize,
    nbe: usize,
    nbp: usize,
    offsets: bool,
) {
    let (qs, rest) = dst.split_at_mut(nbe * 16);
    let (scales, mins) = rest.split_at_mut(nbp * 2);
    let blocks = s.chunks_exact(BB).take(nb);
    for ((blk, q), sc) in blocks
        .clone()
        .zip(qs.chunks_exact_mut(16))
        .zip(scales.chunks_exact_mut(2))
    {
        q.copy_from_slice(&blk[BB - 16..BB]);
        sc.copy_from_slice(&blk[0..2]);
    }
    if offsets {
        for (blk, mn) in blocks.zip(mins.chunks_exact_mut(2)) {
            mn.copy_from_slice(&blk[2..4]);
        }
    }
}

/// Zero the bytes of a packed row that the repack does not write: values of the blocks past
/// `nb` (up to `nbe`), scales and offsets past `nb` (up to `nbp`), and the tail to the stride.
fn zero_padding(kind: Kind, nb: usize, nbe: usize, nbp: usize, row: &mut [u8]) {
    let (qbytes, sbytes, arrays) = match kind {
        Kind::Q4D16 => (nbe * 16, 2, 1),
        Kind::Q4DM16 => (nbe * 16, 2, 2),
        Kind::Q4DM32 => (nbe * 16, 4, 2),
        Kind::Q8D16 => (nb * 32, 2, 1),
    };
    let per_block = if kind.is_q4() { 16 } else { 32 };
    row[nb * per_block..qbytes].fill(0);
    for a in 0..arrays {
        let base = qbytes + a * nbp * sbytes;
        row[base + nb * sbytes..base + nbp * sbytes].fill(0);
    }
    row[qbytes + arrays * nbp * sbytes..].fill(0);
}

#[inline]
fn h2f(b: &[u8], o: usize) -> f32 {
    f16::from_le_bytes([b[o], b[o + 1]]).to_f32()
}

impl QMatrix {
    /// Types with a kernel.
    pub fn supports(ty: GgmlType) -> bool {
        matches!(
            ty,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 | GgmlType::Q4K
        )
    }

    /// Repack `owner[offset..]`, a `rows × cols` matrix of type `ty` in GGML layout.
    pub fn new(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        owner: ByteOwner,
        offset: usize,
    ) -> Result<Self, QMatrixError> {
        Self::new_stacked(ty, cols, &[(rows, owner, offset)])
    }

    /// Repack several matrices of type `ty` and width `cols` (`(rows, owner, offset)` each,
    /// GGML layout) into one, rows appended in order: the fused q/k/v and gate/up projections,
    /// built in one buffer without first packing the parts (a streamed layer is rebuilt every
    /// pass, so the parts' copies would cost memory and time every pass).
    pub fn new_stacked(
        ty: GgmlType,
        cols: usize,
        parts: &[(usize, ByteOwner, usize)],
    ) -> Result<Self, QMatrixError> {
        if !Self::supports(ty) {
            return Err(QMatrixError::UnsupportedType(ty));
        }
        if !cols.is_multiple_of(ty.block_elems()) || cols == 0 {
            return Err(QMatrixError::BadCols {
                ty,
                block: ty.block_elems(),
                cols,
            });
        }
        let src_row = cols / ty.block_elems() * ty.block_bytes();
        let mut srcs: Vec<&[u8]> = Vec::with_capacity(parts.len());
        for (rows, owner, offset) in parts {
            let (rows, offset) = (*rows, *offset);
            let expected = rows * src_row;
            let all: &[u8] = (**owner).as_ref();
            let have = all.len().saturating_sub(offset);
            if have < expected {
                return Err(QMatrixError::BadLength {
                    ty,
                    rows,
                    cols,
                    expected,
                    have,
                });
            }
            srcs.push(&all[offset..offset + expected]);
        }
        let rows: usize = parts.iter().map(|p| p.0).sum();
        let (kind, nb, nbe, nbp, stride) = layout(ty, cols);
        let src_rows = srcs.iter().flat_map(|s| s.chunks_exact(src_row));
        let mut data = WeightBuf::alloc(rows * stride);
        for (dst, s) in data.chunks_exact_mut(stride).zip(src_rows) {
            repack_row(kind, nb, nbe, nbp, s, dst);
        }
        Ok(Self {
            ty,
            kind,
            rows,
            cols,
            nb,
            nbp,
            stride,
            data: Arc::new(data),
        })
    }

    /// Quantize a dense row-major `rows × cols` f32 matrix.
    pub fn quantize(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        w: &[f32],
    ) -> Result<Self, QMatrixError> {
        assert_eq!(w.len(), rows * cols);
        if !Self::supports(ty) {
            return Err(QMatrixError::UnsupportedType(ty));
        }
        if !cols.is_multiple_of(ty.block_elems()) {
            return Err(QMatrixError::BadCols {
                ty,
                block: ty.block_elems(),
                cols,
            });
        }
        let bytes = crate::dequant::quantize(ty, w).ok_or(QMatrixError::UnsupportedType(ty))?;
        Self::new(ty, rows, cols, Arc::new(bytes), 0)
    }

    /// Stack matrices with the same type and width into one (rows appended in order), so that
    /// projections reading the same input (q/k/v, gate/up) run as one kernel call.
    pub fn concat_rows(parts: &[&QMatrix]) -> Option<QMatrix> {
        let first = parts.first()?;
        if parts
            .iter()
            .any(|p| p.kind != first.kind || p.cols != first.cols || p.stride != first.stride)
        {
            return None;
        }
        let mut data = WeightBuf::alloc(parts.iter().map(|p| p.data.len()).sum());
        let mut o = 0;
        for p in parts {
            data[o..o + p.data.len()].copy_from_slice(&p.data);
            o += p.data.len();
        }
        Some(QMatrix {
            rows: parts.iter().map(|p| p.rows).sum(),
            data: Arc::new(data),
            ..(*first).clone()
        })
    }

    /// The stored (GGUF) type.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Bytes the kernel reads per application (the packed matrix).
    pub fn stored_bytes(&self) -> usize {
        self.data.len()
    }
    fn row(&self, r: usize) -> &[u8] {
        &self.data[r * self.stride..(r + 1) * self.stride]
    }

    /// (scale, offset) of block `b` of a packed row, and its integer values.
    fn block(&self, row: &[u8], b: usize, q: &mut [i32; 32]) -> (f32, f32) {
        let nbe = self.nb.next_multiple_of(2);
        match self.kind {
            Kind::Q8D16 => {
                for (l, v) in q.iter_mut().enumerate() {
                    *v = row[b * 32 + l] as i8 as i32;
                }
                (h2f(row, self.nb * 32 + 2 * b), 0.0)
            }
            k => {
                for l in 0..16 {
                    q[l] = (row[b * 16 + l] & 0xF) as i32;
                    q[l + 16] = (row[b * 16 + l] >> 4) as i32;
                }
                let o = nbe * 16;
                match k {
                    Kind::Q4D16 => {
                        let d = h2f(row, o + 2 * b);
                        (d, -8.0 * d)
                    }
                    Kind::Q4DM16 => (h2f(row, o + 2 * b), h2f(row, o + 2 * self.nbp + 2 * b)),
                    _ => {
                        let f = |p: usize| {
                            f32::from_le_bytes([row[p], row[p + 1], row[p + 2], row[p + 3]])
                        };
                        (f(o + 4 * b), f(o + 4 * self.nbp + 4 * b))
                    }
                }
            }
        }
    }

    /// Dequantize row `r` into `out` (length `cols`).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let row = self.row(r);
        let mut q = [0i32; 32];
        for b in 0..self.nb {
            let (d, m) = self.block(row, b, &mut q);
            for l in 0..32 {
                out[b * 32 + l] = d * q[l] as f32 + m;
            }
        }
    }

    /// The activation layout this matrix's kernel reads.
    pub fn act_layout(&self) -> ActLayout {
        if self.kind.is_q4() {
            ActLayout::Paired
        } else {
            ActLayout::Plain
        }
    }

    /// `out[M×rows] = x[M×cols] · selfᵀ`.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) {
        let acts = QuantizedActs::quantize(x, m, self.cols, self.act_layout());
        self.matmul_q(&acts, out)
    }

    /// Same as [`QMatrix::matmul`] with activations already quantized (share them across the
    /// matrices that read the same input and want the same layout).
    pub fn matmul_q(&self, x: &QuantizedActs, out: &mut [f32]) {
        assert_eq!(x.k, self.cols, "matmul: inner dimensions differ");
        assert_eq!(
            x.layout,
            self.act_layout(),
            "matmul: activation layout mismatch"
        );
        assert_eq!(
            out.len(),
            x.m * self.rows,
            "matmul: output has the wrong size"
        );
        let n = self.rows;
        let threads = rayon::current_num_threads().max(1);
        let work = x.m * n * self.cols;
        // Few tasks per thread for load balance; each a whole number of 4-row tiles.
        let chunk = n.div_ceil(threads * 3).next_multiple_of(4).max(4);
        let out_ptr = SendPtr(out.as_mut_ptr());
        let run = |c0: usize| {
            let c1 = (c0 + chunk).min(n);
            // SAFETY: chunks write disjoint column ranges [c0, c1) of `out`.
            unsafe { self.range(x, c0, c1, out_ptr) };
        };
        if threads == 1 || work < 1 << 15 {
            run_serial(n, chunk, run);
        } else {
            (0..n.div_ceil(chunk))
                .into_par_iter()
                .for_each(|i| run(i * chunk));
        }
    }

    /// Output columns `[n0, n1)` for all activation rows.
    ///
    /// # Safety
    /// `out` points to an `x.m × self.rows` buffer; no other thread writes columns `[n0, n1)`.
    unsafe fn range(&self, x: &QuantizedActs, n0: usize, n1: usize, out: SendPtr) {
        self.range_on(isa(), x, n0, n1, out)
    }

    /// [`Self::range`] on `isa`, which the CPU must support ([`best_isa`] or a lesser one).
    ///
    /// # Safety
    /// As [`Self::range`].
    unsafe fn range_on(&self, isa: Isa, x: &QuantizedActs, n0: usize, n1: usize, out: SendPtr) {
        #[cfg(target_arch = "x86_64")]
        {
            match isa {
                Isa::Avx512Vnni => {
                    match self.kind {
                        Kind::Q4D16 => simd512::range4::<0>(self, x, n0, n1, out.0),
                        Kind::Q4DM16 => simd512::range4::<1>(self, x, n0, n1, out.0),
                        Kind::Q4DM32 => simd512::range4::<2>(self, x, n0, n1, out.0),
                        Kind::Q8D16 => simd512::range8(self, x, n0, n1, out.0),
                    }
                    return;
                }
                Isa::Avx2 => {
                    match self.kind {
                        Kind::Q4D16 => simd::range4::<0>(self, x, n0, n1, out.0),
                        Kind::Q4DM16 => simd::range4::<1>(self, x, n0, n1, out.0),
                        Kind::Q4DM32 => simd::range4::<2>(self, x, n0, n1, out.0),
                        Kind::Q8D16 => simd::range8(self, x, n0, n1, out.0),
                    }
                    return;
                }
                Isa::Portable => {}
            }
        }
        portable_range(self, x, n0, n1, out.0)
    }
}

fn run_serial(n: usize, chunk: usize, run: impl Fn(usize)) {
    (0..n).step_by(chunk).for_each(run)
}

/// Instruction set the quantized kernels run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// 512-bit registers and `vpdpbusd` (AVX-512 F/BW/VNNI: Intel Ice Lake and later, AMD Zen 4
    /// and later).
    Avx512Vnni,
    /// 256-bit registers, `vpmaddubsw` + `vpmaddwd` (AVX2/FMA/F16C).
    Avx2,
    /// Scalar Rust, the same integer sums (other CPUs).
    Portable,
}

impl Isa {
    /// The name `LLADA_KERNEL_ISA` and the benchmarks use.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512Vnni => "avx512-vnni",
            Isa::Avx2 => "avx2",
            Isa::Portable => "portable",
        }
    }
    fn code(self) -> u8 {
        self as u8 + 1
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The [`Isa`] in use as `1 + ` its index; 0 until the first call decides.
static ISA: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// The best instruction set this CPU offers the kernels.
pub fn best_isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if simd512::available() {
            return Isa::Avx512Vnni;
        }
        if simd::available() {
            return Isa::Avx2;
        }
    }
    Isa::Portable
}

/// The instruction set the kernels use: AVX2 where the CPU has it (else portable), unless the
/// environment variable `LLADA_KERNEL_ISA` (`avx512-vnni`, `avx2`, `portable`) or [`set_isa`]
/// asks for another; a request the CPU cannot serve falls back to the best it has.
///
/// AVX-512 VNNI is opt-in: on batched passes it is faster (prefill ≈ 1.17x, Q8_0 at M ≥ 8
/// 1.4–2.0x), but on one-row decoding of SmolLM2's shapes it is slower (the 49 152 × 576 Q8_0
/// head 1.0–1.25 ms against 0.54–0.86 with AVX2, docs/kernels.md), and a process must use one
/// path for every pass: a tree verification has to reproduce one-row decoding bit for bit, and
/// the two paths round differently.
pub fn isa() -> Isa {
    use std::sync::atomic::Ordering;
    match ISA.load(Ordering::Relaxed) {
        1 => Isa::Avx512Vnni,
        2 => Isa::Avx2,
        3 => Isa::Portable,
        _ => set_isa(match std::env::var("LLADA_KERNEL_ISA").as_deref() {
            Ok("avx512-vnni") | Ok("avx512") => Isa::Avx512Vnni,
            Ok("portable") => Isa::Portable,
            Ok("avx2") | Ok("") | Err(_) => Isa::Avx2,
            Ok(other) => {
                eprintln!(
                    "warning: LLADA_KERNEL_ISA={other:?} is not avx512-vnni, avx2 or portable; \
                     using avx2"
                );
                Isa::Avx2
            }
        }),
    }
}

/// Run the kernels on `wanted`, or on the best this CPU offers where it lacks `wanted`; returns
/// the one chosen. Process-wide, and meant to be called before any matmul: passes computed on
/// two paths round differently, and a tree verification must reproduce one-row decoding bit
/// for bit (benchmarks switch between whole runs).
pub fn set_isa(wanted: Isa) -> Isa {
    let chosen = wanted.max(best_isa());
    ISA.store(chosen.code(), std::sync::atomic::Ordering::Relaxed);
    chosen
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

/// Byte order of quantized activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActLayout {
    /// Blocks in order, 32 values each (8-bit weights).
    Plain,
    /// Pairs of blocks (A, B) stored as `A0..15 B0..15 A16..31 B16..31` (4-bit weights); an odd
    /// last block is paired with a zero block.
    Paired,
}

/// Activations quantized to 8-bit blocks of 32: `x[i, 32b + l] ≈ d[i, b] · q[i, 32b + l]`.
/// Per row, `d` and `s = d·Σq` are padded with zeros to a multiple of 8 blocks.
pub struct QuantizedActs {
    pub m: usize,
    pub k: usize,
    pub layout: ActLayout,
    /// Bytes of `qs` per row.
    pub qstride: usize,
    /// Blocks per row of `d` / `s` (padded).
    pub nbp: usize,
    pub qs: Vec<i8>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
}

impl QuantizedActs {
    /// Quantize a row-major `m × k` matrix (`k` a multiple of 32).
    pub fn quantize(x: &[f32], m: usize, k: usize, layout: ActLayout) -> Self {
        assert_eq!(x.len(), m * k);
        assert!(
            k.is_multiple_of(32),
            "activation width must be a multiple of 32"
        );
        let nb = k / 32;
        let nbp = nb.next_multiple_of(8);
        let qstride = match layout {
            ActLayout::Plain => k,
            ActLayout::Paired => nb.next_multiple_of(2) * 32,
        };
        let mut qs = vec![0i8; m * qstride];
        let mut d = vec![0f32; m * nbp];
        let mut s = vec![0f32; m * nbp];
        let mut tmp = [0i8; 32];
        for i in 0..m {
            for b in 0..nb {
                let xb = &x[i * k + b * 32..i * k + b * 32 + 32];
                let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
                let dd = amax / 127.0;
                let id = if dd > 0.0 { 1.0 / dd } else { 0.0 };
                let mut sum = 0i32;
                for (q, v) in tmp.iter_mut().zip(xb) {
                    // Round half away from zero without a libm call (|v·id| ≤ 127).
                    let y = v * id;
                    let qi = (y + 0.5f32.copysign(y)) as i32;
                    *q = qi as i8;
                    sum += qi;
                }
                d[i * nbp + b] = dd;
                s[i * nbp + b] = dd * sum as f32;
                let row = &mut qs[i * qstride..(i + 1) * qstride];
                match layout {
                    ActLayout::Plain => row[b * 32..b * 32 + 32].copy_from_slice(&tmp),
                    ActLayout::Paired => {
                        let base = (b / 2) * 64 + (b % 2) * 16;
                        row[base..base + 16].copy_from_slice(&tmp[..16]);
                        row[base + 32..base + 48].copy_from_slice(&tmp[16..]);
                    }
                }
            }
        }
        Self {
            m,
            k,
            layout,
            qstride,
            nbp,
            qs,
            d,
            s,
        }
    }

    /// Value `l` (0..32) of block `b` of row `i`.
    fn q(&self, i: usize, b: usize, l: usize) -> i32 {
        let row = &self.qs[i * self.qstride..];
        (match self.layout {
            ActLayout::Plain => row[b * 32 + l],
            ActLayout::Paired => row[(b / 2) * 64 + (b % 2) * 16 + (l / 16) * 32 + l % 16],
        }) as i32
    }
}

/// Portable path: the same integer sums, one block at a time.
unsafe fn portable_range(w: &QMatrix, x: &QuantizedActs, n0: usize, n1: usize, out: *mut f32) {
    let mut q = [0i32; 32];
    for n in n0..n1 {
        let row = w.row(n);
        for i in 0..x.m {
            let mut acc = 0f32;
            for b in 0..w.nb {
                let (scale, offset) = w.block(row, b, &mut q);
                let dot: i32 = (0..32).map(|l| q[l] * x.q(i, b, l)).sum();
                acc += scale * x.d[i * x.nbp + b] * dot as f32 + offset * x.s[i * x.nbp + b];
            }
            *out.add(i * w.rows + n) = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
/// Weight rows per cache block: a block of rows stays in L2 while all activation rows pass.
const ROW_BLOCK: usize = 32;

/// The loop over a range of output columns shared by the SIMD kernels: blocks of
/// [`ROW_BLOCK`] weight rows, register tiles of up to 4 activation rows, `prefetch_rows` and
/// the tile function `$tile::<NR, MR>` taken from the calling module.
#[cfg(target_arch = "x86_64")]
macro_rules! drive {
    ($w:expr, $x:expr, $n0:expr, $n1:expr, $out:expr, $tile:ident $(::<$t:ident>)?) => {{
        let (w, x, n0, n1, out) = ($w, $x, $n0, $n1, $out);
        let mut nb0 = n0;
        while nb0 < n1 {
            let nb1 = (nb0 + ROW_BLOCK).min(n1);
            let mut i = 0;
            while i < x.m {
                let mr = (x.m - i).min(4);
                let mut n = nb0;
                if mr == 1 {
                    while n + 4 <= nb1 {
                        // Decoding streams each row once: fetch rows four tiles ahead so
                        // short rows (K ≈ 600) do not each pay a DRAM round trip.
                        prefetch_rows(w, n + 16, 4);
                        $tile::<$($t,)? 4, 1>(w, x, n, i, out);
                        n += 4;
                    }
                } else {
                    while n + 2 <= nb1 {
                        match mr {
                            4 => $tile::<$($t,)? 2, 4>(w, x, n, i, out),
                            3 => $tile::<$($t,)? 2, 3>(w, x, n, i, out),
                            _ => $tile::<$($t,)? 2, 2>(w, x, n, i, out),
                        }
                        n += 2;
                    }
                }
                while n < nb1 {
                    match mr {
                        4 => $tile::<$($t,)? 1, 4>(w, x, n, i, out),
                        3 => $tile::<$($t,)? 1, 3>(w, x, n, i, out),
                        2 => $tile::<$($t,)? 1, 2>(w, x, n, i, out),
                        _ => $tile::<$($t,)? 1, 1>(w, x, n, i, out),
                    }
                    n += 1;
                }
                i += mr;
            }
            nb0 = nb1;
        }
    }};
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // register tiles read clearer as indexed loops
mod simd {
    use super::{QMatrix, QuantizedActs, ROW_BLOCK};
    use std::arch::x86_64::*;

    pub fn available() -> bool {
        use std::sync::OnceLock;
        static OK: OnceLock<bool> = OnceLock::new();
        *OK.get_or_init(|| {
            is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
        })
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// Load 8 scales (f16 or f32) starting at `p`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn load8(p: *const u8, f32_scales: bool) -> __m256 {
        if f32_scales {
            _mm256_loadu_ps(p as *const f32)
        } else {
            _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
        }
    }

    /// 4-bit tile. T: 0 = f16 d with offset −8d; 1 = f16 d, m; 2 = f32 d, m.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile4<const T: u8, const NR: usize, const MR: usize>(
        w: &QMatrix,
        x: &QuantizedActs,
        n: usize,
        i: usize,
        out: *mut f32,
    ) {
        let nbe = w.nb.next_multiple_of(2);
        let sb = if T == 2 { 4 } else { 2 };
        let base = w.data.as_ptr().add(n * w.stride);
        let ones = _mm256_set1_epi16(1);
        let m4 = _mm256_set1_epi8(0x0F);
        let mut acc = [[_mm256_setzero_ps(); MR]; NR];
        for g in 0..w.nbp / 8 {
            // Offset term of 8 blocks: one FMA per (row, activation row).
            let mut dv = [_mm256_setzero_ps(); NR];
            for r in 0..NR {
                let row = base.add(r * w.stride);
                dv[r] = load8(row.add(nbe * 16 + g * 8 * sb), T == 2);
                let mv = if T == 0 {
                    _mm256_mul_ps(dv[r], _mm256_set1_ps(-8.0))
                } else {
                    load8(row.add(nbe * 16 + w.nbp * sb + g * 8 * sb), T == 2)
                };
                for c in 0..MR {
                    let sx = _mm256_loadu_ps(x.s.as_ptr().add((i + c) * x.nbp + g * 8));
                    acc[r][c] = _mm256_fmadd_ps(mv, sx, acc[r][c]);
                }
            }
            let mut dx = [_mm256_setzero_ps(); MR];
            for c in 0..MR {
                dx[c] = _mm256_loadu_ps(x.d.as_ptr().add((i + c) * x.nbp + g * 8));
            }
            for p in 0..4 {
                let b = g * 8 + 2 * p;
                if b >= nbe {
                    break;
                }
                // Lanes 0-3 take block b's scale, lanes 4-7 block b+1's.
                let idx = _mm256_setr_epi32(
                    2 * p as i32,
                    2 * p as i32,
                    2 * p as i32,
                    2 * p as i32,
                    2 * p as i32 + 1,
                    2 * p as i32 + 1,
                    2 * p as i32 + 1,
                    2 * p as i32 + 1,
                );
                for r in 0..NR {
                    let qv = _mm256_loadu_si256(base.add(r * w.stride + b * 16) as *const __m256i);
                    let lo = _mm256_and_si256(qv, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(qv, 4), m4);
                    let sw = _mm256_permutevar8x32_ps(dv[r], idx);
                    for c in 0..MR {
                        let xp = x.qs.as_ptr().add((i + c) * x.qstride + b * 32);
                        let xlo = _mm256_loadu_si256(xp as *const __m256i);
                        let xhi = _mm256_loadu_si256(xp.add(32) as *const __m256i);
                        let s16 = _mm256_add_epi16(
                            _mm256_maddubs_epi16(lo, xlo),
                            _mm256_maddubs_epi16(hi, xhi),
                        );
                        let f = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, ones));
                        let sc = _mm256_mul_ps(sw, _mm256_permutevar8x32_ps(dx[c], idx));
                        acc[r][c] = _mm256_fmadd_ps(f, sc, acc[r][c]);
                    }
                }
            }
        }
        for r in 0..NR {
            for c in 0..MR {
                *out.add((i + c) * w.rows + n + r) = hsum(acc[r][c]);
            }
        }
    }

    /// 8-bit tile (Q8_0): sign trick, one block at a time.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile8<const NR: usize, const MR: usize>(
        w: &QMatrix,
        x: &QuantizedActs,
        n: usize,
        i: usize,
        out: *mut f32,
    ) {
        let base = w.data.as_ptr().add(n * w.stride);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); MR]; NR];
        for g in 0..w.nbp / 8 {
            let mut dv = [_mm256_setzero_ps(); NR];
            for r in 0..NR {
                dv[r] = load8(base.add(r * w.stride + w.nb * 32 + g * 16), false);
            }
            for j in 0..8 {
                let b = g * 8 + j;
                if b >= w.nb {
                    break;
                }
                let idx = _mm256_set1_epi32(j as i32);
                for r in 0..NR {
                    let wv = _mm256_loadu_si256(base.add(r * w.stride + b * 32) as *const __m256i);
                    let aw = _mm256_sign_epi8(wv, wv);
                    let sw = _mm256_permutevar8x32_ps(dv[r], idx);
                    for c in 0..MR {
                        let xv = _mm256_loadu_si256(
                            x.qs.as_ptr().add((i + c) * x.qstride + b * 32) as *const __m256i,
                        );
                        let xs = _mm256_sign_epi8(xv, wv);
                        let f = _mm256_cvtepi32_ps(_mm256_madd_epi16(
                            _mm256_maddubs_epi16(aw, xs),
                            ones,
                        ));
                        let sc = _mm256_mul_ps(
                            sw,
                            _mm256_broadcast_ss(&*x.d.as_ptr().add((i + c) * x.nbp + b)),
                        );
                        acc[r][c] = _mm256_fmadd_ps(f, sc, acc[r][c]);
                    }
                }
            }
        }
        for r in 0..NR {
            for c in 0..MR {
                *out.add((i + c) * w.rows + n + r) = hsum(acc[r][c]);
            }
        }
    }

    /// Prefetch `count` packed rows starting at `row` (clamped to the matrix) into L1/L2.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn prefetch_rows(w: &QMatrix, row: usize, count: usize) {
        let end = (row + count).min(w.rows);
        if row >= end {
            return;
        }
        let p = w.data.as_ptr().add(row * w.stride);
        let bytes = (end - row) * w.stride;
        let mut o = 0;
        while o < bytes {
            _mm_prefetch(p.add(o) as *const i8, _MM_HINT_T0);
            o += 64;
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn range4<const T: u8>(
        w: &QMatrix,
        x: &QuantizedActs,
        n0: usize,
        n1: usize,
        out: *mut f32,
    ) {
        drive!(w, x, n0, n1, out, tile4::<T>)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn range8(w: &QMatrix, x: &QuantizedActs, n0: usize, n1: usize, out: *mut f32) {
        drive!(w, x, n0, n1, out, tile8)
    }
}

/// AVX-512 VNNI kernels: the same packed layouts and the same integer sums as [`simd`], with
/// 512-bit registers and `vpdpbusd` (unsigned × signed bytes, summed in fours into 32-bit
/// lanes: one instruction where AVX2 needs `vpmaddubsw` + `vpmaddwd`). A 4-bit pair of blocks
/// (32 bytes) becomes one register — low nibbles in the lower half, high nibbles in the upper —
/// against the pair's 64 activation bytes; a Q8_0 register holds two blocks, its signed values
/// read as `w + 128` (what `vpdpbusd` multiplies) with `128 · d_w · d_x · Σq_x` taken off per
/// block through the same 8-block FMA that applies the 4-bit offsets. Per weight row, activation
/// row and 64 products: load, `vpdpbusd`, convert, scale, FMA — where the AVX2 kernels issue
/// 10 (4-bit) and 16 (8-bit) instructions. candle-core 0.11 has a VNNI kernel for Q8_0 and
/// Q4_K only, on its own tiled layout; ours keeps the per-row layout the weight store streams
/// and repacks into.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // register tiles read clearer as indexed loops
mod simd512 {
    use super::simd::{load8, prefetch_rows};
    use super::{QMatrix, QuantizedActs, ROW_BLOCK};
    use std::arch::x86_64::*;

    pub fn available() -> bool {
        use std::sync::OnceLock;
        static OK: OnceLock<bool> = OnceLock::new();
        *OK.get_or_init(|| {
            super::simd::available()
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vnni")
        })
    }

    /// Lanes 0–7 of `v` (the rest zero) as a 512-bit register.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    unsafe fn wide(v: __m256) -> __m512 {
        _mm512_zextps256_ps512(v)
    }

    /// 4-bit tile. T: 0 = f16 d with offset −8d; 1 = f16 d, m; 2 = f32 d, m.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    unsafe fn tile4<const T: u8, const NR: usize, const MR: usize>(
        w: &QMatrix,
        x: &QuantizedActs,
        n: usize,
        i: usize,
        out: *mut f32,
    ) {
        let nbe = w.nb.next_multiple_of(2);
        let sb = if T == 2 { 4 } else { 2 };
        let base = w.data.as_ptr().add(n * w.stride);
        let m4 = _mm512_set1_epi8(0x0F);
        // Shift counts of the 16-bit lanes: 0 in the lower half (low nibbles), 4 in the upper.
        let shifts = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
        let mut acc = [[_mm512_setzero_ps(); MR]; NR];
        for g in 0..w.nbp / 8 {
            // Offset term of 8 blocks: one FMA per (row, activation row), in lanes 0–7.
            let mut dv = [_mm512_setzero_ps(); NR];
            for r in 0..NR {
                let row = base.add(r * w.stride);
                let d8 = load8(row.add(nbe * 16 + g * 8 * sb), T == 2);
                dv[r] = wide(d8);
                let mv = if T == 0 {
                    _mm256_mul_ps(d8, _mm256_set1_ps(-8.0))
                } else {
                    load8(row.add(nbe * 16 + w.nbp * sb + g * 8 * sb), T == 2)
                };
                for c in 0..MR {
                    let sx = _mm256_loadu_ps(x.s.as_ptr().add((i + c) * x.nbp + g * 8));
                    acc[r][c] = _mm512_fmadd_ps(wide(mv), wide(sx), acc[r][c]);
                }
            }
            let mut dx = [_mm512_setzero_ps(); MR];
            for c in 0..MR {
                dx[c] = wide(_mm256_loadu_ps(x.d.as_ptr().add((i + c) * x.nbp + g * 8)));
            }
            for p in 0..4 {
                let b = g * 8 + 2 * p;
                if b >= nbe {
                    break;
                }
                // Lanes 0–3 and 8–11 hold block b's sums (its values 0–15, then 16–31),
                // lanes 4–7 and 12–15 block b + 1's.
                let (a0, a1) = (2 * p as i32, 2 * p as i32 + 1);
                let idx = _mm512_setr_epi32(
                    a0, a0, a0, a0, a1, a1, a1, a1, a0, a0, a0, a0, a1, a1, a1, a1,
                );
                let mut xv = [_mm512_setzero_si512(); MR];
                let mut sx = [_mm512_setzero_ps(); MR];
                for c in 0..MR {
                    xv[c] = _mm512_loadu_si512(
                        x.qs.as_ptr().add((i + c) * x.qstride + b * 32) as *const _
                    );
                    sx[c] = _mm512_permutexvar_ps(idx, dx[c]);
                }
                for r in 0..NR {
                    let q = _mm256_loadu_si256(base.add(r * w.stride + b * 16) as *const __m256i);
                    let wv =
                        _mm512_and_si512(_mm512_srlv_epi16(_mm512_broadcast_i64x4(q), shifts), m4);
                    let sw = _mm512_permutexvar_ps(idx, dv[r]);
                    for c in 0..MR {
                        let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, xv[c]);
                        let sc = _mm512_mul_ps(sw, sx[c]);
                        acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sc, acc[r][c]);
                    }
                }
            }
        }
        for r in 0..NR {
            for c in 0..MR {
                *out.add((i + c) * w.rows + n + r) = _mm512_reduce_add_ps(acc[r][c]);
            }
        }
    }

    /// The lower 32 of a register's 64 bytes: one Q8_0 block.
    const LOW32: __mmask64 = 0xFFFF_FFFF;

    /// 8-bit tile (Q8_0): two blocks per register, values read as `w + 128`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    unsafe fn tile8<const NR: usize, const MR: usize>(
        w: &QMatrix,
        x: &QuantizedActs,
        n: usize,
        i: usize,
        out: *mut f32,
    ) {
        let base = w.data.as_ptr().add(n * w.stride);
        let flip = _mm512_set1_epi8(i8::MIN);
        let mut acc = [[_mm512_setzero_ps(); MR]; NR];
        for g in 0..w.nbp / 8 {
            // −128 · d_w · (d_x · Σq_x) of 8 blocks: one FMA per (row, activation row).
            let mut dv = [_mm512_setzero_ps(); NR];
            for r in 0..NR {
                let d8 = load8(base.add(r * w.stride + w.nb * 32 + g * 16), false);
                dv[r] = wide(d8);
                let mv = _mm256_mul_ps(d8, _mm256_set1_ps(-128.0));
                for c in 0..MR {
                    let sx = _mm256_loadu_ps(x.s.as_ptr().add((i + c) * x.nbp + g * 8));
                    acc[r][c] = _mm512_fmadd_ps(wide(mv), wide(sx), acc[r][c]);
                }
            }
            let mut dx = [_mm512_setzero_ps(); MR];
            for c in 0..MR {
                dx[c] = wide(_mm256_loadu_ps(x.d.as_ptr().add((i + c) * x.nbp + g * 8)));
            }
            for p in 0..4 {
                let b = g * 8 + 2 * p;
                if b >= w.nb {
                    break;
                }
                // An odd last block loads only its own 32 bytes (the masked bytes read as 0
                // and are never touched in memory); its partner's scale is padding, 0.
                let two = b + 1 < w.nb;
                let (a0, a1) = (2 * p as i32, 2 * p as i32 + 1);
                let idx = _mm512_setr_epi32(
                    a0, a0, a0, a0, a0, a0, a0, a0, a1, a1, a1, a1, a1, a1, a1, a1,
                );
                let mut xv = [_mm512_setzero_si512(); MR];
                let mut sx = [_mm512_setzero_ps(); MR];
                for c in 0..MR {
                    let xp = x.qs.as_ptr().add((i + c) * x.qstride + b * 32);
                    xv[c] = if two {
                        _mm512_loadu_si512(xp as *const _)
                    } else {
                        _mm512_maskz_loadu_epi8(LOW32, xp)
                    };
                    sx[c] = _mm512_permutexvar_ps(idx, dx[c]);
                }
                for r in 0..NR {
                    let wp = base.add(r * w.stride + b * 32);
                    let wq = if two {
                        _mm512_loadu_si512(wp as *const _)
                    } else {
                        _mm512_maskz_loadu_epi8(LOW32, wp as *const i8)
                    };
                    let wu = _mm512_xor_si512(wq, flip);
                    let sw = _mm512_permutexvar_ps(idx, dv[r]);
                    for c in 0..MR {
                        let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wu, xv[c]);
                        let sc = _mm512_mul_ps(sw, sx[c]);
                        acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sc, acc[r][c]);
                    }
                }
            }
        }
        for r in 0..NR {
            for c in 0..MR {
                *out.add((i + c) * w.rows + n + r) = _mm512_reduce_add_ps(acc[r][c]);
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn range4<const T: u8>(
        w: &QMatrix,
        x: &QuantizedActs,
        n0: usize,
        n1: usize,
        out: *mut f32,
    ) {
        drive!(w, x, n0, n1, out, tile4::<T>)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn range8(w: &QMatrix, x: &QuantizedActs, n0: usize, n1: usize, out: *mut f32) {
        drive!(w, x, n0, n1, out, tile8)
    }
}

/// Plain f32 matmul `out[M×N] = x[M×K] · w[N×K]ᵀ` (reference for tests).
pub fn matmul_f32(x: &[f32], m: usize, k: usize, w: &[f32], n: usize, out: &mut [f32]) {
    assert_eq!(x.len(), m * k);
    assert_eq!(w.len(), n * k);
    assert_eq!(out.len(), m * n);
    for i in 0..m {
        let xr = &x[i * k..(i + 1) * k];
        for j in 0..n {
            let wr = &w[j * k..(j + 1) * k];
            out[i * n + j] = xr.iter().zip(wr).map(|(a, b)| a * b).sum();
        }
    }
}

/// Dequantize a GGML-layout row (re-exported for callers that hold raw bytes).
pub fn dequantize_raw(ty: GgmlType, src: &[u8], out: &mut [f32]) {
    dequantize(ty, src, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn random_quantized(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let w: Vec<f32> = (0..rows * cols)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        crate::dequant::quantize(ty, &w).unwrap()
    }

    #[test]
    fn repacked_rows_ignore_old_bytes() {
        // Widths whose block counts need padding (3 blocks: values padded to 4, scales to 8);
        // Q4_K comes in whole super-blocks.
        for (ty, cols) in [
            (GgmlType::Q4_0, 96),
            (GgmlType::Q4_1, 96),
            (GgmlType::Q8_0, 96),
            (GgmlType::Q4K, 256),
        ] {
            let raw = random_quantized(ty, 1, cols, 3);
            let (kind, nb, nbe, nbp, stride) = layout(ty, cols);
            let mut clean = vec![0u8; stride];
            let mut dirty = vec![0xA5u8; stride];
            repack_row(kind, nb, nbe, nbp, &raw, &mut clean);
            repack_row(kind, nb, nbe, nbp, &raw, &mut dirty);
            assert_eq!(clean, dirty, "{ty}: a recycled buffer's old bytes leaked");
        }
    }

    #[test]
    fn stacked_repack_equals_concatenated_parts() {
        for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
            let (a, b) = (
                random_quantized(ty, 5, 96, 1),
                random_quantized(ty, 3, 96, 2),
            );
            let (a, b): (ByteOwner, ByteOwner) = (Arc::new(a), Arc::new(b));
            let qa = QMatrix::new(ty, 5, 96, a.clone(), 0).unwrap();
            let qb = QMatrix::new(ty, 3, 96, b.clone(), 0).unwrap();
            let cat = QMatrix::concat_rows(&[&qa, &qb]).unwrap();
            let st = QMatrix::new_stacked(ty, 96, &[(5, a, 0), (3, b, 0)]).unwrap();
            assert_eq!(st.rows(), 8);
            assert_eq!(&st.data[..], &cat.data[..]);
        }
        // A part shorter than its rows say is an error, not a panic.
        let short: ByteOwner = Arc::new(vec![0u8; 10]);
        assert!(QMatrix::new_stacked(GgmlType::Q8_0, 32, &[(2, short, 0)]).is_err());
    }

    #[test]
    fn arenas_are_recycled_and_stay_counted() {
        // A size no other test uses, so the pooled arena is this test's.
        const N: usize = 3 * 4096 + 64 * 7;
        let _pool = recycle::reserve(1 << 24);
        let raw: ByteOwner = Arc::new(random_quantized(GgmlType::Q8_0, 4, 64, 5));
        let build = || recycle::in_arena(N, || QMatrix::new(GgmlType::Q8_0, 4, 64, raw.clone(), 0));
        let (q, need) = recycle::measure(|| build().unwrap());
        assert!(need > 0 && need <= N);
        // (Pool bytes, not `weight_memory::live`: other tests allocate weights concurrently,
        // but none uses arenas.)
        let pooled = recycle::pooled_bytes();
        drop(q);
        // The arena went back to the pool (where it stays counted as weight memory) ...
        assert_eq!(recycle::pooled_bytes(), pooled + N as u64);
        // ... and the next unit is built in it.
        let again = build().unwrap();
        assert_eq!(
            recycle::pooled_bytes(),
            pooled,
            "a pooled arena was not reused"
        );
        let fresh = QMatrix::new(GgmlType::Q8_0, 4, 64, raw.clone(), 0).unwrap();
        assert_eq!(&again.data[..], &fresh.data[..]);
        // When the reservation goes (its store dropped), so does what the pool kept for it.
        drop(again);
        assert_eq!(recycle::pooled_bytes(), pooled + N as u64);
        drop(_pool);
        assert_eq!(recycle::pooled_bytes(), 0);
    }

    fn check(ty: GgmlType, m: usize, n: usize, k: usize) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let w: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0..1.0)).collect();
        let x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0..1.0)).collect();
        let raw = crate::dequant::quantize(ty, &w).unwrap();
        let q = QMatrix::new(ty, n, k, Arc::new(raw.clone()), 0).unwrap();
        // The packed layout dequantizes exactly like ggml's reference dequantizer.
        let mut wd = vec![0f32; n * k];
        dequantize(ty, &raw, &mut wd);
        let mut row = vec![0f32; k];
        for r in 0..n {
            q.dequantize_row(r, &mut row);
            for (a, b) in row.iter().zip(&wd[r * k..(r + 1) * k]) {
                assert!(
                    (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                    "{ty}: packed {a} vs ggml {b}"
                );
            }
        }
        let mut got = vec![0f32; m * n];
        q.matmul(&x, m, &mut got);
        let mut max_err = 0f64;
        let mut max_ref = 0f64;
        for i in 0..m {
            for j in 0..n {
                let r: f64 = (0..k)
                    .map(|l| x[i * k + l] as f64 * wd[j * k + l] as f64)
                    .sum();
                max_err = max_err.max((r - got[i * n + j] as f64).abs());
                max_ref = max_ref.max(r.abs());
            }
        }
        // 8-bit activations: relative error of a K-term dot product stays around 1%.
        assert!(
            max_err / max_ref < 0.02,
            "{ty} m={m} n={n} k={k}: max err {max_err} vs max {max_ref}"
        );
        // Every instruction set this CPU has computes the same sums from the same quantized
        // activations: the portable path, and AVX2 and AVX-512 VNNI where present (the
        // AVX-512 Q8_0 kernel reads values as w + 128 and subtracts 128·Σx in f32, so its
        // rounding differs slightly).
        let acts = QuantizedActs::quantize(&x, m, k, q.act_layout());
        let mut port = vec![0f32; m * n];
        unsafe { portable_range(&q, &acts, 0, n, port.as_mut_ptr()) };
        for isa in [Isa::Avx512Vnni, Isa::Avx2] {
            if isa < best_isa() {
                eprintln!("{ty}: this CPU lacks {isa}; its kernel is not checked here");
                continue;
            }
            // Columns split as the threads split them: ranges that start mid-matrix and end in
            // partial tiles (7), and ranges longer than a row block (45).
            for chunk in [7, 45] {
                let mut simd = vec![0f32; m * n];
                for n0 in (0..n).step_by(chunk) {
                    let ptr = SendPtr(simd.as_mut_ptr());
                    unsafe { q.range_on(isa, &acts, n0, (n0 + chunk).min(n), ptr) };
                }
                for (a, b) in port.iter().zip(&simd) {
                    assert!(
                        (a - b).abs() <= 1e-3 * (1.0 + a.abs()),
                        "{ty} m={m} n={n} k={k}: portable {a} vs {isa} {b}"
                    );
                }
                // Batch invariance: each activation row alone gives its row of the batch bit
                // for bit (speculative verification reproduces one-row decoding).
                for i in 0..m {
                    let one = QuantizedActs::quantize(&x[i * k..(i + 1) * k], 1, k, q.act_layout());
                    let mut row = vec![0f32; n];
                    unsafe { q.range_on(isa, &one, 0, n, SendPtr(row.as_mut_ptr())) };
                    assert!(
                        row.iter()
                            .zip(&simd[i * n..(i + 1) * n])
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{ty} m={m} n={n} k={k} {isa}: row {i} alone differs from the batch"
                    );
                }
            }
        }
    }

    #[test]
    fn qmatmul_matches_dequantized_reference() {
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            // k = 32·odd exercises the zero-padded last pair and partial scale groups.
            for (m, n, k) in [
                (1, 3, 96),
                (2, 70, 192),
                (3, 17, 576),
                (4, 8, 512),
                (9, 33, 160),
                (13, 64, 512),
                (1, 40, 1536),
            ] {
                check(ty, m, n, k);
            }
        }
        for (m, n) in [(1, 5), (5, 9), (8, 16)] {
            check(GgmlType::Q4K, m, n, 512);
        }
    }

    #[test]
    fn rejects_bad_shapes() {
        assert!(QMatrix::quantize(GgmlType::Q4K, 2, 64, &[0.0; 128]).is_err());
        let err = QMatrix::new(GgmlType::Q8_0, 4, 32, Arc::new(vec![0u8; 10]), 0);
        assert!(matches!(err, Err(QMatrixError::BadLength { .. })));
        assert!(QMatrix::new(GgmlType::F16, 4, 32, Arc::new(vec![0u8; 1000]), 0).is_err());
    }
}
