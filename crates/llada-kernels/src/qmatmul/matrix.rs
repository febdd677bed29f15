//! The packed weight matrix [`QMatrix`]: building one from GGML bytes (repacked into a
//! [`WeightBuf`], carved from the current arena where one is set), stacking, and reading rows
//! back. The fields are the kernels' view of the layout (`repack` module docs).
//!
//! Invariant: a `QMatrix` is immutable once built; clones share its buffer.

use super::buffers::WeightBuf;
use super::repack::{h2f, layout, repack_row, Kind, Layout};
use crate::types::GgmlType;
use std::sync::Arc;

/// Owner of the bytes behind a stored tensor (an mmapped file, or a `Vec`).
pub type ByteOwner = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// A weight matrix `[rows × cols]` (`rows` outputs, `cols` inputs), repacked for the kernels.
#[derive(Clone)]
pub struct QMatrix {
    pub(super) ty: GgmlType,
    pub(super) kind: Kind,
    pub(super) rows: usize,
    pub(super) cols: usize,
    /// Blocks of 32 per row.
    pub(super) nb: usize,
    /// `nb` rounded up to 8 (scale arrays are padded to whole groups of 8 blocks).
    pub(super) nbp: usize,
    /// Bytes of one packed row.
    pub(super) stride: usize,
    /// The whole packed layout (the fields above are its most used parts, copied).
    pub(super) lay: Layout,
    pub(super) data: Arc<WeightBuf>,
}

/// What turns block `b`'s unsigned values `q` into weights: element `l` (half `h = l / 16`)
/// is `a·sc[h]·(q[l] − bias) + off·mn[h]` (ggml's own operation order for every type).
#[derive(Debug, Clone, Copy)]
pub(super) struct BlockTerms {
    pub a: f32,
    pub sc: [i32; 2],
    pub bias: i32,
    pub off: f32,
    pub mn: [i32; 2],
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

impl QMatrix {
    /// Types with a kernel.
    pub fn supports(ty: GgmlType) -> bool {
        ty.is_quantized()
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
        let lay = layout(ty, cols);
        let src_rows = srcs.iter().flat_map(|s| s.chunks_exact(src_row));
        let mut data = WeightBuf::alloc(rows * lay.stride);
        for (dst, s) in data.chunks_exact_mut(lay.stride).zip(src_rows) {
            repack_row(&lay, s, dst);
        }
        Ok(Self {
            ty,
            kind: lay.kind,
            rows,
            cols,
            nb: lay.nb,
            nbp: lay.nbp,
            stride: lay.stride,
            lay,
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
    pub(super) fn row(&self, r: usize) -> &[u8] {
        &self.data[r * self.stride..(r + 1) * self.stride]
    }

    /// Block `b` of a packed row: its unsigned (Q8_0: signed) values into `q`, and the terms
    /// that turn them into weights.
    pub(super) fn block(&self, row: &[u8], b: usize, q: &mut [i32; 32]) -> BlockTerms {
        let lay = &self.lay;
        let ones = [1, 1];
        let plain = |a: f32, bias: i32, off: f32| BlockTerms {
            a,
            sc: ones,
            bias,
            off,
            mn: ones,
        };
        if self.kind == Kind::Q8D16 {
            for (l, v) in q.iter_mut().enumerate() {
                *v = row[b * 32 + l] as i8 as i32;
            }
            return plain(h2f(row, lay.sc + 2 * b), 0, 0.0);
        }
        self.values(row, b, q);
        let (g, j) = (b / 8, b % 8);
        let hdr = lay.sc + g * self.kind.header();
        let sbyte = |i: usize| row[hdr + 2 + i] as i8 as i32;
        match self.kind {
            Kind::Q4D16 => plain(h2f(row, lay.sc + 2 * b), 8, 0.0),
            Kind::Q5D16 => plain(h2f(row, lay.sc + 2 * b), 16, 0.0),
            Kind::Q4DM16 | Kind::Q5DM16 => plain(
                h2f(row, lay.sc + 2 * b),
                0,
                h2f(row, lay.sc + 2 * lay.nbp + 2 * b),
            ),
            Kind::K4 | Kind::K5 => plain(
                h2f(row, hdr) * row[hdr + 4 + j] as f32,
                0,
                -(h2f(row, hdr + 2) * row[hdr + 12 + j] as f32),
            ),
            Kind::K6 | Kind::K3 => {
                let sc = [sbyte(2 * j), sbyte(2 * j + 1)];
                let bias = if self.kind == Kind::K6 { 32 } else { 4 };
                BlockTerms {
                    a: h2f(row, hdr),
                    sc,
                    bias,
                    off: 0.0,
                    mn: sc,
                }
            }
            _ => {
                let (b0, b1) = (row[hdr + 4 + 2 * j], row[hdr + 5 + 2 * j]);
                BlockTerms {
                    a: h2f(row, hdr),
                    sc: [(b0 & 0xF) as i32, (b1 & 0xF) as i32],
                    bias: 0,
                    off: -h2f(row, hdr + 2),
                    mn: [(b0 >> 4) as i32, (b1 >> 4) as i32],
                }
            }
        }
    }

    /// The unsigned values of block `b` of a packed row of a plane kind, read from its planes.
    fn values(&self, row: &[u8], b: usize, q: &mut [i32; 32]) {
        let lay = &self.lay;
        let (p, which) = (b / 2, b % 2);
        for (l, v) in q.iter_mut().enumerate() {
            let (half, j) = (l / 16, l % 16);
            // Each plane is read only by the kinds that have it (the offsets of absent planes
            // point at the next one).
            let nib = || (row[lay.nib + 16 * b + j] >> (4 * half)) & 0xF;
            let two = || (row[lay.two + 16 * p + j] >> (2 * which + 4 * half)) & 3;
            let bit = || {
                let w = lay.bit + 8 * p + 4 * half;
                let word = u32::from_le_bytes([row[w], row[w + 1], row[w + 2], row[w + 3]]);
                ((word >> (16 * which + j)) & 1) as u8
            };
            *v = match self.kind {
                Kind::Q4D16 | Kind::Q4DM16 | Kind::K4 => nib(),
                Kind::Q5D16 | Kind::Q5DM16 | Kind::K5 => nib() | bit() << 4,
                Kind::K6 => nib() | two() << 4,
                Kind::K3 => two() | bit() << 2,
                _ => two(),
            } as i32;
        }
    }

    /// Dequantize row `r` into `out` (length `cols`).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let row = self.row(r);
        let mut q = [0i32; 32];
        for b in 0..self.nb {
            let t = self.block(row, b, &mut q);
            for l in 0..32 {
                let h = l / 16;
                out[b * 32 + l] =
                    (t.a * t.sc[h] as f32) * (q[l] - t.bias) as f32 + t.off * t.mn[h] as f32;
            }
        }
    }
}
