//! `llada quantize`'s plan: a GGUF file to another file type, any supported type to any other,
//! with llama.cpp's mixing rules ([`crate::recipe`]).
//!
//! Invariants: the metadata is copied as it is, except `general.file_type` and
//! `general.quantization_version` (set for the new type) and `general.alignment` (the output is
//! aligned to 32); tensors keep their names, shapes and order; tensors the rules leave alone
//! (norms, biases, 1-D) keep their type and bytes. Quantized sources are dequantized to f32 and
//! requantized, as `llama-quantize` does.

use crate::plan::{OutTensor, Plan};
use crate::recipe::{choose, ModelFacts, Target};
use crate::ConvertError;
use llada_formats::gguf::GgufFile;
use llada_formats::TensorSource;
use std::path::Path;
use std::sync::Arc;

/// Plan requantizing the GGUF file `input` to `target`.
pub fn plan_quantize(input: &Path, target: Target) -> Result<Plan, ConvertError> {
    let g = Arc::new(GgufFile::open(input)?);
    g.architecture()?;
    let count = |part: &str| g.order.iter().filter(|n| n.contains(part)).count();
    let facts = ModelFacts {
        n_attn_v: count("attn_v.weight"),
        n_ffn_down: count("ffn_down"),
        tied: !g.tensors.contains_key("output.weight"),
    };
    let skip = [
        "general.file_type",
        "general.quantization_version",
        "general.alignment",
    ];
    // The architecture first, as every writer puts it.
    let mut kv: Vec<_> = g
        .metadata
        .iter()
        .filter(|(k, _)| !skip.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    kv.sort_by_key(|(k, _)| k != "general.architecture");
    kv.push((
        "general.file_type".into(),
        llada_formats::gguf::Value::U32(target.file_type()),
    ));
    kv.push((
        "general.quantization_version".into(),
        llada_formats::gguf::Value::U32(2),
    ));
    let mut tensors = Vec::with_capacity(g.order.len());
    for name in &g.order {
        let src = g.require(name)?;
        let cols = *src.shape.last().unwrap_or(&1);
        let c = choose(target, name, cols, src.shape.len(), src.ty, &facts);
        tensors.push(OutTensor {
            name: name.clone(),
            shape: src.shape.clone(),
            src_name: name.clone(),
            src,
            ty: c.ty,
            permute_heads: None,
            note: c.note,
        });
    }
    Ok(Plan {
        target,
        kv,
        tensors,
        source: g,
    })
}
