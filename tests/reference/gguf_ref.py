#!/usr/bin/env python3
"""float64 numpy greedy reference for a llama- or qwen2-architecture GGUF, any tensor types
gguf_io dequantizes (written for the Qwen2.5-Coder 0.5B/1.5B Q4_K_M files: Q4_K, Q5_0, Q6_K,
Q8_0 and F32 tensors; q/k/v biases; untied head).

usage: python3 gguf_ref.py GGUF --prompt 1,2,3 [--steps 16] [--json OUT]

Weights are dequantized exactly (ggml block layouts, float32 values) and kept as float32 to
halve the memory (a 1.5B model: 6 GB); every matmul runs in float64 (ref_forward upcasts each
matrix as it uses it). Greedy decoding with a KV cache; the last step is re-checked by a full
causal recompute of the whole sequence. Prints (and writes with --json) the generated ids and
each step's top-2 margin, so a test can tell a real disagreement from a near tie.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_io as G  # noqa: E402
import ref_forward as R  # noqa: E402


def load(path):
    g = G.read_gguf(path)
    md = g.metadata
    arch = md["general.architecture"]
    assert arch in ("llama", "qwen2"), arch
    d = md[f"{arch}.embedding_length"]
    H = md[f"{arch}.attention.head_count"]
    cfg = R.Config(
        arch=arch,
        vocab_size=g.tensors["token_embd.weight"].dims[1],
        d_model=d,
        n_layers=md[f"{arch}.block_count"],
        n_heads=H,
        n_kv_heads=md.get(f"{arch}.attention.head_count_kv", H),
        head_dim=md.get(f"{arch}.rope.dimension_count", d // H),
        ffn=md[f"{arch}.feed_forward_length"],
        rope_theta=float(md.get(f"{arch}.rope.freq_base", 10000.0)),
        rms_eps=float(md[f"{arch}.attention.layer_norm_rms_epsilon"]),
        qkv_bias="blk.0.attn_q.bias" in g.tensors,
        tied="output.weight" not in g.tensors,
    )
    names = R.gguf_names(cfg.n_layers, cfg.qkv_bias, cfg.tied)
    tr = R._qk_transform(cfg, R.unpermute_qk) if R.GGUF_PERMUTES_QK[arch] else None
    W = {"layers": [dict() for _ in range(cfg.n_layers)]}
    for key, name in names.items():
        arr = g.tensors[name].numpy().astype(np.float32, copy=False)  # exact: f32 values
        if tr is not None:
            arr = tr(key, arr)
        if isinstance(key, tuple):
            W["layers"][key[1]][key[2]] = arr
        else:
            W[key] = arr
    if cfg.tied:
        W["lm_head"] = W["embed"]
    types = sorted({G.TYPE_NAMES.get(t.ggml_type, t.ggml_type) for t in g.tensors.values()})
    return cfg, W, types


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--prompt", required=True, help="comma-separated token ids")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--json", help="write the result here")
    a = ap.parse_args(argv[1:])
    prompt = [int(x) for x in a.prompt.split(",")]
    t0 = time.time()
    cfg, W, types = load(a.gguf)
    print(f"loaded {a.gguf} in {time.time() - t0:.1f}s: {cfg.arch}, {cfg.n_layers} layers, "
          f"d {cfg.d_model}, types {types}", flush=True)
    toks = list(prompt)
    logits, kv = R.forward(cfg, W, toks, list(range(len(toks))), "causal", return_kv=True)
    last = logits[-1]
    ids, margins = [], []
    for step in range(a.steps):
        order = np.argsort(-last, kind="stable")[:2]
        nxt = int(order[0])
        ids.append(nxt)
        margins.append(float(last[order[0]] - last[order[1]]))
        print(f"step {step}: {nxt} margin {margins[-1]:.6f}", flush=True)
        if step + 1 == a.steps:
            break
        toks.append(nxt)
        step_logits, kv = R.forward(cfg, W, [nxt], [len(toks) - 1], "causal", past_kv=kv,
                                    return_kv=True)
        last = step_logits[-1]
    full = R.forward(cfg, W, toks, list(range(len(toks))), "causal")
    assert int(np.argmax(full[-1])) == ids[-1], "full recompute disagrees with the KV-cache run"
    out = {"model": os.path.basename(a.gguf), "prompt_ids": prompt, "ids": ids,
           "margins": margins, "types": types}
    print(json.dumps(out))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f)
    print(f"total {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
