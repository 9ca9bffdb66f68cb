#!/usr/bin/env python3
"""Generate llama.cpp reference fixtures for rustorch-core's quantized matmul.

Builds tools/ggml_ref/mul_mat_ref.c against llama.cpp's headers and the
libggml*.so files that llama-cpp-python installed (llama.cpp 0.3.36, GCC 12,
-march=native: AVX-512 VNNI, no AMX), then, for every weight type and shape,
runs one ggml_mul_mat on llama.cpp's CPU backend (2 threads, weights in the
CPU_REPACK buffer where llama.cpp's loader would put them) for each m in
M_LIST and stores what it computed. Output: crates/rustorch-core/tests/
fixtures/ggml_matmul/ (format in its README.md), with cpu.json: the CPU it
ran on (tools/cpu_record.py; the products' order depends on it).

usage: python3 tools/gen_ggml_matmul_fixtures.py [--src LLAMA_CPP_SRC]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from cpu_record import cpu_record

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates/rustorch-conformance/fixtures/ggml_matmul"
LIB = Path("/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/llama_cpp/lib")

# GGML type ids (ggml.h enum ggml_type) and names as rustorch spells them.
TYPES = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8,
    "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14,
    "IQ4_NL": 20, "IQ4_XS": 23, "BF16": 30,
}
# (rows, cols): SmolLM2's 576 and 1536 columns, rows % 8 == 0 (where
# llama.cpp repacks some types) and != 0. K-quants need cols % 256 == 0, so
# they skip 576 (as llama.cpp's quantizer does, falling back to other types).
SHAPES = [(24, 576), (24, 1536), (20, 1536)]
SUPER_BLOCK = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"}
# Float weights are large; one shape per column count is enough for them
# (their paths do not depend on rows % 8).
FLOAT = {"F32", "F16", "BF16"}
M_LIST = [1, 2, 3, 4, 5, 7, 8, 9, 16, 33]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", default="/root/.cache/rustorch/llamacpp-0.3.36/src")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "mul_mat_ref"
        subprocess.run(
            ["gcc", "-O2", "-o", str(exe), str(ROOT / "tools/ggml_ref/mul_mat_ref.c"),
             f"-I{args.src}/ggml/include", f"-L{LIB}", "-lggml", "-lggml-base", "-lggml-cpu",
             f"-Wl,-rpath,{LIB}"],
            check=True,
        )
        rng = np.random.default_rng(20261121)
        for cols in sorted({c for _, c in SHAPES}):
            # Activations like a normed hidden state: mostly N(0, 1) with a
            # few large outliers, so block maxima vary.
            x = rng.standard_normal((max(M_LIST), cols)).astype(np.float32)
            x[rng.random(x.shape) < 0.01] *= 8.0
            x.tofile(OUT / f"x_{cols}.f32")
        for rows, cols in SHAPES:
            xp = OUT / f"x_{cols}.f32"
            for name, tid in TYPES.items():
                if name in SUPER_BLOCK and cols % 256:
                    continue
                if name in FLOAT and rows % 8 == 0 and cols == 1536:
                    continue
                w = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
                wp = Path(tmp) / "w.f32"
                w.tofile(wp)
                dst = OUT / f"{name}_{rows}x{cols}.bin"
                subprocess.run(
                    [str(exe), str(tid), str(rows), str(cols), str(wp), str(xp),
                     ",".join(map(str, M_LIST)), str(dst)],
                    check=True,
                )
    (OUT / "cpu.json").write_text(json.dumps(cpu_record(), indent=1) + "\n")
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"wrote {OUT} ({total} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
