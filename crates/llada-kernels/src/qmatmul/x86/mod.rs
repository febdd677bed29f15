//! x86-64 kernels: [`avx2`] and [`avx512`] (AVX-512 VNNI) tiles over the same packed layouts,
//! [`planes`] (AVX2) and [`planes512`] (AVX-512 VNNI) for the 5-bit and K-quant kinds,
//! and the loop they share (`drive!`: cache blocks of weight rows, register tiles of
//! activation rows). Callers pick a module through `isa.rs` and must only call a kernel whose
//! features the CPU has.

/// Weight rows per cache block: a block of rows stays in L2 while all activation rows pass.
const ROW_BLOCK: usize = 32;

/// The loop over a range of output columns shared by the SIMD kernels: blocks of
/// [`ROW_BLOCK`] weight rows, register tiles of up to 4 activation rows, `prefetch_rows` and
/// the tile function `$tile::<NR, MR>` taken from the calling module.
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
                        if i == 0 {
                            // While the first activation rows pass over this block, fetch the
                            // next block's rows: the later passes find this block in L2, and
                            // the next block does not start with a DRAM stall per row.
                            prefetch_rows(w, n + ROW_BLOCK, 2);
                        }
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

#[allow(clippy::needless_range_loop)] // register tiles read clearer as indexed loops
pub(super) mod avx2;
#[allow(clippy::needless_range_loop)] // register tiles read clearer as indexed loops
pub(super) mod avx512;
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
pub(super) mod planes;
#[allow(clippy::needless_range_loop)]
pub(super) mod planes512;
