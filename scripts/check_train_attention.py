#!/usr/bin/env python3
"""Check `train_tasks_torch.py --compute-dtype bf16` against float64: its attention (batched
products in place of the fused kernel) and one whole training loss and gradient.

The reference is torch's own `scaled_dot_product_attention` and the script's model run in
float64, so the bf16 path is compared with code it does not share. Run by hand (CI has no
torch): `python3 scripts/check_train_attention.py`; it exits 1 on a failed check.

Bounds: bf16 keeps 8 bits of mantissa (relative rounding ≤ 2⁻⁹ ≈ 2·10⁻³ per value), so
outputs and gradients land ≈ 1–3·10⁻² from float64 after a few products; f32 inputs through
the products path (`attend_products`, what bf16 runs) must match to ≈ 10⁻⁶, which tells its
algorithm from its rounding.
"""

import copy
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_tasks_torch as T  # noqa: E402


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def check_attention(failures):
    torch.manual_seed(0)
    b, h, t, d = 6, 8, 96, 16
    key = torch.ones(b, 1, 1, t, dtype=torch.bool)
    key[:3, ..., 70:] = False
    col = torch.arange(t)
    causal = col[None, :] <= col[:, None]
    two = torch.arange(t)[None, :] < torch.clamp(torch.arange(t) + 1, max=t)[:, None]
    for name, mask in (("none", None), ("key mask", key), ("causal", causal),
                       ("two-stream-like", two)):
        q, k, v, g = (torch.randn(b, h, t, d, dtype=torch.float64) * 2 for _ in range(4))

        def run(dtype, fn):
            qq, kk, vv = (x.to(dtype).detach().requires_grad_() for x in (q, k, v))
            o = fn(qq, kk, vv)
            (o.double() * g).sum().backward()
            return o, qq.grad, kk.grad, vv.grad

        ref = run(torch.float64, lambda a, c, e: F.scaled_dot_product_attention(
            a, c, e, attn_mask=mask))
        for dtype, fn, bound in ((torch.float32, T.attend_products, 1e-5),
                                 (torch.bfloat16, T.attend, 4e-2)):
            got = run(dtype, lambda a, c, e: fn(a, c, e, mask))
            errs = [rel(x, y) for x, y in zip(got, ref)]
            ok = max(errs) < bound
            print(f"{fn.__name__:15} {name:16} {str(dtype):15} out/dq/dk/dv rel err "
                  + " ".join(f"{x:.1e}" for x in errs) + ("" if ok else f"  > {bound}: FAIL"))
            if not ok:
                failures.append(f"attend {name} {dtype}")


def check_model(failures):
    for fmt in ("dream", "llada"):
        kv = 4 if fmt == "dream" else 8
        m64 = T.Model(fmt, 128, 4, 8, kv, 384, 1e4, 1e-6, 0.088, 3).double()
        m64.inv_freq = m64.inv_freq.double()
        m64.compute = torch.float64
        mbf = copy.deepcopy(m64).float()
        mbf.inv_freq = mbf.inv_freq.float()
        mbf.compute = torch.bfloat16
        rows, starts, ends = next(iter(T.Batches(5, {"multi": 1, "sort": 1}, 2048, 32, False)))
        for objective in ("diffusion", "warm-up"):
            losses, grads = [], []
            for m in (m64, mbf):
                gen = torch.Generator().manual_seed(11)
                m.zero_grad(set_to_none=True)
                if objective == "diffusion":
                    loss = T.diffusion_loss(m, rows, starts, ends, fmt == "dream", 0.05, 0.5, gen)
                else:
                    loss = T.warmup_loss(m, rows, starts, ends, fmt)
                loss.backward()
                losses.append(loss.item())
                grads.append(torch.cat([p.grad.reshape(-1).double() for p in m.parameters()]))
            le = abs(losses[1] - losses[0]) / abs(losses[0])
            ge = rel(grads[1], grads[0])
            ok = le < 1e-2 and ge < 5e-2
            print(f"model {fmt:5} {objective:9} loss {losses[0]:.5f} (f64) {losses[1]:.5f} (bf16): "
                  f"rel {le:.1e}; gradient rel err {ge:.1e}" + ("" if ok else ": FAIL"))
            if not ok:
                failures.append(f"model {fmt} {objective}")


def main():
    torch.set_num_threads(1)
    failures = []
    check_attention(failures)
    check_model(failures)
    if failures:
        sys.exit("failed: " + ", ".join(failures))
    print("all checks passed")


if __name__ == "__main__":
    main()
