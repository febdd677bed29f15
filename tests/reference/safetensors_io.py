"""Hand-written safetensors reader/writer (standard library + numpy only).

File layout:
  u64 little-endian N (header length in bytes)
  N bytes of UTF-8 JSON: {"__metadata__": {str: str}, name: {"dtype": "F32"|"F16"|"BF16",
                          "shape": [...], "data_offsets": [begin, end]}, ...}
  raw little-endian tensor bytes; data_offsets are relative to the first byte
  after the header. The header is padded with trailing spaces to a multiple of 8.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np

from gguf_io import bf16_bits_to_f32, f32_to_bf16_bits

DTYPE_SIZE = {"F32": 4, "F16": 2, "BF16": 2}


def encode(arr: np.ndarray, dtype: str) -> bytes:
    a = np.asarray(arr, dtype=np.float32)
    if dtype == "F32":
        return a.astype("<f4").tobytes()
    if dtype == "F16":
        return a.astype("<f2").tobytes()
    if dtype == "BF16":
        return f32_to_bf16_bits(a).astype("<u2").tobytes()
    raise ValueError(dtype)


def decode(buf: bytes, dtype: str, shape) -> np.ndarray:
    if dtype == "F32":
        a = np.frombuffer(buf, dtype="<f4").astype(np.float32)
    elif dtype == "F16":
        a = np.frombuffer(buf, dtype="<f2").astype(np.float32)
    elif dtype == "BF16":
        a = bf16_bits_to_f32(np.frombuffer(buf, dtype="<u2"))
    else:
        raise ValueError(f"unsupported dtype {dtype}")
    return a.reshape(shape)


def write_safetensors(path, tensors: dict, dtype: str = "F32", metadata: dict | None = None):
    """tensors: {name: np.ndarray} (all written with `dtype`), or {name: (array, dtype)}."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    off = 0
    for name in sorted(tensors):
        v = tensors[name]
        arr, dt = (v if isinstance(v, tuple) else (v, dtype))
        b = encode(arr, dt)
        header[name] = {"dtype": dt, "shape": list(np.shape(arr)), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((-len(hjson)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """Returns ({name: float32 ndarray}, {name: dtype}, metadata dict)."""
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack_from("<Q", buf, 0)
    header = json.loads(buf[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out, dtypes = {}, {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        dt = info["dtype"]
        shape = info["shape"]
        count = 1
        for s in shape:
            count *= s
        assert e - b == count * DTYPE_SIZE[dt], name
        out[name] = decode(buf[base + b: base + e], dt, shape)
        dtypes[name] = dt
    return out, dtypes, meta


def read_hf_dir(d):
    """Read model.safetensors or a sharded checkpoint via model.safetensors.index.json."""
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            wm = json.load(f)["weight_map"]
        out, dtypes = {}, {}
        for shard in sorted(set(wm.values())):
            t, dt, _ = read_safetensors(os.path.join(d, shard))
            for k in t:
                assert wm[k] == shard, (k, shard)
            out.update(t)
            dtypes.update(dt)
        assert set(out) == set(wm), "index/weights mismatch"
        return out, dtypes
    t, dt, _ = read_safetensors(os.path.join(d, "model.safetensors"))
    return t, dt
