//! A stored tensor, independent of the file format it came from.
use crate::error::FormatError;
use llada_kernels::{ByteOwner, GgmlType};
use std::path::PathBuf;

/// Where a tensor's bytes live: an owner (memory map) plus a byte range, its element type and
/// its shape in row-major order (outermost first, as PyTorch writes it; GGUF's reversed `ne`
/// order is converted on read).
#[derive(Clone)]
pub struct TensorView {
    pub name: String,
    pub ty: GgmlType,
    pub shape: Vec<usize>,
    pub owner: ByteOwner,
    pub offset: usize,
    pub len: usize,
    /// File the tensor came from (for error messages).
    pub file: PathBuf,
}

impl TensorView {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// The raw bytes.
    pub fn bytes(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.offset..self.offset + self.len]
    }
    /// Dequantize / convert to f32 (row-major).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.numel()];
        llada_kernels::dequant::dequantize(self.ty, self.bytes(), &mut out);
        out
    }
    /// Rows `[r0, r1)` of a 2-D tensor (outer dimension) as a view of the same bytes; `None`
    /// for other ranks, an empty or out-of-range span, or rows that are not whole bytes.
    pub fn rows(&self, r0: usize, r1: usize) -> Option<TensorView> {
        let (&[n, cols], true) = (self.shape.as_slice(), r0 < r1) else {
            return None;
        };
        if r1 > n || !self.len.is_multiple_of(n) {
            return None;
        }
        let row = self.len / n;
        Some(TensorView {
            shape: vec![r1 - r0, cols],
            offset: self.offset + r0 * row,
            len: (r1 - r0) * row,
            ..self.clone()
        })
    }
    /// Check the shape against what the config implies.
    pub fn expect_shape(&self, expected: &[usize]) -> Result<(), FormatError> {
        if self.shape != expected {
            return Err(FormatError::ShapeMismatch {
                path: self.file.clone(),
                tensor: self.name.clone(),
                got: self.shape.clone(),
                expected: expected.to_vec(),
            });
        }
        Ok(())
    }
}

/// Something that hands out tensors by name (a GGUF file or an HF directory).
pub trait TensorSource {
    /// The tensor, or `None` if absent.
    fn get(&self, name: &str) -> Option<TensorView>;
    /// All tensor names.
    fn names(&self) -> Vec<String>;
    /// Path used in error messages.
    fn path(&self) -> &std::path::Path;
    /// Drop the tensor's bytes from memory (mapping and page cache) after use; the next read
    /// comes from storage. A no-op for sources that are not file-backed.
    fn release(&self, _name: &str) {}
    /// Rows `[r0, r1)` of a 2-D tensor. File-backed sources that copy what they read
    /// override this to read only those rows.
    fn get_rows(&self, name: &str, r0: usize, r1: usize) -> Option<TensorView> {
        self.get(name)?.rows(r0, r1)
    }
    /// The tensor, or a [`FormatError::MissingTensor`].
    fn require(&self, name: &str) -> Result<TensorView, FormatError> {
        self.get(name).ok_or_else(|| FormatError::MissingTensor {
            path: self.path().to_path_buf(),
            tensor: name.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_views_address_their_rows() {
        // 4 rows of 32 Q8_0 elements: 34 bytes per row, after 6 bytes of something else.
        let bytes: Vec<u8> = (0..6 + 4 * 34).map(|i| i as u8).collect();
        let v = TensorView {
            name: "w".into(),
            ty: GgmlType::Q8_0,
            shape: vec![4, 32],
            owner: std::sync::Arc::new(bytes),
            offset: 6,
            len: 4 * 34,
            file: "f".into(),
        };
        let r = v.rows(1, 3).unwrap();
        assert_eq!(r.shape, vec![2, 32]);
        assert_eq!(r.bytes(), &v.bytes()[34..3 * 34]);
        assert!(v.rows(3, 5).is_none());
        assert!(v.rows(2, 2).is_none());
        let flat = TensorView {
            shape: vec![128],
            ..v.clone()
        };
        assert!(flat.rows(0, 1).is_none());
    }
}
