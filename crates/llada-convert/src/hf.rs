//! `llada convert`'s plan: an HF directory (LLaMA, Qwen2, LLaDA, Dream; f32/f16/bf16
//! safetensors, sharded or not) as the GGUF `convert_hf_to_gguf.py` writes, then typed by the
//! recipe of the requested file type.
//!
//! Invariants: every tensor of the checkpoint is mapped to llama.cpp's name or the conversion
//! is refused (an unknown tensor would be silently dropped); every expected tensor is present
//! with the shape the config implies; q/k rows (and biases) of `llama` and `llada` get
//! llama.cpp's permutation (the `k` one by the KV head count); 1-D tensors are written as F32.

use crate::plan::{OutTensor, Plan};
use crate::recipe::{choose, ModelFacts, Target};
use crate::vocab::tokenizer_kv;
use crate::ConvertError;
use llada_formats::gguf::Value;
use llada_formats::hf::HfDir;
use llada_formats::TensorSource;
use llada_kernels::GgmlType;
use llada_model::{hf_to_gguf_names, Arch, ModelConfig};
use std::path::Path;
use std::sync::Arc;

/// The architecture's metadata keys (`{arch}.…`, `general.*`, `diffusion.*`).
fn model_kv(c: &ModelConfig, target: Target, name: &str) -> Vec<(String, Value)> {
    let a = c.arch.name();
    let k = |s: &str| format!("{a}.{s}");
    let u = |v: usize| Value::U32(v as u32);
    let mut kv = vec![
        ("general.architecture".into(), Value::String(a.into())),
        ("general.type".into(), Value::String("model".into())),
        ("general.name".into(), Value::String(name.into())),
        (k("block_count"), u(c.n_layers)),
        (k("context_length"), u(c.max_ctx)),
        (k("embedding_length"), u(c.d_model)),
        (k("feed_forward_length"), u(c.ffn)),
        (k("attention.head_count"), u(c.n_heads)),
        (k("attention.head_count_kv"), u(c.n_kv_heads)),
        (k("rope.freq_base"), Value::F32(c.rope_theta as f32)),
        (
            k("attention.layer_norm_rms_epsilon"),
            Value::F32(c.rms_eps as f32),
        ),
    ];
    if c.head_dim * c.n_heads != c.d_model {
        kv.push((k("attention.key_length"), u(c.head_dim)));
        kv.push((k("attention.value_length"), u(c.head_dim)));
    }
    if matches!(c.arch, Arch::Llama | Arch::LLaDA) {
        kv.push((k("vocab_size"), u(c.vocab)));
        kv.push((k("rope.dimension_count"), u(c.head_dim)));
    }
    if c.arch.is_diffusion() {
        kv.push((k("attention.causal"), Value::Bool(false)));
        kv.push(("diffusion.shift_logits".into(), Value::Bool(c.shift_logits)));
    }
    kv.push(("general.file_type".into(), Value::U32(target.file_type())));
    kv.push(("general.quantization_version".into(), Value::U32(2)));
    kv
}

/// Plan the conversion of the HF directory `dir` to `target`.
pub fn plan_convert(dir: &Path, target: Target) -> Result<Plan, ConvertError> {
    let hf = Arc::new(HfDir::open(dir)?);
    let cfg_path = hf.config_path();
    let c = ModelConfig::from_hf(&hf.config, &cfg_path)?;
    if c.vocab_ids.is_some() {
        return Err(ConvertError::Unsupported {
            path: cfg_path,
            what: "a reduced vocabulary (reduced_vocab_ids) has no llama.cpp equivalent".into(),
        });
    }
    let names = hf_to_gguf_names(&c);
    // Every tensor of the checkpoint must be one of ours (the rotary tables some checkpoints
    // save are recomputed, as llama.cpp does; a tied head saved anyway is the embedding).
    for n in hf.names() {
        let known = names.iter().any(|(h, _)| *h == n)
            || n.ends_with("rotary_emb.inv_freq")
            || (c.tied_embeddings && n == "lm_head.weight");
        if !known {
            let file = hf.get(&n).map_or(hf.dir.clone(), |v| v.file);
            return Err(ConvertError::Unsupported {
                path: file,
                what: format!("tensor '{n}' has no llama.cpp name for {}", c.arch.name()),
            });
        }
    }
    let facts = ModelFacts {
        n_attn_v: c.n_layers,
        n_ffn_down: c.n_layers,
        tied: c.tied_embeddings,
    };
    let permutes = matches!(c.arch, Arch::Llama | Arch::LLaDA);
    let mut tensors = Vec::with_capacity(names.len());
    for (h, g) in names {
        let src = hf.require(&h)?;
        src.expect_shape(&expected_shape(&c, &g))?;
        let cols = *src.shape.last().unwrap_or(&1);
        let choice = choose(target, &g, cols, src.shape.len(), GgmlType::F32, &facts);
        let permute_heads = match () {
            _ if !permutes => None,
            _ if g.contains(".attn_q.") => Some(c.n_heads),
            _ if g.contains(".attn_k.") => Some(c.n_kv_heads),
            _ => None,
        };
        tensors.push(OutTensor {
            name: g,
            shape: src.shape.clone(),
            src_name: h,
            src,
            ty: choice.ty,
            permute_heads,
            note: choice.note,
        });
    }
    let name = dir
        .canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "model".into());
    let mut kv = model_kv(&c, target, &name);
    let add_bos = (c.arch == Arch::LLaDA).then_some(true);
    let mut tok = tokenizer_kv(dir, &hf.config, c.vocab, add_bos)?;
    if let Some(m) = c.mask_id {
        tok.retain(|(k, _)| k != "tokenizer.ggml.mask_token_id");
        tok.push(("tokenizer.ggml.mask_token_id".into(), Value::U32(m)));
    }
    kv.extend(tok);
    Ok(Plan {
        target,
        kv,
        tensors,
        source: hf,
    })
}

/// The row-major shape the config implies for GGUF tensor `g`.
fn expected_shape(c: &ModelConfig, g: &str) -> Vec<usize> {
    let d = c.d_model;
    // `blk.N.attn_q.weight` → `attn_q.weight`.
    let part = g
        .strip_prefix("blk.")
        .and_then(|s| s.split_once('.'))
        .map_or(g, |(_, s)| s);
    match part {
        "token_embd.weight" | "output.weight" => vec![c.embedding_rows(), d],
        "output_norm.weight" | "attn_norm.weight" | "ffn_norm.weight" => vec![d],
        "attn_q.weight" => vec![c.q_dim(), d],
        "attn_k.weight" | "attn_v.weight" => vec![c.kv_dim(), d],
        "attn_output.weight" => vec![d, c.q_dim()],
        "ffn_gate.weight" | "ffn_up.weight" => vec![c.ffn, d],
        "ffn_down.weight" => vec![d, c.ffn],
        "attn_q.bias" => vec![c.q_dim()],
        "attn_k.bias" | "attn_v.bias" => vec![c.kv_dim()],
        _ => vec![],
    }
}
