//! Bytes of weights held in memory by this process: packed weight buffers
//! ([`WeightBuf`](super::WeightBuf)) and staging read buffers
//! ([`StagingBytes`](super::StagingBytes)), with a high-water mark. This is the memory a
//! `--mem-budget` governs, counted exactly (RSS also holds the KV cache, activations, logits,
//! the tokenizer and the allocator's slack).
//!
//! The lowest layer of the weight allocator: relaxed atomic counters that [`super::recycle`] and
//! the buffers add to and take from; every counted byte is subtracted exactly once, when the
//! process lets it go (a buffer kept in the pool stays counted).

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
