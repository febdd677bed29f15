//! Repacking weights at load: GGML's array-of-blocks rows become per-row structure-of-arrays
//! rows, the layout every kernel reads ([`layout`]). A packed row holds, in order: the values
//! (4-bit kinds: 16 bytes per block, the block count rounded up to 2, low nibbles elements 0–15
//! and high nibbles 16–31; Q8_0: 32 signed bytes per block), the scales (f16, or f32 for Q4_K,
//! the block count rounded up to 8), the offsets where the kind has them (same type and count),
//! and padding to a multiple of 32 bytes.
//!
//! Invariants: repacking keeps the bytes per block; every byte of a packed row is written,
//! padding as zeros ([`zero_padding`]), because an arena hands out old bytes.

use crate::dequant::q4k_scale_min;
use crate::types::GgmlType;
use half::f16;

/// Packed kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
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
    pub(super) fn is_q4(self) -> bool {
        self != Kind::Q8D16
    }
}

/// Packed layout of a `cols`-wide row of `ty`: kind, blocks, blocks rounded up to 2 (value
/// array) and to 8 (scale arrays), and the row's stride in bytes.
pub(super) fn layout(ty: GgmlType, cols: usize) -> (Kind, usize, usize, usize, usize) {
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
pub(super) fn repack_row(kind: Kind, nb: usize, nbe: usize, nbp: usize, s: &[u8], dst: &mut [u8]) {
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
pub(super) fn h2f(b: &[u8], o: usize) -> f32 {
    f16::from_le_bytes([b[o], b[o + 1]]).to_f32()
}
