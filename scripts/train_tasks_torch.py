#!/usr/bin/env python3
"""Train a synthetic-task diffusion model (LLaDA or Dream format) with PyTorch, on CPU or GPU.

Written as the accelerator path of `llada train --preset tiny-llada-tasks` (Rust, candle), it
trains the shipped task models on this 2-core machine's CPU in under an hour
(each model card gives its command; the Rust recipe scores lower, docs/training.md). The same
tasks, the same checkpoint format (HF directory with the real field
and tensor names, loaded by the engine like any other), the same objective (two-stream
autoregressive warm-up for LLaDA / shifted next-token warm-up for Dream, then masked-diffusion
SFT with structured masks and EOS-padded answers), at a size and a token count a GPU affords in
minutes. It runs on CPU too (`--device cpu`), slowly. Nothing here is imported by the engine:
the engine's `llada eval` scores what this writes, so this file is also an independent
implementation of both architectures (`--load DIR --eval-file F --dump OUT` decodes a checkpoint
for a comparison with `llada eval --show`) and, through `task_data.py`, of the task generator
(`crates/llada-train/src/tasks.rs` is the reference; the test `python_task_generator_agrees`
checks the two agree).

Usage:
    python3 scripts/train_tasks_torch.py --format llada --out DIR --minutes 7   # GPU if present
    scripts/gpu_train_tasks.sh OUT 7                                            # both formats
"""

import argparse
import copy
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

# ---------------------------------------------------------------- vocabulary and tasks
from task_data import (BOS, EOS, MASK, MULTI_SUBTASKS, REV_MAX, SPECIALS, TASKS,  # noqa: E402
                       VOCAB, CHARS, decode, example, solve_prompt, tokenizer_json)

_LUT = np.zeros(256, dtype=np.int64)
for _i, _c in enumerate(CHARS):
    _LUT[ord(_c)] = _i + len(SPECIALS)


def encode(s):
    return _LUT[np.frombuffer(s.encode("ascii"), dtype=np.uint8)]


def region(answer_len, pad_to):
    """Answer + at least one EOS, rounded up to `pad_to` (layout_padded / llada eval)."""
    n = answer_len + 1
    return -(-n // pad_to) * pad_to


def layout(pairs, pad_to, tails=None):
    """`BOS prompt answer EOS…` rows of one length (multiple of 8), the answer starts and each
    row's own end (`1 + prompt + region`: what `llada eval` lays out for that example alone).
    `tails[r]`, where not None, replaces row r's rounded region by answer + 1 + tails[r] EOS."""
    enc = [(encode(p), encode(a)) for p, a in pairs]
    tails = tails or [None] * len(enc)
    regions = [region(len(a), pad_to) if x is None else len(a) + 1 + x
               for (_, a), x in zip(enc, tails)]
    t = max(1 + len(p) + g for (p, _), g in zip(enc, regions))
    t = -(-t // 8) * 8
    rows = np.full((len(enc), t), EOS, dtype=np.int64)
    starts = np.zeros(len(enc), dtype=np.int64)
    ends = np.zeros(len(enc), dtype=np.int64)
    for r, (p, a) in enumerate(enc):
        rows[r, 0] = BOS
        rows[r, 1:1 + len(p)] = p
        starts[r] = 1 + len(p)
        ends[r] = 1 + len(p) + regions[r]
        rows[r, 1 + len(p):1 + len(p) + len(a)] = a
    return rows, starts, ends


class Batches(torch.utils.data.IterableDataset):
    """Endless (rows, starts, ends) batches of one task each and ≈ `batch_tokens` tokens; every
    data-loader worker process draws from its own seed."""

    def __init__(self, seed, weights, batch_tokens, pad_to, bands, tail=None, multi=None,
                 short_rev=None):
        self.seed, self.weights, self.bands = seed, weights, bands
        self.batch_tokens, self.pad_to, self.tail = batch_tokens, pad_to, tail
        self.multi, self.short_rev = multi, short_rev

    def tails(self, rng, n):
        """Per row: None (the region rounded up to `pad_to`) or, with probability P of
        `--eos-tail P:MAX`, a uniform 0 to MAX (inclusive) EOS beyond the answer's own one."""
        if self.tail is None:
            return None
        p, most = self.tail
        return [rng.randint(0, most) if rng.random() < p else None for _ in range(n)]

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        rng = random.Random(self.seed * 1000 + (info.id if info else 0))
        tasks, w = zip(*self.weights.items())
        while True:
            task = rng.choices(tasks, w)[0]
            # One length band (a quarter of the range) per batch, as the Rust trainer draws
            # them: rows then need little EOS padding beyond their own answer region.
            # Multi-question rows have a fixed length and mix question lengths: no band.
            band = rng.randrange(4)
            banded = self.bands and task != "multi"
            scale, lo = ((band + 1) / 4, band / (band + 1)) if banded else (1.0, 0.0)
            draw = lambda: example(rng, task, False, scale, lo, self.multi,  # noqa: E731
                                   self.short_rev)
            first = [draw() for _ in range(4)]
            tails = self.tails(rng, 4)
            probe, _, _ = layout(first, self.pad_to, tails)
            n = max(4, self.batch_tokens // probe.shape[1])
            more = [draw() for _ in range(n - 4)]
            tails = tails and tails + self.tails(rng, n - 4)
            rows, starts, ends = layout(first + more, self.pad_to, tails)
            yield torch.from_numpy(rows), torch.from_numpy(starts), torch.from_numpy(ends)


# ---------------------------------------------------------------- model (llada-train model.rs)
def attend(q, k, v, allowed):
    """Softmax attention of [B, H, T, D] q, k, v; `allowed` a bool mask broadcastable to
    [B, H, T, T] (True: may attend) or None. f32 (and any CUDA dtype) goes to the fused kernel.
    bf16 on a CPU is computed as batched products instead: torch 2.5's CPU flash-attention
    kernel runs its bf16 backward ≈ 3x slower than its f32 one, and with head dim 16 two
    bf16 `baddbmm`s and a softmax run ≈ 1.4x faster than the f32 kernel (docs/training.md,
    "bf16 products on this CPU")."""
    if q.dtype != torch.bfloat16 or q.is_cuda:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    return attend_products(q, k, v, allowed)


def attend_products(q, k, v, allowed):
    """`attend` as two batched products and a softmax, in the inputs' dtype."""
    b, h, t, d = q.shape
    qq, kk = q.reshape(b * h, t, d), k.reshape(b * h, t, d).transpose(1, 2)
    if allowed is None:
        s = torch.bmm(qq, kk) * d ** -0.5
    else:
        bias = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device)
        bias = bias.masked_fill(~allowed, float("-inf")).expand(b, h, t, t).reshape(b * h, t, t)
        s = torch.baddbmm(bias, qq, kk, alpha=d ** -0.5)
    return torch.bmm(torch.softmax(s, -1), v.reshape(b * h, t, d)).view(b, h, t, d)


class Model(torch.nn.Module):
    """LLaMA-style block stack; `fmt` "llada" (no biases) or "dream" (q/k/v biases, GQA)."""

    def __init__(self, fmt, d, layers, heads, kv_heads, ffn, theta, eps, init_std, seed):
        super().__init__()
        self.fmt, self.d, self.h, self.kv, self.eps = fmt, d, heads, kv_heads, eps
        self.hd = d // heads
        g = torch.Generator().manual_seed(seed)

        def normal(*shape, std=init_std):
            return torch.nn.Parameter(torch.randn(*shape, generator=g) * std)

        out_std = init_std / math.sqrt(2 * layers)
        qd, kvd = heads * self.hd, kv_heads * self.hd
        self.embed = normal(VOCAB, d)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            b = torch.nn.Module()
            b.attn_norm = torch.nn.Parameter(torch.ones(d))
            b.q, b.k, b.v = normal(qd, d), normal(kvd, d), normal(kvd, d)
            bias = fmt == "dream"
            b.bq = torch.nn.Parameter(torch.zeros(qd)) if bias else None
            b.bk = torch.nn.Parameter(torch.zeros(kvd)) if bias else None
            b.bv = torch.nn.Parameter(torch.zeros(kvd)) if bias else None
            b.o = normal(d, qd, std=out_std)
            b.ffn_norm = torch.nn.Parameter(torch.ones(d))
            b.gate, b.up = normal(ffn, d), normal(ffn, d)
            b.down = normal(d, ffn, std=out_std)
            self.blocks.append(b)
        self.norm = torch.nn.Parameter(torch.ones(d))
        self.head = normal(VOCAB, d)
        half = self.hd // 2
        inv = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / self.hd)
        self.register_buffer("inv_freq", inv.float(), persistent=False)
        # The dtype of the products (`--compute-dtype`): the parameters, the residual stream,
        # the norms' statistics and the logits stay f32 either way.
        self.compute = torch.float32

    def rms(self, x, w):
        """RMSNorm of the f32 residual `x`, in the compute dtype."""
        xf = x.float()
        n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return n.to(self.compute) * w.to(self.compute)

    def forward(self, ids, positions, allowed):
        """Logits [B, T, V]; `positions` [T] RoPE positions, `allowed` [T, T] bool (True: may
        attend) or None for full bidirectional attention."""
        bsz, t = ids.shape
        cd = self.compute

        def c(p):
            return None if p is None else p.to(cd)

        x = self.embed[ids]
        ang = positions.float()[:, None] * self.inv_freq[None, :]
        cos = torch.cat([ang.cos(), ang.cos()], -1).to(cd)
        sin = torch.cat([ang.sin(), ang.sin()], -1).to(cd)
        half = self.hd // 2

        def rope(z):
            z1, z2 = z[..., :half], z[..., half:]
            return z * cos + torch.cat([-z2, z1], -1) * sin

        g = self.h // self.kv
        for b in self.blocks:
            hh = self.rms(x, b.attn_norm)
            q = F.linear(hh, c(b.q), c(b.bq)).view(bsz, t, self.h, self.hd).transpose(1, 2)
            k = F.linear(hh, c(b.k), c(b.bk)).view(bsz, t, self.kv, self.hd).transpose(1, 2)
            v = F.linear(hh, c(b.v), c(b.bv)).view(bsz, t, self.kv, self.hd).transpose(1, 2)
            q, k = rope(q), rope(k)
            if g > 1:
                k = k.repeat_interleave(g, dim=1)
                v = v.repeat_interleave(g, dim=1)
            o = attend(q, k, v, allowed)
            x = x + F.linear(o.transpose(1, 2).reshape(bsz, t, self.h * self.hd), c(b.o))
            hh = self.rms(x, b.ffn_norm)
            x = x + F.linear(F.silu(F.linear(hh, c(b.gate))) * F.linear(hh, c(b.up)), c(b.down))
        return F.linear(self.rms(x, self.norm).to(self.head.dtype), self.head)

    def state(self):
        """Tensors under the real checkpoint names (model.rs `TrainModel::new`)."""
        out = {}
        llada = self.fmt == "llada"
        out["model.transformer.wte.weight" if llada else "model.embed_tokens.weight"] = self.embed
        for i, b in enumerate(self.blocks):
            if llada:
                p = f"model.transformer.blocks.{i}."
                names = {"attn_norm.weight": b.attn_norm, "q_proj.weight": b.q,
                         "k_proj.weight": b.k, "v_proj.weight": b.v, "attn_out.weight": b.o,
                         "ff_norm.weight": b.ffn_norm, "ff_proj.weight": b.gate,
                         "up_proj.weight": b.up, "ff_out.weight": b.down}
            else:
                p = f"model.layers.{i}."
                names = {"input_layernorm.weight": b.attn_norm,
                         "self_attn.q_proj.weight": b.q, "self_attn.q_proj.bias": b.bq,
                         "self_attn.k_proj.weight": b.k, "self_attn.k_proj.bias": b.bk,
                         "self_attn.v_proj.weight": b.v, "self_attn.v_proj.bias": b.bv,
                         "self_attn.o_proj.weight": b.o,
                         "post_attention_layernorm.weight": b.ffn_norm,
                         "mlp.gate_proj.weight": b.gate, "mlp.up_proj.weight": b.up,
                         "mlp.down_proj.weight": b.down}
            out.update({p + k: v for k, v in names.items()})
        out["model.transformer.ln_f.weight" if llada else "model.norm.weight"] = self.norm
        out["model.transformer.ff_out.weight" if llada else "lm_head.weight"] = self.head
        return out


def config_json(a):
    """config.json with the real field names (model.rs `ModelSpec::config_json`)."""
    if a.format == "llada":
        return {
            "architectures": ["LLaDAModelLM"], "model_type": "llada", "d_model": a.d_model,
            "n_heads": a.heads, "n_kv_heads": a.kv_heads, "n_layers": a.layers,
            "mlp_hidden_size": a.ffn, "mlp_ratio": a.ffn // a.d_model, "vocab_size": VOCAB,
            "embedding_size": VOCAB, "rope_theta": a.rope_theta, "rms_norm_eps": a.eps,
            "max_sequence_length": 512, "mask_token_id": MASK, "eos_token_id": EOS,
            "pad_token_id": EOS, "bos_token_id": BOS, "weight_tying": False,
            "include_bias": False, "include_qkv_bias": False, "block_type": "llama",
            "activation_type": "silu", "layer_norm_type": "rms", "rope": True,
            "torch_dtype": "float16",
        }
    return {
        "architectures": ["DreamModel"], "model_type": "Dream", "hidden_size": a.d_model,
        "intermediate_size": a.ffn, "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads, "num_hidden_layers": a.layers, "rms_norm_eps": a.eps,
        "rope_theta": a.rope_theta, "vocab_size": VOCAB, "tie_word_embeddings": False,
        "mask_token_id": MASK, "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": EOS,
        "max_position_embeddings": 512, "hidden_act": "silu", "torch_dtype": "float16",
    }


def save(model, a, out, extra):
    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    tensors = {k: v.detach().to("cpu", torch.float16).contiguous()
               for k, v in model.state().items()}
    save_file(tensors, os.path.join(out, "model.safetensors"))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config_json(a), f, indent=2)
    if not a.weights_only:
        with open(os.path.join(out, "tokenizer.json"), "w") as f:
            json.dump(tokenizer_json(), f)
        with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
            json.dump({"bos_token": SPECIALS[BOS], "chat_template": "{{ messages[0]['content'] }}",
                       "eos_token": SPECIALS[EOS]}, f, indent=2)
    with open(os.path.join(out, "train_state.json"), "w") as f:
        json.dump(extra, f, indent=2)


# ---------------------------------------------------------------- objectives (objective.rs)
def weighted_ce(logits, targets, weights):
    """Σ weight · CE(logits, target) / B (objective.rs `weighted_ce`)."""
    ce = F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1), reduction="none")
    return (ce * weights.reshape(-1)).sum() / logits.shape[0]


def diffusion_loss(model, rows, starts, ends, shift, eps, structured, gen):
    """Masked-diffusion SFT: stratified t per row, answer positions masked independently with
    probability t, or (a `structured` fraction of rows) the answer's suffix / prefix of ⌈t·L⌉
    positions; CE on masked positions weighted 1/(t·L), summed, divided by B. Dream (`shift`):
    position i is predicted from output i − 1.

    `ends` None: a row's answer runs to the batch's end (EOS padding up to the longest row is
    answer, visible to every position and weighted). Otherwise row r is `[0, ends[r])` — its
    answer is its own EOS-padded region, the padding beyond is hidden from attention and from
    the loss — so every row trains in exactly the layout `llada eval` decodes it in, whatever
    else the batch holds."""
    b, t = rows.shape
    dev = rows.device
    col = torch.arange(t, device=dev)[None, :]
    s = starts[:, None]
    e = torch.full_like(starts, t) if ends is None else ends
    ans = (col >= s) & (col < e[:, None])
    length = (e - starts).float()[:, None]
    u = torch.rand((), generator=gen, device=dev)
    tt = (eps + (1 - eps) * ((torch.arange(b, device=dev) + u) / b))[:, None]
    shape = torch.rand(b, 1, generator=gen, device=dev)
    k = torch.clamp(torch.ceil(tt * length), min=1).long()
    suffix = ans & (col >= (e[:, None] - k))
    prefix = ans & (col < s + k)
    iid = ans & (torch.rand(b, t, generator=gen, device=dev) < tt)
    masked = torch.where(shape < structured / 2, suffix,
                         torch.where(shape < structured, prefix, iid))
    # At least one masked answer position per row.
    none = ~masked.any(1)
    if none.any():
        pick = starts + (torch.rand(b, generator=gen, device=dev) * (e - starts)).long()
        masked[none, pick[none]] = True
    ids = torch.where(masked, torch.full_like(rows, MASK), rows)
    w = masked.float() / (tt * length)
    keys = None if ends is None else (col < e[:, None])[:, None, None, :]
    logits = model(ids, torch.arange(t, device=dev), keys)
    if shift:
        return weighted_ce(logits[:, :-1], rows[:, 1:], w[:, 1:])
    return weighted_ce(logits, rows, w)


def warmup_loss(model, rows, starts, ends, fmt):
    """Autoregressive warm-up. LLaDA: two streams (content causal, query i sees content < i and
    predicts token i, weight 1/L on answer positions; objective.rs `two_stream_batch`). Dream:
    causal next-token prediction in the shifted layout. `ends` as in `diffusion_loss` (causal
    attention never sees the padding beyond a row's end, so only the weights change)."""
    b, t = rows.shape
    dev = rows.device
    e = torch.full_like(starts, t) if ends is None else ends
    length = (e - starts).float()[:, None]
    col = torch.arange(t, device=dev)
    inside = col[None, :] < e[:, None]
    if fmt == "dream":
        causal = col[None, :] <= col[:, None]
        logits = model(rows, col, causal)[:, :-1]
        w = ((col[None, 1:] >= starts[:, None]) & inside[:, 1:]).float() / length
        return weighted_ce(logits, rows[:, 1:], w)
    vis = torch.cat([col + 1, torch.clamp(col, min=1)])  # columns visible to each row (prefix)
    allowed = torch.arange(2 * t, device=dev)[None, :] < vis[:, None]
    ids = torch.cat([rows, torch.full_like(rows, MASK)], 1)
    logits = model(ids, torch.cat([col, col]), allowed)[:, t:]
    w = ((col[None, :] >= starts[:, None]) & inside).float() / length
    return weighted_ce(logits, rows, w)


# ---------------------------------------------------------------- decoding (llada eval, vanilla)
@torch.no_grad()
def vanilla_decode(model, prompts, gen_len, block, shift):
    """LLaDA's vanilla sampler at temperature 0: semi-autoregressive blocks of `block`, one token
    per step, the masked position of the current block with the highest top probability
    committed first (low-confidence remasking). Batched over prompts of one length."""
    dev = model.embed.device
    b = len(prompts)
    p = torch.tensor(np.stack(prompts), device=dev)
    x = torch.cat([p, torch.full((b, gen_len), MASK, device=dev)], 1)
    t = x.shape[1]
    pos = torch.arange(t, device=dev)
    lp = p.shape[1]
    for blk in range(0, gen_len, block):
        lo, hi = lp + blk, lp + min(blk + block, gen_len)
        for _ in range(hi - lo):
            logits = model(x, pos, None).float()
            if shift:
                logits = torch.cat([logits[:, :1], logits[:, :-1]], 1)
            prob = logits.softmax(-1)
            conf, tok = prob.max(-1)
            cand = (x == MASK)
            cand[:, :lo] = False
            cand[:, hi:] = False
            conf = torch.where(cand, conf, torch.full_like(conf, -1.0))
            i = conf.argmax(1)
            rows = torch.arange(b, device=dev)
            x[rows, i] = torch.where(cand[rows, i], tok[rows, i], x[rows, i])
    return x[:, lp:].tolist()


def evaluate(model, a, per_task, seed, pairs=None, dump=None):
    """Exact match per task on examples from this generator's held-out side, or on `pairs`
    ((prompt, answer) held-out examples, e.g. the Rust split)."""
    rng = random.Random(seed)
    shift = a.format == "dream"
    model.eval()
    res = {}
    for task in TASKS:
        if pairs is None:
            todo = [example(rng, task, held_out=True) for _ in range(per_task)]
        else:
            todo = [(p, an) for p, an in pairs if solve_prompt(p)[0] == task]
        if not todo:
            continue
        groups = {}
        for pr, an in todo:
            ids = np.concatenate([[BOS], encode(pr)])
            groups.setdefault((len(ids), region(len(an), 32)), []).append((ids, an, pr))
        ok = 0
        for (_, gl), items in groups.items():
            outs = vanilla_decode(model, [i for i, _, _ in items], gl, 32, shift)
            ok += sum(decode(o) == an for o, (_, an, _) in zip(outs, items))
            if dump is not None:
                dump.extend((pr, decode(o)) for o, (_, _, pr) in zip(outs, items))
        res[task] = ok / len(todo)
    model.train()
    res["overall"] = sum(res.values()) / len(res)
    return res


# ---------------------------------------------------------------- main
def parse():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--format", choices=["llada", "dream"], required=True)
    ap.add_argument("--out", help="checkpoint directory to write")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--minutes", type=float, default=6.0, help="wall-clock budget of training")
    ap.add_argument("--steps", type=int, default=100000, help="most optimizer steps")
    ap.add_argument("--d-model", type=int, default=192)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, help="default: heads (LLaDA), heads / 3 (Dream)")
    ap.add_argument("--ffn", type=int, help="default: 3 × d_model")
    ap.add_argument("--rope-theta", type=float, default=1e4)
    ap.add_argument("--batch-tokens", type=int, default=32768)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup-steps", type=int, default=200)
    ap.add_argument("--ar-warmup", type=float, help="fraction of the first stage's progress "
                    "(LLaDA 0.3, Dream 0.5)")
    ap.add_argument("--ar-mix", type=float, default=0.0,
                    help="after the warm-up (both stages): this fraction of the steps, drawn "
                    "from the seed, still train the warm-up's next-token objective, so the "
                    "long lookups it teaches are kept through the diffusion phase (default 0)")
    ap.add_argument("--structured", type=float, default=0.5)
    ap.add_argument("--mix", default="add:1,sort:2,rev:1,cumsum:1,multi:3",
                    help="task weights of the batches")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bands", action="store_true",
                    help="one length quarter per single-task batch, as the Rust trainer (default: "
                    "the whole range; banded runs solved far fewer reversals, docs/training.md)")
    ap.add_argument("--padding", choices=["hidden", "answer"], default="hidden",
                    help="EOS padding beyond a row's own answer region, up to the batch's "
                    "longest row: hidden from attention and loss, so each row trains in the "
                    "layout `llada eval` decodes it in (default), or `answer`: part of the "
                    "answer, seen and weighted (an earlier layout)")
    ap.add_argument("--eos-tail", metavar="P:MAX",
                    help="with probability P a row's answer region is its answer, one EOS and a "
                    "uniform 0 to MAX (inclusive) more EOS, not rounded up to 32. With P = 1 "
                    "the region's end no longer tells the model how long the answer is, so it "
                    "has to end answers itself: other block lengths and fixed generation lengths "
                    "up to about answer + MAX (`llada generate --gen-length`, `llada eval "
                    "--answer-region N`) then decode in its training layout (default: every "
                    "region rounded up to 32)")
    ap.add_argument("--late-eos-tail", metavar="P:MAX",
                    help="--eos-tail of the second stage (--late-mix) only, so one run can learn "
                    "the tasks in the rounded layout first and then end answers in random regions "
                    "(default: the first stage's --eos-tail)")
    ap.add_argument("--threads", type=int, help="CPU threads of the training process")
    ap.add_argument("--compute-dtype", choices=["f32", "bf16"], default="f32",
                    help="dtype of the training products: bf16 runs the matmuls and attention "
                    "in bfloat16 (f32 weights, optimizer, residual stream, norms and loss); "
                    "on a CPU with avx512_bf16 it trains ≈ 1.5x the tokens per second (CUDA "
                    "uses autocast either way)")
    ap.add_argument("--producers", type=int, default=3, help="batch-producing processes")
    ap.add_argument("--weights-only", action="store_true",
                    help="write config, weights and train state, not the tokenizer files")
    ap.add_argument("--save-every-s", type=float, default=0,
                    help="also write the checkpoint every this many seconds (0: at the end)")
    ap.add_argument("--eval-per-task", type=int, default=50)
    ap.add_argument("--log-every", type=int, default=200)
    ap.add_argument("--eval-file", help="after training (or with --load, instead), also "
                    "score the held-out `prompt<TAB>answer<TAB>1` lines of this file")
    ap.add_argument("--dump", help="with --load and --eval-file: write `prompt<TAB>output` "
                    "lines of the file's examples")
    ap.add_argument("--load", help="checkpoint directory to evaluate instead of training")
    ap.add_argument("--init", help="checkpoint directory to start training from (its shape "
                    "replaces --d-model/--layers/--heads; the optimizer starts fresh)")
    ap.add_argument("--late-mix", help="a second stage from --late-from of the run's progress "
                    "on: batches of these task weights, a fresh AdamW at --late-lr with its own "
                    "warm-up (--late-warmup-steps) and cosine to 10 %% over the rest of the "
                    "budget, no warm-up objective — what `--init` of the first stage's output "
                    "would do (docs/training.md, 'A sort-weighted second stage'); the model "
                    "as the first stage left it is saved in OUT/stage1. On two threads the "
                    "stage cost tiny-llada-tasks its rows (docs/experiments/)")
    ap.add_argument("--multi-mix", metavar="SUB:WEIGHT,…",
                    help="weights of the sub-tasks (add, rev, cumsum) of the five items of a "
                         "training multi-question row, in both stages (default: uniform, as the "
                         "held-out split draws them; e.g. add:1,rev:2,cumsum:1 gives the rows' "
                         "reversal lookup twice the items)")
    ap.add_argument("--multi-short-rev", metavar="P:MOST",
                    help="with probability P a training multi-question row's reversal item "
                         "draws its word from 1 to MOST letters instead of 1 to 16, in both "
                         "stages: short words sit behind the widest space padding of a row's "
                         "right-aligned items, where such rows failed (default: the full "
                         "range, as the held-out split draws them)")
    ap.add_argument("--late-from", type=float, default=0.75,
                    help="fraction of the run's progress where the second stage begins")
    ap.add_argument("--late-lr", type=float, default=5e-4, help="peak lr of the second stage")
    ap.add_argument("--late-schedule", choices=["restart", "continue"], default="restart",
                    help="`restart` (default): the second stage gets a fresh AdamW at "
                    "--late-lr, its own warm-up and cosine, after the first stage annealed to "
                    "10 %% of --lr; `continue`: one optimizer and one cosine (--lr to 10 %%) over "
                    "the whole run, the second stage changing only the batches (mix, EOS tails) "
                    "and dropping the warm-up objective, so the first stage is not annealed only "
                    "to be heated again (--late-lr and --late-warmup-steps unused; one "
                    "run of it formed the rows and lost the sorts: docs/experiments/)")
    ap.add_argument("--late-warmup-steps", type=int, default=50)
    ap.add_argument("--ema", default="",
                    help="comma-separated decays (e.g. 0.999,0.9998): also keep exponential moving "
                         "averages of the weights and save each as OUT/ema-DECAY beside the last "
                         "weights in OUT (each average's decay ramps up as (1+step)/(10+step))")
    a = ap.parse_args()

    def weights(flag, spec, allowed=TASKS):
        # Parsed here, not where the batches are made: a typo in --late-mix would otherwise
        # surface only when the second stage begins, most of a run later.
        try:
            w = {k: float(v) for k, v in (kv.split(":") for kv in spec.split(","))}
        except ValueError:
            ap.error(f"{flag} {spec!r}: expected TASK:WEIGHT,… (e.g. add:1,sort:2)")
        if not set(w) <= set(allowed) or min(w.values()) < 0 or sum(w.values()) <= 0:
            ap.error(f"{flag} {spec!r}: tasks are {', '.join(allowed)}, weights ≥ 0, not all 0")
        return w

    a.mix_weights = weights("--mix", a.mix)
    a.late_weights = weights("--late-mix", a.late_mix) if a.late_mix else None
    a.multi_weights = (weights("--multi-mix", a.multi_mix, MULTI_SUBTASKS) if a.multi_mix
                       else None)
    try:
        a.ema_decays = [float(d) for d in a.ema.split(",")] if a.ema else []
    except ValueError:
        ap.error(f"--ema {a.ema!r}: expected decays such as 0.999,0.9998")
    if any(not 0 < d < 1 for d in a.ema_decays):
        ap.error(f"--ema {a.ema!r}: every decay must lie strictly between 0 and 1")
    a.kv_heads = a.kv_heads or (a.heads if a.format == "llada" else max(1, a.heads // 3))
    # The model's shape, checked here: a bad one would otherwise fail as a reshape error
    # inside the first attention call.
    if min(a.d_model, a.layers, a.heads, a.kv_heads) < 1:
        ap.error("--d-model, --layers, --heads and --kv-heads must be at least 1")
    if a.d_model % a.heads or (a.d_model // a.heads) % 2:
        ap.error(f"--d-model {a.d_model} / --heads {a.heads}: the head dimension must be a whole, "
                 "even number (RoPE rotates pairs)")
    if a.heads % a.kv_heads:
        ap.error(f"--kv-heads {a.kv_heads} must divide --heads {a.heads} (each key/value head "
                 "serves a whole group of query heads)")
    # Every other number, refused here with its flag rather than deep in a run (a zero budget
    # divided by zero; a zero MLP width trained a degenerate model without a word).
    for flag, ok, need in [
            ("--minutes", a.minutes > 0, "> 0"), ("--steps", a.steps >= 1, "≥ 1"),
            ("--ffn", a.ffn is None or a.ffn >= 1, "≥ 1"),
            ("--rope-theta", a.rope_theta > 0, "> 0"),
            ("--batch-tokens", a.batch_tokens >= 1, "≥ 1"), ("--lr", a.lr > 0, "> 0"),
            ("--late-lr", a.late_lr > 0, "> 0"), ("--warmup-steps", a.warmup_steps >= 0, "≥ 0"),
            ("--late-warmup-steps", a.late_warmup_steps >= 0, "≥ 0"),
            ("--ar-warmup", a.ar_warmup is None or 0 <= a.ar_warmup <= 1, "in [0, 1]"),
            ("--ar-mix", 0 <= a.ar_mix < 1, "in [0, 1)"),
            ("--late-from", not a.late_mix or 0 < a.late_from < 1, "strictly between 0 and 1"),
            ("--structured", 0 <= a.structured <= 1, "in [0, 1]"),
            ("--threads", a.threads is None or a.threads >= 1, "≥ 1"),
            ("--producers", a.producers >= 0, "≥ 0"),
            ("--save-every-s", a.save_every_s >= 0, "≥ 0"),
            ("--eval-per-task", a.eval_per_task >= 0, "≥ 0"),
            ("--log-every", a.log_every >= 1, "≥ 1")]:
        if not ok:
            ap.error(f"{flag} {getattr(a, flag[2:].replace('-', '_'))}: must be {need}")
    a.ffn = a.ffn or 3 * a.d_model
    a.eps = 1e-5 if a.format == "llada" else 1e-6
    if a.ar_warmup is None:
        a.ar_warmup = 0.3 if a.format == "llada" else 0.5
    a.row_ends = a.padding == "hidden"

    def share_count(flag, spec, name, sample, lo, hi, need):
        """`P:N` of `flag`: a probability in (0, 1] and a count in [lo, hi]."""
        try:
            p, n = spec.split(":")
            out = (float(p), int(n))
        except ValueError:
            ap.error(f"{flag} {spec!r}: expected P:{name} such as {sample}")
        if not 0 < out[0] <= 1 or not lo <= out[1] <= hi:
            ap.error(f"{flag} {spec!r}: P must lie in (0, 1] and {name} {need}")
        return out

    def tail(flag, spec):
        if spec is None:
            return None
        out = share_count(flag, spec, "MAX", "0.5:96", 0, math.inf, "be ≥ 0")
        if not a.row_ends:
            ap.error(f"{flag} needs --padding hidden (each row its own region)")
        return out

    a.eos_tail = tail("--eos-tail", a.eos_tail)
    if a.late_eos_tail is not None and not a.late_mix:
        ap.error("--late-eos-tail needs --late-mix (a second stage)")
    a.late_eos_tail = (tail("--late-eos-tail", a.late_eos_tail) if a.late_eos_tail is not None
                       else a.eos_tail)
    if a.multi_short_rev is not None:
        a.multi_short_rev = share_count("--multi-short-rev", a.multi_short_rev, "MOST", "0.3:6",
                                        1, REV_MAX, f"in 1 to {REV_MAX}")
    # Both shape the multi-question rows only: refused, not silently unused, when no stage
    # draws a row.
    rows = any(w and w.get("multi", 0) > 0 for w in (a.mix_weights, a.late_weights))
    for flag, given in [("--multi-mix", a.multi_mix), ("--multi-short-rev", a.multi_short_rev)]:
        if given is not None and not rows:
            ap.error(f"{flag} shapes the multi-question rows: give multi a weight in --mix or "
                     "--late-mix")
    return a


def read_pairs(path):
    """Held-out (prompt, answer) pairs of a `prompt<TAB>answer<TAB>held` file."""
    out = []
    for line in open(path):
        prompt, answer, held = line.rstrip("\n").split("\t")
        if held == "1":
            out.append((prompt, answer))
    return out


def load(a, path, dev):
    """A checkpoint written by `save` (or by `llada train`): its shape from config.json."""
    from safetensors.torch import load_file

    cfg = json.load(open(os.path.join(path, "config.json")))
    if cfg["model_type"] == "llada":
        a.format, a.d_model, a.layers = "llada", cfg["d_model"], cfg["n_layers"]
        a.heads, a.kv_heads, a.ffn = cfg["n_heads"], cfg["n_kv_heads"], cfg["mlp_hidden_size"]
    else:
        a.format, a.d_model, a.layers = "dream", cfg["hidden_size"], cfg["num_hidden_layers"]
        a.heads, a.kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        a.ffn = cfg["intermediate_size"]
    a.rope_theta, a.eps = cfg["rope_theta"], cfg["rms_norm_eps"]
    model = Model(a.format, a.d_model, a.layers, a.heads, a.kv_heads, a.ffn, a.rope_theta, a.eps,
                  0.0, 0)
    tensors = load_file(os.path.join(path, "model.safetensors"))
    with torch.no_grad():
        for name, p in model.state().items():
            p.copy_(tensors.pop(name).float())
    if tensors:
        raise ValueError(f"unexpected tensors in {path}: {sorted(tensors)[:5]}")
    return model.to(dev)


def report(label, res):
    print(f"{label}: " + ", ".join(f"{k} {100 * v:.1f} %" for k, v in res.items()), flush=True)


def main():
    a = parse()
    dev = torch.device(a.device)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.load:
        model = load(a, a.load, dev)
        if a.eval_per_task:
            report("held-out (this script's generator)", evaluate(model, a, a.eval_per_task,
                                                                   a.seed + 7))
        if a.eval_file:
            dump = []
            report("held-out (file)", evaluate(model, a, 0, 0, read_pairs(a.eval_file), dump))
            if a.dump:
                with open(a.dump, "w") as f:
                    f.writelines(f"{p}\t{o}\n" for p, o in dump)
        return
    if not a.out:
        sys.exit("--out is required")
    torch.manual_seed(a.seed)
    model, state, averages = train(a, dev)
    res = evaluate(model, a, a.eval_per_task, a.seed + 7) if a.eval_per_task else {}
    if res:
        report("held-out (this script's generator, vanilla decoding)", res)
    state["script_eval"] = res
    save(model, a, a.out, state)
    for decay, avg in averages:
        save(avg, a, os.path.join(a.out, f"ema-{decay:g}"), {**state, "ema_decay": decay})
    if a.eval_file:
        report("held-out (file)", evaluate(model, a, 0, 0, read_pairs(a.eval_file)))


def train(a, dev):
    cuda = dev.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    if a.init:
        model = load(a, a.init, dev)
    else:
        model = Model(a.format, a.d_model, a.layers, a.heads, a.kv_heads, a.ffn, a.rope_theta,
                      a.eps, 1 / math.sqrt(a.d_model), a.seed).to(dev)
    if a.compute_dtype == "bf16" and not cuda:
        model.compute = torch.bfloat16
    params = [p for p in model.parameters()]
    n_params = sum(p.numel() for p in params)
    decay = [p for p in params if p.dim() == 2]
    other = [p for p in params if p.dim() != 2]

    def adamw(lr):
        return torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                  {"params": other, "weight_decay": 0.0}],
                                 lr=lr, betas=(0.9, 0.95), fused=cuda)

    opt = adamw(a.lr)

    def loader(mix, seed, tail):
        # Worker processes make the batches (the generator is Python: in the training process
        # it would hold the interpreter lock the training loop needs).
        return iter(torch.utils.data.DataLoader(
            Batches(seed, mix, a.batch_tokens, 32, a.bands, tail, a.multi_weights,
                    a.multi_short_rev),
            batch_size=None,
            num_workers=a.producers, pin_memory=cuda,
            prefetch_factor=8 if a.producers else None))

    batches = loader(a.mix_weights, a.seed, a.eos_tail)
    # The second stage's batches come from a second generator seeded apart from the first, made
    # only when the stage begins (its workers would otherwise share the CPU all run long).
    second = False
    # Learning-rate schedule of the current stage: (peak, warm-up steps, first step, progress at
    # its start, progress at its end).
    # The first stage ends (and the warm-up objective's share is measured) at --late-from,
    # whichever schedule; with `--late-schedule continue` its cosine spans the whole run.
    first_end = a.late_from if a.late_mix else 1.0
    restart = a.late_schedule == "restart"
    stage = (a.lr, a.warmup_steps, 0, 0.0, first_end if restart else 1.0)
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    # Which diffusion-phase steps keep the next-token objective (--ar-mix): its own stream, so
    # the masking draws of `gen` are the same as without it.
    mix_rng = random.Random(a.seed + 7)
    print(f"{a.format}: {n_params / 1e6:.2f} M parameters, d {a.d_model}, {a.layers} layers, "
          f"{a.heads}/{a.kv_heads} heads, ffn {a.ffn}, device {dev}", flush=True)
    budget = a.minutes * 60
    t0 = time.time()
    ema, tokens, step = None, 0, 0
    # Weight averages (--ema): float copies of the model, updated after every optimizer step.
    averages = []
    for d in a.ema_decays:
        avg = copy.deepcopy(model)
        for p in avg.parameters():
            p.requires_grad_(False)
        averages.append((d, avg, list(avg.parameters())))
    last_save = t0
    while step < a.steps:
        progress = max(step / a.steps, (time.time() - t0) / budget)
        if progress >= 1:
            break
        if a.late_mix and progress >= a.late_from and not second:
            second = True
            if a.out:
                # The first stage's end, kept beside the run to tell what each stage bought.
                save(model, a, os.path.join(a.out, "stage1"),
                     {"steps": step, "tokens": tokens, "partial": True})
            batches = loader(a.late_weights, a.seed + 1000, a.late_eos_tail)
            if restart:
                opt = adamw(a.late_lr)
                stage = (a.late_lr, a.late_warmup_steps, step, progress, 1.0)
            tails = f", EOS tails {a.late_eos_tail}" if a.late_eos_tail else ""
            lr_note = f"lr {a.late_lr:g}" if restart else "the run's optimizer and cosine"
            print(f"step {step}: second stage, mix {a.late_mix}, {lr_note}{tails}", flush=True)
        peak, warm, first, p0, p1 = stage
        frac = min(1.0, (progress - p0) / (p1 - p0))
        lr_scale = min(1.0, (step - first + 1) / warm)
        lr_scale *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))
        # The warm-up objective covers the first `ar_warmup` of the first stage only.
        warming = not second and progress < a.ar_warmup * first_end
        next_token = warming or (a.ar_mix > 0 and mix_rng.random() < a.ar_mix)
        for grp in opt.param_groups:
            grp["lr"] = peak * lr_scale
        rows, starts, ends = next(batches)
        rows = rows.to(dev, non_blocking=True)
        starts = starts.to(dev, non_blocking=True)
        ends = ends.to(dev, non_blocking=True) if a.row_ends else None
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            if next_token:
                loss = warmup_loss(model, rows, starts, ends, a.format)
            else:
                loss = diffusion_loss(model, rows, starts, ends, a.format == "dream", 0.05,
                                      a.structured, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        with torch.no_grad():
            for d, _, avg_params in averages:
                torch._foreach_lerp_(avg_params, params, 1 - min(d, (1 + step) / (10 + step)))
        tokens += rows.numel()
        if step % a.log_every == 0:
            v = loss.item()
            ema = v if ema is None else 0.9 * ema + 0.1 * v
            el = time.time() - t0
            phase = "warm-up" if warming else "next-token" if next_token else "diffusion"
            print(f"step {step} {phase} loss {v:.4f} (ema {ema:.4f}) lr {peak * lr_scale:.2e} "
                  f"{tokens / el:,.0f} tok/s {el:.0f} s", flush=True)
        if a.save_every_s and time.time() - last_save > a.save_every_s:
            last_save = time.time()
            save(model, a, a.out, {"steps": step, "tokens": tokens, "partial": True})
    wall = time.time() - t0
    print(f"trained {step} steps, {tokens:,} tokens in {wall:.0f} s", flush=True)
    state = {"steps": step, "tokens": tokens, "wall_s": wall, "parameters": n_params,
             "final_loss_ema": ema, "options": dict(vars(a))}
    return model, state, [(d, m) for d, m, _ in averages]


if __name__ == "__main__":
    main()
