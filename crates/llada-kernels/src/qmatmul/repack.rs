//! Repacking weights at load: GGML's array-of-blocks rows become per-row structure-of-arrays
//! rows, the layout every kernel reads ([`Layout`]). Element values are stored unsigned, in
//! *planes* of bits, for pairs of 32-element blocks (the kernels process two blocks per
//! 256-bit register):
//!
//! * nibble plane (4 low bits): 16 bytes per block, byte `l` = element `l` | element `16 + l`
//!   << 4 — so one 32-byte load of a pair, masked, gives elements 0–15 of both blocks, and
//!   shifted by 4 elements 16–31;
//! * two-bit plane (Q6_K's bits 4–5; Q3_K's and Q2_K's bits 0–1): 16 bytes per pair, byte `j`
//!   = `A[j] | B[j] << 2 | A[16+j] << 4 | B[16+j] << 6` (A, B the pair's blocks);
//! * one-bit plane (the 5th bit of Q5_0/Q5_1/Q5_K, Q3_K's 3rd): 8 bytes per pair, two u32:
//!   bit `j` of the first = `A[j]`, bit `16 + j` = `B[j]`; the second the same for `16 + j`.
//!
//! After the planes come the scales: per block f16 `d` (and f16 `m`) for the 32-element types,
//! padded to a multiple of 8 blocks; per super-block of 256 a header for the K-quants (f16 `d`,
//! f16 `dmin` where the type has mins, then the sub-block scales as bytes: Q4_K/Q5_K 8 scales
//! and 8 mins, Q6_K/Q3_K 16 signed scales (Q3_K's unbiased), Q2_K its 16 scale|min bytes).
//! Q8_0 keeps 32 signed bytes per block then the f16 scales. Rows are padded to 32 bytes.
//!
//! Every element is `w = a·sc·(q − bias) + off·mn` with `q` the unsigned plane value and the
//! other terms from the scales ([`super::matrix::BlockTerms`]). Bytes per super-block against
//! the file's: Q5_0/Q5_1/Q6_K/Q2_K/Q4_0/Q4_1/Q8_0 equal, Q4_K 148 vs 144, Q5_K 180 vs 176,
//! Q3_K 114 vs 110 (the 6-bit scales widened to bytes).
//!
//! Invariants: every byte of a packed row is written, padding as zeros, because an arena
//! hands out old bytes.

use crate::dequant::kquants::q3k_scales;
use crate::dequant::q4k_scale_min;
use crate::types::GgmlType;
use half::f16;

/// Packed kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Kind {
    /// 4-bit values, f16 scale, offset −8·d (Q4_0).
    Q4D16,
    /// 4-bit values, f16 scale and f16 offset (Q4_1).
    Q4DM16,
    /// Signed 8-bit values, f16 scale (Q8_0).
    Q8D16,
    /// 5-bit values (nibble + bit planes), f16 scale, bias 16 (Q5_0).
    Q5D16,
    /// 5-bit values, f16 scale and f16 offset (Q5_1).
    Q5DM16,
    /// Q4_K: nibbles; per 32 a scale and a min.
    K4,
    /// Q5_K: nibbles + bit plane; per 32 a scale and a min.
    K5,
    /// Q6_K: nibbles + two-bit plane; per 16 a signed scale, bias 32.
    K6,
    /// Q3_K: two-bit + bit planes; per 16 a signed scale, bias 4.
    K3,
    /// Q2_K: two-bit plane; per 16 a scale and a min.
    K2,
}

impl Kind {
    pub(super) fn of(ty: GgmlType) -> Option<Kind> {
        Some(match ty {
            GgmlType::Q4_0 => Kind::Q4D16,
            GgmlType::Q4_1 => Kind::Q4DM16,
            GgmlType::Q8_0 => Kind::Q8D16,
            GgmlType::Q5_0 => Kind::Q5D16,
            GgmlType::Q5_1 => Kind::Q5DM16,
            GgmlType::Q4K => Kind::K4,
            GgmlType::Q5K => Kind::K5,
            GgmlType::Q6K => Kind::K6,
            GgmlType::Q3K => Kind::K3,
            GgmlType::Q2K => Kind::K2,
            _ => return None,
        })
    }
    /// Activations in paired order (everything but Q8_0).
    pub(super) fn is_q4(self) -> bool {
        self != Kind::Q8D16
    }
    fn planes(self) -> (bool, bool, bool) {
        use Kind::*;
        // (nibble, two-bit, one-bit)
        match self {
            Q4D16 | Q4DM16 | K4 => (true, false, false),
            Q5D16 | Q5DM16 | K5 => (true, false, true),
            K6 => (true, true, false),
            K3 => (false, true, true),
            K2 => (false, true, false),
            Q8D16 => (false, false, false),
        }
    }
    /// Bytes of a K-quant super-block header.
    pub(super) fn header(self) -> usize {
        Self::header_of(self as u8)
    }
    /// [`Kind::header`] of a kind given as its `u8` (the kernels' const parameter).
    pub(super) const fn header_of(k: u8) -> usize {
        if k == Kind::K4 as u8 || k == Kind::K5 as u8 || k == Kind::K2 as u8 {
            20
        } else if k == Kind::K6 as u8 || k == Kind::K3 as u8 {
            18
        } else {
            0
        }
    }
}

/// Packed layout of a row: kind, block counts and byte offsets of the planes and scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Layout {
    pub kind: Kind,
    /// Blocks of 32.
    pub nb: usize,
    /// `nb` rounded up to 2 (whole pairs in the planes).
    pub nbe: usize,
    /// `nb` rounded up to 8 (scale arrays in whole groups of 8).
    pub nbp: usize,
    /// Bytes of one packed row.
    pub stride: usize,
    pub nib: usize,
    pub two: usize,
    pub bit: usize,
    pub sc: usize,
}

/// The packed layout of a `cols`-wide row of `ty` (a type with a kernel).
pub(super) fn layout(ty: GgmlType, cols: usize) -> Layout {
    let kind = Kind::of(ty).expect("layout: a type with a kernel");
    let nb = cols / 32;
    let nbp = nb.next_multiple_of(8);
    let nbe = nb.next_multiple_of(2);
    let (has_nib, has_two, has_bit) = kind.planes();
    let nib = 0;
    let two = nib + if has_nib { nbe * 16 } else { 0 };
    let bit = two + if has_two { nbe * 8 } else { 0 };
    let mut sc = bit + if has_bit { nbe * 4 } else { 0 };
    let scales = match kind {
        Kind::Q4D16 | Kind::Q5D16 => nbp * 2,
        Kind::Q4DM16 | Kind::Q5DM16 => nbp * 4,
        Kind::Q8D16 => {
            sc = nb * 32;
            nbp * 2
        }
        k => nb / 8 * k.header(),
    };
    Layout {
        kind,
        nb,
        nbe,
        nbp,
        stride: (sc + scales).next_multiple_of(32),
        nib,
        two,
        bit,
        sc,
    }
}

/// Repack one GGML row `s` into the packed row `dst` (`lay.stride` bytes); every byte of
/// `dst` is written.
pub(super) fn repack_row(lay: &Layout, s: &[u8], dst: &mut [u8]) {
    match lay.kind {
        // Fixed-size copies (the block size as a constant): a streamed model repacks every
        // streamed layer on every pass; with runtime-length copies this loop repacked Q4_1 at
        // 5.2 GB/s instead of 6.0.
        Kind::Q4D16 => {
            zero_padding(lay, dst);
            repack_q4::<18>(s, dst, lay, false)
        }
        Kind::Q4DM16 => {
            zero_padding(lay, dst);
            repack_q4::<20>(s, dst, lay, true)
        }
        Kind::Q8D16 => {
            zero_padding(lay, dst);
            let (qs, rest) = dst.split_at_mut(lay.nb * 32);
            for b in 0..lay.nb {
                let blk = &s[b * 34..(b + 1) * 34];
                qs[b * 32..b * 32 + 32].copy_from_slice(&blk[2..]);
                rest[2 * b..2 * b + 2].copy_from_slice(&blk[0..2]);
            }
        }
        _ => repack_planes(lay, s, dst),
    }
}

/// Repack a row of `nb` 4-bit GGML blocks of `BB` bytes (scale, [offset,] 16 value bytes).
#[inline]
fn repack_q4<const BB: usize>(s: &[u8], dst: &mut [u8], lay: &Layout, offsets: bool) {
    let (qs, rest) = dst.split_at_mut(lay.nbe * 16);
    let (scales, mins) = rest.split_at_mut(lay.nbp * 2);
    let blocks = s.chunks_exact(BB).take(lay.nb);
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

/// Zero the bytes of a Q4_0/Q4_1/Q8_0 packed row that the repack does not write: values of
/// the blocks past `nb` (up to `nbe`), scales and offsets past `nb` (up to `nbp`), and the
/// tail to the stride.
fn zero_padding(lay: &Layout, row: &mut [u8]) {
    let (qbytes, arrays, per_block) = match lay.kind {
        Kind::Q4D16 => (lay.nbe * 16, 1, 16),
        Kind::Q4DM16 => (lay.nbe * 16, 2, 16),
        _ => (lay.nb * 32, 1, 32),
    };
    row[lay.nb * per_block..qbytes].fill(0);
    for a in 0..arrays {
        let base = qbytes + a * lay.nbp * 2;
        row[base + lay.nb * 2..base + lay.nbp * 2].fill(0);
    }
    row[qbytes + arrays * lay.nbp * 2..].fill(0);
}

/// Repack the plane kinds: whole bytes move from the GGML blocks to the planes (a streamed
/// model repacks every streamed layer on every pass).
fn repack_planes(lay: &Layout, s: &[u8], dst: &mut [u8]) {
    match lay.kind {
        Kind::Q5D16 | Kind::Q5DM16 => {
            dst.fill(0);
            repack_q5(lay, s, dst, if lay.kind == Kind::Q5D16 { 22 } else { 24 })
        }
        k => {
            // Whole super-blocks (`nb` a multiple of 8, so `nbe == nb`): the planes and the
            // headers are written in full, only the tail to the stride is padding.
            dst[lay.sc + lay.nb / 8 * k.header()..].fill(0);
            let bb = match k {
                Kind::K4 => 144,
                Kind::K5 => 176,
                Kind::K6 => 210,
                Kind::K3 => 110,
                _ => 84,
            };
            for (sb, blk) in s.chunks_exact(bb).take(lay.nb / 8).enumerate() {
                match k {
                    Kind::K4 => nibbles_k(&blk[16..144], &mut dst[lay.nib + 128 * sb..]),
                    Kind::K5 => {
                        nibbles_k(&blk[48..176], &mut dst[lay.nib + 128 * sb..]);
                        bits_k5(&blk[16..48], &mut dst[lay.bit + 32 * sb..]);
                    }
                    Kind::K6 => planes_k6(blk, dst, lay.nib + 128 * sb, lay.two + 64 * sb),
                    Kind::K3 => {
                        twobits_k(&blk[32..96], &mut dst[lay.two + 64 * sb..]);
                        // Q3_K's hmask has Q5_K's qh layout (bit s of byte l: sub-block s).
                        bits_k5(&blk[0..32], &mut dst[lay.bit + 32 * sb..]);
                    }
                    _ => twobits_k(&blk[16..80], &mut dst[lay.two + 64 * sb..]),
                }
                let h = lay.sc + sb * k.header();
                header(k, blk, &mut dst[h..h + k.header()]);
            }
        }
    }
}

/// Q5_0/Q5_1 (`bb`-byte blocks): the nibbles are already in plane order; the high bits of a
/// pair (A, B) become `A[0..16] | B[0..16] << 16` and `A[16..32] | B[16..32] << 16`.
fn repack_q5(lay: &Layout, s: &[u8], dst: &mut [u8], bb: usize) {
    let o = bb - 20;
    let qh = |b: usize| -> u32 {
        if b >= lay.nb {
            return 0;
        }
        let p = b * bb + o;
        u32::from_le_bytes([s[p], s[p + 1], s[p + 2], s[p + 3]])
    };
    for (b, blk) in s.chunks_exact(bb).take(lay.nb).enumerate() {
        dst[lay.nib + 16 * b..lay.nib + 16 * b + 16].copy_from_slice(&blk[o + 4..o + 20]);
        dst[lay.sc + 2 * b..lay.sc + 2 * b + 2].copy_from_slice(&blk[0..2]);
        if bb == 24 {
            let m = lay.sc + 2 * lay.nbp + 2 * b;
            dst[m..m + 2].copy_from_slice(&blk[2..4]);
        }
    }
    for p in 0..lay.nbe / 2 {
        let (a, b) = (qh(2 * p), qh(2 * p + 1));
        let w = lay.bit + 8 * p;
        dst[w..w + 4].copy_from_slice(&((a & 0xFFFF) | (b << 16)).to_le_bytes());
        dst[w + 4..w + 8].copy_from_slice(&((a >> 16) | (b & 0xFFFF_0000)).to_le_bytes());
    }
}

/// 128 bytes of Q4_K/Q5_K nibbles (`qs[32c + l]`: sub-block 2c low, 2c+1 high) → the nibble
/// plane of 8 blocks (byte `j` of a block = element `j` | element `16 + j` << 4).
fn nibbles_k(qs: &[u8], out: &mut [u8]) {
    for c in 0..4 {
        let q: &[u8; 32] = qs[32 * c..32 * c + 32].try_into().expect("32 bytes");
        let o: &mut [u8; 32] = (&mut out[32 * c..32 * c + 32])
            .try_into()
            .expect("32 bytes");
        split_nibbles(q, o);
    }
}

/// 32 bytes `q` of two 16-byte halves (`lo`, `hi`) → `o[0..16]` the low nibbles of both
/// (`lo & 15 | hi << 4`), `o[16..32]` the high ones (`lo >> 4 | hi & 0xF0`). Fixed sizes, so
/// the loop compiles to vector code (a streamed layer is repacked on every pass).
#[inline(always)]
fn split_nibbles(q: &[u8; 32], o: &mut [u8; 32]) {
    for j in 0..16 {
        let (lo, hi) = (q[j], q[16 + j]);
        o[j] = (lo & 0x0F) | (hi << 4);
        o[16 + j] = (lo >> 4) | (hi & 0xF0);
    }
}

/// Bit `s` of each of 8 bytes (`x`, little-endian) gathered into one byte: bit `j` = bit `s`
/// of byte `j`. The multiply moves bit `8j` to bit `56 + j`, without carries (every partial
/// product lands on its own bit).
#[inline(always)]
fn gather_bits(x: u64, s: u32) -> u32 {
    let m = (x >> s) & 0x0101_0101_0101_0101;
    (m.wrapping_mul(0x0102_0408_1020_4080) >> 56) as u32
}

/// Q5_K's `qh[32]` (bit `s` of byte `l` = 5th bit of sub-block `s`, element `l`) → the bit
/// plane of 4 pairs.
fn bits_k5(qh: &[u8], out: &mut [u8]) {
    let w = |i: usize| u64::from_le_bytes(qh[8 * i..8 * i + 8].try_into().expect("8 bytes"));
    let (q0, q1, q2, q3) = (w(0), w(1), w(2), w(3));
    // 16 bits of bit `s` over 16 bytes (two words).
    let g16 = |a: u64, b: u64, s: u32| gather_bits(a, s) | gather_bits(b, s) << 8;
    for c in 0..4u32 {
        let (s0, s1) = (2 * c, 2 * c + 1);
        let lo = g16(q0, q1, s0) | g16(q0, q1, s1) << 16;
        let hi = g16(q2, q3, s0) | g16(q2, q3, s1) << 16;
        let c = c as usize;
        out[8 * c..8 * c + 4].copy_from_slice(&lo.to_le_bytes());
        out[8 * c + 4..8 * c + 8].copy_from_slice(&hi.to_le_bytes());
    }
}

/// Q2_K/Q3_K's `qs[64]` (in each half of 128, byte `l` holds elements `l`, `l + 32`,
/// `l + 64`, `l + 96` at bits 0, 2, 4, 6) → the two-bit plane of 4 pairs: pair `P` (elements
/// `64P..64P + 64`) takes bits `4(P % 2)..+4` of bytes `32(P / 2) + j` and `+ 16 + j`.
fn twobits_k(qs: &[u8], out: &mut [u8]) {
    for p in 0..4 {
        let (b0, sh) = (32 * (p / 2), 4 * (p % 2));
        for j in 0..16 {
            out[16 * p + j] = ((qs[b0 + j] >> sh) & 0xF) | (((qs[b0 + 16 + j] >> sh) & 0xF) << 4);
        }
    }
}

/// A Q6_K super-block → 8 blocks of nibble plane at `out[nib..nib + 128]` and 4 pairs of
/// two-bit plane at `out[two..two + 64]`. Block `4h + k` (half `h`, `k` 0..4) takes the low (`k` < 2)
/// or high nibbles of `ql[64h + 32(k % 2)..]` and bits `2k` of `qh[32h..]`.
fn planes_k6(b: &[u8], out: &mut [u8], nib: usize, two: usize) {
    for h in 0..2 {
        for half in 0..2 {
            let src: &[u8; 32] = b[64 * h + 32 * half..][..32].try_into().expect("32 bytes");
            let mut o = [0u8; 32];
            split_nibbles(src, &mut o);
            // Low nibbles are block 4h + half, high ones block 4h + 2 + half.
            let (lo_at, hi_at) = (nib + 16 * (4 * h + half), nib + 16 * (4 * h + 2 + half));
            out[lo_at..lo_at + 16].copy_from_slice(&o[..16]);
            out[hi_at..hi_at + 16].copy_from_slice(&o[16..]);
        }
        let qh: &[u8; 32] = b[128 + 32 * h..160 + 32 * h].try_into().expect("32 bytes");
        let o: &mut [u8; 32] = (&mut out[two + 32 * h..two + 32 * h + 32])
            .try_into()
            .expect("32 bytes");
        // Pair 2h takes bits 0–3 of each qh byte, pair 2h + 1 bits 4–7: the nibble split.
        split_nibbles(qh, o);
    }
}

/// A K-quant super-block header (module docs) from GGML block `b`.
fn header(k: Kind, b: &[u8], h: &mut [u8]) {
    match k {
        Kind::K4 | Kind::K5 => {
            h[0..4].copy_from_slice(&b[0..4]);
            for j in 0..8 {
                let (sc, mn) = q4k_scale_min(j, &b[4..16]);
                h[4 + j] = sc;
                h[12 + j] = mn;
            }
        }
        Kind::K6 => {
            h[0..2].copy_from_slice(&b[208..210]);
            h[2..18].copy_from_slice(&b[192..208]);
        }
        Kind::K3 => {
            h[0..2].copy_from_slice(&b[108..110]);
            for (o, s) in h[2..18].iter_mut().zip(q3k_scales(&b[96..108])) {
                *o = (s as i32 - 32) as i8 as u8;
            }
        }
        _ => {
            h[0..4].copy_from_slice(&b[80..84]);
            h[4..20].copy_from_slice(&b[0..16]);
        }
    }
}

#[inline]
pub(super) fn h2f(b: &[u8], o: usize) -> f32 {
    f16::from_le_bytes([b[o], b[o + 1]]).to_f32()
}
