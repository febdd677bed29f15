#!/usr/bin/env python3
"""float64 numpy reference run of a llama-architecture GGUF (written for
SmolLM2-135M-Instruct.Q4_1.gguf: 30 layers, d 576, 9 heads / 3 kv heads, head dim 64,
FFN 1536, vocab 49152, rope theta 1e5, eps 1e-5, tied embeddings with token_embd Q8_0).

usage: python3 smollm2_ref.py GGUF_PATH [--steps N] [--prompt 504,3575,282,4649,314]

Weights are dequantized with gguf_io (ggml block layouts) and used in float64.
llama.cpp's converter permuted the q/k rows (LlamaModel.permute), so they are
un-permuted here and HF rotate-half RoPE is applied; the first step is also
recomputed with llama.cpp's adjacent-pair (NORM) RoPE on the permuted rows and
must agree. Greedy decoding uses a KV cache, then a full causal recompute of the
whole sequence re-checks every step.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_io as G  # noqa: E402
import ref_forward as R  # noqa: E402

DEFAULT_PROMPT = [504, 3575, 282, 4649, 314]
EXPECTED_IDS = [7042, 30, 198, 198, 504, 2988, 314, 42, 216, 34]


def load(path):
    g = G.read_gguf(path)
    md = g.metadata
    arch = md["general.architecture"]
    assert arch == "llama", arch
    d = md[f"{arch}.embedding_length"]
    H = md[f"{arch}.attention.head_count"]
    tied = "output.weight" not in g.tensors
    cfg = R.Config(
        arch="llama",
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
        tied=tied,
    )
    raw = {name: t.numpy() for name, t in g.tensors.items()}
    W = R.from_gguf(cfg, raw)  # float64, q/k un-permuted
    Wperm = R.from_named(cfg, raw, R.gguf_names(cfg.n_layers, cfg.qkv_bias, cfg.tied))  # as stored
    types = sorted({(G.TYPE_NAMES.get(t.ggml_type, t.ggml_type)) for t in g.tensors.values()})
    return g, cfg, W, Wperm, types


def top2(row):
    i = np.argsort(-row, kind="stable")[:2]
    return [(int(i[0]), float(row[i[0]])), (int(i[1]), float(row[i[1]]))]


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--prompt", default=",".join(map(str, DEFAULT_PROMPT)))
    a = ap.parse_args(argv[1:])
    prompt = [int(x) for x in a.prompt.split(",")]

    t0 = time.time()
    g, cfg, W, Wperm, types = load(a.gguf)
    print(f"loaded {a.gguf} in {time.time() - t0:.1f}s: {cfg}")
    print(f"tensor types: {types}; token_embd {G.TYPE_NAMES[g.tensors['token_embd.weight'].ggml_type]}, "
          f"blk.0.attn_q {G.TYPE_NAMES[g.tensors['blk.0.attn_q.weight'].ggml_type]}")

    toks = list(prompt)
    pos = list(range(len(toks)))
    logits, kv = R.forward(cfg, W, toks, pos, "causal", return_kv=True)
    # cross-check: llama.cpp NORM rope on the stored (permuted) q/k rows gives the same logits
    logits_norm = R.forward(cfg, Wperm, toks, pos, "causal", rope_fn=R.apply_rope_norm)
    dn = float(np.max(np.abs(logits - logits_norm)))
    print(f"NEOX(unpermuted) vs NORM(permuted) max |diff| on prompt logits: {dn:.3e}")
    assert dn < 1e-8

    generated, steps = [], []
    last = logits[-1]
    for step in range(a.steps):
        t2 = top2(last)
        nxt = t2[0][0]
        generated.append(nxt)
        steps.append(t2)
        print(f"step {step}: next {nxt:6d}  top2 = ({t2[0][0]}, {t2[0][1]:.6f}), ({t2[1][0]}, {t2[1][1]:.6f})"
              f"  margin {t2[0][1] - t2[1][1]:.6f}")
        if step + 1 == a.steps:
            break
        p = len(toks)
        toks.append(nxt)
        step_logits, kv = R.forward(cfg, W, [nxt], [p], "causal", past_kv=kv, return_kv=True)
        last = step_logits[-1]

    # full recompute (no cache) of the whole sequence: every step's top-1 must agree
    full = R.forward(cfg, W, toks, list(range(len(toks))), "causal")
    n0 = len(prompt)
    for s in range(a.steps):
        row = full[n0 - 1 + s]
        assert int(np.argmax(row)) == generated[s], f"full recompute disagrees at step {s}"
        assert abs(float(row[generated[s]]) - steps[s][0][1]) < 1e-9
    print("full causal recompute agrees with the KV-cache run")

    print(f"generated ids: {generated}")
    if prompt == DEFAULT_PROMPT and a.steps == len(EXPECTED_IDS):
        ok = generated == EXPECTED_IDS
        print(f"expected ids:  {EXPECTED_IDS} -> {'MATCH' if ok else 'MISMATCH'}")
        print(f"total time {time.time() - t0:.1f}s")
        return 0 if ok else 1
    print(f"total time {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
