//! aarch64 kernels: [`neon`] tiles over the packed layouts of Q4_0, Q4_1 and Q8_0, and
//! [`planes`] tiles for the plane kinds (Q5_0, Q5_1 and the K-quants), every kind in two
//! flavours that differ only in the 8-bit dot product of a block: `sdot` where the CPU has the
//! dot-product extension ([`crate::Isa::NeonDot`]), `smull` + `sadalp` otherwise
//! ([`crate::Isa::Neon`]; NEON is baseline on aarch64). Both reduce each block to its exact
//! integer sum before any float arithmetic, so their results are equal bit for bit. Callers
//! pick a flavour through `isa.rs` and [`kernel`], and must call the `sdot` one only where the
//! CPU has `dotprod`.
//!
//! The loop over a range of output columns ([`drive`]) is the x86 kernels' (`x86/mod.rs`):
//! cache blocks of weight rows, register tiles of `NR` weight rows × `MR` activation rows
//! (4 × 1 for decoding, 2 × up to 4 for batches).

use super::repack::Kind;
use super::{Isa, QMatrix, QuantizedActs};

/// A kernel entry point: output columns `[n0, n1)` of `x · wᵀ` into the `x.m × w.rows` output.
pub(super) type Kernel = unsafe fn(&QMatrix, &QuantizedActs, usize, usize, *mut f32);

/// The NEON kernel for a kind on `isa` ([`Isa::NeonDot`] or [`Isa::Neon`]); `None` for other
/// ISAs. Every kind has one on both paths.
pub(super) fn kernel(kind: Kind, isa: Isa) -> Option<Kernel> {
    use planes::{range, range_dot};
    let dot = match isa {
        Isa::NeonDot => true,
        Isa::Neon => false,
        _ => return None,
    };
    Some(match (kind, dot) {
        (Kind::Q4D16, true) => neon::range4_dot::<0>,
        (Kind::Q4D16, false) => neon::range4::<0>,
        (Kind::Q4DM16, true) => neon::range4_dot::<1>,
        (Kind::Q4DM16, false) => neon::range4::<1>,
        (Kind::Q8D16, true) => neon::range8_dot,
        (Kind::Q8D16, false) => neon::range8,
        (Kind::Q5D16, true) => range_dot::<{ planes::Q5_0 }>,
        (Kind::Q5D16, false) => range::<{ planes::Q5_0 }>,
        (Kind::Q5DM16, true) => range_dot::<{ planes::Q5_1 }>,
        (Kind::Q5DM16, false) => range::<{ planes::Q5_1 }>,
        (Kind::K4, true) => range_dot::<{ planes::K4 }>,
        (Kind::K4, false) => range::<{ planes::K4 }>,
        (Kind::K5, true) => range_dot::<{ planes::K5 }>,
        (Kind::K5, false) => range::<{ planes::K5 }>,
        (Kind::K6, true) => range_dot::<{ planes::K6 }>,
        (Kind::K6, false) => range::<{ planes::K6 }>,
        (Kind::K3, true) => range_dot::<{ planes::K3 }>,
        (Kind::K3, false) => range::<{ planes::K3 }>,
        (Kind::K2, true) => range_dot::<{ planes::K2 }>,
        (Kind::K2, false) => range::<{ planes::K2 }>,
    })
}

/// Weight rows per cache block: a block of rows stays in L2 while all activation rows pass.
const ROW_BLOCK: usize = 32;

/// A register-tile kernel: output columns `n..n + NR` of activation rows `i..i + MR`.
pub(super) trait Tile {
    /// # Safety
    /// `out` is the `x.m × w.rows` output; rows `n..n + NR` and `i..i + MR` exist; the CPU has
    /// the kernel's features.
    unsafe fn tile<const NR: usize, const MR: usize>(
        w: &QMatrix,
        x: &QuantizedActs,
        n: usize,
        i: usize,
        out: *mut f32,
    );
}

/// Output columns `[n0, n1)` for all activation rows with the tile kernel `K`: blocks of
/// [`ROW_BLOCK`] weight rows, register tiles of up to 4 activation rows. Inlined into the
/// caller, whose `#[target_feature]` set the tiles are compiled with.
///
/// # Safety
/// As [`Tile::tile`], for every column of `[n0, n1)`.
#[inline(always)]
pub(super) unsafe fn drive<K: Tile>(
    w: &QMatrix,
    x: &QuantizedActs,
    n0: usize,
    n1: usize,
    out: *mut f32,
) {
    let mut nb0 = n0;
    while nb0 < n1 {
        let nb1 = (nb0 + ROW_BLOCK).min(n1);
        let mut i = 0;
        while i < x.m {
            let mr = (x.m - i).min(4);
            let mut n = nb0;
            if mr == 1 {
                while n + 4 <= nb1 {
                    // Decoding streams each row once: fetch rows four tiles ahead so short
                    // rows (K ≈ 600) do not each pay a DRAM round trip.
                    prefetch_rows(w, n + 16, 4);
                    K::tile::<4, 1>(w, x, n, i, out);
                    n += 4;
                }
            } else {
                while n + 2 <= nb1 {
                    match mr {
                        4 => K::tile::<2, 4>(w, x, n, i, out),
                        3 => K::tile::<2, 3>(w, x, n, i, out),
                        _ => K::tile::<2, 2>(w, x, n, i, out),
                    }
                    n += 2;
                }
            }
            while n < nb1 {
                match mr {
                    4 => K::tile::<1, 4>(w, x, n, i, out),
                    3 => K::tile::<1, 3>(w, x, n, i, out),
                    2 => K::tile::<1, 2>(w, x, n, i, out),
                    _ => K::tile::<1, 1>(w, x, n, i, out),
                }
                n += 1;
            }
            i += mr;
        }
        nb0 = nb1;
    }
}

/// Prefetch `count` packed rows starting at `row` (clamped to the matrix) into L1.
#[inline(always)]
unsafe fn prefetch_rows(w: &QMatrix, row: usize, count: usize) {
    let end = (row + count).min(w.rows);
    if row >= end {
        return;
    }
    let p = w.data.as_ptr().add(row * w.stride);
    let bytes = (end - row) * w.stride;
    let mut o = 0;
    while o < bytes {
        // SAFETY: a prefetch is a hint; the address lies inside the matrix.
        std::arch::asm!(
            "prfm pldl1keep, [{p}]",
            p = in(reg) p.add(o),
            options(nostack, preserves_flags, readonly)
        );
        o += 64;
    }
}

#[allow(clippy::needless_range_loop)] // register tiles read clearer as indexed loops
pub(super) mod neon;
#[allow(clippy::needless_range_loop)]
pub(super) mod planes;
