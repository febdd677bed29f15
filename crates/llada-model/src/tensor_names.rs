//! Tensor names of every supported checkpoint layout, in one place (as llama.cpp's
//! `llama-arch`): GGUF (`blk.N.attn_q.weight`, …), HF LLaMA / Qwen2 / Dream
//! (`model.layers.N.self_attn.q_proj.weight`, …) and HF LLaDA
//! (`model.transformer.blocks.N.q_proj.weight`, …).
//!
//! Invariants: every name of layer `N` starts with [`Scheme::layer_prefix`] followed by `N.`
//! (what [`layer_of`] parses back); a scheme's [`Names`] list the same nine matrices/norms and
//! three biases in every layout, so a layer is built (and exported) the same way whatever its
//! source.

use crate::config::{Arch, ModelConfig};

/// Tensor names of one layer in a given naming scheme.
pub(crate) struct Names {
    pub attn_norm: String,
    pub q: String,
    pub k: String,
    pub v: String,
    pub o: String,
    pub ffn_norm: String,
    pub gate: String,
    pub up: String,
    pub down: String,
    /// q, k, v biases (present only when the config has `qkv_bias`).
    pub bias: [String; 3],
}

/// The tensor naming scheme of a source (for rebuilding streamed layers).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Scheme {
    Gguf,
    Hf(Arch),
}

impl Scheme {
    /// What every tensor name of layer `N` starts with, before `N.`.
    pub fn layer_prefix(self) -> &'static str {
        match self {
            Scheme::Gguf => "blk.",
            Scheme::Hf(Arch::LLaDA) => "model.transformer.blocks.",
            Scheme::Hf(_) => "model.layers.",
        }
    }
    pub fn names(self, i: usize) -> Names {
        match self {
            Scheme::Gguf => gguf_names(i),
            Scheme::Hf(a) => hf_names(a, i),
        }
    }
    /// (token embedding, final norm, LM head).
    pub fn globals(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Scheme::Gguf => ("token_embd.weight", "output_norm.weight", "output.weight"),
            Scheme::Hf(Arch::LLaDA) => (
                "model.transformer.wte.weight",
                "model.transformer.ln_f.weight",
                "model.transformer.ff_out.weight",
            ),
            Scheme::Hf(_) => (
                "model.embed_tokens.weight",
                "model.norm.weight",
                "lm_head.weight",
            ),
        }
    }
    /// Tensor names of layer `i` (biases only when the config has them).
    pub fn layer_tensors(self, c: &ModelConfig, i: usize) -> Vec<String> {
        let n = self.names(i);
        let mut v = vec![
            n.attn_norm,
            n.q,
            n.k,
            n.v,
            n.o,
            n.ffn_norm,
            n.gate,
            n.up,
            n.down,
        ];
        if c.qkv_bias {
            v.extend(n.bias);
        }
        v
    }
}

fn gguf_names(i: usize) -> Names {
    let p = format!("{}{i}.", Scheme::Gguf.layer_prefix());
    Names {
        attn_norm: format!("{p}attn_norm.weight"),
        q: format!("{p}attn_q.weight"),
        k: format!("{p}attn_k.weight"),
        v: format!("{p}attn_v.weight"),
        o: format!("{p}attn_output.weight"),
        ffn_norm: format!("{p}ffn_norm.weight"),
        gate: format!("{p}ffn_gate.weight"),
        up: format!("{p}ffn_up.weight"),
        down: format!("{p}ffn_down.weight"),
        bias: [
            format!("{p}attn_q.bias"),
            format!("{p}attn_k.bias"),
            format!("{p}attn_v.bias"),
        ],
    }
}

pub(crate) fn hf_names(arch: Arch, i: usize) -> Names {
    if arch == Arch::LLaDA {
        let p = format!("{}{i}.", Scheme::Hf(arch).layer_prefix());
        Names {
            attn_norm: format!("{p}attn_norm.weight"),
            q: format!("{p}q_proj.weight"),
            k: format!("{p}k_proj.weight"),
            v: format!("{p}v_proj.weight"),
            o: format!("{p}attn_out.weight"),
            ffn_norm: format!("{p}ff_norm.weight"),
            gate: format!("{p}ff_proj.weight"),
            up: format!("{p}up_proj.weight"),
            down: format!("{p}ff_out.weight"),
            bias: [
                format!("{p}q_proj.bias"),
                format!("{p}k_proj.bias"),
                format!("{p}v_proj.bias"),
            ],
        }
    } else {
        let p = format!("{}{i}.", Scheme::Hf(arch).layer_prefix());
        Names {
            attn_norm: format!("{p}input_layernorm.weight"),
            q: format!("{p}self_attn.q_proj.weight"),
            k: format!("{p}self_attn.k_proj.weight"),
            v: format!("{p}self_attn.v_proj.weight"),
            o: format!("{p}self_attn.o_proj.weight"),
            ffn_norm: format!("{p}post_attention_layernorm.weight"),
            gate: format!("{p}mlp.gate_proj.weight"),
            up: format!("{p}mlp.up_proj.weight"),
            down: format!("{p}mlp.down_proj.weight"),
            bias: [
                format!("{p}self_attn.q_proj.bias"),
                format!("{p}self_attn.k_proj.bias"),
                format!("{p}self_attn.v_proj.bias"),
            ],
        }
    }
}

/// Every tensor of a model of config `c` as (HF name, GGUF name): the token embedding, each
/// layer's nine matrices/norms (and q/k/v biases when the config has them), the final norm and
/// the LM head (absent when the embeddings are tied). The one table `llada convert` maps by.
pub fn hf_to_gguf_names(c: &ModelConfig) -> Vec<(String, String)> {
    let (hf, gg) = (Scheme::Hf(c.arch), Scheme::Gguf);
    let mut v = Vec::new();
    let globals = |s: Scheme| {
        let (e, n, h) = s.globals();
        [e, n, h].map(String::from)
    };
    let ([he, hn, hh], [ge, gn, gh]) = (globals(hf), globals(gg));
    v.push((he, ge));
    for i in 0..c.n_layers {
        v.extend(
            hf.layer_tensors(c, i)
                .into_iter()
                .zip(gg.layer_tensors(c, i)),
        );
    }
    v.push((hn, gn));
    if !c.tied_embeddings {
        v.push((hh, gh));
    }
    v
}

/// The layer a tensor belongs to under `scheme` (`blk.N.*`, `model.layers.N.*`,
/// `model.transformer.blocks.N.*`), if it is a layer tensor.
pub(crate) fn layer_of(scheme: Scheme, name: &str) -> Option<u64> {
    let rest = name.strip_prefix(scheme.layer_prefix())?;
    let (n, _) = rest.split_once('.')?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Absurdly long digit strings saturate (still beyond any layer count).
    Some(n.parse().unwrap_or(u64::MAX))
}
