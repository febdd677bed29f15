//! Exporting a subset of a model's layers as f32 tensors under HF LLaMA names (a draft model
//! initialised from its target's layers).
//!
//! Invariants: the output is in HF layout whatever the source (GGUF q/k rows un-permuted,
//! quantized tensors dequantized), and layers are renumbered `0..layers.len()` in the order
//! given.

use crate::config::{Arch, ModelConfig};
use crate::layer_builder::unpermute_rows;
use crate::tensor_names::{hf_names, Scheme};
use crate::ModelError;
use llada_formats::gguf::GgufFile;
use llada_formats::hf::HfDir;
use llada_formats::{FormatError, TensorSource, TensorView};
use std::path::Path;
use std::sync::Arc;

/// One tensor of [`export_layers_f32`]: its HF (LLaMA-scheme) name, shape and f32 values.
pub struct ExportedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// A model's embedding, final norm and the chosen `layers` as f32 tensors under HF LLaMA names,
/// renumbered `0..layers.len()` (for a draft initialised from a subset of its target's layers).
/// GGUF q/k rows are un-permuted, so the tensors are in the layout the HF checkpoints (and the
/// trainer) use; quantized tensors are dequantized.
pub fn export_layers_f32(
    path: &Path,
    layers: &[usize],
) -> Result<(ModelConfig, Vec<ExportedTensor>), ModelError> {
    let (src, config, scheme, permuted): (Arc<dyn TensorSource + Send + Sync>, _, _, _) =
        if path.is_dir() {
            let hf = Arc::new(HfDir::open(path)?);
            let c = ModelConfig::from_hf(&hf.config, &hf.config_path())?;
            let arch = c.arch;
            (hf, c, Scheme::Hf(arch), false)
        } else {
            let g = Arc::new(GgufFile::open(path)?);
            let c = ModelConfig::from_gguf(&g)?;
            let permuted = matches!(c.arch, Arch::Llama | Arch::LLaDA);
            (g, c, Scheme::Gguf, permuted)
        };
    let bad = |msg: String| ModelError::from(FormatError::corrupt(path, msg));
    if config.arch != Arch::Llama || config.qkv_bias {
        return Err(bad(format!(
            "exporting layers needs a LLaMA-architecture model without q/k/v biases, found {:?}",
            config.arch
        )));
    }
    if let Some(&l) = layers.iter().find(|&&l| l >= config.n_layers) {
        return Err(bad(format!(
            "layer {l} does not exist (the model has {} layers)",
            config.n_layers
        )));
    }
    let mut out = Vec::new();
    let mut push = |name: String, v: TensorView| {
        out.push(ExportedTensor {
            name,
            shape: v.shape.clone(),
            data: v.to_f32(),
        })
    };
    let (emb, norm, _) = scheme.globals();
    let (hf_emb, hf_norm, _) = Scheme::Hf(Arch::Llama).globals();
    push(hf_emb.into(), src.require(emb)?);
    push(hf_norm.into(), src.require(norm)?);
    for (j, &i) in layers.iter().enumerate() {
        let from = scheme.names(i);
        let to = hf_names(Arch::Llama, j);
        let pairs = [
            (&from.attn_norm, &to.attn_norm, None),
            (&from.q, &to.q, Some(config.n_heads)),
            (&from.k, &to.k, Some(config.n_kv_heads)),
            (&from.v, &to.v, None),
            (&from.o, &to.o, None),
            (&from.ffn_norm, &to.ffn_norm, None),
            (&from.gate, &to.gate, None),
            (&from.up, &to.up, None),
            (&from.down, &to.down, None),
        ];
        for (f, t, heads) in pairs {
            let mut v = src.require(f)?;
            if let (true, Some(h)) = (permuted, heads) {
                v = unpermute_rows(&v, h)?;
            }
            push(t.clone(), v);
        }
    }
    Ok((config, out))
}
