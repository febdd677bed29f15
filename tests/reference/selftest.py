#!/usr/bin/env python3
"""Self-checks for the Python reference (standard library + numpy only).

usage: python3 selftest.py      (exit 0 and a '... passed, 0 failed' line on success)

- vectorized dequantizers == literal scalar transliterations of ggml's dequantize_row_*
- quantizers: scalar transliterations of quantize_row_{q8_0,q4_0,q4_1}_ref give the same bytes
- GGUF writer -> reader round trip of every metadata type, alignment, tensor data
- safetensors round trip for F32 / F16 / BF16
- permute/unpermute are inverse; NORM rope on permuted rows == NEOX rope on HF rows
- KV-cache scenario == equivalent full forward (both masks)
"""

from __future__ import annotations

import math
import os
import struct
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_io as G  # noqa: E402
import ref_forward as R  # noqa: E402
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402

f32 = np.float32


def h2f(b, off):
    return f32(np.frombuffer(bytes(b[off:off + 2]), dtype="<f2")[0])


# ------------------------------------------------------- scalar transliterations of ggml

def scalar_q4_0(raw):
    y = []
    for i in range(0, len(raw), 18):
        d = h2f(raw, i)
        qs = raw[i + 2:i + 18]
        blk = [f32(0)] * 32
        for j in range(16):
            blk[j] = f32(f32((qs[j] & 0x0F) - 8) * d)
            blk[j + 16] = f32(f32((qs[j] >> 4) - 8) * d)
        y += blk
    return np.array(y, dtype=f32)


def scalar_q4_1(raw):
    y = []
    for i in range(0, len(raw), 20):
        d, m = h2f(raw, i), h2f(raw, i + 2)
        qs = raw[i + 4:i + 20]
        blk = [f32(0)] * 32
        for j in range(16):
            blk[j] = f32(f32(f32(qs[j] & 0x0F) * d) + m)
            blk[j + 16] = f32(f32(f32(qs[j] >> 4) * d) + m)
        y += blk
    return np.array(y, dtype=f32)


def scalar_q8_0(raw):
    y = []
    for i in range(0, len(raw), 34):
        d = h2f(raw, i)
        for j in range(32):
            q = struct.unpack("<b", bytes([raw[i + 2 + j]]))[0]
            y.append(f32(f32(q) * d))
    return np.array(y, dtype=f32)


def get_scale_min_k4(j, q):
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4)


def scalar_q4_k(raw):
    y = []
    for i in range(0, len(raw), 144):
        d, mn = h2f(raw, i), h2f(raw, i + 2)
        scales = raw[i + 4:i + 16]
        q = raw[i + 16:i + 144]
        qo = 0
        is_ = 0
        for _ in range(0, 256, 64):
            sc, m = get_scale_min_k4(is_ + 0, scales)
            d1, m1 = f32(d * f32(sc)), f32(mn * f32(m))
            sc, m = get_scale_min_k4(is_ + 1, scales)
            d2, m2 = f32(d * f32(sc)), f32(mn * f32(m))
            for l in range(32):
                y.append(f32(f32(d1 * f32(q[qo + l] & 0xF)) - m1))
            for l in range(32):
                y.append(f32(f32(d2 * f32(q[qo + l] >> 4)) - m2))
            qo += 32
            is_ += 2
    return np.array(y, dtype=f32)


def scalar_q6_k(raw):
    out = []
    for i in range(0, len(raw), 210):
        ql = raw[i:i + 128]
        qh = raw[i + 128:i + 192]
        sc = [struct.unpack("<b", bytes([b]))[0] for b in raw[i + 192:i + 208]]
        d = h2f(raw, i + 208)
        y = [f32(0)] * 256
        lo = qo = so = yo = 0
        for _ in range(0, 256, 128):
            for l in range(32):
                is_ = l // 16
                q1 = ((ql[lo + l] & 0xF) | (((qh[qo + l] >> 0) & 3) << 4)) - 32
                q2 = ((ql[lo + l + 32] & 0xF) | (((qh[qo + l] >> 2) & 3) << 4)) - 32
                q3 = ((ql[lo + l] >> 4) | (((qh[qo + l] >> 4) & 3) << 4)) - 32
                q4 = ((ql[lo + l + 32] >> 4) | (((qh[qo + l] >> 6) & 3) << 4)) - 32
                y[yo + l] = f32(f32(d * f32(sc[so + is_ + 0])) * f32(q1))
                y[yo + l + 32] = f32(f32(d * f32(sc[so + is_ + 2])) * f32(q2))
                y[yo + l + 64] = f32(f32(d * f32(sc[so + is_ + 4])) * f32(q3))
                y[yo + l + 96] = f32(f32(d * f32(sc[so + is_ + 6])) * f32(q4))
            yo += 128
            lo += 64
            qo += 32
            so += 8
        out += y
    return np.array(out, dtype=f32)


def c_roundf(v):
    v = float(v)
    return math.floor(v + 0.5) if v >= 0 else -math.floor(-v + 0.5)


def scalar_quant_q8_0(x):
    out = b""
    for i in range(0, len(x), 32):
        blk = x[i:i + 32]
        amax = f32(0)
        for v in blk:
            amax = max(amax, f32(abs(v)))
        d = f32(amax / f32(127))
        idd = f32(f32(1) / d) if d else f32(0)
        out += np.array([d], dtype="<f2").tobytes()
        out += bytes([(int(c_roundf(f32(v * idd))) & 0xFF) for v in blk])
    return out


def scalar_quant_q4_0(x):
    out = b""
    for i in range(0, len(x), 32):
        blk = x[i:i + 32]
        amax = f32(0)
        mx = f32(0)
        for v in blk:
            if amax < abs(v):
                amax = f32(abs(v))
                mx = v
        d = f32(mx / f32(-8))
        idd = f32(f32(1) / d) if d else f32(0)
        qs = []
        for j in range(16):
            x0 = f32(blk[j] * idd)
            x1 = f32(blk[j + 16] * idd)
            xi0 = min(15, int(f32(x0 + f32(8.5))))
            xi1 = min(15, int(f32(x1 + f32(8.5))))
            qs.append(xi0 | (xi1 << 4))
        out += np.array([d], dtype="<f2").tobytes() + bytes(qs)
    return out


def scalar_quant_q4_1(x):
    out = b""
    for i in range(0, len(x), 32):
        blk = x[i:i + 32]
        mn, mx = f32(np.finfo(f32).max), f32(-np.finfo(f32).max)
        for v in blk:
            mn = min(mn, v)
            mx = max(mx, v)
        d = f32(f32(mx - mn) / f32(15))
        idd = f32(f32(1) / d) if d else f32(0)
        qs = []
        for j in range(16):
            x0 = f32(f32(blk[j] - mn) * idd)
            x1 = f32(f32(blk[j + 16] - mn) * idd)
            xi0 = min(15, int(f32(x0 + f32(0.5))))
            xi1 = min(15, int(f32(x1 + f32(0.5))))
            qs.append(xi0 | (xi1 << 4))
        out += np.array([d], dtype="<f2").tobytes() + np.array([mn], dtype="<f2").tobytes() + bytes(qs)
    return out


# ------------------------------------------------------- tests

def t_dequant_vs_scalar():
    rng = np.random.default_rng(1)
    for tt, nblk, fn in ((G.Q4_0, 18, scalar_q4_0), (G.Q4_1, 20, scalar_q4_1), (G.Q8_0, 34, scalar_q8_0),
                         (G.Q4_K, 144, scalar_q4_k), (G.Q6_K, 210, scalar_q6_k)):
        raw = bytearray(rng.integers(0, 256, nblk * 3, dtype=np.uint8).tobytes())
        # keep the f16 scales finite
        offs = {G.Q4_0: [0], G.Q4_1: [0, 2], G.Q8_0: [0], G.Q4_K: [0, 2], G.Q6_K: [208]}[tt]
        for b in range(3):
            for o in offs:
                raw[b * nblk + o: b * nblk + o + 2] = np.array([rng.uniform(-0.05, 0.05)], dtype="<f2").tobytes()
        raw = bytes(raw)
        blk = G.BLOCK_INFO[tt][0]
        v = G.dequantize(np.frombuffer(raw, dtype=np.uint8), tt, 3 * blk)
        s = fn(raw)
        assert np.array_equal(v, s), (G.TYPE_NAMES[tt], np.max(np.abs(v - s)))


def t_quant_vs_scalar():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(32 * 6) * 0.5).astype(f32)
    x[40] = f32(-3.0)
    x[64:96] = 0
    x[96:128] = np.abs(x[96:128])
    x[128:160] = f32(0.25)  # constant block (q4_1: d = 0)
    for q, s in ((G.quantize_q8_0, scalar_quant_q8_0), (G.quantize_q4_0, scalar_quant_q4_0),
                 (G.quantize_q4_1, scalar_quant_q4_1)):
        assert q(x) == s(list(x)), q.__name__
    # quantization error bounds
    y = G.dequant_q8_0(G.quantize_q8_0(x))
    assert np.max(np.abs(y - x)) < 0.02


def t_gguf_roundtrip():
    w = G.GGUFWriter(alignment=64)
    w.add("k.u8", G.T_U8, 200)
    w.add("k.i8", G.T_I8, -100)
    w.add("k.u16", G.T_U16, 60000)
    w.add("k.i16", G.T_I16, -30000)
    w.add_u32("k.u32", 4000000000)
    w.add_i32("k.i32", -2000000000)
    w.add_f32("k.f32", 0.5)
    w.add_bool("k.bool", True)
    w.add_string("k.str", "héllo")
    w.add_u64("k.u64", 2 ** 63)
    w.add("k.i64", G.T_I64, -2 ** 62)
    w.add("k.f64", G.T_F64, 1e-300)
    w.add_array("k.arr_s", ["a", "", "ccc"], G.T_STRING)
    w.add_array("k.arr_i", [1, -2, 3], G.T_I32)
    w.add_array("k.arr_empty", [], G.T_STRING)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 5)).astype(f32)
    b = rng.standard_normal((2, 64)).astype(f32)
    w.add_tensor("a", a, G.F32)
    w.add_tensor("b16", b, G.F16)
    w.add_tensor("bq8", b, G.Q8_0)
    w.add_tensor("bbf", b, G.BF16)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "t.gguf")
        w.write(p)
        g = G.read_gguf(p)
    m = g.metadata
    assert g.version == 3 and g.alignment == 64 and g.data_offset % 64 == 0
    assert m["k.u8"] == 200 and m["k.i8"] == -100 and m["k.u16"] == 60000 and m["k.i16"] == -30000
    assert m["k.u32"] == 4000000000 and m["k.i32"] == -2000000000 and m["k.f32"] == 0.5
    assert m["k.bool"] is True and m["k.str"] == "héllo" and m["k.u64"] == 2 ** 63
    assert m["k.i64"] == -2 ** 62 and m["k.f64"] == 1e-300
    assert m["k.arr_s"] == ["a", "", "ccc"] and m["k.arr_i"] == [1, -2, 3] and m["k.arr_empty"] == []
    assert g.tensors["a"].dims == [5, 3] and np.array_equal(g.tensor("a"), a)
    assert np.array_equal(g.tensor("b16"), b.astype(np.float16).astype(f32))
    assert np.max(np.abs(g.tensor("bq8") - b)) < 0.05
    assert np.max(np.abs(g.tensor("bbf") - b)) < 0.02
    for t in g.tensors.values():
        assert t.offset % 64 == 0


def t_safetensors_roundtrip():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((4, 6)) * 0.1).astype(f32)
    x = G.bf16_bits_to_f32(G.f32_to_bf16_bits(x))  # exactly representable everywhere
    with tempfile.TemporaryDirectory() as d:
        for dt in ("F32", "F16", "BF16"):
            p = os.path.join(d, f"{dt}.safetensors")
            write_safetensors(p, {"w": x, "v": x[0]}, dt, {"format": "pt"})
            t, dts, meta = read_safetensors(p)
            assert dts == {"w": dt, "v": dt} and meta == {"format": "pt"}
            assert np.array_equal(t["w"], x) and np.array_equal(t["v"], x[0])
            with open(p, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
            assert n % 8 == 0


def _tiny(arch, qkv_bias, Hkv):
    cfg = R.Config(arch, 23, 32, 2, 4, Hkv, 8, 48, 10000.0, 1e-5, qkv_bias=qkv_bias, tied=False)
    rng = np.random.default_rng(5)
    d, H, D, F, V = 32, 4, 8, 48, 23
    W = {"embed": rng.standard_normal((V, d)) * 0.3, "final_norm": 1 + 0.1 * rng.standard_normal(d),
         "lm_head": rng.standard_normal((V, d)) * 0.2, "layers": []}
    for _ in range(2):
        L = {"attn_norm": 1 + 0.1 * rng.standard_normal(d), "ffn_norm": 1 + 0.1 * rng.standard_normal(d),
             "wq": rng.standard_normal((H * D, d)) * 0.3, "wk": rng.standard_normal((Hkv * D, d)) * 0.3,
             "wv": rng.standard_normal((Hkv * D, d)) * 0.3, "wo": rng.standard_normal((d, H * D)) * 0.3,
             "w_gate": rng.standard_normal((F, d)) * 0.2, "w_up": rng.standard_normal((F, d)) * 0.2,
             "w_down": rng.standard_normal((d, F)) * 0.2}
        if qkv_bias:
            L["bq"], L["bk"], L["bv"] = (rng.standard_normal(H * D) * 0.2, rng.standard_normal(Hkv * D) * 0.2,
                                         rng.standard_normal(Hkv * D) * 0.2)
        W["layers"].append(L)
    return cfg, W


def t_permute_and_rope():
    rng = np.random.default_rng(6)
    w = rng.standard_normal((4 * 8, 5))
    assert np.array_equal(R.unpermute_qk(R.permute_qk(w, 4), 4), w)
    p = R.permute_qk(w, 4)
    # new row 2i of head h == old row i; new row 2i+1 == old row i + D/2
    assert np.array_equal(p[8 * 1 + 2 * 3], w[8 * 1 + 3]) and np.array_equal(p[8 * 1 + 2 * 3 + 1], w[8 * 1 + 3 + 4])
    for arch, bias, Hkv in (("llama", False, 2), ("llada", False, 4)):
        cfg, W = _tiny(arch, bias, Hkv)
        named = R.to_gguf(cfg, W)
        Wp = R.from_named(cfg, named, R.gguf_names(cfg.n_layers, cfg.qkv_bias, cfg.tied))
        toks, pos = [1, 5, 7, 7, 2, 9], [0, 1, 2, 3, 4, 5]
        a = R.forward(cfg, W, toks, pos, "bidirectional")
        b = R.forward(cfg, Wp, toks, pos, "bidirectional", rope_fn=R.apply_rope_norm)
        c = R.forward(cfg, Wp, toks, pos, "bidirectional")  # wrong rope for permuted rows
        assert np.max(np.abs(a - b)) < 1e-12
        assert np.max(np.abs(a - c)) > 1e-3
        assert R.forward(cfg, R.from_gguf(cfg, named), toks, pos).tolist() == R.forward(cfg, W, toks, pos).tolist()


def t_kv_and_masks():
    cfg, W = _tiny("qwen2", True, 2)
    toks, pos = [3, 1, 4, 1, 5, 9, 2, 6], list(range(8))
    for mask in ("causal", "bidirectional"):
        R.kv_scenario(cfg, W, toks, pos, 3, mask)  # asserts internally
    # causal: row i must not depend on tokens after i
    a = R.forward(cfg, W, toks, pos, "causal")
    b = R.forward(cfg, W, toks[:5] + [7, 7, 7], pos, "causal")
    assert np.max(np.abs(a[:5] - b[:5])) == 0 and np.max(np.abs(a[5:] - b[5:])) > 0
    # bidirectional: row 0 does depend on later tokens
    a = R.forward(cfg, W, toks, pos, "bidirectional")
    b = R.forward(cfg, W, toks[:5] + [7, 7, 7], pos, "bidirectional")
    assert np.max(np.abs(a[0] - b[0])) > 0
    # explicit positions matter (RoPE): shifting all positions changes nothing for relative attention
    c = R.forward(cfg, W, toks, [p + 100 for p in pos], "bidirectional")
    assert np.max(np.abs(a - c)) < 1e-9


TESTS = [t_dequant_vs_scalar, t_quant_vs_scalar, t_gguf_roundtrip, t_safetensors_roundtrip,
         t_permute_and_rope, t_kv_and_masks]


def main():
    passed = failed = 0
    for t in TESTS:
        try:
            t()
            passed += 1
            print(f"ok   {t.__name__}")
        except Exception as e:  # noqa: BLE001
            failed += 1
            print(f"FAIL {t.__name__}: {type(e).__name__}: {e}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
