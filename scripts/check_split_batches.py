#!/usr/bin/env python3
"""Check `train_tasks_torch.py --split-batches` against the unsplit batch, in float64.

A split batch must train exactly what the whole batch trains:
1. every row's logits, at every position it owns (`< end`), are the same whether the row runs
   at the whole batch's width or cut to its part's width (the cut padding was hidden);
2. the warm-up (next-token) loss and gradient of the parts, each scaled by its share of the
   rows and summed, equal the whole batch's, for both formats (the diffusion loss differs from
   it only in the random masks, drawn per row from the same per-row logits of 1);
3. on real sort batches the split computes fewer positions, and multi-question batches (rows of
   one length) are not split.

Run by hand (CI has no torch): `python3 scripts/check_split_batches.py`; it exits 1 on a
failed check.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_tasks_torch as T  # noqa: E402


def model64(fmt):
    kv = 4 if fmt == "dream" else 8
    m = T.Model(fmt, 128, 4, 8, kv, 384, 1e4, 1e-6, 0.088, 3).double()
    m.inv_freq = m.inv_freq.double()
    m.compute = torch.float64
    return m


def main():
    torch.set_num_threads(1)
    failures = []
    sort_batches = iter(T.Batches(5, {"sort": 1}, 2048, 32, False))
    saved = []
    for _ in range(20):
        rows, starts, ends = next(sort_batches)
        parts = T.split_by_length(rows, starts, ends)
        computed = sum(p[0].numel() for p in parts)
        saved.append(1 - computed / rows.numel())
        if sorted(torch.cat([p[2] for p in parts]).tolist()) != sorted(ends.tolist()):
            failures.append("split loses or repeats rows")
    split = sum(s > 0 for s in saved)
    print(f"sort batches: {split}/20 split, positions saved: median "
          f"{sorted(saved)[10]:.1%}, max {max(saved):.1%}")
    if split == 0:
        failures.append("no sort batch split")
    rows, starts, ends = next(iter(T.Batches(5, {"multi": 1}, 2048, 32, False)))
    if len(T.split_by_length(rows, starts, ends)) != 1:
        failures.append("a multi-question batch was split")

    rows, starts, ends = next(sort_batches)
    while len(T.split_by_length(rows, starts, ends)) == 1:
        rows, starts, ends = next(sort_batches)
    for fmt in ("dream", "llada"):
        m = model64(fmt)
        b, t = rows.shape
        keys = (torch.arange(t)[None, :] < ends[:, None])[:, None, None, :]
        with torch.no_grad():
            whole = m(rows, torch.arange(t), keys)
            worst = 0.0
            for p_rows, _, p_ends, _ in T.split_by_length(rows, starts, ends):
                w = p_rows.shape[1]
                pk = (torch.arange(w)[None, :] < p_ends[:, None])[:, None, None, :]
                got = m(p_rows, torch.arange(w), pk)
                for r in range(p_rows.shape[0]):
                    i = next(j for j in range(b) if torch.equal(rows[j, :w], p_rows[r])
                             and ends[j] == p_ends[r])
                    e = int(p_ends[r])
                    worst = max(worst, (got[r, :e] - whole[i, :e]).abs().max().item())
        ok = worst < 1e-9
        print(f"{fmt:5} logits of each row, whole vs cut width: max |diff| {worst:.1e}"
              + ("" if ok else ": FAIL"))
        if not ok:
            failures.append(f"{fmt} logits")

        m.zero_grad(set_to_none=True)
        ref = T.warmup_loss(m, rows, starts, ends, fmt)
        ref.backward()
        ref_g = torch.cat([p.grad.reshape(-1) for p in m.parameters()])
        m.zero_grad(set_to_none=True)
        total = 0.0
        for p_rows, p_starts, p_ends, share in T.split_by_length(rows, starts, ends):
            part = T.warmup_loss(m, p_rows, p_starts, p_ends, fmt) * share
            part.backward()
            total += part.item()
        got_g = torch.cat([p.grad.reshape(-1) for p in m.parameters()])
        le = abs(total - ref.item()) / abs(ref.item())
        ge = ((got_g - ref_g).norm() / ref_g.norm()).item()
        ok = le < 1e-6 and ge < 1e-10  # the cross-entropy runs in f32 (weighted_ce)
        print(f"{fmt:5} warm-up loss {ref.item():.6f} whole, {total:.6f} split (rel {le:.1e}); "
              f"gradient rel err {ge:.1e}" + ("" if ok else ": FAIL"))
        if not ok:
            failures.append(f"{fmt} warm-up loss/gradient")
    if failures:
        sys.exit("failed: " + ", ".join(failures))
    print("all checks passed")


if __name__ == "__main__":
    main()
