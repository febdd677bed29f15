#!/usr/bin/env python3
"""Check a GGUF written by `llada convert` against the HF directory it came from, with
llama.cpp's own reader (the `gguf` package, gguf-py) and the float64 numpy reference.

usage: python3 check_convert.py HF_DIR OUT.gguf [--json REPORT.json]

1. gguf-py reads every key and tensor. Every tensor name must be one llama.cpp knows for the
   architecture (gguf.MODEL_TENSORS / TENSOR_NAMES), the set must be the one the HF config
   implies, and each shape must be the HF shape with gguf's reversed dimension order. The
   metadata gguf-py reads gives the same hyper-parameters as config.json (read here on its own).
2. Each tensor, dequantized by gguf-py (gguf.quants.dequantize) and with llama.cpp's q/k
   permutation undone, is compared with the HF tensor (read by safetensors_io): the relative
   RMS error must be within the bound of its GGML type.
3. The numpy reference forward (ref_forward) on the GGUF's weights and on the HF weights, over
   a fixed prompt (causal for llama/qwen2, bidirectional for llada/dream): the RMS logit
   difference relative to the logits' standard deviation, bounded per the file's worst type.

Exits non-zero with a message on the first failed check; prints a JSON report otherwise.
Needs numpy and gguf (`pip install gguf`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gguf  # noqa: E402  (llama.cpp's gguf-py, from PyPI)
import ref_forward as R  # noqa: E402
from safetensors_io import read_hf_dir  # noqa: E402

# Relative RMS error bounds of one tensor per stored type (uniform-ish weights; the measured
# values are far below: see docs/convert.md). F32 and F16 are exact on the fixtures (their
# values are f16-representable) and within f16 rounding elsewhere.
TENSOR_BOUND = {"F32": 1e-6, "F16": 1e-3, "BF16": 8e-3, "Q8_0": 0.01, "Q6_K": 0.02,
                "Q5_K": 0.04, "Q5_0": 0.05, "Q5_1": 0.04, "Q4_K": 0.08, "Q4_0": 0.1,
                "Q4_1": 0.08}
# RMS(Δlogit) / std(logits) of the whole forward, bounded by the coarsest type in the file:
# LOGIT_FACTOR times its tensor bound (the tiny random fixtures amplify weight error 4-5x by
# the logits: measured in docs/convert.md).
LOGIT_FACTOR = 6.0
COARSE = ["F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K", "Q5_1", "Q5_0", "Q4_K", "Q4_1", "Q4_0"]
ARCH = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2,
        "llada": gguf.MODEL_ARCH.LLADA, "dream": gguf.MODEL_ARCH.DREAM}


def fail(msg):
    sys.exit(f"check_convert: FAIL: {msg}")


def hf_config(d):
    """R.Config from config.json alone (the real field names of each architecture)."""
    c = json.load(open(os.path.join(d, "config.json")))
    archs = c.get("architectures") or []
    mt = str(c.get("model_type", "")).lower()
    if "LLaDAModelLM" in archs or mt == "llada":
        d_model, H = c["d_model"], c["n_heads"]
        return R.Config("llada", c.get("embedding_size") or c["vocab_size"], d_model,
                        c["n_layers"], H, c.get("n_kv_heads", H), d_model // H,
                        c["mlp_hidden_size"], float(c.get("rope_theta", 10000.0)),
                        float(c.get("rms_norm_eps", 1e-5)),
                        qkv_bias=bool(c.get("include_bias") or c.get("include_qkv_bias")),
                        tied=bool(c.get("weight_tying", False)))
    arch = "dream" if ("DreamModel" in archs or mt == "dream") else (
        "qwen2" if ("Qwen2ForCausalLM" in archs or mt == "qwen2") else "llama")
    d_model, H = c["hidden_size"], c["num_attention_heads"]
    return R.Config(arch, c["vocab_size"], d_model, c["num_hidden_layers"], H,
                    c.get("num_key_value_heads", H), c.get("head_dim", d_model // H),
                    c["intermediate_size"], float(c.get("rope_theta", 10000.0)),
                    float(c.get("rms_norm_eps", 1e-6)), qkv_bias=arch in ("qwen2", "dream"),
                    tied=bool(c.get("tie_word_embeddings", False)))


def field(reader, key):
    f = reader.fields.get(key)
    if f is None:
        return None
    return f.contents()


def gguf_config(reader, tensors):
    arch = field(reader, "general.architecture")
    k = lambda s: field(reader, f"{arch}.{s}")  # noqa: E731
    d, H = k("embedding_length"), k("attention.head_count")
    return R.Config(arch, tensors["token_embd.weight"].shape[0], d, k("block_count"), H,
                    k("attention.head_count_kv") or H,
                    k("attention.key_length") or k("rope.dimension_count") or d // H,
                    k("feed_forward_length"), float(k("rope.freq_base")),
                    float(k("attention.layer_norm_rms_epsilon")),
                    qkv_bias="blk.0.attn_q.bias" in tensors,
                    tied="output.weight" not in tensors)


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("gguf_file")
    ap.add_argument("--json")
    a = ap.parse_args(argv)

    reader = gguf.GGUFReader(a.gguf_file)
    keys = {k: field(reader, k) for k in reader.fields if not k.startswith("GGUF.")}
    arch = keys.get("general.architecture")
    if arch not in ARCH:
        fail(f"general.architecture is {arch!r}")
    cfg = hf_config(a.hf_dir)
    if cfg.arch != arch:
        fail(f"architecture {arch} but config.json says {cfg.arch}")

    # 1. names llama.cpp knows, the expected set, shapes.
    known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[ARCH[arch]]}
    types, deq = {}, {}
    for t in reader.tensors:
        base = t.name.rsplit(".", 1)[0]
        generic = base
        if base.startswith("blk."):
            generic = "blk.{bid}." + base.split(".", 2)[2]
        if generic not in known:
            fail(f"tensor {t.name} is not a llama.cpp name for {arch}")
        types[t.name] = t.tensor_type.name
        arr = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64)
        deq[t.name] = arr.reshape([int(x) for x in reversed(t.shape)])
    gcfg = gguf_config(reader, deq)
    for f in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn",
              "qkv_bias", "tied"):
        if getattr(gcfg, f) != getattr(cfg, f):
            fail(f"{f}: GGUF gives {getattr(gcfg, f)}, config.json {getattr(cfg, f)}")
    for f in ("rope_theta", "rms_eps"):
        if abs(getattr(gcfg, f) / getattr(cfg, f) - 1) > 1e-6:
            fail(f"{f}: GGUF gives {getattr(gcfg, f)}, config.json {getattr(cfg, f)}")
    names = R.gguf_names(cfg.n_layers, cfg.qkv_bias, cfg.tied)
    if set(names.values()) != set(deq):
        fail(f"tensor set differs: extra {sorted(set(deq) - set(names.values()))}, "
             f"missing {sorted(set(names.values()) - set(deq))}")
    hf, _ = read_hf_dir(a.hf_dir)
    hf_names = R.hf_names(cfg.arch, cfg.n_layers, cfg.qkv_bias, cfg.tied)
    for key, g in names.items():
        if deq[g].shape != hf[hf_names[key]].shape:
            fail(f"{g}: shape {deq[g].shape}, HF {hf[hf_names[key]].shape}")
    tok = keys.get("tokenizer.ggml.tokens")
    if keys.get("tokenizer.ggml.model") != "gpt2" or tok is None or len(tok) != cfg.vocab_size:
        fail("tokenizer.ggml.model/tokens missing or not one token per vocabulary id")
    if arch in ("llada", "dream") and ("tokenizer.ggml.mask_token_id" not in keys
                                       or f"{arch}.attention.causal" not in keys):
        fail("diffusion keys (mask_token_id, attention.causal) missing")

    # 2. per tensor, against HF.
    W_g = R.from_gguf(cfg, deq)
    W_h = R.from_hf(cfg, hf)
    worst, per_tensor = "F32", {}
    for key, g in names.items():
        ref = R._get(W_h, key)
        got = R._get(W_g, key)
        rms = float(np.sqrt(np.mean(ref ** 2))) or 1.0
        err = float(np.sqrt(np.mean((got - ref) ** 2))) / rms
        per_tensor[g] = {"type": types[g], "rel_rms_err": err}
        if err > TENSOR_BOUND[types[g]]:
            fail(f"{g} ({types[g]}): relative RMS error {err:.3g} > {TENSOR_BOUND[types[g]]}")
        if COARSE.index(types[g]) > COARSE.index(worst):
            worst = types[g]

    # 3. logits.
    rng = np.random.default_rng(7)
    prompt = rng.integers(0, cfg.vocab_size, size=12).tolist()
    mask = "bidirectional" if arch in ("llada", "dream") else "causal"
    pos = list(range(len(prompt)))
    lh = R.forward(cfg, W_h, prompt, pos, mask)
    lg = R.forward(cfg, W_g, prompt, pos, mask)
    rel = float(np.sqrt(np.mean((lg - lh) ** 2)) / np.std(lh))
    if rel > LOGIT_FACTOR * TENSOR_BOUND[worst]:
        fail(f"logits differ by {rel:.3g} (RMS) of their std (> {LOGIT_FACTOR * TENSOR_BOUND[worst]:.3g} for {worst})")
    report = {"arch": arch, "tensors": len(deq), "keys": len(keys), "worst_type": worst,
              "logit_rel_rms_diff": rel,
              "logit_rel_max_diff": float(np.max(np.abs(lg - lh)) / np.std(lh)),
              "argmax_agree": float(np.mean(lh.argmax(-1) == lg.argmax(-1))),
              "max_tensor_rel_rms_err": max(v["rel_rms_err"] for v in per_tensor.values()),
              "per_tensor": per_tensor}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    short = {k: v for k, v in report.items() if k != "per_tensor"}
    print(json.dumps(short))


if __name__ == "__main__":
    main(sys.argv[1:])
