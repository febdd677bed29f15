//! The packed weight matrix [`QMatrix`]: building one from GGML bytes (repacked into a
//! [`WeightBuf`], carved from the current arena where one is set), stacking, and reading rows
//! back. The fields are the kernels' view of the layout (`repack` module docs).
//!
//! Invariant: a `QMatrix` is immutable once built; clones share its buffer.

use super::buffers::WeightBuf;
use super::repack::{h2f, layout, repack_row, Kind};
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
    pub(super) data: Arc<WeightBuf>,
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
    pub(super) fn row(&self, r: usize) -> &[u8] {
        &self.data[r * self.stride..(r + 1) * self.stride]
    }

    /// (scale, offset) of block `b` of a packed row, and its integer values.
    pub(super) fn block(&self, row: &[u8], b: usize, q: &mut [i32; 32]) -> (f32, f32) {
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
}
