//! Weight containers: linear layers, norms, the embedding table.
//!
//! A [`Linear`] is either quantized (our batched kernel, [`llada_kernels::QMatrix`]) or dense f32
//! (a candle tensor: its gemm for wide passes, [`dense_few_rows`] for passes of at most
//! [`SMALL_M`] rows). Every block-quantized GGML type runs natively on its stored blocks;
//! dense F16/BF16 inputs are widened to f32 at load (candle's bf16 matmul is unusable on
//! CPUs), and `LoadOptions::quantize` can instead requantize them to any quantized type.

use crate::ModelError;
use candle_core::{Device, Tensor};
use llada_formats::TensorView;
use llada_kernels::{GgmlType, QMatrix, QuantizedActs};
use llada_runtime::trace::OpSpan;

/// A `[out × in]` weight applied as `y = x · Wᵀ (+ b)`.
pub enum Linear {
    Quant(QMatrix),
    Dense { w: Tensor, rows: usize, cols: usize },
}

impl Linear {
    /// Build from a stored tensor of shape `[out, in]`; `requant` converts it (F32 = dequantize).
    pub fn from_view(v: &TensorView, requant: Option<GgmlType>) -> Result<Self, ModelError> {
        if v.shape.len() != 2 {
            return Err(ModelError::Format(
                llada_formats::FormatError::ShapeMismatch {
                    path: v.file.clone(),
                    tensor: v.name.clone(),
                    got: v.shape.clone(),
                    expected: vec![0, 0],
                },
            ));
        }
        let (rows, cols) = (v.shape[0], v.shape[1]);
        if QMatrix::supports(v.ty) && requant.is_none_or(|t| t == v.ty) {
            let q = QMatrix::new(v.ty, rows, cols, v.owner.clone(), v.offset).map_err(|e| {
                ModelError::Other(format!("{}: tensor '{}': {e}", v.file.display(), v.name))
            })?;
            return Ok(Linear::Quant(q));
        }
        let f = v.to_f32();
        Self::from_f32(f, rows, cols, requant).map_err(|e| {
            ModelError::Other(format!("{}: tensor '{}': {e}", v.file.display(), v.name))
        })
    }

    /// Build from a dense row-major matrix, optionally quantizing it.
    pub fn from_f32(
        w: Vec<f32>,
        rows: usize,
        cols: usize,
        quant: Option<GgmlType>,
    ) -> Result<Self, ModelError> {
        if let Some(t) =
            quant.filter(|t| QMatrix::supports(*t) && cols.is_multiple_of(t.block_elems()))
        {
            let q = QMatrix::quantize(t, rows, cols, &w)
                .map_err(|e| ModelError::Other(e.to_string()))?;
            return Ok(Linear::Quant(q));
        }
        let w = Tensor::from_vec(w, (rows, cols), &Device::Cpu)?;
        Ok(Linear::Dense { w, rows, cols })
    }

    pub fn rows(&self) -> usize {
        match self {
            Linear::Quant(q) => q.rows(),
            Linear::Dense { rows, .. } => *rows,
        }
    }
    pub fn cols(&self) -> usize {
        match self {
            Linear::Quant(q) => q.cols(),
            Linear::Dense { cols, .. } => *cols,
        }
    }
    /// Bytes of weights read by one application.
    pub fn weight_bytes(&self) -> usize {
        match self {
            Linear::Quant(q) => q.stored_bytes(),
            Linear::Dense { rows, cols, .. } => rows * cols * 4,
        }
    }
    pub fn dtype(&self) -> GgmlType {
        match self {
            Linear::Quant(q) => q.ty(),
            Linear::Dense { .. } => GgmlType::F32,
        }
    }

    /// `y[m × rows] = x[m × cols] · Wᵀ`, with `xq` the activations quantized once by the caller
    /// (shared by the projections that read the same input).
    pub fn forward(
        &self,
        x: &[f32],
        xq: &mut Option<QuantizedActs>,
        m: usize,
        layer: i32,
        op: &str,
    ) -> Result<Vec<f32>, ModelError> {
        let (n, k) = (self.rows(), self.cols());
        let _span = OpSpan::begin(
            op,
            layer,
            &[m as u64, n as u64, k as u64],
            self.dtype().name(),
        )
        .cost(
            (self.weight_bytes() + m * k * 4) as u64,
            (m * n * 4) as u64,
            (2 * m * n * k) as u64,
        );
        match self {
            Linear::Quant(q) => {
                if xq.as_ref().is_none_or(|a| a.layout != q.act_layout()) {
                    *xq = Some(QuantizedActs::quantize(x, m, k, q.act_layout()));
                }
                let acts = xq
                    .as_ref()
                    .ok_or_else(|| ModelError::Other("activations".into()))?;
                let mut out = vec![0f32; m * n];
                q.matmul_q(acts, &mut out);
                Ok(out)
            }
            Linear::Dense { w, .. } => {
                if (1..=SMALL_M).contains(&m) {
                    if let Some(y) = dense_few_rows(w, x, m, n, k)? {
                        return Ok(y);
                    }
                }
                let xt = Tensor::from_slice(x, (m, k), &Device::Cpu)?;
                let y = xt.matmul(&w.t()?)?;
                Ok(y.flatten_all()?.to_vec1::<f32>()?)
            }
        }
    }
}

/// Batches of at most this many rows skip candle's gemm for dense weights (see
/// [`dense_few_rows`]; the crossover measured by `cargo run --release -p llada-model --example
/// few_rows`).
pub const SMALL_M: usize = 64;

/// `y = x · Wᵀ` for a few rows with [`llada_kernels::vecops::matmul_rows`] (weights read in
/// place, register-tiled, batch-invariant), in parallel over chunks of output features.
///
/// Written by hand because candle's gemm packs the whole (transposed) weight matrix on every
/// call: for the few-row passes of diffusion windows, revision probes and drafts, that packing
/// costs as much as the product itself. `None` when `w` is not a contiguous CPU f32 tensor (the
/// caller then uses the gemm).
pub fn dense_few_rows(
    w: &Tensor,
    x: &[f32],
    m: usize,
    n: usize,
    k: usize,
) -> Result<Option<Vec<f32>>, ModelError> {
    use rayon::prelude::*;
    let (st, layout) = w.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*st else {
        return Ok(None);
    };
    let Some((a, b)) = layout.contiguous_offsets() else {
        return Ok(None);
    };
    let Ok(all) = cpu.as_slice::<f32>() else {
        return Ok(None);
    };
    let data = &all[a..b];
    if data.len() != n * k || x.len() != m * k || k == 0 {
        return Ok(None);
    }
    // Output features per task: enough work per task to amortise the scheduling (even, so
    // that the 2-feature register tiles stay whole).
    let chunk = ((4096 / k.max(1)).clamp(8, 256) / 2) * 2;
    let mut yt = vec![0f32; n * m];
    if m * n * k < 1 << 16 {
        // A few microseconds of work: less than handing it to another thread.
        llada_kernels::vecops::matmul_rows(data, x, k, &mut yt);
    } else {
        yt.par_chunks_mut(chunk * m)
            .zip(data.par_chunks(chunk * k))
            .for_each(|(out, wc)| llada_kernels::vecops::matmul_rows(wc, x, k, out));
    }
    let mut y = vec![0f32; m * n];
    for (f, col) in yt.chunks_exact(m).enumerate() {
        for (i, v) in col.iter().enumerate() {
            y[i * n + f] = *v;
        }
    }
    Ok(Some(y))
}

/// Several projections of the same input: fused into one matrix when their types allow
/// (one kernel call instead of several), else applied one by one.
pub enum Projection {
    Fused { w: Linear, splits: Vec<usize> },
    Separate(Vec<Linear>),
}

impl Projection {
    /// Fuse `parts` (all `[out_i × in]`) when they share a kernel type.
    pub fn new(parts: Vec<Linear>) -> Result<Self, ModelError> {
        let splits: Vec<usize> = parts.iter().map(|p| p.rows()).collect();
        let quants: Vec<&QMatrix> = parts
            .iter()
            .filter_map(|p| match p {
                Linear::Quant(q) => Some(q),
                _ => None,
            })
            .collect();
        if quants.len() == parts.len() {
            if let Some(q) = QMatrix::concat_rows(&quants) {
                return Ok(Projection::Fused {
                    w: Linear::Quant(q),
                    splits,
                });
            }
        }
        let dense: Vec<&Tensor> = parts
            .iter()
            .filter_map(|p| match p {
                Linear::Dense { w, .. } => Some(w),
                _ => None,
            })
            .collect();
        if dense.len() == parts.len() {
            let w = Tensor::cat(&dense, 0)?;
            let cols = parts[0].cols();
            return Ok(Projection::Fused {
                w: Linear::Dense {
                    w,
                    rows: splits.iter().sum(),
                    cols,
                },
                splits,
            });
        }
        Ok(Projection::Separate(parts))
    }

    /// Apply to `x[m × in]`; one output `[m × out_i]` per part.
    pub fn forward(
        &self,
        x: &[f32],
        m: usize,
        layer: i32,
        op: &str,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let mut xq = None;
        match self {
            Projection::Separate(parts) => parts
                .iter()
                .map(|p| p.forward(x, &mut xq, m, layer, op))
                .collect(),
            Projection::Fused { w, splits } => {
                let y = w.forward(x, &mut xq, m, layer, op)?;
                let total = w.rows();
                let mut outs: Vec<Vec<f32>> =
                    splits.iter().map(|s| Vec::with_capacity(m * s)).collect();
                for row in y.chunks_exact(total) {
                    let mut o = 0;
                    for (out, s) in outs.iter_mut().zip(splits) {
                        out.extend_from_slice(&row[o..o + s]);
                        o += s;
                    }
                }
                Ok(outs)
            }
        }
    }

    /// The underlying matrices.
    pub fn linears(&self) -> Vec<&Linear> {
        match self {
            Projection::Fused { w, .. } => vec![w],
            Projection::Separate(p) => p.iter().collect(),
        }
    }
}

/// The token embedding table, read row by row in its stored type.
/// A reduced vocabulary: embedding / head row `r` is token `ids[r]`; all other tokens share the
/// last embedding row, and their logits are [`VocabMap::NO_LOGIT`] (probability 0 after softmax,
/// finite so `p · log p` stays 0).
#[derive(Debug, Clone)]
pub struct VocabMap {
    pub ids: Vec<u32>,
    row_of: Vec<u32>,
}

impl VocabMap {
    pub const NO_LOGIT: f32 = -1e30;
    /// `ids` must be distinct and `< vocab` (checked by the config).
    pub fn new(ids: Vec<u32>, vocab: usize) -> Self {
        let other = ids.len() as u32;
        let mut row_of = vec![other; vocab];
        for (r, &t) in ids.iter().enumerate() {
            if let Some(slot) = row_of.get_mut(t as usize) {
                *slot = r as u32;
            }
        }
        Self { ids, row_of }
    }
    /// The embedding row of token `t` (`t < vocab`).
    pub fn row(&self, t: u32) -> u32 {
        self.row_of
            .get(t as usize)
            .copied()
            .unwrap_or(self.ids.len() as u32)
    }
    /// Scatter `rows × (K + 1)` head outputs into `rows × vocab` logits (the shared row's logit
    /// is dropped).
    pub fn scatter(&self, small: &[f32], vocab: usize) -> Vec<f32> {
        let k1 = self.ids.len() + 1;
        let n = small.len() / k1;
        let mut out = vec![Self::NO_LOGIT; n * vocab];
        for (dst, src) in out.chunks_exact_mut(vocab).zip(small.chunks_exact(k1)) {
            for (&t, &v) in self.ids.iter().zip(src) {
                dst[t as usize] = v;
            }
        }
        out
    }
}

pub struct Embedding {
    view: TensorView,
    row_bytes: usize,
    pub vocab: usize,
    pub dim: usize,
}

impl Embedding {
    pub fn new(view: TensorView) -> Self {
        let (vocab, dim) = (view.shape[0], view.shape[1]);
        let row_bytes = view.len / vocab.max(1);
        Self {
            view,
            row_bytes,
            vocab,
            dim,
        }
    }
    /// Write the embedding of `tok` into `out` (length `dim`).
    pub fn lookup(&self, tok: u32, out: &mut [f32]) -> Result<(), ModelError> {
        let t = tok as usize;
        if t >= self.vocab {
            return Err(ModelError::BadToken {
                id: tok,
                vocab: self.vocab,
            });
        }
        let b = &self.view.bytes()[t * self.row_bytes..(t + 1) * self.row_bytes];
        llada_kernels::dequant::dequantize(self.view.ty, b, out);
        Ok(())
    }
    pub fn view(&self) -> &TensorView {
        &self.view
    }
}

/// One transformer block's weights.
pub struct Layer {
    pub attn_norm: Vec<f32>,
    /// q, k, v projections (fused when possible).
    pub qkv: Projection,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub wo: Linear,
    pub ffn_norm: Vec<f32>,
    /// gate and up projections (fused when possible).
    pub gate_up: Projection,
    pub w_down: Linear,
}

impl Layer {
    /// Every matrix of the block.
    pub fn linears(&self) -> Vec<&Linear> {
        let mut v = self.qkv.linears();
        v.push(&self.wo);
        v.extend(self.gate_up.linears());
        v.push(&self.w_down);
        v
    }

    pub fn weight_bytes(&self) -> usize {
        self.linears()
            .iter()
            .map(|l| l.weight_bytes())
            .sum::<usize>()
            + (self.attn_norm.len() + self.ffn_norm.len()) * 4
    }
}

/// All weights of a model.
pub struct Weights {
    pub embed: Embedding,
    /// Reduced vocabulary (see [`ModelConfig::vocab_ids`](crate::ModelConfig)).
    pub vocab_map: Option<VocabMap>,
    /// `None`: streamed from the file for every pass (memory budget; see `store`).
    pub layers: Vec<Option<Layer>>,
    pub final_norm: Vec<f32>,
    /// `None`: streamed.
    pub lm_head: Option<Linear>,
}
