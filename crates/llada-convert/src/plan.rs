//! A conversion plan (metadata, and per output tensor its source, shape and type) and the
//! streaming writer that carries it out.
//!
//! Invariants: tensors are written one at a time, a chunk of rows at a time (about
//! [`CHUNK_BYTES`] of f32), each chunk read from the memory-mapped source, converted and
//! written, and the source's pages dropped once the chunk is done — so the peak memory is a few
//! chunks, whatever the model's size. A tensor whose type does not change (and needs no row
//! permutation) is copied byte for byte. The output is written atomically.

use crate::recipe::Target;
use crate::ConvertError;
use llada_formats::gguf::{GgufWriter, Value};
use llada_formats::{TensorSource, TensorView};
use llada_kernels::GgmlType;
use rayon::prelude::*;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

/// f32 bytes converted per chunk.
pub const CHUNK_BYTES: usize = 32 << 20;

/// One tensor of the output file.
#[derive(Clone)]
pub struct OutTensor {
    /// Name in the output (llama.cpp's).
    pub name: String,
    /// Row-major shape (outermost first).
    pub shape: Vec<usize>,
    /// Name in the source.
    pub src_name: String,
    /// The source tensor (same shape).
    pub src: TensorView,
    /// Output type.
    pub ty: GgmlType,
    /// llama.cpp's q/k row permutation (`convert_hf_to_gguf.py`'s `LlamaModel.permute`) with
    /// this many heads.
    pub permute_heads: Option<usize>,
    /// Why the type differs from the file type's base type (a rule or a fallback).
    pub note: Option<String>,
}

impl OutTensor {
    /// Bytes in the output.
    pub fn out_bytes(&self) -> u64 {
        let n: usize = self.shape.iter().product();
        self.ty.bytes_for(n as u64).unwrap_or(0)
    }
    /// (rows, columns): a 1-D tensor is one row.
    fn rows_cols(&self) -> (usize, usize) {
        match self.shape.as_slice() {
            [r, c] => (*r, *c),
            s => (1, s.iter().product()),
        }
    }
}

/// Everything to write: metadata in order, then the tensors in order.
pub struct Plan {
    pub target: Target,
    pub kv: Vec<(String, Value)>,
    pub tensors: Vec<OutTensor>,
    /// The source, for dropping pages once read.
    pub source: Arc<dyn TensorSource + Send + Sync>,
}

impl Plan {
    fn writer(&self) -> GgufWriter {
        let mut w = GgufWriter::new();
        for (k, v) in &self.kv {
            w.kv(k, v.clone());
        }
        for t in &self.tensors {
            w.tensor_lazy(&t.name, &t.shape, t.ty);
        }
        w
    }
    /// Size of the output file in bytes.
    pub fn file_bytes(&self) -> u64 {
        self.writer().file_len()
    }
    /// Bytes of tensor data in the output.
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(OutTensor::out_bytes).sum()
    }

    /// Write the output to `out` atomically; `progress(n)` is told each time `n` more bytes of
    /// tensor data are written.
    pub fn write(&self, out: &Path, progress: &(dyn Fn(u64) + Sync)) -> Result<(), ConvertError> {
        let w = self.writer();
        w.write_tensors(out, &mut |i, sink| {
            let t = &self.tensors[i];
            let r = write_tensor(t, sink, progress, &|| self.source.release(&t.src_name));
            self.source.release(&t.src_name);
            r
        })?;
        Ok(())
    }
}

/// The source row that output row `o` takes: llama.cpp's permutation within each head of
/// `rows / heads` rows (`reshape(heads, 2, hd / 2, …).swapaxes(1, 2)`): output row
/// `h·hd + 2i + j` is input row `h·hd + j·hd/2 + i`.
pub fn permuted_row(o: usize, rows: usize, heads: usize) -> usize {
    let hd = rows / heads;
    let (h, r) = (o / hd, o % hd);
    h * hd + (r % 2) * (hd / 2) + r / 2
}

/// Convert and write one tensor, a chunk of rows at a time.
fn write_tensor(
    t: &OutTensor,
    w: &mut dyn Write,
    progress: &(dyn Fn(u64) + Sync),
    release: &dyn Fn(),
) -> std::io::Result<()> {
    let src = t.src.bytes();
    if t.ty == t.src.ty && t.permute_heads.is_none() {
        for c in src.chunks(CHUNK_BYTES) {
            w.write_all(c)?;
            progress(c.len() as u64);
            release();
        }
        return Ok(());
    }
    let (rows, cols) = t.rows_cols();
    let row_bytes = src.len() / rows;
    let out_row = t.ty.bytes_for(cols as u64).unwrap_or(0) as usize;
    // Whole heads per chunk when permuting (the permutation stays inside a head).
    let unit = t.permute_heads.map_or(1, |h| rows / h);
    let chunk = (CHUNK_BYTES / (4 * cols).max(1)).max(1).div_ceil(unit) * unit;
    let mut r0 = 0;
    while r0 < rows {
        let r1 = (r0 + chunk).min(rows);
        let bytes: Vec<Vec<u8>> = (r0..r1)
            .into_par_iter()
            .map(|o| {
                let i = t.permute_heads.map_or(o, |h| permuted_row(o, rows, h));
                let mut x = vec![0f32; cols];
                llada_kernels::dequant::dequantize(
                    t.src.ty,
                    &src[i * row_bytes..(i + 1) * row_bytes],
                    &mut x,
                );
                // The recipe only picks types that divide the rows into whole blocks.
                llada_kernels::dequant::quantize(t.ty, &x).unwrap_or_default()
            })
            .collect();
        for b in &bytes {
            if b.len() != out_row {
                return Err(std::io::Error::other(format!(
                    "tensor '{}': rows of {cols} do not make whole {} blocks",
                    t.name, t.ty
                )));
            }
            w.write_all(b)?;
        }
        progress(((r1 - r0) * out_row) as u64);
        release();
        r0 = r1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The permutation of two heads of 4 rows: [0 2 1 3 | 4 6 5 7].
    #[test]
    fn permutation_matches_llama_cpp() {
        let got: Vec<usize> = (0..8).map(|o| permuted_row(o, 8, 2)).collect();
        assert_eq!(got, [0, 2, 1, 3, 4, 6, 5, 7]);
        let got: Vec<usize> = (0..6).map(|o| permuted_row(o, 6, 1)).collect();
        assert_eq!(got, [0, 3, 1, 4, 2, 5]);
    }
}
