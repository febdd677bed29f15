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
    /// The tensor, or a [`FormatError::MissingTensor`].
    fn require(&self, name: &str) -> Result<TensorView, FormatError> {
        self.get(name).ok_or_else(|| FormatError::MissingTensor {
            path: self.path().to_path_buf(),
            tensor: name.to_string(),
        })
    }
}
