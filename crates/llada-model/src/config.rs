//! Hyper-parameters, from GGUF metadata or HF `config.json`.
use crate::ModelError;
use llada_formats::gguf::{GgufFile, Value};
use llada_formats::FormatError;
use serde_json::Value as J;
use std::path::Path;

/// Supported architectures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// LLaMA (SmolLM2 …): causal, optional GQA, no biases.
    Llama,
    /// Qwen2: LLaMA plus q/k/v biases.
    Qwen2,
    /// LLaDA: bidirectional masked-diffusion LM, LLaMA blocks, logits not shifted.
    LLaDA,
    /// Dream: bidirectional masked-diffusion LM on Qwen2 blocks, logits shifted by one.
    Dream,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::LLaDA => "llada",
            Arch::Dream => "dream",
        }
    }
    /// Diffusion LMs (bidirectional attention, mask token).
    pub fn is_diffusion(self) -> bool {
        matches!(self, Arch::LLaDA | Arch::Dream)
    }
}

/// Everything the forward pass needs to know about the model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_layers: usize,
    pub d_model: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub rope_theta: f64,
    pub rms_eps: f64,
    pub max_ctx: usize,
    pub qkv_bias: bool,
    pub tied_embeddings: bool,
    /// Dream: the logit for position i comes from the output at i−1.
    pub shift_logits: bool,
    pub mask_id: Option<u32>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    /// Reduced vocabulary (small drafts; HF `config.json` field `reduced_vocab_ids`): embedding
    /// and LM-head row `r` hold token `vocab_ids[r]`; every other token id shares one extra
    /// embedding row (the last) and gets no logit. `vocab` stays the size of the id space.
    pub vocab_ids: Option<Vec<u32>>,
}

impl ModelConfig {
    /// Rows of the embedding / LM-head tensors (`vocab`, or the reduced set plus the shared row).
    pub fn embedding_rows(&self) -> usize {
        self.vocab_ids.as_ref().map_or(self.vocab, |v| v.len() + 1)
    }
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    /// Parameter count implied by the shapes.
    pub fn param_count(&self) -> u64 {
        let d = self.d_model as u64;
        let per_layer = d * self.q_dim() as u64 * 2
            + d * self.kv_dim() as u64 * 2
            + 3 * d * self.ffn as u64
            + 2 * d
            + if self.qkv_bias {
                (self.q_dim() + 2 * self.kv_dim()) as u64
            } else {
                0
            };
        let emb = self.embedding_rows() as u64 * d;
        per_layer * self.n_layers as u64 + emb + if self.tied_embeddings { 0 } else { emb } + d
    }

    fn validate(self, path: &Path) -> Result<Self, ModelError> {
        let bad = |what: String| ModelError::Format(FormatError::corrupt(path, what));
        if self.n_layers == 0 || self.n_layers > 1024 {
            return Err(bad(format!("absurd layer count {}", self.n_layers)));
        }
        if self.d_model == 0 || self.d_model > 1 << 16 || self.ffn == 0 || self.ffn > 1 << 18 {
            return Err(bad(format!(
                "absurd widths d_model={} ffn={}",
                self.d_model, self.ffn
            )));
        }
        if self.n_heads == 0
            || self.n_kv_heads == 0
            || self.n_heads > 1 << 12
            || !self.n_heads.is_multiple_of(self.n_kv_heads)
        {
            return Err(bad(format!(
                "head counts {} / {} kv are inconsistent",
                self.n_heads, self.n_kv_heads
            )));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) || self.head_dim > 1024 {
            return Err(bad(format!("head dimension {} is invalid", self.head_dim)));
        }
        if self.vocab == 0 || self.vocab > 1 << 22 {
            return Err(bad(format!("absurd vocabulary size {}", self.vocab)));
        }
        if self.max_ctx == 0 {
            return Err(bad("context length is 0".into()));
        }
        if let Some(ids) = &self.vocab_ids {
            let mut seen = vec![false; self.vocab];
            for &t in ids {
                let slot = seen.get_mut(t as usize).ok_or_else(|| {
                    bad(format!(
                        "reduced_vocab_ids holds {t}, outside the vocabulary of {}",
                        self.vocab
                    ))
                })?;
                if std::mem::replace(slot, true) {
                    return Err(bad(format!("reduced_vocab_ids lists {t} twice")));
                }
            }
            if ids.is_empty() {
                return Err(bad("reduced_vocab_ids is empty".into()));
            }
        }
        let ok = self.rms_eps > 0.0 && self.rms_eps < 1.0 && self.rope_theta > 1.0;
        if !ok {
            return Err(bad(format!(
                "invalid eps {} or rope theta {}",
                self.rms_eps, self.rope_theta
            )));
        }
        Ok(self)
    }

    /// From GGUF metadata (llama.cpp key names).
    pub fn from_gguf(g: &GgufFile) -> Result<Self, ModelError> {
        let arch_s = g.architecture()?;
        let arch = match arch_s {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "llada" => Arch::LLaDA,
            "dream" => Arch::Dream,
            other => {
                return Err(FormatError::UnsupportedArch {
                    path: g.path.clone(),
                    arch: other.to_string(),
                    supported: "llama, qwen2, llada, dream".into(),
                }
                .into())
            }
        };
        let k = |s: &str| format!("{arch_s}.{s}");
        let u = |s: &str| g.get_u64(&k(s)).map(|v| v as usize);
        let d_model = u("embedding_length")?;
        let n_heads = u("attention.head_count")?;
        let n_kv_heads = g
            .get(&k("attention.head_count_kv"))
            .and_then(Value::as_u64)
            .map(|v| v as usize)
            .unwrap_or(n_heads);
        let head_dim = g
            .get(&k("attention.key_length"))
            .and_then(Value::as_u64)
            .map(|v| v as usize)
            .unwrap_or(d_model.checked_div(n_heads).unwrap_or(0));
        let vocab = match g.get(&k("vocab_size")).and_then(Value::as_u64) {
            Some(v) => v as usize,
            None => g
                .get("tokenizer.ggml.tokens")
                .and_then(Value::as_array)
                .map(|a| a.len())
                .ok_or_else(|| FormatError::metadata(&g.path, k("vocab_size"), " is missing"))?,
        };
        let id = |s: &str| g.get(s).and_then(Value::as_u64).map(|v| v as u32);
        let cfg = ModelConfig {
            arch,
            n_layers: u("block_count")?,
            d_model,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn: u("feed_forward_length")?,
            vocab,
            rope_theta: g
                .get(&k("rope.freq_base"))
                .and_then(Value::as_f64)
                .unwrap_or(10000.0),
            rms_eps: g.get_f64(&k("attention.layer_norm_rms_epsilon"))?,
            max_ctx: u("context_length")?,
            qkv_bias: g.tensors.contains_key("blk.0.attn_q.bias"),
            tied_embeddings: !g.tensors.contains_key("output.weight"),
            shift_logits: g
                .get("diffusion.shift_logits")
                .and_then(Value::as_bool)
                .unwrap_or(arch == Arch::Dream),
            mask_id: id("tokenizer.ggml.mask_token_id"),
            bos_id: id("tokenizer.ggml.bos_token_id"),
            eos_id: id("tokenizer.ggml.eos_token_id"),
            vocab_ids: None,
        };
        cfg.validate(&g.path)
    }

    /// From an HF `config.json` (real field names of each architecture).
    pub fn from_hf(cfg: &J, path: &Path) -> Result<Self, ModelError> {
        let archs: Vec<&str> = cfg
            .get("architectures")
            .and_then(J::as_array)
            .map(|a| a.iter().filter_map(J::as_str).collect())
            .unwrap_or_default();
        let model_type = cfg.get("model_type").and_then(J::as_str).unwrap_or("");
        let arch = if archs.contains(&"LLaDAModelLM") || model_type == "llada" {
            Arch::LLaDA
        } else if archs.contains(&"DreamModel") || model_type.eq_ignore_ascii_case("dream") {
            Arch::Dream
        } else if archs.contains(&"Qwen2ForCausalLM") || model_type == "qwen2" {
            Arch::Qwen2
        } else if archs.contains(&"LlamaForCausalLM") || model_type == "llama" {
            Arch::Llama
        } else {
            return Err(FormatError::UnsupportedArch {
                path: path.to_path_buf(),
                arch: archs.first().copied().unwrap_or(model_type).to_string(),
                supported: "LlamaForCausalLM, Qwen2ForCausalLM, LLaDAModelLM, DreamModel".into(),
            }
            .into());
        };
        let get = |key: &str| -> Result<usize, ModelError> {
            cfg.get(key)
                .and_then(J::as_u64)
                .map(|v| v as usize)
                .ok_or_else(|| {
                    FormatError::metadata(path, key, " is missing or not an integer").into()
                })
        };
        let opt_u = |key: &str| cfg.get(key).and_then(J::as_u64);
        let opt_f = |key: &str| cfg.get(key).and_then(J::as_f64);
        let vocab_ids: Option<Vec<u32>> = match cfg.get("reduced_vocab_ids") {
            None | Some(J::Null) => None,
            Some(v) => Some(
                v.as_array()
                    .and_then(|a| {
                        a.iter()
                            .map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()))
                            .collect::<Option<Vec<u32>>>()
                    })
                    .ok_or_else(|| {
                        FormatError::metadata(
                            path,
                            "reduced_vocab_ids",
                            " is not a list of token ids",
                        )
                    })?,
            ),
        };
        let c = if arch == Arch::LLaDA {
            let d_model = get("d_model")?;
            let n_heads = get("n_heads")?;
            ModelConfig {
                arch,
                n_layers: get("n_layers")?,
                d_model,
                n_heads,
                n_kv_heads: opt_u("n_kv_heads").map(|v| v as usize).unwrap_or(n_heads),
                head_dim: d_model / n_heads.max(1),
                ffn: get("mlp_hidden_size")?,
                vocab: opt_u("embedding_size").or(opt_u("vocab_size")).unwrap_or(0) as usize,
                rope_theta: opt_f("rope_theta").unwrap_or(10000.0),
                rms_eps: opt_f("rms_norm_eps").unwrap_or(1e-5),
                max_ctx: opt_u("max_sequence_length").unwrap_or(4096) as usize,
                qkv_bias: cfg
                    .get("include_bias")
                    .and_then(J::as_bool)
                    .unwrap_or(false)
                    || cfg
                        .get("include_qkv_bias")
                        .and_then(J::as_bool)
                        .unwrap_or(false),
                tied_embeddings: cfg
                    .get("weight_tying")
                    .and_then(J::as_bool)
                    .unwrap_or(false),
                shift_logits: false,
                mask_id: Some(opt_u("mask_token_id").unwrap_or(126336) as u32),
                bos_id: opt_u("bos_token_id").map(|v| v as u32),
                eos_id: opt_u("eos_token_id").map(|v| v as u32),
                vocab_ids: vocab_ids.clone(),
            }
        } else {
            let d_model = get("hidden_size")?;
            let n_heads = get("num_attention_heads")?;
            ModelConfig {
                arch,
                n_layers: get("num_hidden_layers")?,
                d_model,
                n_heads,
                n_kv_heads: opt_u("num_key_value_heads")
                    .map(|v| v as usize)
                    .unwrap_or(n_heads),
                head_dim: opt_u("head_dim")
                    .map(|v| v as usize)
                    .unwrap_or(d_model / n_heads.max(1)),
                ffn: get("intermediate_size")?,
                vocab: get("vocab_size")?,
                rope_theta: opt_f("rope_theta").unwrap_or(10000.0),
                rms_eps: opt_f("rms_norm_eps").unwrap_or(1e-6),
                max_ctx: opt_u("max_position_embeddings").unwrap_or(4096) as usize,
                qkv_bias: matches!(arch, Arch::Qwen2 | Arch::Dream),
                tied_embeddings: cfg
                    .get("tie_word_embeddings")
                    .and_then(J::as_bool)
                    .unwrap_or(false),
                shift_logits: arch == Arch::Dream,
                mask_id: opt_u("mask_token_id").map(|v| v as u32),
                bos_id: opt_u("bos_token_id").map(|v| v as u32),
                eos_id: opt_u("eos_token_id").map(|v| v as u32),
                vocab_ids: vocab_ids.clone(),
            }
        };
        c.validate(path)
    }
}
