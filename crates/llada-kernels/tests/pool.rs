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

    // Read buffers obey the same rule: with B in use and one B arena pooled, a fresh A-sized
    // read (B + B + A over the cap) frees the pooled arena first.
    drop(b2);
    assert_eq!(recycle::pooled_bytes(), B as u64);
    let read = StagingBytes::for_read(10, A);
    assert_eq!(
        recycle::pooled_bytes(),
        0,
        "an idle arena kept beside a fresh read buffer"
    );
    assert_eq!(weight_memory::live() - base, (B + A) as u64);
    assert_eq!(recycle::lent_bytes(), (B + A) as u64);
    drop(read);
    assert_eq!(recycle::pooled_bytes(), A as u64);

    // When what is in use and the new buffer alone exceed the cap (two passes streaming at
    // once), freeing cannot reach it: the pooled buffer stays for the requests that take it.
    let big = StagingBytes::for_read(4 * A, 4 * A);
    assert_eq!(recycle::pooled_bytes(), A as u64, "freed in vain");
    let again = StagingBytes::for_read(10, A);
    assert_eq!(
        recycle::pooled_bytes(),
        0,
        "the pooled read buffer was not reused"
    );
    drop((big, again));
    drop(b1);
    drop(_pool);
    assert_eq!(recycle::pooled_bytes(), 0);
    assert_eq!(recycle::lent_bytes(), 0);
    assert_eq!(weight_memory::live(), base);

    // Oldest first: with an A arena returned before a C arena, a B request that needs one of
    // them freed frees the A.
    const C: usize = A + 8192;
    let _pool = recycle::reserve(3 * A as u64);
    let (a, c) = (unit(A), unit(C));
    drop(a);
    drop(c);
    assert_eq!(recycle::pooled_bytes(), (A + C) as u64);
    let b = unit(B);
    assert_eq!(recycle::pooled_bytes(), C as u64, "not the oldest freed");
    drop(b);
    drop(_pool);
    assert_eq!(recycle::pooled_bytes(), 0);
    assert_eq!(weight_memory::live(), base);
}
