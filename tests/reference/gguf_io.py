"""Minimal GGUF v3 reader/writer with numpy (de)quantization.

Independent reference for llada-rs tests. Standard library + numpy only.

Layout (all little-endian):
  header:  b"GGUF", u32 version, u64 n_tensors, u64 n_kv
  kv:      string key, u32 value_type, value
  tensors: string name, u32 n_dims, u64 dims[n_dims] (dims[0] = innermost /
           contiguous), u32 ggml_type, u64 offset (relative to data section)
  padding to `general.alignment` (default 32), then the data section.
  string = u64 length + utf-8 bytes (no NUL).

numpy shape of a tensor = reversed(dims): a GGUF matrix with dims [in, out]
is a row-major numpy array [out, in] (same as the HF/PyTorch weight).

Block layouts follow ggml (ggml-common.h / ggml-quants.c):
  Q4_0  (2):  32 elems, 18 B: f16 d, u8 qs[16]; y[j]=((qs[j]&15)-8)*d, y[j+16]=((qs[j]>>4)-8)*d
  Q4_1  (3):  32 elems, 20 B: f16 d, f16 m, u8 qs[16]; y = q*d + m
  Q8_0  (8):  32 elems, 34 B: f16 d, i8 qs[32]; y = qs*d
  Q5_0  (6):  32 elems, 22 B: f16 d, u32 qh, u8 qs[16]; q = nibble | (bit of qh) << 4; y=(q-16)*d
  Q5_1  (7):  32 elems, 24 B: f16 d, f16 m, u32 qh, u8 qs[16]; y = q*d + m
  Q2_K (10): 256 elems, 84 B: u8 scales[16] (lo nibble scale, hi nibble min), u8 qs[64], f16 d, f16 dmin
  Q3_K (11): 256 elems, 110 B: u8 hmask[32], u8 qs[64], u8 scales[12] (6-bit, -32), f16 d
  Q4_K (12): 256 elems, 144 B: f16 d, f16 dmin, u8 scales[12], u8 qs[128]
  Q5_K (13): 256 elems, 176 B: f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]
  Q6_K (14): 256 elems, 210 B: u8 ql[128], u8 qh[64], i8 scales[16], f16 d
All dequantization arithmetic is done in float32 in the same operation order
as ggml's scalar dequantize_row_* code (no fused multiply-add).
"""

from __future__ import annotations

import struct
import sys

import numpy as np

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
DEFAULT_ALIGNMENT = 32

# ---- metadata value types ----
T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STRING, T_ARRAY, T_U64, T_I64, T_F64 = range(13)

_SCALAR_FMT = {
    T_U8: "<B", T_I8: "<b", T_U16: "<H", T_I16: "<h", T_U32: "<I", T_I32: "<i",
    T_F32: "<f", T_BOOL: "<?", T_U64: "<Q", T_I64: "<q", T_F64: "<d",
}

# ---- ggml tensor types ----
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, BF16 = 0, 1, 2, 3, 6, 7, 8, 30
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = 10, 11, 12, 13, 14
TYPE_NAMES = {F32: "F32", F16: "F16", Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0", Q5_1: "Q5_1",
              Q8_0: "Q8_0", Q2_K: "Q2_K", Q3_K: "Q3_K", Q4_K: "Q4_K", Q5_K: "Q5_K",
              Q6_K: "Q6_K", BF16: "BF16"}
# type -> (elements per block, bytes per block)
BLOCK_INFO = {F32: (1, 4), F16: (1, 2), BF16: (1, 2), Q4_0: (32, 18), Q4_1: (32, 20),
              Q8_0: (32, 34), Q4_K: (256, 144), Q6_K: (256, 210), Q5_0: (32, 22),
              Q5_1: (32, 24), Q2_K: (256, 84), Q3_K: (256, 110), Q5_K: (256, 176)}


def tensor_nbytes(ggml_type: int, n_elems: int) -> int:
    blk, nb = BLOCK_INFO[ggml_type]
    assert n_elems % blk == 0, (ggml_type, n_elems)
    return n_elems // blk * nb


# ============================================================ fp helpers

def f16_bytes_to_f32(b: np.ndarray) -> np.ndarray:
    """uint8 array [..., 2] -> float32 [...] (exact)."""
    return np.ascontiguousarray(b).view("<f2")[..., 0].astype(np.float32)


def f32_to_f16_bits(x) -> np.ndarray:
    """Round-to-nearest-even float32 -> float16 (what GGML_FP32_TO_FP16 does)."""
    return np.asarray(x, dtype=np.float32).astype("<f2")


def f32_to_bf16_bits(x) -> np.ndarray:
    """Round-to-nearest-even float32 -> bf16 bit patterns (uint16)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return r.astype(np.uint16)


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# ============================================================ dequantization

def _blocks(raw, nbytes_block):
    raw = np.frombuffer(raw, dtype=np.uint8) if not isinstance(raw, np.ndarray) else raw
    assert raw.size % nbytes_block == 0
    return raw.reshape(-1, nbytes_block)


def dequant_q4_0(raw) -> np.ndarray:
    b = _blocks(raw, 18)
    d = f16_bytes_to_f32(b[:, 0:2])[:, None]
    qs = b[:, 2:18]
    lo = (qs & 0x0F).astype(np.int32) - 8
    hi = (qs >> 4).astype(np.int32) - 8
    q = np.concatenate([lo, hi], axis=1).astype(np.float32)
    return (q * d).astype(np.float32).reshape(-1)


def dequant_q4_1(raw) -> np.ndarray:
    b = _blocks(raw, 20)
    d = f16_bytes_to_f32(b[:, 0:2])[:, None]
    m = f16_bytes_to_f32(b[:, 2:4])[:, None]
    qs = b[:, 4:20]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
    return ((q * d).astype(np.float32) + m).astype(np.float32).reshape(-1)


def dequant_q8_0(raw) -> np.ndarray:
    b = _blocks(raw, 34)
    d = f16_bytes_to_f32(b[:, 0:2])[:, None]
    qs = np.ascontiguousarray(b[:, 2:34]).view(np.int8).astype(np.float32)
    return (qs * d).astype(np.float32).reshape(-1)


def q4k_scales_mins(scales: np.ndarray):
    """ggml get_scale_min_k4 for j = 0..7, vectorized over blocks. scales: uint8 [nb, 12]."""
    s = scales.astype(np.uint8)
    nb = s.shape[0]
    sc = np.empty((nb, 8), dtype=np.uint8)
    mn = np.empty((nb, 8), dtype=np.uint8)
    for j in range(8):
        if j < 4:
            sc[:, j] = s[:, j] & 63
            mn[:, j] = s[:, j + 4] & 63
        else:
            sc[:, j] = (s[:, j + 4] & 0x0F) | ((s[:, j - 4] >> 6) << 4)
            mn[:, j] = (s[:, j + 4] >> 4) | ((s[:, j] >> 6) << 4)
    return sc, mn


def dequant_q4_k(raw) -> np.ndarray:
    b = _blocks(raw, 144)
    nb = b.shape[0]
    d = f16_bytes_to_f32(b[:, 0:2])
    dmin = f16_bytes_to_f32(b[:, 2:4])
    sc, mn = q4k_scales_mins(b[:, 4:16])
    d_sub = (d[:, None] * sc.astype(np.float32)).astype(np.float32)     # [nb, 8]
    m_sub = (dmin[:, None] * mn.astype(np.float32)).astype(np.float32)  # [nb, 8]
    qs = b[:, 16:144].reshape(nb, 4, 32)
    # chunk c (32 bytes): low nibbles -> sub-block 2c, high nibbles -> sub-block 2c+1
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(nb, 8, 32).astype(np.float32)
    y = (d_sub[:, :, None] * q).astype(np.float32) - m_sub[:, :, None]
    return y.astype(np.float32).reshape(-1)


def dequant_q6_k(raw) -> np.ndarray:
    b = _blocks(raw, 210)
    nb = b.shape[0]
    ql = b[:, 0:128].astype(np.int32)
    qh = b[:, 128:192].astype(np.int32)
    sc = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float32)  # [nb, 16]
    d = f16_bytes_to_f32(b[:, 208:210])
    q = np.empty((nb, 256), dtype=np.int32)
    for n in range(2):
        L = ql[:, 64 * n: 64 * n + 64]
        H = qh[:, 32 * n: 32 * n + 32]
        base = 128 * n
        q[:, base + 0: base + 32] = ((L[:, 0:32] & 0xF) | (((H >> 0) & 3) << 4)) - 32
        q[:, base + 32: base + 64] = ((L[:, 32:64] & 0xF) | (((H >> 2) & 3) << 4)) - 32
        q[:, base + 64: base + 96] = ((L[:, 0:32] >> 4) | (((H >> 4) & 3) << 4)) - 32
        q[:, base + 96: base + 128] = ((L[:, 32:64] >> 4) | (((H >> 6) & 3) << 4)) - 32
    # element e of a super-block uses scale sc[e // 16]; y = (d * sc) * q  (float32, C order)
    dsc = (d[:, None] * sc).astype(np.float32)                    # [nb, 16]
    dsc = np.repeat(dsc, 16, axis=1)                              # [nb, 256]
    return (dsc * q.astype(np.float32)).astype(np.float32).reshape(-1)


def _bits(words: np.ndarray, n: int) -> np.ndarray:
    """uint32 [nb] -> uint8 [nb, n]: bit j of each word."""
    return ((words[:, None].astype(np.uint64) >> np.arange(n, dtype=np.uint64)) & 1).astype(np.uint8)


def _q5_values(qh_bytes: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1: element j (<16) = low nibble of qs[j] | bit j of qh << 4;
    element 16+j = high nibble of qs[j] | bit 16+j of qh << 4."""
    qh = np.ascontiguousarray(qh_bytes).view("<u4").reshape(-1)
    hb = _bits(qh, 32)
    nib = np.concatenate([qs & 0x0F, qs >> 4], axis=1)
    return (nib | (hb << 4)).astype(np.int32)


def dequant_q5_0(raw) -> np.ndarray:
    b = _blocks(raw, 22)
    d = f16_bytes_to_f32(b[:, 0:2])[:, None]
    q = _q5_values(b[:, 2:6], b[:, 6:22]) - 16
    return (q.astype(np.float32) * d).astype(np.float32).reshape(-1)


def dequant_q5_1(raw) -> np.ndarray:
    b = _blocks(raw, 24)
    d = f16_bytes_to_f32(b[:, 0:2])[:, None]
    m = f16_bytes_to_f32(b[:, 2:4])[:, None]
    q = _q5_values(b[:, 4:8], b[:, 8:24]).astype(np.float32)
    return ((q * d).astype(np.float32) + m).astype(np.float32).reshape(-1)


def _two_bit_256(qs: np.ndarray) -> np.ndarray:
    """Q2_K/Q3_K qs [nb, 64] -> [nb, 256]: half n (128 elements) uses bytes 32n..32n+32;
    element 32j + l of the half is bits 2j..2j+1 of byte l."""
    nb = qs.shape[0]
    out = np.empty((nb, 256), dtype=np.int32)
    for n in range(2):
        q = qs[:, 32 * n: 32 * n + 32].astype(np.int32)
        for j in range(4):
            out[:, 128 * n + 32 * j: 128 * n + 32 * j + 32] = (q >> (2 * j)) & 3
    return out


def dequant_q2_k(raw) -> np.ndarray:
    b = _blocks(raw, 84)
    sc = b[:, 0:16]
    q = _two_bit_256(b[:, 16:80]).astype(np.float32)
    d = f16_bytes_to_f32(b[:, 80:82])[:, None]
    dmin = f16_bytes_to_f32(b[:, 82:84])[:, None]
    dl = np.repeat((d * (sc & 0x0F).astype(np.float32)).astype(np.float32), 16, axis=1)
    ml = np.repeat((dmin * (sc >> 4).astype(np.float32)).astype(np.float32), 16, axis=1)
    return ((dl * q).astype(np.float32) - ml).astype(np.float32).reshape(-1)


def q3k_scales(s: np.ndarray) -> np.ndarray:
    """Q3_K scales [nb, 12] -> [nb, 16] 6-bit values (biased by 32): scale j has its low
    4 bits in byte j (j < 8, low nibble) or byte j-8 (high nibble), its high 2 bits at
    bits 2*(j//4) of byte 8 + j%4."""
    s = s.astype(np.int32)
    out = np.empty((s.shape[0], 16), dtype=np.int32)
    for j in range(16):
        low = (s[:, j] & 0x0F) if j < 8 else (s[:, j - 8] >> 4)
        high = (s[:, 8 + j % 4] >> (2 * (j // 4))) & 3
        out[:, j] = low | (high << 4)
    return out


def dequant_q3_k(raw) -> np.ndarray:
    b = _blocks(raw, 110)
    hmask = b[:, 0:32].astype(np.int32)
    q2 = _two_bit_256(b[:, 32:96])
    sc = q3k_scales(b[:, 96:108]) - 32
    d = f16_bytes_to_f32(b[:, 108:110])[:, None]
    # element e: high bit = bit e // 32 of hmask[e % 32]; value q2 - (hbit ? 0 : 4)
    e = np.arange(256)
    h = (hmask[:, e % 32] >> (e // 32)) & 1
    q = (q2 - np.where(h == 1, 0, 4)).astype(np.float32)
    dl = np.repeat((d * sc.astype(np.float32)).astype(np.float32), 16, axis=1)
    return (dl * q).astype(np.float32).reshape(-1)


def dequant_q5_k(raw) -> np.ndarray:
    b = _blocks(raw, 176)
    nb = b.shape[0]
    d = f16_bytes_to_f32(b[:, 0:2])
    dmin = f16_bytes_to_f32(b[:, 2:4])
    sc, mn = q4k_scales_mins(b[:, 4:16])
    qh = b[:, 16:48].astype(np.int32)
    qs = b[:, 48:176].reshape(nb, 4, 32).astype(np.int32)
    nib = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(nb, 8, 32)  # sub-block s = 2c (+1)
    hb = np.stack([(qh >> s) & 1 for s in range(8)], axis=1)        # [nb, 8, 32]
    q = (nib + 16 * hb).astype(np.float32)
    d_sub = (d[:, None] * sc.astype(np.float32)).astype(np.float32)
    m_sub = (dmin[:, None] * mn.astype(np.float32)).astype(np.float32)
    y = (d_sub[:, :, None] * q).astype(np.float32) - m_sub[:, :, None]
    return y.astype(np.float32).reshape(-1)


def dequantize(raw, ggml_type: int, n_elems: int) -> np.ndarray:
    """Raw tensor bytes -> float32 1-D array of n_elems values."""
    raw = np.frombuffer(raw, dtype=np.uint8) if not isinstance(raw, np.ndarray) else raw
    nbytes = tensor_nbytes(ggml_type, n_elems)
    raw = raw[:nbytes]
    if ggml_type == F32:
        out = np.ascontiguousarray(raw).view("<f4").astype(np.float32)
    elif ggml_type == F16:
        out = np.ascontiguousarray(raw).view("<f2").astype(np.float32)
    elif ggml_type == BF16:
        out = bf16_bits_to_f32(np.ascontiguousarray(raw).view("<u2"))
    elif ggml_type == Q4_0:
        out = dequant_q4_0(raw)
    elif ggml_type == Q4_1:
        out = dequant_q4_1(raw)
    elif ggml_type == Q8_0:
        out = dequant_q8_0(raw)
    elif ggml_type == Q4_K:
        out = dequant_q4_k(raw)
    elif ggml_type == Q6_K:
        out = dequant_q6_k(raw)
    elif ggml_type == Q5_0:
        out = dequant_q5_0(raw)
    elif ggml_type == Q5_1:
        out = dequant_q5_1(raw)
    elif ggml_type == Q2_K:
        out = dequant_q2_k(raw)
    elif ggml_type == Q3_K:
        out = dequant_q3_k(raw)
    elif ggml_type == Q5_K:
        out = dequant_q5_k(raw)
    else:
        raise NotImplementedError(f"ggml type {ggml_type}")
    assert out.size == n_elems
    return out


# ============================================================ quantization (ggml *_ref rules)

def _roundf(x: np.ndarray) -> np.ndarray:
    """C roundf: round half away from zero."""
    return np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))


def quantize_q8_0(x) -> bytes:
    """quantize_row_q8_0_ref: d = amax/127, qs = roundf(x * (1/d))."""
    x = np.asarray(x, dtype=np.float32).reshape(-1, 32)
    amax = np.max(np.abs(x), axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idd = np.where(d != 0, np.float32(1.0) / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = _roundf((x * idd[:, None]).astype(np.float32)).astype(np.int8)
    out = np.empty((x.shape[0], 34), dtype=np.uint8)
    out[:, 0:2] = f32_to_f16_bits(d).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()


def quantize_q4_0(x) -> bytes:
    """quantize_row_q4_0_ref: max = signed value of largest |x| (first one), d = max/-8,
    q = MIN(15, (int8)(x*id + 8.5))."""
    x = np.asarray(x, dtype=np.float32).reshape(-1, 32)
    idx = np.argmax(np.abs(x), axis=1)  # first occurrence == strict '<' scan
    mx = x[np.arange(x.shape[0]), idx]
    d = (mx / np.float32(-8)).astype(np.float32)
    idd = np.where(d != 0, np.float32(1.0) / np.where(d != 0, d, 1), 0).astype(np.float32)
    v = ((x * idd[:, None]).astype(np.float32) + np.float32(8.5)).astype(np.float32)
    q = np.minimum(15, np.trunc(v).astype(np.int32)).astype(np.uint8)
    out = np.empty((x.shape[0], 18), dtype=np.uint8)
    out[:, 0:2] = f32_to_f16_bits(d).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
    return out.tobytes()


def quantize_q4_1(x) -> bytes:
    """quantize_row_q4_1_ref: d = (max-min)/15, m = min, q = MIN(15, (int8)((x-min)*id + 0.5))."""
    x = np.asarray(x, dtype=np.float32).reshape(-1, 32)
    mn = np.min(x, axis=1)
    mx = np.max(x, axis=1)
    d = ((mx - mn) / np.float32(15)).astype(np.float32)
    idd = np.where(d != 0, np.float32(1.0) / np.where(d != 0, d, 1), 0).astype(np.float32)
    v = (((x - mn[:, None]).astype(np.float32) * idd[:, None]).astype(np.float32) + np.float32(0.5)).astype(np.float32)
    q = np.minimum(15, np.trunc(v).astype(np.int32)).astype(np.uint8)
    out = np.empty((x.shape[0], 20), dtype=np.uint8)
    out[:, 0:2] = f32_to_f16_bits(d).view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = f32_to_f16_bits(mn).view(np.uint8).reshape(-1, 2)
    out[:, 4:] = q[:, :16] | (q[:, 16:] << 4)
    return out.tobytes()


def encode_tensor(arr: np.ndarray, ggml_type: int) -> bytes:
    a = np.asarray(arr, dtype=np.float32)
    if ggml_type == F32:
        return a.astype("<f4").tobytes()
    if ggml_type == F16:
        return a.astype("<f2").tobytes()
    if ggml_type == BF16:
        return f32_to_bf16_bits(a).astype("<u2").tobytes()
    if ggml_type == Q8_0:
        return quantize_q8_0(a)
    if ggml_type == Q4_0:
        return quantize_q4_0(a)
    if ggml_type == Q4_1:
        return quantize_q4_1(a)
    raise NotImplementedError(f"writing ggml type {ggml_type}")


# ============================================================ reader

class GGUFTensor:
    def __init__(self, name, dims, ggml_type, offset):
        self.name = name
        self.dims = list(dims)          # ggml order, dims[0] innermost
        self.ggml_type = ggml_type
        self.offset = offset            # relative to data section
        self.raw = None                 # np.uint8 view of the tensor bytes

    @property
    def shape(self):                    # numpy order
        return tuple(reversed(self.dims))

    @property
    def n_elems(self):
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def nbytes(self):
        return tensor_nbytes(self.ggml_type, self.n_elems)

    def numpy(self) -> np.ndarray:
        """Dequantized float32 array of shape reversed(dims)."""
        return dequantize(self.raw, self.ggml_type, self.n_elems).reshape(self.shape)

    def __repr__(self):
        return f"GGUFTensor({self.name!r}, dims={self.dims}, type={TYPE_NAMES.get(self.ggml_type, self.ggml_type)}, off={self.offset})"


class GGUFFile:
    def __init__(self):
        self.version = None
        self.metadata = {}       # key -> python value (arrays -> list)
        self.kv_types = {}       # key -> (type, elem_type or None)
        self.tensors = {}        # name -> GGUFTensor (insertion order = file order)
        self.alignment = DEFAULT_ALIGNMENT
        self.data_offset = None

    def tensor(self, name) -> np.ndarray:
        return self.tensors[name].numpy()


class _Cursor:
    def __init__(self, buf):
        self.buf = buf
        self.pos = 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v[0]

    def string(self):
        n = self.take("<Q")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8")
        self.pos += n
        return s

    def value(self, t):
        if t in _SCALAR_FMT:
            return self.take(_SCALAR_FMT[t])
        if t == T_STRING:
            return self.string()
        if t == T_ARRAY:
            et = self.take("<I")
            n = self.take("<Q")
            if et in _SCALAR_FMT and et != T_BOOL:
                fmt = _SCALAR_FMT[et]
                size = struct.calcsize(fmt)
                arr = np.frombuffer(self.buf, dtype=np.dtype(fmt), count=n, offset=self.pos)
                self.pos += n * size
                return arr.tolist()
            return [self.value(et) for _ in range(n)]
        raise ValueError(f"bad gguf value type {t}")


def read_gguf(path) -> GGUFFile:
    with open(path, "rb") as f:
        buf = f.read()
    g = GGUFFile()
    c = _Cursor(buf)
    magic = bytes(buf[0:4])
    if magic != GGUF_MAGIC:
        raise ValueError(f"{path}: bad magic {magic!r}")
    c.pos = 4
    g.version = c.take("<I")
    if g.version not in (2, 3):
        raise ValueError(f"unsupported gguf version {g.version}")
    n_tensors = c.take("<Q")
    n_kv = c.take("<Q")
    for _ in range(n_kv):
        key = c.string()
        t = c.take("<I")
        et = None
        if t == T_ARRAY:
            et = struct.unpack_from("<I", buf, c.pos)[0]
        g.metadata[key] = c.value(t)
        g.kv_types[key] = (t, et)
    g.alignment = int(g.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        nd = c.take("<I")
        dims = [c.take("<Q") for _ in range(nd)]
        tt = c.take("<I")
        off = c.take("<Q")
        infos.append(GGUFTensor(name, dims, tt, off))
    a = g.alignment
    g.data_offset = (c.pos + a - 1) // a * a
    whole = np.frombuffer(buf, dtype=np.uint8)
    for t in infos:
        if t.offset % a != 0:
            raise ValueError(f"tensor {t.name} offset {t.offset} not aligned to {a}")
        start = g.data_offset + t.offset
        t.raw = whole[start:start + t.nbytes]
        if t.raw.size != t.nbytes:
            raise ValueError(f"tensor {t.name} truncated")
        g.tensors[t.name] = t
    return g


# ============================================================ writer

class GGUFWriter:
    """Collect metadata + tensors, then write(). Tensors are written in insertion order,
    each data offset aligned to `alignment` (zero padding)."""

    def __init__(self, alignment: int = DEFAULT_ALIGNMENT):
        self.alignment = alignment
        self.kv = []        # (key, type, value, elem_type)
        self.tensors = []   # (name, dims, ggml_type, bytes)
        if alignment != DEFAULT_ALIGNMENT:
            self.add_u32("general.alignment", alignment)

    # --- metadata
    def add(self, key, t, value, elem_type=None):
        self.kv.append((key, t, value, elem_type))

    def add_u32(self, k, v): self.add(k, T_U32, int(v))
    def add_i32(self, k, v): self.add(k, T_I32, int(v))
    def add_u64(self, k, v): self.add(k, T_U64, int(v))
    def add_f32(self, k, v): self.add(k, T_F32, float(v))
    def add_bool(self, k, v): self.add(k, T_BOOL, bool(v))
    def add_string(self, k, v): self.add(k, T_STRING, str(v))
    def add_array(self, k, values, elem_type): self.add(k, T_ARRAY, list(values), elem_type)

    # --- tensors
    def add_tensor(self, name: str, arr: np.ndarray, ggml_type: int = F32):
        """arr in numpy order (e.g. [out, in]); stored dims are reversed."""
        arr = np.asarray(arr)
        dims = list(reversed(arr.shape))
        blk, _ = BLOCK_INFO[ggml_type]
        if dims[0] % blk != 0:
            raise ValueError(f"{name}: innermost dim {dims[0]} not a multiple of block {blk}")
        data = encode_tensor(arr, ggml_type)
        assert len(data) == tensor_nbytes(ggml_type, arr.size)
        self.tensors.append((name, dims, ggml_type, data))

    def add_raw_tensor(self, name: str, dims, ggml_type: int, data: bytes):
        self.tensors.append((name, list(dims), ggml_type, bytes(data)))

    @staticmethod
    def _pack_string(s: str) -> bytes:
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def _pack_value(self, t, v, et=None) -> bytes:
        if t in _SCALAR_FMT:
            return struct.pack(_SCALAR_FMT[t], v)
        if t == T_STRING:
            return self._pack_string(v)
        if t == T_ARRAY:
            out = struct.pack("<IQ", et, len(v))
            return out + b"".join(self._pack_value(et, x) for x in v)
        raise ValueError(t)

    def to_bytes(self) -> bytes:
        a = self.alignment
        parts = [GGUF_MAGIC, struct.pack("<IQQ", GGUF_VERSION, len(self.tensors), len(self.kv))]
        for key, t, v, et in self.kv:
            parts.append(self._pack_string(key) + struct.pack("<I", t) + self._pack_value(t, v, et))
        offset = 0
        offsets = []
        for name, dims, tt, data in self.tensors:
            offsets.append(offset)
            parts.append(self._pack_string(name) + struct.pack("<I", len(dims))
                         + b"".join(struct.pack("<Q", d) for d in dims)
                         + struct.pack("<IQ", tt, offset))
            offset += (len(data) + a - 1) // a * a
        head = b"".join(parts)
        head += b"\x00" * ((-len(head)) % a)
        body = []
        for (name, dims, tt, data), off in zip(self.tensors, offsets):
            body.append(data + b"\x00" * ((-len(data)) % a))
        return head + b"".join(body)

    def write(self, path):
        with open(path, "wb") as f:
            f.write(self.to_bytes())


def _main(argv):
    if len(argv) < 2:
        print("usage: gguf_io.py FILE.gguf  (prints metadata and tensor table)")
        return 1
    g = read_gguf(argv[1])
    print(f"version {g.version}, alignment {g.alignment}, data at {g.data_offset}")
    for k, v in g.metadata.items():
        if isinstance(v, list) and len(v) > 8:
            v = f"[{len(v)} items: {v[:4]} ...]"
        print(f"  {k} = {v}")
    for t in g.tensors.values():
        print(f"  {t}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
