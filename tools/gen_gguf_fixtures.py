#!/usr/bin/env python3
"""Writes the GGUF test corpus into crates/rustorch-core/tests/fixtures/gguf/.

valid/      small files written by the `gguf` Python package (llama.cpp's own
            writer), so RusTorch's reader is checked against an independent
            implementation. valid/manifest.json lists every metadata value
            (floats also as bit patterns) and every tensor (type, dims, offset,
            bytes as hex, decoded values for dense types).
malformed/  hand-built broken files, each with the error kind the reader must
            report and text its message must contain (malformed/manifest.json).
            They are assembled byte by byte here (not with any GGUF writer) so
            each defect is exactly the one intended.

Run from the repository root: python3 tools/gen_gguf_fixtures.py
Needs numpy and gguf (pip install gguf). Output is deterministic.
"""

import json
import os
import shutil
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT, GGUFValueType as VT

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "crates", "rustorch-core", "tests", "fixtures", "gguf")

VT_NAME = {
    VT.UINT8: "u8", VT.INT8: "i8", VT.UINT16: "u16", VT.INT16: "i16",
    VT.UINT32: "u32", VT.INT32: "i32", VT.UINT64: "u64", VT.INT64: "i64",
    VT.FLOAT32: "f32", VT.FLOAT64: "f64", VT.BOOL: "bool", VT.STRING: "string",
    VT.ARRAY: "array",
}


# ---------------------------------------------------------------- valid files

def manifest_value(vtype, value, sub_type=None):
    """JSON for one metadata value; floats carry their exact bits."""
    if vtype == VT.ARRAY:
        if sub_type is None:
            sub_type = VT.get_type(value[0])
        return {
            "type": "array",
            "elem": VT_NAME[sub_type],
            "items": [manifest_value(sub_type, v) for v in value],
        }
    out = {"type": VT_NAME[vtype]}
    if vtype == VT.FLOAT32:
        out["bits"] = struct.unpack("<I", struct.pack("<f", value))[0]
    elif vtype == VT.FLOAT64:
        out["bits"] = struct.unpack("<Q", struct.pack("<d", value))[0]
    else:
        out["value"] = value
    return out


class Fixture:
    """A GGUFWriter plus the manifest entries of what went into it."""

    def __init__(self, name, alignment=None):
        self.name = name
        self.path = os.path.join(OUT, "valid", name + ".gguf")
        self.w = gguf.GGUFWriter(self.path, arch="testarch")
        self.kv = [("general.architecture", manifest_value(VT.STRING, "testarch"))]
        self.tensors = []
        if alignment is not None:
            self.w.add_custom_alignment(alignment)
            self.kv.append(("general.alignment", manifest_value(VT.UINT32, alignment)))
        self.alignment = alignment or 32

    def kv_add(self, key, vtype, value, sub_type=None):
        self.w.add_key_value(key, value, vtype, sub_type=sub_type)
        self.kv.append((key, manifest_value(vtype, value, sub_type)))

    def tensor(self, name, qtype, shape, data, values=None):
        """`shape` row-major; `data` the array handed to the writer."""
        raw = None if qtype in (QT.F32, QT.F16, QT.F64, QT.I8, QT.I16, QT.I32, QT.I64) else qtype
        self.w.add_tensor(name, data, raw_dtype=raw)
        entry = {
            "name": name,
            "type": qtype.name,
            "shape": list(shape),
            "dims": list(reversed(shape)),
            "hex": data.tobytes().hex(),
        }
        if values is not None:
            # As f64 bit patterns: exact whatever the JSON parser's rounding.
            entry["values_f64_bits"] = [
                struct.unpack("<Q", struct.pack("<d", float(v)))[0] for v in values.reshape(-1)
            ]
        self.tensors.append(entry)

    def write(self, version=None):
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()
        if version is not None:
            # v2 and v3 share the little-endian layout; only the field differs.
            with open(self.path, "r+b") as f:
                f.seek(4)
                f.write(struct.pack("<I", version))
        # Offsets as an independent reader (the package's) sees them.
        r = gguf.GGUFReader(self.path)
        by_name = {t.name: t for t in r.tensors}
        for t in self.tensors:
            rt = by_name[t["name"]]
            t["offset"] = int(rt.data_offset) - int(r.data_offset)
            assert rt.tensor_type.name == t["type"], (rt.tensor_type, t["type"])
            assert [int(d) for d in rt.shape] == t["dims"], (rt.shape, t["dims"])
        return {
            "file": os.path.relpath(self.path, OUT),
            "version": version or 3,
            "alignment": self.alignment,
            "data_offset": int(r.data_offset),
            "metadata": [{"key": k, **v} for k, v in self.kv],
            "tensors": self.tensors,
        }


def bf16_bits(x):
    """Round-to-nearest-even f32 -> bf16 bits, as torch and ggml do."""
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return b.astype(np.uint16)


def valid_files(rng):
    out = []

    f = Fixture("all_types")
    f.kv_add("general.name", VT.STRING, "all types")
    f.kv_add("test.u8", VT.UINT8, 200)
    f.kv_add("test.i8", VT.INT8, -100)
    f.kv_add("test.u16", VT.UINT16, 60000)
    f.kv_add("test.i16", VT.INT16, -30000)
    f.kv_add("test.u32", VT.UINT32, 4_000_000_000)
    f.kv_add("test.i32", VT.INT32, -2_000_000_000)
    f.kv_add("test.u64", VT.UINT64, 2**63 + 5)
    f.kv_add("test.i64", VT.INT64, -(2**62) - 7)
    f.kv_add("test.f32", VT.FLOAT32, 1.2345)
    f.kv_add("test.f32_neg_zero", VT.FLOAT32, -0.0)
    f.kv_add("test.f32_inf", VT.FLOAT32, float("inf"))
    f.kv_add("test.f64", VT.FLOAT64, 2.718281828459045)
    f.kv_add("test.f64_tiny", VT.FLOAT64, 5e-324)
    f.kv_add("test.bool_true", VT.BOOL, True)
    f.kv_add("test.bool_false", VT.BOOL, False)
    f.kv_add("test.unicode", VT.STRING, "h\u00e9llo w\u00f6rld \u2713 \U0001F600")
    f.kv_add("test.nul_inside", VT.STRING, "a\x00b")
    f.kv_add("test.arr_u8", VT.ARRAY, [0, 1, 255], VT.UINT8)
    f.kv_add("test.arr_i8", VT.ARRAY, [-128, 0, 127], VT.INT8)
    f.kv_add("test.arr_u16", VT.ARRAY, [0, 65535], VT.UINT16)
    f.kv_add("test.arr_i16", VT.ARRAY, [-32768, 32767], VT.INT16)
    f.kv_add("test.arr_u32", VT.ARRAY, [1, 2, 3, 4294967295], VT.UINT32)
    f.kv_add("test.arr_i32", VT.ARRAY, [-1, 0, 1])
    f.kv_add("test.arr_u64", VT.ARRAY, [2**64 - 1, 0], VT.UINT64)
    f.kv_add("test.arr_i64", VT.ARRAY, [-(2**63), 2**63 - 1], VT.INT64)
    f.kv_add("test.arr_f32", VT.ARRAY, [0.5, -1.25, 1e-30])
    f.kv_add("test.arr_f64", VT.ARRAY, [0.1, -2.5e300], VT.FLOAT64)
    f.kv_add("test.arr_bool", VT.ARRAY, [True, False, True])
    f.kv_add("test.arr_str", VT.ARRAY, ["alpha", "", "\u03b2\u03b3", "<0x0A>"])
    f.kv_add("test.nested_i32", VT.ARRAY, [[1, 2, 3], [4], [5, 6]])
    f.kv_add("test.nested_str", VT.ARRAY, [["a", "b"], ["c"]])
    f.kv_add("test.nested_deep", VT.ARRAY, [[[1.5], [2.5, 3.5]], [[4.5]]])
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    f.tensor("t.f32", QT.F32, x.shape, x, x)
    x = rng.standard_normal((5, 7)).astype(np.float16)
    f.tensor("t.f16", QT.F16, x.shape, x, x)
    bits = bf16_bits(rng.standard_normal((3, 8)))
    f.tensor("t.bf16", QT.BF16, (3, 8), bits,
             (bits.astype(np.uint32) << 16).view(np.float32))
    x = rng.standard_normal(4)
    f.tensor("t.f64", QT.F64, x.shape, x, x)
    x = rng.integers(-128, 128, 6, dtype=np.int8)
    f.tensor("t.i8", QT.I8, x.shape, x)
    x = rng.integers(-30000, 30000, (2, 2), dtype=np.int16)
    f.tensor("t.i16", QT.I16, x.shape, x)
    x = rng.integers(-2**31, 2**31, (3, 1), dtype=np.int32)
    f.tensor("t.i32", QT.I32, x.shape, x, x)
    x = rng.integers(-2**40, 2**40, 2, dtype=np.int64)
    f.tensor("t.i64", QT.I64, x.shape, x, x)
    x = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    f.tensor("t.f32_4d", QT.F32, x.shape, x, x)
    x = np.zeros((0, 4), dtype=np.float32)
    f.tensor("t.empty", QT.F32, x.shape, x, x)
    for qt, shape in [(QT.Q8_0, (2, 64)), (QT.Q4_0, (1, 32)), (QT.Q4_1, (3, 32)), (QT.Q5_0, (1, 64))]:
        q = gguf.quants.quantize(rng.standard_normal(shape).astype(np.float32), qt)
        f.tensor("t." + qt.name.lower(), qt, shape, q)
    # K-quant blocks: the reader treats them as opaque bytes.
    for qt, shape in [(QT.Q4_K, (2, 256)), (QT.Q6_K, (1, 256))]:
        _, type_size = gguf.GGML_QUANT_SIZES[qt]
        raw = rng.integers(0, 256, (shape[0], shape[1] // 256 * type_size), dtype=np.uint8)
        f.tensor("t." + qt.name.lower(), qt, shape, raw)
    out.append(f.write())

    # A larger alignment and sizes that are not multiples of it.
    f = Fixture("align64", alignment=64)
    f.kv_add("general.name", VT.STRING, "aligned to 64")
    for name, shape in [("a", (3,)), ("b", (5, 3)), ("c", (1,)), ("d", (17,))]:
        x = rng.standard_normal(shape).astype(np.float32)
        f.tensor(name, QT.F32, shape, x, x)
    out.append(f.write())

    # Alignment 1: no padding anywhere.
    f = Fixture("align1", alignment=1)
    for name, shape in [("x", (3,)), ("y", (2, 3))]:
        x = rng.standard_normal(shape).astype(np.float16)
        f.tensor(name, QT.F16, shape, x, x)
    out.append(f.write())

    f = Fixture("metadata_only")
    f.kv_add("general.name", VT.STRING, "no tensors")
    f.kv_add("tokenizer.ggml.tokens", VT.ARRAY, ["<s>", "</s>", "hello", " world"])
    f.kv_add("tokenizer.ggml.scores", VT.ARRAY, [0.0, -1.0, -2.5, -3.75])
    f.kv_add("tokenizer.ggml.token_type", VT.ARRAY, [3, 3, 1, 1])
    out.append(f.write())

    f = Fixture("version2")
    f.kv_add("general.name", VT.STRING, "a version 2 file")
    f.kv_add("test.u64", VT.UINT64, 7)
    x = rng.standard_normal((2, 2)).astype(np.float32)
    f.tensor("w", QT.F32, x.shape, x, x)
    out.append(f.write(version=2))
    return out


# ------------------------------------------------------------ malformed files

def s_(b):
    """A GGUF string from bytes or str."""
    if isinstance(b, str):
        b = b.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, payload):
    return s_(key) + struct.pack("<I", vtype) + payload


def ti(name, dims, ggml_type, offset):
    return s_(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) \
        + struct.pack("<I", ggml_type) + struct.pack("<Q", offset)


def header(n_tensors, n_kv, version=3, magic=b"GGUF"):
    return magic + struct.pack("<IQQ", version, n_tensors, n_kv)


def pad(b, align=32):
    return b + b"\0" * (-len(b) % align)


def file(kvs=(), tensors=(), data=b"", align=32, n_tensors=None, n_kv=None, version=3):
    """Header, metadata, tensor infos, padding, data."""
    body = header(len(tensors) if n_tensors is None else n_tensors,
                  len(kvs) if n_kv is None else n_kv, version) + b"".join(kvs) + b"".join(tensors)
    return pad(body, align) + data


def u32(v):
    return struct.pack("<I", v)


def u64(v):
    return struct.pack("<Q", v)


ARCH = kv("general.architecture", VT.STRING, s_("x"))
F32_4 = np.arange(4, dtype=np.float32).tobytes()  # 16 bytes


def malformed_files():
    cases = []

    def case(name, data, kind, *expect):
        cases.append((name, data, kind, list(expect)))

    good = file([ARCH], [ti("w", [4], QT.F32, 0)], F32_4)
    case("empty", b"", "Truncated", "magic at offset 0")
    case("magic_only", b"GGUF", "Truncated", "version at offset 4")
    case("bad_magic", b"GGML" + good[4:], "BadMagic", "starts with bytes 47 47 4d 4c")
    case("bad_magic_short", b"PK", "BadMagic", "starts with bytes 50 4b,")
    case("version1", file([ARCH], version=1), "UnsupportedVersion", "version 1", "obsolete")
    case("version4", file([ARCH], version=4), "UnsupportedVersion", "version 4")
    case("version_huge", file([ARCH], version=0xDEADBEEF), "UnsupportedVersion")
    case("big_endian", b"GGUF" + struct.pack(">I", 3) + good[8:], "BigEndian", "big-endian")
    case("header_truncated", good[:13], "Truncated", "tensor count at offset 8")
    case("huge_tensor_count", file([ARCH], n_tensors=2**63), "LengthTooLarge", "tensor count", "offset 8")
    case("huge_kv_count", file([ARCH], n_kv=2**62), "LengthTooLarge", "metadata entry count", "offset 16")
    case("kv_count_past_end", header(0, 2) + ARCH, "Truncated", "key of metadata entry #1")
    case("huge_key_length", header(0, 1) + u64(2**60) + b"abc" * 10, "LengthTooLarge",
         "string length in key of metadata entry #0", "offset 24")
    case("huge_string_value", header(0, 1) + s_("k") + u32(VT.STRING) + u64(2**60) + b"x" * 64,
         "LengthTooLarge", "value of metadata key \"k\"", "offset 37")
    case("huge_array_u8", header(0, 1) + s_("k") + u32(VT.ARRAY) + u32(VT.UINT8) + u64(2**40) + b"x" * 100,
         "LengthTooLarge", "array length", "offset 41")
    case("huge_array_u32_overflow", header(0, 1) + s_("k") + u32(VT.ARRAY) + u32(VT.UINT32) + u64(2**63)
         + b"x" * 100, "LengthTooLarge", "array length")
    case("huge_array_strings", header(0, 1) + s_("k") + u32(VT.ARRAY) + u32(VT.STRING) + u64(1000) + b"\0" * 800,
         "LengthTooLarge", "array length")
    case("huge_nested_array", header(0, 1) + s_("k") + u32(VT.ARRAY) + u32(VT.ARRAY) + u64(2)
         + u32(VT.UINT64) + u64(2**58) + b"\0" * 200, "LengthTooLarge", "array length", "offset 53")
    deep = b""
    for _ in range(20):
        deep += u32(VT.ARRAY) + u64(1)
    case("nesting_too_deep", header(0, 1) + s_("k") + u32(VT.ARRAY) + deep + u32(VT.UINT8) + u64(0),
         "NestingTooDeep", "16 deep")
    case("truncated_in_value", file([ARCH])[:24] + kv("k", VT.UINT64, b"\1\2\3"), "Truncated",
         "value of metadata key \"k\"")
    case("truncated_in_string", header(0, 1) + ARCH[:16], "LengthTooLarge", "key of metadata entry #0", "offset 24")
    case("truncated_in_tensor_info", good[:24 + len(ARCH) + 11], "Truncated",
         "dimension count of tensor \"w\"")
    case("truncated_in_dims", header(1, 1) + ARCH + s_("w") + u32(2) + u64(4) + b"\4\0", "Truncated",
         "dimensions of tensor \"w\"")
    case("truncated_data", good[:-4], "TensorOutOfBounds", "tensor \"w\"")
    case("unknown_value_type", header(0, 1) + s_("k") + u32(13) + u32(0), "UnknownValueType",
         "type id 13", "offset 33")
    case("unknown_array_type", header(0, 1) + s_("k") + u32(VT.ARRAY) + u32(99) + u64(0), "UnknownValueType",
         "type id 99", "offset 37")
    case("invalid_utf8_key", header(0, 1) + s_(b"ab\xffc") + u32(VT.UINT8) + b"\0", "InvalidUtf8",
         "key of metadata entry #0", "offset 34")
    case("invalid_utf8_value", file([kv("k", VT.STRING, s_(b"\xc3\x28"))]), "InvalidUtf8",
         "value of metadata key \"k\"")
    case("invalid_bool", file([kv("flag", VT.BOOL, b"\x02")]), "InvalidBool", "flag", "stored as 2")
    case("duplicate_key", file([ARCH, kv("a", VT.UINT8, b"\1"), kv("a", VT.UINT8, b"\2")]), "DuplicateKey",
         "\"a\"")
    case("alignment_string", file([kv("general.alignment", VT.STRING, s_("32"))]), "WellKnownKeyType",
         "general.alignment", "expected u32", "type string")
    case("alignment_u64", file([kv("general.alignment", VT.UINT64, u64(32))]), "WellKnownKeyType",
         "type u64, expected u32")
    case("alignment_zero", file([kv("general.alignment", VT.UINT32, u32(0))]), "BadAlignment", "is 0")
    case("alignment_48", file([kv("general.alignment", VT.UINT32, u32(48))]), "BadAlignment", "is 48",
         "power of two")
    case("architecture_u32", file([kv("general.architecture", VT.UINT32, u32(7))]), "WellKnownKeyType",
         "general.architecture")
    case("file_type_array", file([ARCH, kv("general.file_type", VT.ARRAY, u32(VT.UINT32) + u64(0))]),
         "WellKnownKeyType", "array of u32")
    case("zero_dims", file([ARCH], [ti("w", [], QT.F32, 0)], F32_4), "BadDimCount", "0 dimensions")
    case("five_dims", file([ARCH], [ti("w", [1, 1, 1, 1, 4], QT.F32, 0)], F32_4), "BadDimCount",
         "5 dimensions")
    case("huge_dim_count", file([ARCH], [s_("w") + u32(2**31) + u64(1) * 8]), "BadDimCount")
    case("dims_overflow", file([ARCH], [ti("w", [2**32, 2**32], QT.F32, 0)]), "ElementCountOverflow",
         "tensor \"w\"")
    case("dims_over_i64", file([ARCH], [ti("w", [2**62, 2], QT.I8, 0)]), "ElementCountOverflow")
    case("bytes_overflow", file([ARCH], [ti("w", [2**62], QT.F32, 0)]), "ElementCountOverflow")
    case("unknown_tensor_type", file([ARCH], [ti("w", [4], 99, 0)], F32_4), "UnknownTensorType",
         "type id 99")
    case("removed_tensor_type_4", file([ARCH], [ti("w", [32], 4, 0)], b"\0" * 32), "UnknownTensorType",
         "type id 4")
    case("row_not_block_multiple", file([ARCH], [ti("w", [33], QT.Q4_0, 0)], b"\0" * 64), "NotBlockMultiple",
         "Q4_0", "33")
    case("misaligned_offset", file([ARCH], [ti("w", [4], QT.F32, 4)], F32_4 * 2), "MisalignedTensor",
         "data offset 4", "alignment 32")
    case("misaligned_64", file([kv("general.alignment", VT.UINT32, u32(64)), ARCH],
                               [ti("w", [4], QT.F32, 32)], F32_4 * 8, align=64),
         "MisalignedTensor", "alignment 64")
    case("offset_out_of_range", file([ARCH], [ti("w", [4], QT.F32, 2**40)], F32_4), "TensorOutOfBounds")
    case("offset_overflow", file([ARCH], [ti("w", [4], QT.F32, 2**64 - 32)], F32_4), "TensorOutOfBounds")
    past_end = file([ARCH], [ti("w", [4096], QT.F32, 0)], F32_4)
    case("size_past_end", past_end, "TensorOutOfBounds", f"file, which has {len(past_end)} bytes")
    # Found by the fuzzer: a 0 among the dims made the element count 0, but
    # the other dims multiplied in row-major order overflowed in Shape.
    case("fuzz_zero_dim_overflow", bytes.fromhex(
        "47475546030000000100000000000000000000000000000000000000000000000400000000000000000000000100"
        "000000000000000000000000006009000400000000000000000000000000000000000000010000000004000000"
        "000000000000000000000000610000"), "ElementCountOverflow", "tensor \"\"")
    case("zero_dim_with_huge_dims", file([ARCH], [ti("w", [0, 2**40, 2**40], QT.F32, 0)]),
         "ElementCountOverflow", "[0, 1099511627776, 1099511627776]")
    # Found by the fuzzer (a legal file whose data section starts 1 GiB past
    # its end): with a tensor in it, that tensor is out of bounds.
    case("huge_alignment", header(1, 1) + kv("general.alignment", VT.UINT32, u32(2**30))
         + ti("w", [4], QT.F32, 0) + F32_4, "TensorOutOfBounds", "bytes 1073741824..1073741840")
    case("no_data_section", header(1, 1) + ARCH + ti("w", [4], QT.F32, 0), "TensorOutOfBounds")
    case("overlap_same_offset", file([ARCH], [ti("a", [8], QT.F32, 0), ti("b", [8], QT.F32, 0)],
                                     b"\0" * 64), "OverlappingTensors", "\"a\"", "\"b\"")
    case("overlap_partial", file([ARCH], [ti("a", [16], QT.F32, 0), ti("b", [8], QT.F32, 32)],
                                 b"\0" * 96), "OverlappingTensors")
    case("duplicate_tensor", file([ARCH], [ti("w", [4], QT.F32, 0), ti("w", [4], QT.F32, 32)], b"\0" * 64),
         "DuplicateTensor", "\"w\"")
    return cases


def main():
    rng = np.random.default_rng(1234)
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(os.path.join(OUT, "valid"))
    os.makedirs(os.path.join(OUT, "malformed"))
    valid = valid_files(rng)
    with open(os.path.join(OUT, "valid", "manifest.json"), "w") as f:
        json.dump(valid, f, indent=1)
    entries = []
    for name, data, kind, expect in malformed_files():
        path = os.path.join("malformed", name + ".gguf")
        with open(os.path.join(OUT, path), "wb") as f:
            f.write(data)
        entries.append({"file": path, "kind": kind, "message_contains": expect})
    with open(os.path.join(OUT, "malformed", "manifest.json"), "w") as f:
        json.dump(entries, f, indent=1)
    total = sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(OUT) for n in ns)
    print(f"wrote {len(valid)} valid and {len(entries)} malformed files, {total} bytes, to {os.path.relpath(OUT, ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
