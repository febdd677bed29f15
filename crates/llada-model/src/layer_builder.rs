//! Building a layer (and the LM head) from a tensor source: the [`Recipe`] holds what a build
//! needs — the source, its naming scheme, the requantization type and whether q/k rows are in
//! llama.cpp's permuted order — so the same code builds resident layers at load and streamed
//! ones on the prefetch thread ([`crate::store`]).
//!
//! Invariants: every tensor's shape is checked against the config before it is repacked (a
//! bad file fails naming the tensor); GGUF q/k rows (and biases) of LLaMA and LLaDA are put
//! back in HF head order, so a layer's numbers do not depend on the file format it came from.

use crate::config::ModelConfig;
use crate::tensor_names::Scheme;
use crate::weights::{Layer, Linear, Projection};
use crate::ModelError;
use llada_formats::{FormatError, TensorSource, TensorView};
use llada_kernels::GgmlType;
use llada_kernels::QMatrix;
use std::sync::Arc;

/// Everything needed to (re)build a layer from its source: used at load for resident layers
/// and on the prefetch thread for streamed ones.
pub(crate) struct Recipe {
    pub src: Arc<dyn TensorSource + Send + Sync>,
    pub scheme: Scheme,
    pub quant: Option<GgmlType>,
    pub permuted: bool,
}

impl Recipe {
    /// Tensor names of layer `i`.
    pub fn layer_tensors(&self, c: &ModelConfig, i: usize) -> Vec<String> {
        self.scheme.layer_tensors(c, i)
    }
    /// Bytes layer `i` occupies in the file.
    pub fn layer_file_bytes(&self, c: &ModelConfig, i: usize) -> u64 {
        self.layer_tensors(c, i)
            .iter()
            .filter_map(|t| self.src.get(t))
            .map(|v| v.len as u64)
            .sum()
    }
    /// The LM head's tensor name (the embedding when tied).
    pub fn head_name(&self, c: &ModelConfig) -> &'static str {
        let (emb, _, head) = self.scheme.globals();
        if c.tied_embeddings {
            emb
        } else {
            head
        }
    }
    /// The LM head's name and file bytes. (`get` of a staged source reads the tensor: call
    /// this on the file's own source, or use [`Self::head_name`].)
    pub fn head(&self, c: &ModelConfig) -> (&'static str, u64) {
        let name = self.head_name(c);
        (name, self.src.get(name).map_or(0, |v| v.len as u64))
    }
    pub fn build_head(&self, c: &ModelConfig) -> Result<Linear, ModelError> {
        let (name, _) = self.head(c);
        let v = self.src.require(name)?;
        v.expect_shape(&[c.embedding_rows(), c.d_model])?;
        Linear::from_view(&v, self.quant)
    }
    /// Build rows `[r0, r1)` of the LM head (a streamed head is read in such chunks).
    pub fn build_head_rows(
        &self,
        c: &ModelConfig,
        r0: usize,
        r1: usize,
    ) -> Result<Linear, ModelError> {
        self.build_head_view(c, &self.head_rows(c, r0, r1)?, r1 - r0)
    }
    /// The bytes of rows `[r0, r1)` of the LM head. Only the rows are read (a staged source
    /// would read the whole tensor for `get`); the full shape is checked at load.
    pub fn head_rows(
        &self,
        c: &ModelConfig,
        r0: usize,
        r1: usize,
    ) -> Result<TensorView, ModelError> {
        let name = self.head_name(c);
        self.src.get_rows(name, r0, r1).ok_or_else(|| {
            ModelError::Other(format!(
                "{}: rows {r0}..{r1} of tensor '{name}' cannot be read",
                self.src.path().display()
            ))
        })
    }
    /// Build `rows` rows of the LM head from their bytes `v`.
    pub fn build_head_view(
        &self,
        c: &ModelConfig,
        v: &TensorView,
        rows: usize,
    ) -> Result<Linear, ModelError> {
        v.expect_shape(&[rows, c.d_model])?;
        Linear::from_view(v, self.quant)
    }
    /// Build layer `i` (reads and repacks its tensors).
    pub fn build_layer(&self, c: &ModelConfig, i: usize) -> Result<Layer, ModelError> {
        self.build_layer_from(&*self.src, c, i)
    }
    /// Build layer `i` from `src` (the recipe's source, or its layer staged in one read).
    pub fn build_layer_from(
        &self,
        src: &dyn TensorSource,
        c: &ModelConfig,
        i: usize,
    ) -> Result<Layer, ModelError> {
        let d = c.d_model;
        let q = self.quant;
        let n = self.scheme.names(i);
        let perm_q = self.permuted.then_some(c.n_heads);
        let perm_k = self.permuted.then_some(c.n_kv_heads);
        let bias = |name: &str,
                    len: usize,
                    heads: Option<usize>|
         -> Result<Option<Vec<f32>>, ModelError> {
            if !c.qkv_bias {
                return Ok(None);
            }
            let mut v = src.require(name)?;
            v.expect_shape(&[len])?;
            if let Some(h) = heads {
                // Treat the bias as a [len × 1] matrix for the row permutation.
                v.shape = vec![len, 1];
                v = unpermute_rows(&v, h)?;
                v.shape = vec![len];
            }
            Ok(Some(v.to_f32()))
        };
        Ok(Layer {
            attn_norm: vec1(src, &n.attn_norm, d)?,
            qkv: projection(
                src,
                &[
                    (&n.q, c.q_dim(), perm_q),
                    (&n.k, c.kv_dim(), perm_k),
                    (&n.v, c.kv_dim(), None),
                ],
                d,
                q,
            )?,
            bq: bias(&n.bias[0], c.q_dim(), perm_q)?,
            bk: bias(&n.bias[1], c.kv_dim(), perm_k)?,
            bv: bias(&n.bias[2], c.kv_dim(), None)?,
            wo: matrix(src, &n.o, d, c.q_dim(), q, None)?,
            ffn_norm: vec1(src, &n.ffn_norm, d)?,
            gate_up: projection(src, &[(&n.gate, c.ffn, None), (&n.up, c.ffn, None)], d, q)?,
            w_down: matrix(src, &n.down, d, c.ffn, q, None)?,
        })
    }
}

/// Undo llama.cpp's q/k row permutation (`convert_hf_to_gguf.py`'s `LlamaModel.permute`, applied
/// to llama and llada): stored row `h·D + 2j + i` is HF row `h·D + i·D/2 + j`. Works on whole
/// rows, so on any (quantized) type; biases are 1-row-per-element and handled the same way.
pub(crate) fn unpermute_rows(v: &TensorView, n_head: usize) -> Result<TensorView, ModelError> {
    let rows = v.shape[0];
    if n_head == 0 || !rows.is_multiple_of(n_head) || !(rows / n_head).is_multiple_of(2) {
        return Err(FormatError::corrupt(
            &v.file,
            format!(
                "tensor '{}': {rows} rows do not split into {n_head} heads",
                v.name
            ),
        )
        .into());
    }
    let hd = rows / n_head;
    let rb = v.len / rows;
    let src = v.bytes();
    let mut out = vec![0u8; v.len];
    for h in 0..n_head {
        for i in 0..2 {
            for j in 0..hd / 2 {
                let hf = h * hd + i * hd / 2 + j;
                let st = h * hd + 2 * j + i;
                out[hf * rb..(hf + 1) * rb].copy_from_slice(&src[st * rb..(st + 1) * rb]);
            }
        }
    }
    let mut nv = v.clone();
    nv.len = out.len();
    nv.owner = Arc::new(out);
    nv.offset = 0;
    Ok(nv)
}

pub(crate) fn vec1(src: &dyn TensorSource, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
    let v = src.require(name)?;
    v.expect_shape(&[n])?;
    Ok(v.to_f32())
}

/// Projections reading the same input (`(name, rows, unpermute heads)` each, `cols` wide),
/// fused into one matrix: repacked straight into one buffer when they share a kernel type (no
/// per-part copies: a streamed layer is rebuilt every pass), else built part by part and fused
/// by [`Projection::new`].
fn projection(
    src: &dyn TensorSource,
    parts: &[(&str, usize, Option<usize>)],
    cols: usize,
    requant: Option<GgmlType>,
) -> Result<Projection, ModelError> {
    let views = parts
        .iter()
        .map(|&(name, rows, heads)| matrix_view(src, name, rows, cols, heads))
        .collect::<Result<Vec<_>, _>>()?;
    let ty = views.first().map(|v| v.ty);
    if let Some(ty) = ty.filter(|&t| {
        QMatrix::supports(t) && requant.is_none_or(|r| r == t) && views.iter().all(|v| v.ty == t)
    }) {
        let stacked: Vec<_> = views
            .iter()
            .map(|v| (v.shape[0], v.owner.clone(), v.offset))
            .collect();
        let w = QMatrix::new_stacked(ty, cols, &stacked).map_err(|e| {
            let names: Vec<&str> = views.iter().map(|v| v.name.as_str()).collect();
            ModelError::Other(format!(
                "{}: tensors {}: {e}",
                src.path().display(),
                names.join(", ")
            ))
        })?;
        return Ok(Projection::Fused {
            w: Linear::Quant(w),
            splits: parts.iter().map(|p| p.1).collect(),
        });
    }
    Projection::new(
        views
            .iter()
            .map(|v| Linear::from_view(v, requant))
            .collect::<Result<Vec<_>, _>>()?,
    )
}

/// A `[rows × cols]` matrix's bytes, checked, with the rows of a GGUF Q/K projection put back
/// in head order.
fn matrix_view(
    src: &dyn TensorSource,
    name: &str,
    rows: usize,
    cols: usize,
    unpermute_heads: Option<usize>,
) -> Result<TensorView, ModelError> {
    let v = src.require(name)?;
    v.expect_shape(&[rows, cols])?;
    match unpermute_heads {
        Some(h) => unpermute_rows(&v, h),
        None => Ok(v),
    }
}

fn matrix(
    src: &dyn TensorSource,
    name: &str,
    rows: usize,
    cols: usize,
    requant: Option<GgmlType>,
    unpermute_heads: Option<usize>,
) -> Result<Linear, ModelError> {
    Linear::from_view(
        &matrix_view(src, name, rows, cols, unpermute_heads)?,
        requant,
    )
}
