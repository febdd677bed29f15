//! A trainable LLaMA-style transformer whose parameter names are those of the real checkpoint
//! format it is saved as, so `VarMap::save` writes a `model.safetensors` the engine loads with
//! the same code path as LLaDA-8B or Dream-7B.

use crate::ops::Visibility;
use candle_core::{DType, Device, Result, Tensor, Var, D};
use candle_nn::{Init, VarBuilder, VarMap};
use serde_json::json;

/// `n` draws of N(0, std²) from a generator seeded by `seed` and the parameter's `name`
/// (Box–Muller), so parameters do not depend on creation order. The generator is SplitMix64,
/// written out here so that a dependency update cannot change the models a seed makes (rand's
/// `StdRng` does not promise a stable algorithm across versions).
fn seeded_normal(seed: u64, name: &str, n: usize, std: f64) -> Vec<f32> {
    // FNV-1a of the name, mixed with the seed.
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let mut state = h ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    // Uniform in (0, 1]: the top 53 bits of a SplitMix64 output, plus one ulp.
    let mut uniform = || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        ((z >> 11) + 1) as f64 / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let (u1, u2) = (uniform(), uniform());
            (std * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        })
        .collect()
}

/// Which real format the model is saved in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `LLaDAModelLM`: bidirectional, no biases, `model.transformer.*` names.
    LLaDA,
    /// `DreamModel`: bidirectional, Qwen2 names, q/k/v biases, GQA, shifted logits.
    Dream,
    /// `LlamaForCausalLM`: causal (drafts).
    Llama,
}

/// Shape of the model.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    pub format: Format,
    pub vocab: usize,
    pub d_model: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub ffn: usize,
    pub rope_theta: f64,
    pub rms_eps: f64,
    pub max_len: usize,
    pub mask_id: u32,
    pub eos_id: u32,
    pub bos_id: u32,
    /// Tie the LM head to the embedding (no head tensor is saved; LLaDA's `weight_tying`,
    /// Dream's and Llama's `tie_word_embeddings`).
    pub tied: bool,
    /// Store weights as f16 (training stays in f32).
    pub store_f16: bool,
    /// Standard deviation of the normal init (output projections: divided by √(2·layers)).
    pub init_std: f64,
}

impl ModelSpec {
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads
    }

    fn dtype_name(&self) -> &'static str {
        if self.store_f16 {
            "float16"
        } else {
            "float32"
        }
    }

    /// `config.json` with the real field names of the format.
    pub fn config_json(&self) -> serde_json::Value {
        match self.format {
            Format::LLaDA => json!({
                "architectures": ["LLaDAModelLM"], "model_type": "llada",
                "d_model": self.d_model, "n_heads": self.n_heads, "n_kv_heads": self.n_kv_heads,
                "n_layers": self.n_layers, "mlp_hidden_size": self.ffn,
                "mlp_ratio": self.ffn / self.d_model, "vocab_size": self.vocab, "embedding_size": self.vocab,
                "rope_theta": self.rope_theta, "rms_norm_eps": self.rms_eps,
                "max_sequence_length": self.max_len, "mask_token_id": self.mask_id,
                "eos_token_id": self.eos_id, "pad_token_id": self.eos_id, "bos_token_id": self.bos_id,
                "weight_tying": self.tied, "include_bias": false, "include_qkv_bias": false,
                "block_type": "llama", "activation_type": "silu", "layer_norm_type": "rms", "rope": true,
                "torch_dtype": self.dtype_name()
            }),
            Format::Dream => json!({
                "architectures": ["DreamModel"], "model_type": "Dream",
                "hidden_size": self.d_model, "intermediate_size": self.ffn,
                "num_attention_heads": self.n_heads, "num_key_value_heads": self.n_kv_heads,
                "num_hidden_layers": self.n_layers, "rms_norm_eps": self.rms_eps,
                "rope_theta": self.rope_theta, "vocab_size": self.vocab, "tie_word_embeddings": self.tied,
                "mask_token_id": self.mask_id, "bos_token_id": self.bos_id, "eos_token_id": self.eos_id,
                "pad_token_id": self.eos_id, "max_position_embeddings": self.max_len, "hidden_act": "silu",
                "torch_dtype": self.dtype_name()
            }),
            Format::Llama => json!({
                "architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "hidden_size": self.d_model, "intermediate_size": self.ffn,
                "num_attention_heads": self.n_heads, "num_key_value_heads": self.n_kv_heads,
                "num_hidden_layers": self.n_layers, "rms_norm_eps": self.rms_eps,
                "rope_theta": self.rope_theta, "vocab_size": self.vocab, "tie_word_embeddings": self.tied,
                "bos_token_id": self.bos_id, "eos_token_id": self.eos_id,
                "max_position_embeddings": self.max_len, "hidden_act": "silu", "torch_dtype": self.dtype_name()
            }),
        }
    }
}

struct Layer {
    attn_norm: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bq: Option<Tensor>,
    bk: Option<Tensor>,
    bv: Option<Tensor>,
    o: Tensor,
    ffn_norm: Tensor,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
}

/// The trainable model.
pub struct TrainModel {
    pub spec: ModelSpec,
    pub varmap: VarMap,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    head: Tensor,
}

fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let y = x.broadcast_matmul(&w.t()?)?;
    match b {
        Some(b) => y.broadcast_add(b),
        None => Ok(y),
    }
}

fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(ms + eps)?.sqrt()?)?.broadcast_mul(w)
}

impl TrainModel {
    /// Fresh parameters (normal init, std `spec.init_std`; output projections scaled by
    /// 1/√(2·layers)), drawn from `seed`: the same seed gives the same model.
    pub fn new(spec: ModelSpec, dev: &Device, seed: u64) -> Result<Self> {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, dev);
        let (d, hd) = (spec.d_model, spec.head_dim());
        let (qd, kvd) = (spec.n_heads * hd, spec.n_kv_heads * hd);
        let init = spec.init_std;
        let out_init = spec.init_std / (2.0 * spec.n_layers as f64).sqrt();
        // Normal parameters are made here and inserted into the VarMap (candle's CPU `randn`,
        // behind `Init::Randn`, draws from an unseeded thread RNG: no two runs started alike).
        let randn = |name: &str, shape: (usize, usize), std: f64| -> Result<Tensor> {
            let data = seeded_normal(seed, name, shape.0 * shape.1, std);
            let var = Var::from_tensor(&Tensor::from_vec(data, shape, dev)?)?;
            let t = var.as_tensor().clone();
            varmap
                .data()
                .lock()
                .map_err(|_| candle_core::Error::Msg("parameter map lock poisoned".into()))?
                .insert(name.to_string(), var);
            Ok(t)
        };
        let ones = Init::Const(1.0);
        let zeros = Init::Const(0.0);
        let llada = spec.format == Format::LLaDA;
        let (emb_n, norm_n, head_n) = if llada {
            (
                "model.transformer.wte.weight",
                "model.transformer.ln_f.weight",
                "model.transformer.ff_out.weight",
            )
        } else {
            (
                "model.embed_tokens.weight",
                "model.norm.weight",
                "lm_head.weight",
            )
        };
        let embed = randn(emb_n, (spec.vocab, d), init)?;
        let mut layers = vec![];
        for i in 0..spec.n_layers {
            let n = |hf: &str, ll: &str| {
                if llada {
                    format!("model.transformer.blocks.{i}.{ll}")
                } else {
                    format!("model.layers.{i}.{hf}")
                }
            };
            let bias = spec.format == Format::Dream;
            let b = |name: String, len: usize| -> Result<Option<Tensor>> {
                if bias {
                    Ok(Some(vb.get_with_hints(len, &name, zeros)?))
                } else {
                    Ok(None)
                }
            };
            layers.push(Layer {
                attn_norm: vb.get_with_hints(
                    d,
                    &n("input_layernorm.weight", "attn_norm.weight"),
                    ones,
                )?,
                q: randn(
                    &n("self_attn.q_proj.weight", "q_proj.weight"),
                    (qd, d),
                    init,
                )?,
                k: randn(
                    &n("self_attn.k_proj.weight", "k_proj.weight"),
                    (kvd, d),
                    init,
                )?,
                v: randn(
                    &n("self_attn.v_proj.weight", "v_proj.weight"),
                    (kvd, d),
                    init,
                )?,
                bq: b(n("self_attn.q_proj.bias", ""), qd)?,
                bk: b(n("self_attn.k_proj.bias", ""), kvd)?,
                bv: b(n("self_attn.v_proj.bias", ""), kvd)?,
                o: randn(
                    &n("self_attn.o_proj.weight", "attn_out.weight"),
                    (d, qd),
                    out_init,
                )?,
                ffn_norm: vb.get_with_hints(
                    d,
                    &n("post_attention_layernorm.weight", "ff_norm.weight"),
                    ones,
                )?,
                gate: randn(
                    &n("mlp.gate_proj.weight", "ff_proj.weight"),
                    (spec.ffn, d),
                    init,
                )?,
                up: randn(
                    &n("mlp.up_proj.weight", "up_proj.weight"),
                    (spec.ffn, d),
                    init,
                )?,
                down: randn(
                    &n("mlp.down_proj.weight", "ff_out.weight"),
                    (d, spec.ffn),
                    out_init,
                )?,
            });
        }
        let norm = vb.get_with_hints(d, norm_n, ones)?;
        let head = if spec.tied {
            embed.clone()
        } else {
            randn(head_n, (spec.vocab, d), init)?
        };
        Ok(Self {
            spec,
            varmap,
            embed,
            layers,
            norm,
            head,
        })
    }

    /// Logits `[B, T, V]` for token ids `[B, T]` (u32); `causal` selects the mask.
    pub fn forward(&self, ids: &Tensor, causal: bool) -> Result<Tensor> {
        let vis = if causal {
            Visibility::Causal
        } else {
            Visibility::All
        };
        self.forward_with(ids, None, vis)
    }

    /// [`TrainModel::forward`] with explicit RoPE positions per column (`None`: `0..T`) and any
    /// prefix visibility (the two-stream warm-up: [`crate::objective::two_stream_batch`]).
    pub fn forward_with(
        &self,
        ids: &Tensor,
        positions: Option<&[u32]>,
        vis: Visibility,
    ) -> Result<Tensor> {
        let s = &self.spec;
        let (b, t) = ids.dims2()?;
        let dev = ids.device();
        let (hd, nh, nkv) = (s.head_dim(), s.n_heads, s.n_kv_heads);
        let mut x = self
            .embed
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, s.d_model))?;
        // RoPE (rotate-half) tables [T, hd].
        let half = hd / 2;
        let inv: Vec<f32> = (0..half)
            .map(|i| (s.rope_theta.powf(-2.0 * i as f64 / hd as f64)) as f32)
            .collect();
        let mut cos = vec![0f32; t * hd];
        let mut sin = vec![0f32; t * hd];
        if positions.is_some_and(|p| p.len() != t) {
            candle_core::bail!("forward_with: {t} columns but a different number of positions");
        }
        for r in 0..t {
            let p = positions.map_or(r, |ps| ps[r] as usize);
            for i in 0..half {
                let a = p as f64 * inv[i] as f64;
                cos[r * hd + i] = a.cos() as f32;
                cos[r * hd + half + i] = a.cos() as f32;
                sin[r * hd + i] = a.sin() as f32;
                sin[r * hd + half + i] = a.sin() as f32;
            }
        }
        let cos = Tensor::from_vec(cos, (1, 1, t, hd), dev)?;
        let sin = Tensor::from_vec(sin, (1, 1, t, hd), dev)?;
        let rope = |x: &Tensor| -> Result<Tensor> {
            let x1 = x.narrow(D::Minus1, 0, half)?;
            let x2 = x.narrow(D::Minus1, half, half)?;
            let rot = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
            x.broadcast_mul(&cos)? + rot.broadcast_mul(&sin)?
        };
        let scale = 1.0 / (hd as f64).sqrt();
        for l in &self.layers {
            let h = rms_norm(&x, &l.attn_norm, s.rms_eps)?;
            let q = linear(&h, &l.q, l.bq.as_ref())?
                .reshape((b, t, nh, hd))?
                .transpose(1, 2)?
                .contiguous()?;
            let k = linear(&h, &l.k, l.bk.as_ref())?
                .reshape((b, t, nkv, hd))?
                .transpose(1, 2)?
                .contiguous()?;
            let v = linear(&h, &l.v, l.bv.as_ref())?
                .reshape((b, t, nkv, hd))?
                .transpose(1, 2)?
                .contiguous()?;
            // The 1/√hd scale goes on q ([B, H, T, hd]) rather than on the [B, H, T, T] scores.
            let (q, k) = ((rope(&q)? * scale)?, rope(&k)?);
            let (k, v) = if nkv != nh {
                let g = nh / nkv;
                let rep = |x: Tensor| -> Result<Tensor> {
                    x.unsqueeze(2)?
                        .expand((b, nkv, g, t, hd))?
                        .reshape((b, nh, t, hd))
                };
                (rep(k)?, rep(v)?)
            } else {
                (k, v)
            };
            let att = q.matmul(&k.t()?.contiguous()?)?;
            // Fused softmax with its own backward (crate::ops); candle_nn's fused
            // softmax_last_dim records no backward and its composed softmax is slow.
            let att = crate::ops::softmax_visible(&att, vis.clone())?;
            let o = att.matmul(&v)?.transpose(1, 2)?.reshape((b, t, nh * hd))?;
            x = (x + linear(&o, &l.o, None)?)?;
            let h = rms_norm(&x, &l.ffn_norm, s.rms_eps)?;
            let g = candle_nn::ops::silu(&linear(&h, &l.gate, None)?)?;
            let u = linear(&h, &l.up, None)?;
            x = (x + linear(&(g * u)?, &l.down, None)?)?;
        }
        let h = rms_norm(&x, &self.norm, s.rms_eps)?;
        linear(&h, &self.head, None)
    }

    /// Number of parameters.
    pub fn param_count(&self) -> usize {
        self.varmap.all_vars().iter().map(|v| v.elem_count()).sum()
    }
}
