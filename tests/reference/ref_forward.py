"""Independent numpy (float64) reference forward pass for llama / qwen2 / llada / dream.

Written from the model specs, not from the Rust code.

  x      = embed[tokens]
  per layer:
    h    = RMSNorm(x; attn_norm)              RMSNorm(x) = x / sqrt(mean(x^2) + eps) * w
    q,k,v = h @ Wq^T (+bq), h @ Wk^T (+bk), h @ Wv^T (+bv)     (biases: qwen2, dream)
    q,k  = RoPE (HF rotate-half layout) at the given explicit positions
    attn = softmax(q k^T / sqrt(D) + mask) v   (GQA: kv head j serves q heads j*g .. j*g+g-1)
    x    = x + attn @ Wo^T
    h    = RMSNorm(x; ffn_norm)
    x    = x + Wdown (silu(Wgate h) * Wup h)
  logits = RMSNorm(x; final_norm) @ lm_head^T        (lm_head may be tied to embed)

RoPE (HF rotate-half): inv_freq[i] = theta^(-2i/D), i < D/2; angle = pos * inv_freq
duplicated to length D; x' = x*cos + rotate_half(x)*sin, rotate_half(x) = [-x[D/2:], x[:D/2]].

Dream: the model's logits are SHIFTED by the decoder (prediction for position i is
read from row i-1). This module always returns RAW per-position logits.

Canonical weight dict (float64, HF orientation [out, in]):
  {"embed": [V,d], "final_norm": [d], "lm_head": [V,d],
   "layers": [{"attn_norm","wq","wk","wv","wo","ffn_norm","w_gate","w_up","w_down",
               optional "bq","bk","bv"}]}
"""

from __future__ import annotations

from dataclasses import dataclass, field, asdict

import numpy as np


@dataclass
class Config:
    arch: str                 # "llama" | "qwen2" | "llada" | "dream"
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    rope_theta: float
    rms_eps: float
    qkv_bias: bool = False
    tied: bool = False
    extra: dict = field(default_factory=dict)

    def to_dict(self):
        return asdict(self)


# ================================================================= primitives

def rms_norm(x, w, eps):
    x = np.asarray(x)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + x.dtype.type(eps)) * w.astype(x.dtype)


def silu(x):
    return x / (1.0 + np.exp(-x))


def rope_cos_sin(positions, head_dim, theta):
    half = head_dim // 2
    inv_freq = theta ** (-(2.0 * np.arange(half, dtype=np.float64)) / head_dim)
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]   # [T, D/2]
    ang = np.concatenate([ang, ang], axis=-1)                                     # [T, D]
    return np.cos(ang), np.sin(ang)


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def apply_rope_neox(x, positions, theta):
    """HF rotate-half RoPE. x: [T, H, D]."""
    cos, sin = rope_cos_sin(positions, x.shape[-1], theta)
    cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def apply_rope_norm(x, positions, theta):
    """llama.cpp ROPE_TYPE_NORM: rotates adjacent pairs (x[2i], x[2i+1]) with inv_freq[i].
    Equivalent to apply_rope_neox on un-permuted rows. x: [T, H, D]."""
    D = x.shape[-1]
    inv_freq = theta ** (-(2.0 * np.arange(D // 2, dtype=np.float64)) / D)
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    c, s = np.cos(ang)[:, None, :].astype(x.dtype), np.sin(ang)[:, None, :].astype(x.dtype)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def softmax(x, axis=-1):
    x = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(x)
    return e / np.sum(e, axis=axis, keepdims=True)


def build_mask(mask, n_past, n_new):
    """Boolean [n_new, n_past + n_new], True = may attend. Query row t has global index n_past+t;
    key column j has global index j.
      "causal":        j <= n_past + t
      "bidirectional": all True
      ndarray:         used as is (must have that shape)."""
    S = n_past + n_new
    if isinstance(mask, str):
        if mask == "causal":
            q = n_past + np.arange(n_new)[:, None]
            return np.arange(S)[None, :] <= q
        if mask == "bidirectional":
            return np.ones((n_new, S), dtype=bool)
        raise ValueError(mask)
    m = np.asarray(mask, dtype=bool)
    assert m.shape == (n_new, S), (m.shape, (n_new, S))
    return m


# ================================================================= forward

def forward(cfg: Config, W: dict, tokens, positions, mask="causal", past_kv=None,
            return_kv=False, rope_fn=apply_rope_neox, dtype=np.float64):
    """tokens/positions: int sequences of length T (rows to compute).
    past_kv: optional list (per layer) of (K [P, Hkv, D], V [P, Hkv, D]) already RoPE'd.
    Returns logits [T, V] (float64 by default; dtype=np.float32 emulates an all-f32
    implementation), and if return_kv also the per-layer (K, V) of past + new rows."""
    tokens = np.asarray(tokens, dtype=np.int64)
    positions = np.asarray(positions, dtype=np.int64)
    T = tokens.shape[0]
    H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    g = H // Hkv
    P = 0 if past_kv is None else past_kv[0][0].shape[0]
    allowed = build_mask(mask, P, T)
    scale = dtype(1.0 / np.sqrt(D))

    def w(a):
        return np.asarray(a).astype(dtype, copy=False)

    x = w(W["embed"])[tokens]
    new_kv = []
    for li, L in enumerate(W["layers"]):
        h = rms_norm(x, L["attn_norm"], cfg.rms_eps)
        q = h @ w(L["wq"]).T
        k = h @ w(L["wk"]).T
        v = h @ w(L["wv"]).T
        if "bq" in L:
            q = q + w(L["bq"])
            k = k + w(L["bk"])
            v = v + w(L["bv"])
        q = rope_fn(q.reshape(T, H, D), positions, cfg.rope_theta)
        k = rope_fn(k.reshape(T, Hkv, D), positions, cfg.rope_theta)
        v = v.reshape(T, Hkv, D)
        if past_kv is not None:
            k = np.concatenate([past_kv[li][0], k], axis=0)
            v = np.concatenate([past_kv[li][1], v], axis=0)
        new_kv.append((k, v))
        kk = np.repeat(k, g, axis=1)             # [S, H, D]: q head h uses kv head h // g
        vv = np.repeat(v, g, axis=1)
        scores = np.einsum("thd,shd->hts", q, kk) * scale
        scores = np.where(allowed[None, :, :], scores, -np.inf)
        p = softmax(scores, axis=-1)
        o = np.einsum("hts,shd->thd", p, vv).reshape(T, H * D)
        x = x + o @ w(L["wo"]).T
        h = rms_norm(x, L["ffn_norm"], cfg.rms_eps)
        x = x + (silu(h @ w(L["w_gate"]).T) * (h @ w(L["w_up"]).T)) @ w(L["w_down"]).T
    x = rms_norm(x, W["final_norm"], cfg.rms_eps)
    logits = x @ w(W["lm_head"]).T
    if return_kv:
        return logits, new_kv
    return logits


def prefix_block_mask(n_total, prefix_len):
    """Full-sequence mask equivalent to the bidirectional KV-cache scenario: prefix rows
    attend only to the prefix; later rows attend to everything."""
    i = np.arange(n_total)[:, None]
    j = np.arange(n_total)[None, :]
    return (i >= prefix_len) | (j < prefix_len)


def kv_scenario(cfg, W, tokens, positions, prefix_len, mask):
    """Compute prefix K/V once (prefix attends to itself under `mask`), then forward the
    remaining rows against cached prefix K/V + their own K/V (with `mask`).
    Returns (prefix_logits [P,V], rest_logits [T-P,V]) and asserts equality with the
    equivalent full forward."""
    tokens = list(tokens)
    positions = list(positions)
    P = prefix_len
    pre_logits, kv = forward(cfg, W, tokens[:P], positions[:P], mask, return_kv=True)
    rest = forward(cfg, W, tokens[P:], positions[P:], mask, past_kv=kv)
    if mask == "causal":
        full_mask = "causal"
    elif mask == "bidirectional":
        full_mask = prefix_block_mask(len(tokens), P)
    else:
        raise ValueError(mask)
    full = forward(cfg, W, tokens, positions, full_mask)
    err = max(np.max(np.abs(full[P:] - rest)), np.max(np.abs(full[:P] - pre_logits)))
    assert err < 1e-10, f"KV scenario mismatch {err}"
    if mask == "causal":
        plain = forward(cfg, W, tokens, positions, "causal")
        assert np.max(np.abs(plain - full)) == 0.0
    return pre_logits, rest


# ================================================================= checkpoint name maps

def permute_qk(w, n_head):
    """llama.cpp convert_hf_to_gguf LlamaModel.permute / LLaDAModel.permute (rows)."""
    w = np.asarray(w)
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def unpermute_qk(w, n_head):
    w = np.asarray(w)
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


# archs whose llama.cpp converter permutes q/k (ROPE_TYPE_NORM); others are NEOX, unpermuted
GGUF_PERMUTES_QK = {"llama": True, "llada": True, "qwen2": False, "dream": False}

_LAYER_KEYS = ["attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w_gate", "w_up", "w_down", "bq", "bk", "bv"]


def hf_names(arch, n_layers, qkv_bias, tied):
    """canonical key -> HF tensor name. Layer keys as ('L', i, key)."""
    m = {}
    if arch == "llada":
        m["embed"] = "model.transformer.wte.weight"
        m["final_norm"] = "model.transformer.ln_f.weight"
        m["lm_head"] = "model.transformer.ff_out.weight"
        per = {"attn_norm": "attn_norm.weight", "wq": "q_proj.weight", "wk": "k_proj.weight",
               "wv": "v_proj.weight", "wo": "attn_out.weight", "ffn_norm": "ff_norm.weight",
               "w_gate": "ff_proj.weight", "w_up": "up_proj.weight", "w_down": "ff_out.weight"}
        pre = "model.transformer.blocks.{}."
    else:
        m["embed"] = "model.embed_tokens.weight"
        m["final_norm"] = "model.norm.weight"
        if not tied:
            m["lm_head"] = "lm_head.weight"
        per = {"attn_norm": "input_layernorm.weight", "wq": "self_attn.q_proj.weight",
               "wk": "self_attn.k_proj.weight", "wv": "self_attn.v_proj.weight",
               "wo": "self_attn.o_proj.weight", "ffn_norm": "post_attention_layernorm.weight",
               "w_gate": "mlp.gate_proj.weight", "w_up": "mlp.up_proj.weight",
               "w_down": "mlp.down_proj.weight"}
        if qkv_bias:
            per.update({"bq": "self_attn.q_proj.bias", "bk": "self_attn.k_proj.bias",
                        "bv": "self_attn.v_proj.bias"})
        pre = "model.layers.{}."
    for i in range(n_layers):
        for k, v in per.items():
            m[("L", i, k)] = pre.format(i) + v
    return m


def gguf_names(n_layers, qkv_bias, tied):
    m = {"embed": "token_embd.weight", "final_norm": "output_norm.weight"}
    if not tied:
        m["lm_head"] = "output.weight"
    per = {"attn_norm": "attn_norm.weight", "wq": "attn_q.weight", "wk": "attn_k.weight",
           "wv": "attn_v.weight", "wo": "attn_output.weight", "ffn_norm": "ffn_norm.weight",
           "w_gate": "ffn_gate.weight", "w_up": "ffn_up.weight", "w_down": "ffn_down.weight"}
    if qkv_bias:
        per.update({"bq": "attn_q.bias", "bk": "attn_k.bias", "bv": "attn_v.bias"})
    for i in range(n_layers):
        for k, v in per.items():
            m[("L", i, k)] = f"blk.{i}." + v
    return m


def _get(W, key):
    if isinstance(key, tuple):
        return W["layers"][key[1]][key[2]]
    return W[key]


def to_named(cfg, W, names, transform=None):
    out = {}
    for key, name in names.items():
        arr = _get(W, key)
        if transform is not None:
            arr = transform(key, arr)
        out[name] = arr
    return out


def from_named(cfg, tensors, names, transform=None):
    W = {"layers": [dict() for _ in range(cfg.n_layers)]}
    for key, name in names.items():
        arr = np.asarray(tensors[name], dtype=np.float64)
        if transform is not None:
            arr = transform(key, arr)
        if isinstance(key, tuple):
            W["layers"][key[1]][key[2]] = arr
        else:
            W[key] = arr
    if cfg.tied:
        W["lm_head"] = W["embed"]
    return W


def _qk_transform(cfg, fn):
    def t(key, arr):
        if isinstance(key, tuple) and key[2] in ("wq", "bq"):
            return fn(arr, cfg.n_heads)
        if isinstance(key, tuple) and key[2] in ("wk", "bk"):
            return fn(arr, cfg.n_kv_heads)
        return arr
    return t


def to_hf(cfg, W):
    return to_named(cfg, W, hf_names(cfg.arch, cfg.n_layers, cfg.qkv_bias, cfg.tied))


def from_hf(cfg, tensors):
    return from_named(cfg, tensors, hf_names(cfg.arch, cfg.n_layers, cfg.qkv_bias, cfg.tied))


def to_gguf(cfg, W):
    names = gguf_names(cfg.n_layers, cfg.qkv_bias, cfg.tied)
    tr = _qk_transform(cfg, permute_qk) if GGUF_PERMUTES_QK[cfg.arch] else None
    return to_named(cfg, W, names, tr)


def from_gguf(cfg, tensors):
    names = gguf_names(cfg.n_layers, cfg.qkv_bias, cfg.tied)
    tr = _qk_transform(cfg, unpermute_qk) if GGUF_PERMUTES_QK[cfg.arch] else None
    return from_named(cfg, tensors, names, tr)
