#!/usr/bin/env python3
"""Generate tiny deterministic fixture checkpoints + golden outputs for llada-rs tests.

usage: python3 make_fixtures.py OUTDIR

Writes (see README.md next to this file for the exact formats):
  OUTDIR/hf-llada/      config.json, tokenizer.json, model.safetensors (F32)
  OUTDIR/hf-dream/      config.json, tokenizer.json, model-0000{1,2}-of-00002.safetensors (BF16)
                        + model.safetensors.index.json
  OUTDIR/hf-llama/      config.json, tokenizer.json, model.safetensors (F16, tied embeddings)
  OUTDIR/hf-qwen2/      config.json, tokenizer.json, model.safetensors (F32)
  OUTDIR/gguf-llada.gguf  gguf-dream.gguf  gguf-llama.gguf (F32)   gguf-qwen2.gguf (F16 matrices)
  OUTDIR/gguf-llama-q8.gguf    (all 2-D weights Q8_0, general.alignment = 64)
  OUTDIR/gguf-llama-q4_1.gguf  (2-D weights Q4_1, token_embd Q8_0 — the SmolLM2 mix)
  OUTDIR/expected.json, OUTDIR/quant_cases.json
  OUTDIR/diffusion_expected.json  (greedy LLaDA / Dream diffusion goldens, via ref_diffusion.py)

Standard library + numpy only. Deterministic (fixed seeds); runs in a few seconds.
All random weights are snapped to values exactly representable in bf16 AND f16, so the
F32 / F16 / BF16 files hold identical values and share one set of golden logits.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gguf_io as G  # noqa: E402
import ref_forward as R  # noqa: E402
from safetensors_io import write_safetensors, read_hf_dir  # noqa: E402

SEED = 20240607
VOCAB = 97
D_MODEL = 64
N_LAYERS = 2
N_HEADS = 4
HEAD_DIM = 16
FFN = 96
MASK_ID = 96
BOS_ID = 94
EOS_ID = 95
PAD_ID = 95
TOKENS = [5, 17, 42, 96, 96, 3, 88, 96, 60, 12, 96, 71]
POSITIONS = list(range(12))
PREFIX_LEN = 5

CONFIGS = {
    "llada": R.Config("llada", VOCAB, D_MODEL, N_LAYERS, N_HEADS, 4, HEAD_DIM, FFN, 500000.0, 1e-5,
                      qkv_bias=False, tied=False),
    "dream": R.Config("dream", VOCAB, D_MODEL, N_LAYERS, N_HEADS, 2, HEAD_DIM, FFN, 1000000.0, 1e-6,
                      qkv_bias=True, tied=False),
    "llama": R.Config("llama", VOCAB, D_MODEL, N_LAYERS, N_HEADS, 2, HEAD_DIM, FFN, 10000.0, 1e-5,
                      qkv_bias=False, tied=True),
    "qwen2": R.Config("qwen2", VOCAB, D_MODEL, N_LAYERS, N_HEADS, 2, HEAD_DIM, FFN, 1000000.0, 1e-6,
                      qkv_bias=True, tied=False),
}
HF_DTYPE = {"llada": "F32", "dream": "BF16", "llama": "F16", "qwen2": "F32"}
CONTEXT = {"llada": 4096, "dream": 131072, "llama": 2048, "qwen2": 32768}


# ----------------------------------------------------------------- weights

def snap(x):
    """Round to the bf16 grid and flush |x| < 2^-17 to zero: the result is exactly
    representable in f32, bf16 and f16."""
    x32 = np.asarray(x, dtype=np.float32)
    b = G.bf16_bits_to_f32(G.f32_to_bf16_bits(x32))
    b = np.where(np.abs(b) < 2.0 ** -17, np.float32(0), b).astype(np.float32)
    assert np.array_equal(b.astype(np.float16).astype(np.float32), b)
    return b.astype(np.float64)


def make_weights(cfg: R.Config, seed: int):
    rng = np.random.default_rng(seed)
    d, H, Hkv, D, F, V = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn, cfg.vocab_size

    def n(shape, std):
        return snap(rng.standard_normal(shape) * std)

    W = {"embed": n((V, d), 0.1), "layers": []}
    for _ in range(cfg.n_layers):
        L = {
            "attn_norm": snap(1.0 + 0.1 * rng.standard_normal(d)),
            "wq": n((H * D, d), 0.1), "wk": n((Hkv * D, d), 0.1), "wv": n((Hkv * D, d), 0.1),
            "wo": n((d, H * D), 0.1),
            "ffn_norm": snap(1.0 + 0.1 * rng.standard_normal(d)),
            "w_gate": n((F, d), 0.1), "w_up": n((F, d), 0.1), "w_down": n((d, F), 0.1),
        }
        if cfg.qkv_bias:
            L["bq"] = n((H * D,), 0.1)
            L["bk"] = n((Hkv * D,), 0.1)
            L["bv"] = n((Hkv * D,), 0.1)
        W["layers"].append(L)
    W["final_norm"] = snap(1.0 + 0.1 * rng.standard_normal(d))
    W["lm_head"] = W["embed"] if cfg.tied else n((V, d), 0.1)
    return W


def weights_equal(A, B):
    if not np.array_equal(A["embed"], B["embed"]) or not np.array_equal(A["final_norm"], B["final_norm"]):
        return False
    if not np.array_equal(A["lm_head"], B["lm_head"]):
        return False
    for la, lb in zip(A["layers"], B["layers"]):
        if set(la) != set(lb):
            return False
        for k in la:
            if not np.array_equal(la[k], lb[k]):
                return False
    return True


# ----------------------------------------------------------------- HF dirs

def hf_config(arch, cfg: R.Config):
    if arch == "llada":
        return {
            "architectures": ["LLaDAModelLM"], "model_type": "llada",
            "d_model": cfg.d_model, "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
            "n_layers": cfg.n_layers, "mlp_hidden_size": cfg.ffn, "mlp_ratio": cfg.ffn / cfg.d_model,
            "vocab_size": cfg.vocab_size, "embedding_size": cfg.vocab_size,
            "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.rms_eps, "rope": True,
            "max_sequence_length": CONTEXT[arch], "mask_token_id": MASK_ID,
            "eos_token_id": EOS_ID, "pad_token_id": PAD_ID,
            "weight_tying": False, "include_bias": False, "include_qkv_bias": False,
            "block_type": "llama", "activation_type": "silu", "layer_norm_type": "rms",
            "alibi": False, "scale_logits": False, "use_cache": False,
            "torch_dtype": "float32",
        }
    if arch == "dream":
        return {
            "architectures": ["DreamModel"], "model_type": "Dream",
            "hidden_size": cfg.d_model, "intermediate_size": cfg.ffn,
            "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
            "num_hidden_layers": cfg.n_layers, "rms_norm_eps": cfg.rms_eps, "rope_theta": cfg.rope_theta,
            "rope_scaling": None, "vocab_size": cfg.vocab_size, "tie_word_embeddings": False,
            "mask_token_id": MASK_ID, "bos_token_id": BOS_ID, "eos_token_id": EOS_ID,
            "pad_token_id": PAD_ID, "max_position_embeddings": CONTEXT[arch], "hidden_act": "silu",
            "use_sliding_window": False, "sliding_window": None, "torch_dtype": "bfloat16",
        }
    common = {
        "hidden_size": cfg.d_model, "intermediate_size": cfg.ffn,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
        "num_hidden_layers": cfg.n_layers, "rms_norm_eps": cfg.rms_eps, "rope_theta": cfg.rope_theta,
        "rope_scaling": None, "vocab_size": cfg.vocab_size, "tie_word_embeddings": cfg.tied,
        "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "max_position_embeddings": CONTEXT[arch],
        "hidden_act": "silu",
    }
    if arch == "llama":
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **common,
                "head_dim": cfg.head_dim, "attention_bias": False, "mlp_bias": False,
                "pretraining_tp": 1, "torch_dtype": "float16"}
    if arch == "qwen2":
        return {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **common,
                "use_sliding_window": False, "sliding_window": None,
                "max_window_layers": cfg.n_layers, "torch_dtype": "float32"}
    raise ValueError(arch)


def tokenizer_json():
    vocab = {f"t{i}": i for i in range(VOCAB)}
    special = [BOS_ID, EOS_ID, MASK_ID]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": f"t{i}", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True} for i in special
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"},
    }


def write_hf(outdir, arch, cfg, W):
    d = os.path.join(outdir, f"hf-{arch}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(hf_config(arch, cfg), f, indent=2)
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(), f, indent=1)
    tensors = R.to_hf(cfg, W)
    dtype = HF_DTYPE[arch]
    meta = {"format": "pt"}
    if arch == "dream":
        # two shards: embed + layer 0 | layer 1 + final norm + lm_head
        s1 = {k: v for k, v in tensors.items() if k.startswith("model.embed_tokens") or k.startswith("model.layers.0.")}
        s2 = {k: v for k, v in tensors.items() if k not in s1}
        names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
        wm = {}
        total = 0
        for shard, name in zip([s1, s2], names):
            write_safetensors(os.path.join(d, name), shard, dtype, meta)
            for k, v in shard.items():
                wm[k] = name
                total += v.size * 2
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(wm.items()))}, f, indent=2)
    else:
        write_safetensors(os.path.join(d, "model.safetensors"), tensors, dtype, meta)
    return d


# ----------------------------------------------------------------- GGUF

def write_gguf(path, arch, cfg, W, matrix_type=G.F32, embd_type=None, alignment=32, name=None):
    """llama.cpp-style GGUF. matrix_type applies to 2-D weights; 1-D (norms, biases) stay F32.
    embd_type overrides the type of token_embd.weight."""
    w = G.GGUFWriter(alignment=alignment)
    w.add_string("general.architecture", arch)
    w.add_string("general.name", name or f"llada-rs fixture {arch}")
    file_type = {G.F32: 0, G.F16: 1, G.Q4_0: 2, G.Q4_1: 3, G.Q8_0: 7}[matrix_type]
    w.add_u32("general.file_type", file_type)
    if matrix_type not in (G.F32, G.F16):
        w.add_u32("general.quantization_version", 2)
    w.add_u32(f"{arch}.context_length", CONTEXT[arch])
    w.add_u32(f"{arch}.embedding_length", cfg.d_model)
    w.add_u32(f"{arch}.block_count", cfg.n_layers)
    w.add_u32(f"{arch}.feed_forward_length", cfg.ffn)
    w.add_u32(f"{arch}.attention.head_count", cfg.n_heads)
    w.add_u32(f"{arch}.attention.head_count_kv", cfg.n_kv_heads)
    w.add_f32(f"{arch}.rope.freq_base", cfg.rope_theta)
    w.add_u32(f"{arch}.rope.dimension_count", cfg.head_dim)
    w.add_f32(f"{arch}.attention.layer_norm_rms_epsilon", cfg.rms_eps)
    w.add_u32(f"{arch}.vocab_size", cfg.vocab_size)
    if arch in ("llada", "dream"):
        w.add_bool(f"{arch}.attention.causal", False)
        w.add_bool("diffusion.shift_logits", arch == "dream")
        w.add_u32("tokenizer.ggml.mask_token_id", MASK_ID)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "default")
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(cfg.vocab_size)], G.T_STRING)
    w.add_array("tokenizer.ggml.token_type",
                [3 if i in (BOS_ID, EOS_ID, MASK_ID) else 1 for i in range(cfg.vocab_size)], G.T_I32)
    w.add_array("tokenizer.ggml.merges", [], G.T_STRING)
    w.add_u32("tokenizer.ggml.bos_token_id", BOS_ID)
    w.add_u32("tokenizer.ggml.eos_token_id", EOS_ID)
    w.add_u32("tokenizer.ggml.padding_token_id", PAD_ID)
    w.add_bool("tokenizer.ggml.add_bos_token", False)

    tensors = R.to_gguf(cfg, W)
    for tname, arr in tensors.items():
        arr = np.asarray(arr, dtype=np.float32)
        if arr.ndim == 1:
            tt = G.F32
        elif tname == "token_embd.weight" and embd_type is not None:
            tt = embd_type
        else:
            tt = matrix_type
        w.add_tensor(tname, arr, tt)
    w.write(path)


def load_gguf_weights(path, cfg):
    g = G.read_gguf(path)
    tensors = {name: t.numpy() for name, t in g.tensors.items()}
    return g, R.from_gguf(cfg, tensors)


# ----------------------------------------------------------------- goldens

def lst(a):
    return [[float(v) for v in row] for row in np.asarray(a)]


def golden(cfg, W):
    out = {"logits": {}, "kv": {"prefix_len": PREFIX_LEN}}
    for mask in ("causal", "bidirectional"):
        out["logits"][mask] = lst(R.forward(cfg, W, TOKENS, POSITIONS, mask))
    P = PREFIX_LEN
    for mask in ("causal", "bidirectional"):
        pre, rest = R.kv_scenario(cfg, W, TOKENS, POSITIONS, P, mask)
        desc = {
            "causal": (f"Pass 1: rows 0..{P-1} (tokens[:{P}], positions[:{P}]) forwarded with a causal "
                       f"mask; their per-layer post-RoPE K/V are cached. Pass 2: rows {P}..{len(TOKENS)-1} "
                       f"forwarded alone; each new row i attends to all cached prefix keys and to new "
                       f"rows j <= i. 'logits' == full causal forward rows {P}.., 'prefix_logits' == rows ..{P-1}."),
            "bidirectional": (f"Pass 1: rows 0..{P-1} forwarded with a bidirectional mask over the prefix "
                              f"ONLY (prefix never sees later rows); per-layer post-RoPE K/V cached. Pass 2: "
                              f"rows {P}..{len(TOKENS)-1} forwarded alone; every new row attends to all cached "
                              f"prefix keys and to ALL new rows. Equivalent to one full forward with mask "
                              f"allowed[i][j] = (i >= {P}) or (j < {P}); NOT equal to the plain bidirectional "
                              f"full forward."),
        }[mask]
        out["kv"][mask] = {
            "prefix_rows": list(range(P)),
            "rows": list(range(P, len(TOKENS))),
            "prefix_logits": lst(pre),
            "logits": lst(rest),
            "description": desc,
        }
    return out


def entry(arch_key, arch, cfg, W, hf_dir, gguf, weights_dtype, extra=None):
    e = {
        "arch": arch,
        "hf_dir": hf_dir,
        "gguf": gguf,
        "weights_dtype": weights_dtype,
        "config": {k: v for k, v in cfg.to_dict().items() if k != "extra"},
        "vocab_size": cfg.vocab_size,
        "mask_token_id": MASK_ID if arch in ("llada", "dream") else None,
        "shift_logits": arch == "dream",
        "tokens": TOKENS,
        "positions": POSITIONS,
    }
    if extra:
        e.update(extra)
    e.update(golden(cfg, W))
    return e


# ----------------------------------------------------------------- quant cases

def quant_cases():
    rng = np.random.default_rng(SEED + 1000)
    cases = []

    def add(tname, ttype, raw: bytes, note, quant_input=None):
        blk, nbytes = G.BLOCK_INFO[ttype]
        n_blocks = len(raw) // nbytes
        vals = G.dequantize(np.frombuffer(raw, dtype=np.uint8), ttype, n_blocks * blk)
        c = {"type": tname, "ggml_type": ttype, "block_elems": blk, "block_bytes": nbytes,
             "n_blocks": n_blocks, "hex": raw.hex(), "values": [float(v) for v in vals], "note": note}
        if quant_input is not None:
            c["quant_input"] = [float(v) for v in np.asarray(quant_input, dtype=np.float32)]
        cases.append(c)

    # simple float formats
    f16_vals = np.array([0.0, -0.0, 1.0, -2.5, 65504.0, 6.103515625e-05, 5.960464477539063e-08,
                         -3.0517578125e-05, 0.333251953125, 1234.0], dtype=np.float16)
    add("F16", G.F16, f16_vals.astype("<f2").tobytes(), "includes -0.0, max normal, min normal, subnormals")
    bf16_f32 = np.array([0.0, -0.0, 1.0, -2.5, 3.3895313892515355e38, 1.1754943508222875e-38,
                         9.183549615799121e-41, 0.333984375, -1234.0, 1e-3], dtype=np.float32)
    add("BF16", G.BF16, G.f32_to_bf16_bits(bf16_f32).astype("<u2").tobytes(),
        "bf16 = upper 16 bits of f32; includes -0.0, max, min normal, subnormal; 1e-3 is rounded (RNE)")

    # Q8_0 / Q4_0 / Q4_1 produced by the ggml *_ref quantizers from floats
    for tname, ttype, fn in (("Q8_0", G.Q8_0, G.quantize_q8_0),
                             ("Q4_0", G.Q4_0, G.quantize_q4_0),
                             ("Q4_1", G.Q4_1, G.quantize_q4_1)):
        x = rng.standard_normal(96).astype(np.float32) * np.float32(0.7)
        x[5] = np.float32(-2.75)          # a dominant negative value in block 0
        x[32:64] = np.abs(x[32:64])       # an all-positive block
        x = np.concatenate([x, np.zeros(32, dtype=np.float32)])  # an all-zero block (d = 0)
        add(tname, ttype, fn(x), f"4 blocks from quantize_row_{tname.lower()}_ref(quant_input); last block all zeros",
            quant_input=x)

    # K-quants: random bytes with sane f16 super-block scales
    def f16b(v):
        return np.array([v], dtype="<f2").tobytes()

    raw = b""
    for _ in range(2):
        d = float(rng.uniform(0.001, 0.02))
        dmin = float(rng.uniform(0.001, 0.02))
        raw += f16b(d) + f16b(dmin) + rng.integers(0, 256, 12, dtype=np.uint8).tobytes() \
            + rng.integers(0, 256, 128, dtype=np.uint8).tobytes()
    add("Q4_K", G.Q4_K, raw, "2 super-blocks: random scales[12]/qs[128] bytes, d/dmin random positive f16")

    raw = b""
    for _ in range(2):
        d = float(rng.uniform(0.0005, 0.01))
        raw += rng.integers(0, 256, 128, dtype=np.uint8).tobytes() + rng.integers(0, 256, 64, dtype=np.uint8).tobytes() \
            + rng.integers(-128, 128, 16).astype(np.int8).tobytes() + f16b(d)
    add("Q6_K", G.Q6_K, raw, "2 super-blocks: random ql[128]/qh[64]/scales[16] (int8) bytes, d random positive f16")

    # 5-bit and the other K-quants: random value/scale bytes, sane f16 scales (a negative d in
    # one block of each: files hold them)
    for tname, ttype, nbytes, n in (("Q5_0", G.Q5_0, 22, 5), ("Q5_1", G.Q5_1, 24, 5)):
        raw = b""
        for k in range(n):
            d = float(rng.uniform(0.001, 0.05)) * (-1 if k == 1 else 1)
            head = f16b(d) + (f16b(float(rng.uniform(-0.5, 0.5))) if ttype == G.Q5_1 else b"")
            raw += head + rng.integers(0, 256, nbytes - len(head), dtype=np.uint8).tobytes()
        add(tname, ttype, raw, f"{n} blocks: random qh/qs bytes, random f16 d (one negative)")
    for tname, ttype, layout in (
            ("Q2_K", G.Q2_K, [("rand", 80), ("d", 0), ("d", 0)]),
            ("Q3_K", G.Q3_K, [("rand", 108), ("d", 0)]),
            ("Q5_K", G.Q5_K, [("d", 0), ("d", 0), ("rand", 172)])):
        raw = b""
        for k in range(3):
            for part, nb in layout:
                if part == "d":
                    raw += f16b(float(rng.uniform(0.0005, 0.02)) * (-1 if k == 2 else 1))
                else:
                    raw += rng.integers(0, 256, nb, dtype=np.uint8).tobytes()
        add(tname, ttype, raw, "3 super-blocks: random value/scale bytes, random f16 d (last negative)")

    return {
        "format": "llada-rs quant cases v1",
        "description": ("Each case: raw little-endian ggml blocks as hex, and the float32 values that "
                        "ggml's scalar dequantize_row_* produces (numpy, float32, same operation order, no FMA). "
                        "'quant_input' (Q8_0/Q4_0/Q4_1 only) is the float32 input that ggml's reference "
                        "quantize_row_*_ref turns into exactly 'hex'."),
        "cases": cases,
    }


# ----------------------------------------------------------------- main

def main(argv):
    if len(argv) != 2:
        print(__doc__)
        return 2
    t0 = time.time()
    outdir = argv[1]
    os.makedirs(outdir, exist_ok=True)
    expected = {
        "format": "llada-rs reference v1",
        "generator": "tests/reference/make_fixtures.py",
        "notes": ("logits are RAW per-position outputs [row][vocab] in float64 (row-major). For dream the "
                  "decoder must shift (prediction for position i is row i-1); the values here are not shifted. "
                  "All f32/f16/bf16 files of one architecture hold identical weight values, so HF and GGUF "
                  "share one golden set. Quantized GGUFs have their own entries (logits from the dequantized weights)."),
        "checkpoints": {},
    }
    summary = []
    for idx, (arch, cfg) in enumerate(CONFIGS.items()):
        W = make_weights(cfg, SEED + idx)
        hf_dir = write_hf(outdir, arch, cfg, W)
        gguf_name = f"gguf-{arch}.gguf"
        mt = G.F16 if arch == "qwen2" else G.F32
        write_gguf(os.path.join(outdir, gguf_name), arch, cfg, W, matrix_type=mt)

        # --- round-trip self checks
        t, dts = read_hf_dir(hf_dir)
        assert set(dts.values()) == {HF_DTYPE[arch]}
        assert weights_equal(W, R.from_hf(cfg, t)), f"HF round trip failed for {arch}"
        g, Wg = load_gguf_weights(os.path.join(outdir, gguf_name), cfg)
        assert weights_equal(W, Wg), f"GGUF round trip failed for {arch}"
        assert g.metadata["general.architecture"] == arch
        if R.GGUF_PERMUTES_QK[arch]:
            # the stored q rows are permuted (differ from HF) but the unpermuted ones match
            assert not np.array_equal(g.tensor("blk.0.attn_q.weight"), W["layers"][0]["wq"])
            # NORM rope on permuted q/k == NEOX rope on HF q/k (checked via logits)
            Wperm = R.from_named(cfg, {n: tt.numpy() for n, tt in g.tensors.items()},
                                 R.gguf_names(cfg.n_layers, cfg.qkv_bias, cfg.tied))
            a = R.forward(cfg, Wperm, TOKENS, POSITIONS, "causal", rope_fn=R.apply_rope_norm)
            b = R.forward(cfg, W, TOKENS, POSITIONS, "causal")
            assert np.max(np.abs(a - b)) < 1e-10, "NORM/NEOX equivalence failed"

        expected["checkpoints"][arch] = entry(arch, arch, cfg, W, f"hf-{arch}", gguf_name,
                                              {"hf": HF_DTYPE[arch],
                                               "gguf": "F16 (2-D) / F32 (1-D)" if arch == "qwen2" else "F32"})
        lg = np.array(expected["checkpoints"][arch]["logits"]["causal"])
        summary.append(f"{arch}: logits std {lg.std():.3f} max|.| {np.abs(lg).max():.3f}")

        if arch == "llama":
            # quantized variants of the same weights
            for key, fname, mtype, etype, align in (
                    ("llama-q8", "gguf-llama-q8.gguf", G.Q8_0, G.Q8_0, 64),
                    ("llama-q4_1", "gguf-llama-q4_1.gguf", G.Q4_1, G.Q8_0, 32)):
                path = os.path.join(outdir, fname)
                write_gguf(path, arch, cfg, W, matrix_type=mtype, embd_type=etype, alignment=align)
                gq, Wq = load_gguf_weights(path, cfg)
                assert gq.alignment == align
                # dequantized weights are close to (but not equal to) the originals
                err = np.max(np.abs(Wq["layers"][0]["wq"] - W["layers"][0]["wq"]))
                assert 0 < err < 0.1, err
                expected["checkpoints"][key] = entry(
                    key, arch, cfg, Wq, None, fname,
                    {"gguf": f"{G.TYPE_NAMES[mtype]} (2-D), token_embd {G.TYPE_NAMES[etype]}, F32 (1-D)"},
                    extra={"note": "logits computed in float64 from the dequantized GGUF weights "
                                   "(q/k rows un-permuted, HF rotate-half RoPE)",
                           "gguf_alignment": align})
                lq = np.array(expected["checkpoints"][key]["logits"]["causal"])
                summary.append(f"{key}: max|logits - f32 logits| = {np.abs(lq - lg).max():.4f}")

    with open(os.path.join(outdir, "expected.json"), "w") as f:
        json.dump(expected, f)
    with open(os.path.join(outdir, "quant_cases.json"), "w") as f:
        json.dump(quant_cases(), f, indent=1)
    # diffusion goldens, computed from the HF files just written (and checked against expected.json)
    import ref_diffusion  # noqa: E402
    doc = ref_diffusion.write(outdir, os.path.join(outdir, "diffusion_expected.json"), verbose=False)
    summary.append(f"diffusion_expected.json: {len(doc['cases'])} cases, smallest min_margin "
                   f"{min(c['min_margin'] for c in doc['cases'] if c['min_margin'] is not None):.2e}")
    for s in summary:
        print(s)
    print(f"fixtures written to {outdir} in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
