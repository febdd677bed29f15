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

/// The keys a config's values came from, for validation messages.
struct Keys {
    eps: String,
    theta: String,
    mask: String,
    bos: String,
    eos: String,
}

/// A token id read from `key` must be inside the vocabulary of `vocab` tokens.
fn check_token_id(path: &Path, key: &str, id: u64, vocab: usize) -> Result<(), ModelError> {
    if id >= vocab as u64 {
        return Err(FormatError::metadata(
            path,
            key,
            format!(": token id {id} is outside the vocabulary ({vocab} tokens)"),
        )
        .into());
    }
    Ok(())
}

/// A token id (`u32`) from an integer, or an error naming `key`.
fn token_id(path: &Path, key: &str, v: u64) -> Result<u32, ModelError> {
    u32::try_from(v).map_err(|_| {
        FormatError::metadata(
            path,
            key,
            format!(": token id {v} is out of range (ids are 32-bit)"),
        )
        .into()
    })
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

    fn validate(self, path: &Path, keys: &Keys) -> Result<Self, ModelError> {
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
        // (NaN fails both comparisons.)
        if !(self.rms_eps > 0.0 && self.rms_eps < 1.0) {
            return Err(bad(format!(
                "invalid eps {} ('{}' must be a number in (0, 1))",
                self.rms_eps, keys.eps
            )));
        }
        if !(self.rope_theta > 1.0 && self.rope_theta.is_finite()) {
            return Err(bad(format!(
                "invalid rope theta {} ('{}' must be a finite number above 1)",
                self.rope_theta, keys.theta
            )));
        }
        // Special token ids index the embedding: each must be inside the vocabulary.
        for (id, key) in [
            (self.mask_id, &keys.mask),
            (self.bos_id, &keys.bos),
            (self.eos_id, &keys.eos),
        ] {
            if let Some(id) = id {
                check_token_id(path, key, id as u64, self.vocab)?;
            }
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
        // Optional keys: absent gives the default, a value of the wrong type is an error.
        let opt_u = |key: &str| -> Result<Option<u64>, FormatError> {
            g.get(key)
                .map(|v| {
                    v.as_u64().ok_or_else(|| {
                        FormatError::metadata(&g.path, key, ": not an unsigned integer")
                    })
                })
                .transpose()
        };
        let d_model = u("embedding_length")?;
        let n_heads = u("attention.head_count")?;
        let n_kv_heads = opt_u(&k("attention.head_count_kv"))?
            .map(|v| v as usize)
            .unwrap_or(n_heads);
        let head_dim = opt_u(&k("attention.key_length"))?
            .map(|v| v as usize)
            .unwrap_or(d_model.checked_div(n_heads).unwrap_or(0));
        let vocab = match opt_u(&k("vocab_size"))? {
            Some(v) => v as usize,
            None => g
                .get("tokenizer.ggml.tokens")
                .and_then(Value::as_array)
                .map(|a| a.len())
                .ok_or_else(|| FormatError::metadata(&g.path, k("vocab_size"), " is missing"))?,
        };
        let id = |key: &str| -> Result<Option<u32>, ModelError> {
            opt_u(key)?.map(|v| token_id(&g.path, key, v)).transpose()
        };
        let theta_key = k("rope.freq_base");
        let rope_theta = match g.get(&theta_key) {
            None => 10000.0,
            Some(v) => v
                .as_f64()
                .ok_or_else(|| FormatError::metadata(&g.path, &theta_key, ": not a number"))?,
        };
        let shift_logits = match g.get("diffusion.shift_logits") {
            None => arch == Arch::Dream,
            Some(v) => v.as_bool().ok_or_else(|| {
                FormatError::metadata(&g.path, "diffusion.shift_logits", ": not a boolean")
            })?,
        };
        let cfg = ModelConfig {
            arch,
            n_layers: u("block_count")?,
            d_model,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn: u("feed_forward_length")?,
            vocab,
            rope_theta,
            rms_eps: g.get_f64(&k("attention.layer_norm_rms_epsilon"))?,
            max_ctx: u("context_length")?,
            qkv_bias: g.tensors.contains_key("blk.0.attn_q.bias"),
            tied_embeddings: !g.tensors.contains_key("output.weight"),
            shift_logits,
            mask_id: id("tokenizer.ggml.mask_token_id")?,
            bos_id: id("tokenizer.ggml.bos_token_id")?,
            eos_id: id("tokenizer.ggml.eos_token_id")?,
            vocab_ids: None,
        };
        let keys = Keys {
            eps: k("attention.layer_norm_rms_epsilon"),
            theta: theta_key,
            mask: "tokenizer.ggml.mask_token_id".into(),
            bos: "tokenizer.ggml.bos_token_id".into(),
            eos: "tokenizer.ggml.eos_token_id".into(),
        };
        cfg.validate(&g.path, &keys)
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
        // Optional fields: absent or `null` gives the default; present, `conv` must read it,
        // else an error naming the key and `what` it should be (never a silent fallback).
        let present = |key: &str| cfg.get(key).filter(|v| !v.is_null());
        fn opt<T>(
            v: Option<&J>,
            path: &Path,
            key: &str,
            what: &str,
            conv: impl Fn(&J) -> Option<T>,
        ) -> Result<Option<T>, ModelError> {
            v.map(|v| conv(v).ok_or_else(|| FormatError::metadata(path, key, what).into()))
                .transpose()
        }
        let opt_u = |key: &str| {
            opt(
                present(key),
                path,
                key,
                ": not a non-negative integer",
                J::as_u64,
            )
        };
        let opt_f = |key: &str| opt(present(key), path, key, ": not a number", J::as_f64);
        let opt_b = |key: &str| opt(present(key), path, key, ": not a boolean", J::as_bool);
        let id = |key: &str| -> Result<Option<u32>, ModelError> {
            opt_u(key)?.map(|v| token_id(path, key, v)).transpose()
        };
        // `eos_token_id` may be a list (LLaMA-3.1 and others): the first is the EOS id, the
        // others are checked against the vocabulary too.
        let eos_ids: Vec<u32> = match present("eos_token_id") {
            None => vec![],
            Some(v) => v
                .as_array()
                .map_or(std::slice::from_ref(v), |a| a.as_slice())
                .iter()
                .map(|x| {
                    let v = x.as_u64().ok_or_else(|| {
                        FormatError::metadata(
                            path,
                            "eos_token_id",
                            ": not a token id or a list of token ids",
                        )
                    })?;
                    token_id(path, "eos_token_id", v)
                })
                .collect::<Result<_, _>>()?,
        };
        let (eos_id, more_eos) = (eos_ids.first().copied(), eos_ids);
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
        let mut keys = Keys {
            eps: "rms_norm_eps".into(),
            theta: "rope_theta".into(),
            mask: "mask_token_id".into(),
            bos: "bos_token_id".into(),
            eos: "eos_token_id".into(),
        };
        let c = if arch == Arch::LLaDA {
            let d_model = get("d_model")?;
            let n_heads = get("n_heads")?;
            // LLaDA's checkpoints name their mask token in the code, not always in the config.
            let mask_id = match id("mask_token_id")? {
                Some(m) => m,
                None => {
                    keys.mask = "mask_token_id (absent: LLaDA's default 126336)".into();
                    126336
                }
            };
            ModelConfig {
                arch,
                n_layers: get("n_layers")?,
                d_model,
                n_heads,
                n_kv_heads: opt_u("n_kv_heads")?.map(|v| v as usize).unwrap_or(n_heads),
                head_dim: d_model / n_heads.max(1),
                ffn: get("mlp_hidden_size")?,
                vocab: match opt_u("embedding_size")? {
                    Some(v) => v,
                    None => opt_u("vocab_size")?.unwrap_or(0),
                } as usize,
                rope_theta: opt_f("rope_theta")?.unwrap_or(10000.0),
                rms_eps: opt_f("rms_norm_eps")?.unwrap_or(1e-5),
                max_ctx: opt_u("max_sequence_length")?.unwrap_or(4096) as usize,
                qkv_bias: opt_b("include_bias")?.unwrap_or(false)
                    || opt_b("include_qkv_bias")?.unwrap_or(false),
                tied_embeddings: opt_b("weight_tying")?.unwrap_or(false),
                shift_logits: false,
                mask_id: Some(mask_id),
                bos_id: id("bos_token_id")?,
                eos_id,
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
                n_kv_heads: opt_u("num_key_value_heads")?
                    .map(|v| v as usize)
                    .unwrap_or(n_heads),
                head_dim: opt_u("head_dim")?
                    .map(|v| v as usize)
                    .unwrap_or(d_model / n_heads.max(1)),
                ffn: get("intermediate_size")?,
                vocab: get("vocab_size")?,
                rope_theta: opt_f("rope_theta")?.unwrap_or(10000.0),
                rms_eps: opt_f("rms_norm_eps")?.unwrap_or(1e-6),
                max_ctx: opt_u("max_position_embeddings")?.unwrap_or(4096) as usize,
                qkv_bias: matches!(arch, Arch::Qwen2 | Arch::Dream),
                tied_embeddings: opt_b("tie_word_embeddings")?.unwrap_or(false),
                shift_logits: arch == Arch::Dream,
                mask_id: id("mask_token_id")?,
                bos_id: id("bos_token_id")?,
                eos_id,
                vocab_ids: vocab_ids.clone(),
            }
        };
        let c = c.validate(path, &keys)?;
        for id in more_eos {
            check_token_id(path, "eos_token_id", id as u64, c.vocab)?;
        }
        Ok(c)
    }
}
