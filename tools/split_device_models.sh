#!/usr/bin/env bash
# Cuts the real models of tools/fetch_models.py into the pieces that bench/device_cuda_llm.sh joins
# on the device (.device-model/NAME.part.aa, .ab, ...; git-ignored), sized to ride beside the other
# carried files within a call's 64 MiB (docs/BENCHMARKS.md, "Issue 33 on the device"): SmolLM2-135M
# Q4_1 as 9 + 15 + 45 MiB + the rest, Gemma-3-270M Q4_K_M as 20 + 4 x 44.5 MiB + the rest.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
eval "$(python3 "$root/tools/fetch_models.py" --print-env)"
out="$root/.device-model"
mkdir -p "$out"
python3 - "$out" "$RUSTORCH_SMOLLM2_GGUF" "$RUSTORCH_GEMMA3_GGUF" <<'PY'
import os, sys
out, smollm2, gemma3 = sys.argv[1:4]
M = 1 << 20
def cut(src, name, sizes):
    for f in os.listdir(out):
        if f.startswith(name + ".part."):
            os.remove(os.path.join(out, f))
    data = open(src, "rb").read()
    off = 0
    for i, size in enumerate(sizes + [len(data)]):
        chunk = data[off:off + size]
        if not chunk:
            break
        path = os.path.join(out, f"{name}.part.a{'abcdefghijklmnop'[i]}")
        open(path, "wb").write(chunk)
        off += len(chunk)
        print(f"{path}: {len(chunk)} bytes")
    assert off == len(data)
cut(smollm2, "smollm2", [9 * M, 15 * M, 45 * M])
cut(gemma3, "gemma3", [20 * M] + [int(44.5 * M)] * 4)
PY
