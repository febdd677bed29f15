//! The staging pool frees idle buffers of other shapes before it allocates beside them.
//!
//! Its own test binary (one process, one test): the pool, its cap and the weight-memory counter
//! are process-wide, so the exact byte counts below hold only with no other test beside it.

use llada_kernels::{recycle, weight_memory, GgmlType, QMatrix, StagingBytes};
use std::sync::Arc;

/// A streamed unit: one small matrix carved from an arena of `bytes`.
fn unit(bytes: usize) -> QMatrix {
    let w: Vec<f32> = (0..4 * 64).map(|i| (i % 7) as f32 - 3.0).collect();
    let raw = llada_kernels::dequant::quantize(GgmlType::Q8_0, &w).expect("Q8_0 quantizes");
    recycle::in_arena(bytes, || {
        QMatrix::new(GgmlType::Q8_0, 4, 64, Arc::new(raw), 0)
    })
    .expect("a 4x64 Q8_0 matrix")
}

#[test]
fn idle_buffers_of_other_shapes_are_freed_before_a_fresh_allocation() {
    const A: usize = 16 * 4096;
    const B: usize = A + 4096;
    let _pool = recycle::reserve(3 * A as u64);
    let base = weight_memory::live();

    // A pass that holds two A-sized arenas at once, then returns them: both pooled.
    let (a1, a2) = (unit(A), unit(A));
    assert_eq!(recycle::lent_bytes(), 2 * A as u64);
    drop((a1, a2));
    assert_eq!(recycle::pooled_bytes(), 2 * A as u64);
    assert_eq!(weight_memory::live() - base, 2 * A as u64);

    // Work of another shape: no pooled arena fits, so each fresh one first frees idle ones
    // until in use + pooled + new fits the cap (3A): the first frees one A, the second the
    // other. Without that, 2A idle would sit beside 2B in use (4A + 8 KiB > the cap).
    let (b1, b2) = (unit(B), unit(B));
    assert_eq!(
        recycle::pooled_bytes(),
        0,
        "idle arenas kept beside fresh ones"
    );
    assert_eq!(weight_memory::live() - base, 2 * B as u64);

    // Steady state: the B arenas come back and are reused; nothing is freed or allocated.
    drop((b1, b2));
    assert_eq!(recycle::pooled_bytes(), 2 * B as u64);
    let (b1, b2) = (unit(B), unit(B));
    assert_eq!(recycle::pooled_bytes(), 0);
    assert_eq!(weight_memory::live() - base, 2 * B as u64);

    // Read buffers obey the same rule: with 2B in use, a read larger than any pooled buffer
    // frees what is pooled first (one B arena returned, then a 4A read).
    drop(b2);
    assert_eq!(recycle::pooled_bytes(), B as u64);
    let read = StagingBytes::for_read(10, 4 * A);
    assert_eq!(
        recycle::pooled_bytes(),
        0,
        "an idle arena kept beside a fresh read buffer"
    );
    assert_eq!(weight_memory::live() - base, (B + 4 * A) as u64);
    assert_eq!(recycle::lent_bytes(), (B + 4 * A) as u64);

    // Over the cap, a returned buffer is freed rather than pooled; when the reservation goes,
    // the pool empties.
    drop(read);
    drop(b1);
    drop(_pool);
    assert_eq!(recycle::pooled_bytes(), 0);
    assert_eq!(recycle::lent_bytes(), 0);
    assert_eq!(weight_memory::live(), base);
}
