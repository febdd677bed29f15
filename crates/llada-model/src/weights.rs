//! Weight containers: linear layers, norms, the embedding table.
//!
//! A [`Linear`] is either quantized (our batched kernel, [`llada_kernels::QMatrix`]) or dense f32
//! (a candle tensor, whose gemm is good for dense f32 at every M). Dense F16/BF16/Q6_K inputs are
//! converted at load (candle's bf16 matmul is unusable on CPUs); `LoadOptions::quantize` can
//! instead requantize them to Q8_0/Q4_0/Q4_1/Q4_K for speed.

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
    /// Build from a stored tensor of shape `[out, in]`.
    pub fn from_view(v: &TensorView, requant: Option<GgmlType>) -> Result<Self, ModelError> {
        if v.shape.len() != 2 {
            return Err(ModelError::Format(llada_formats::FormatError::ShapeMismatch {
                path: v.file.clone(),
                tensor: v.name.clone(),
                got: v.shape.clone(),
                expected: vec![0, 0],
            }));
        }
        let (rows, cols) = (v.shape[0], v.shape[1]);
        if QMatrix::supports(v.ty) && requant.is_none_or(|t| t == v.ty) {
            let q = QMatrix::new(v.ty, rows, cols, v.owner.clone(), v.offset)
                .map_err(|e| ModelError::Other(format!("{}: tensor '{}': {e}", v.file.display(), v.name)))?;
            return Ok(Linear::Quant(q));
        }
        let f = v.to_f32();
        Self::from_f32(f, rows, cols, requant.or(match v.ty {
            // Q6_K has no kernel of its own: requantize to Q8_0 (error ≈ 0.4% of a row's range).
            GgmlType::Q6K => Some(GgmlType::Q8_0),
            _ => None,
        }))
        .map_err(|e| ModelError::Other(format!("{}: tensor '{}': {e}", v.file.display(), v.name)))
    }

    /// Build from a dense row-major matrix, optionally quantizing it.
    pub fn from_f32(w: Vec<f32>, rows: usize, cols: usize, quant: Option<GgmlType>) -> Result<Self, ModelError> {
        if let Some(t) = quant.filter(|t| QMatrix::supports(*t) && cols % t.block_elems() == 0) {
            let q = QMatrix::quantize(t, rows, cols, &w).map_err(|e| ModelError::Other(e.to_string()))?;
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
            Linear::Quant(q) => q.bytes().len(),
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
    pub fn forward(&self, x: &[f32], xq: &mut Option<QuantizedActs>, m: usize, layer: i32, op: &str) -> Result<Vec<f32>, ModelError> {
        let (n, k) = (self.rows(), self.cols());
        let _span = OpSpan::begin(op, layer, &[m as u64, n as u64, k as u64], self.dtype().name())
            .cost((self.weight_bytes() + m * k * 4) as u64, (m * n * 4) as u64, (2 * m * n * k) as u64);
        match self {
            Linear::Quant(q) => {
                let acts = xq.get_or_insert_with(|| QuantizedActs::quantize(x, m, k));
                let mut out = vec![0f32; m * n];
                q.matmul_q(acts, &mut out);
                Ok(out)
            }
            Linear::Dense { w, .. } => {
                let xt = Tensor::from_slice(x, (m, k), &Device::Cpu)?;
                let y = xt.matmul(&w.t()?)?;
                Ok(y.flatten_all()?.to_vec1::<f32>()?)
            }
        }
    }
}

/// The token embedding table, read row by row in its stored type.
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
    pub wq: Linear,
    pub wk: Linear,
    pub wv: Linear,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub wo: Linear,
    pub ffn_norm: Vec<f32>,
    pub w_gate: Linear,
    pub w_up: Linear,
    pub w_down: Linear,
}

impl Layer {
    pub fn weight_bytes(&self) -> usize {
        [&self.wq, &self.wk, &self.wv, &self.wo, &self.w_gate, &self.w_up, &self.w_down]
            .iter()
            .map(|l| l.weight_bytes())
            .sum::<usize>()
            + (self.attn_norm.len() + self.ffn_norm.len()) * 4
    }
}

/// All weights of a model.
pub struct Weights {
    pub embed: Embedding,
    pub layers: Vec<Layer>,
    pub final_norm: Vec<f32>,
    pub lm_head: Linear,
}
