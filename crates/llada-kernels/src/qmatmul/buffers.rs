//! Memory that holds weight bytes: [`WeightBuf`], the packed matrix a kernel reads, and
//! [`StagingBytes`], a read buffer for bytes coming from storage. Both are counted in
//! [`weight_memory`] for as long as the process holds them, and both are recycled through
//! [`recycle`] while a pool is armed.

use super::{recycle, weight_memory};
use std::sync::Arc;

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
    /// too, `repack::zero_padding`).
    pub(super) fn alloc(len: usize) -> Self {
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
