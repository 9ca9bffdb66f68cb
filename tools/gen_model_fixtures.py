#!/usr/bin/env python3
"""Writes crates/rustorch-core/tests/fixtures/models/{smollm2,gemma3}.json.

For each real model fetched by tools/fetch_models.py, the fixture records
what the `gguf` Python package (0.19) reads from the file, so that
tests/real_models.rs can check RusTorch's reader and dequantizers against
it without the package:

- "file": name, size and SHA-256 of the GGUF file the fixture describes.
- "header": GGUF version, alignment, tensor and metadata counts.
- "facts": architecture, context length, block count, embedding length and
  attention head counts (`<arch>.context_length` ...), as the package
  reads them.
- "metadata": every key in file order with its GGUF value type id. Scalars
  carry their value (f32 values are exact in JSON: an f32 widened to f64
  prints and parses back to the same number). Arrays carry their element
  type id, length, first entries and the SHA-256 of their elements as GGUF
  encodes them: numbers little-endian, bools one byte, strings a u64
  length then UTF-8 bytes.
- "tensors": in file order, name, type name, dims (GGML order, ne[0]
  first), shape (row-major), data offset (relative to the data section),
  byte size, and the SHA-256 of the tensor dequantized with
  `gguf.quants.dequantize` to float32, little-endian, row-major (which is
  also GGML's memory order), plus a few sample values [index, value].
- "roundtrip": for a few tensors, the values (dequantized, as above) are
  quantized with `gguf.quants.quantize` to each type the package can
  quantize; recorded are the SHA-256 of the quantized bytes and of their
  dequantized values.

Usage (the paths default to $RUSTORCH_SMOLLM2_GGUF / $RUSTORCH_GEMMA3_GGUF):
  eval "$(python3 tools/fetch_models.py --print-env)"
  python3 tools/gen_model_fixtures.py [--smollm2 PATH] [--gemma3 PATH]

Output is deterministic. It takes a few minutes (the Gemma 3 embedding
alone is 168 million values).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

OUT = Path(__file__).resolve().parent.parent / "crates/rustorch-core/tests/fixtures/models"

# Tensors whose values are requantized for "roundtrip": real F32 weights
# (norms) and a few dequantized matrices of other types. Row lengths are
# multiples of 256, so the Rust test can also quantize them to K-quants.
ROUNDTRIP = {
    "smollm2": ["blk.0.attn_norm.weight", "output_norm.weight", "blk.0.ffn_down.weight",
                "blk.3.attn_k.weight"],
    "gemma3": ["blk.0.attn_q_norm.weight", "output_norm.weight", "blk.0.ffn_down.weight",
               "blk.1.attn_output.weight", "blk.2.attn_v.weight"],
}
# Types gguf 0.19 quantizes (its quantize_blocks is implemented for these).
PACKAGE_QUANT = [QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0]

NUMPY_OF = {
    VT.UINT8: "<u1", VT.INT8: "<i1", VT.UINT16: "<u2", VT.INT16: "<i2",
    VT.UINT32: "<u4", VT.INT32: "<i4", VT.UINT64: "<u8", VT.INT64: "<i8",
    VT.FLOAT32: "<f4", VT.FLOAT64: "<f8", VT.BOOL: "<u1",
}
CHUNK = 1 << 20  # values per dequantization step, to bound memory


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def plain(v):
    """numpy scalars -> JSON-able Python values."""
    if isinstance(v, (np.floating, float)):
        return float(v)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.bool_,)):
        return bool(v)
    return v


def array_sha(elem: VT, items) -> str:
    h = hashlib.sha256()
    if elem == VT.STRING:
        for s in items:
            b = s.encode("utf-8")
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
    else:
        h.update(np.asarray(items, dtype=NUMPY_OF[elem]).tobytes())
    return h.hexdigest()


def metadata(reader: gguf.GGUFReader) -> list[dict]:
    out = []
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):  # the header, which the package shows as fields
            continue
        ty = field.types[0]
        entry = {"key": key, "type": int(ty)}
        if ty == VT.ARRAY:
            elem = field.types[1]
            if len(field.types) > 2:
                raise SystemExit(f"{key}: nested arrays are not handled")
            items = field.contents()
            entry.update(elem=int(elem), len=len(items), head=[plain(x) for x in items[:4]],
                         sha256=array_sha(elem, items))
        else:
            entry["value"] = plain(field.contents())
        out.append(entry)
    return out


def facts(reader: gguf.GGUFReader) -> dict:
    arch = reader.fields["general.architecture"].contents()
    f = {"architecture": arch}
    for k in ["context_length", "block_count", "embedding_length", "feed_forward_length",
              "attention.head_count", "attention.head_count_kv"]:
        f[k] = int(reader.fields[f"{arch}.{k}"].contents())
    return f


def rows2d(t) -> np.ndarray:
    """The tensor's data as 2-D [rows, row bytes or values]."""
    d = t.data
    return d.reshape(-1, d.shape[-1])


def dequant_chunks(t):
    """Yields the tensor's dequantized float32 values, in order, in pieces."""
    qt = t.tensor_type
    rows = rows2d(t)
    row_len = int(t.shape[0])
    step = max(1, CHUNK // row_len)
    for r in range(0, rows.shape[0], step):
        v = gguf.quants.dequantize(rows[r:r + step], qt)
        yield np.ascontiguousarray(v, dtype="<f4").reshape(-1)


def sample_indices(n: int) -> list[int]:
    return sorted({0, 1, n // 7, n // 2, (n * 5) // 6, n - 1} & set(range(n)))


def tensor_entry(t, data_offset: int) -> dict:
    n = int(t.n_elements)
    want = sample_indices(n)
    h = hashlib.sha256()
    samples, seen, finite = [], 0, True
    for chunk in dequant_chunks(t):
        h.update(chunk.tobytes())
        for i in want:
            if seen <= i < seen + chunk.size:
                samples.append([i, float(chunk[i - seen])])
        finite &= bool(np.isfinite(chunk).all())
        seen += chunk.size
    if seen != n:
        raise SystemExit(f"{t.name}: dequantized {seen} values, expected {n}")
    if not finite:
        raise SystemExit(f"{t.name}: non-finite values cannot go in JSON")
    dims = [int(x) for x in t.shape]
    return {
        "name": t.name, "type": t.tensor_type.name, "dims": dims, "shape": dims[::-1],
        "offset": int(t.data_offset) - data_offset, "n_bytes": int(t.n_bytes),
        "sha256": h.hexdigest(), "samples": samples,
    }


def dequant_all(t) -> np.ndarray:
    return np.concatenate(list(dequant_chunks(t))).reshape(-1, int(t.shape[0]))


def roundtrip_entry(t) -> dict:
    x = dequant_all(t)
    targets = []
    for qt in PACKAGE_QUANT:
        q = gguf.quants.quantize(x, qt)
        y = np.ascontiguousarray(gguf.quants.dequantize(q, qt), dtype="<f4")
        targets.append({
            "type": qt.name,
            "bytes_sha256": hashlib.sha256(np.ascontiguousarray(q).tobytes()).hexdigest(),
            "values_sha256": hashlib.sha256(y.tobytes()).hexdigest(),
        })
    return {"name": t.name, "source_type": t.tensor_type.name, "shape": list(x.shape),
            "targets": targets}


def dump(obj: dict) -> str:
    """JSON with one tensor per line: small diffs when a model changes."""
    parts = []
    for k, v in obj.items():
        if isinstance(v, list):
            body = ",\n".join("  " + json.dumps(e) for e in v)
            parts.append(f" {json.dumps(k)}: [\n{body}\n ]")
        else:
            parts.append(f" {json.dumps(k)}: {json.dumps(v)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def fixture(name: str, path: Path) -> dict:
    print(f"{name}: reading {path}", file=sys.stderr)
    r = gguf.GGUFReader(str(path))
    align = int(r.fields["general.alignment"].contents()) if "general.alignment" in r.fields else 32
    data_offset = int(r.data_offset)
    tensors = []
    for i, t in enumerate(r.tensors):
        tensors.append(tensor_entry(t, data_offset))
        if (i + 1) % 50 == 0:
            print(f"{name}: {i + 1}/{len(r.tensors)} tensors", file=sys.stderr)
    by_name = {t.name: t for t in r.tensors}
    rt = [roundtrip_entry(by_name[n]) for n in ROUNDTRIP[name]]
    return {
        "file": {"name": path.name, "size": path.stat().st_size, "sha256": sha256_file(path)},
        "header": {"version": int(r.fields["GGUF.version"].contents()), "alignment": align,
                   "tensor_count": len(r.tensors),
                   "kv_count": int(r.fields["GGUF.kv_count"].contents()),
                   "data_offset": data_offset},
        "facts": facts(r),
        "metadata": metadata(r),
        "tensors": tensors,
        "roundtrip": rt,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smollm2", type=Path, default=os.environ.get("RUSTORCH_SMOLLM2_GGUF"))
    ap.add_argument("--gemma3", type=Path, default=os.environ.get("RUSTORCH_GEMMA3_GGUF"))
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for name in ["smollm2", "gemma3"]:
        path = getattr(args, name)
        if path is None:
            print(f"no path for {name}: pass --{name} or run tools/fetch_models.py --print-env",
                  file=sys.stderr)
            return 1
        out = OUT / f"{name}.json"
        out.write_text(dump(fixture(name, Path(path))))
        print(f"wrote {out} ({out.stat().st_size:,} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
