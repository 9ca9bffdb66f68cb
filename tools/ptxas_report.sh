#!/usr/bin/env bash
# Registers, spills and shared memory of the CUDA kernels, without a GPU:
# PTX from NVRTC (examples/kernel_ptx.rs), then `ptxas -v` from the
# nvidia-cuda-nvcc wheel (installed into a cache folder on first use).
# usage: tools/ptxas_report.sh [KERNEL-NAME-REGEX] [sm_90]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
pattern="${1:-.}"
sm="${2:-sm_90}"
tools="${XDG_CACHE_HOME:-$HOME/.cache}/rustorch/nvcc-wheel"
ptxas=$(find "$tools" -name ptxas -type f 2>/dev/null | head -1 || true)
if [ -z "$ptxas" ]; then
    mkdir -p "$tools"
    pip download -q nvidia-cuda-nvcc --no-deps -d "$tools"
    (cd "$tools" && python3 -m zipfile -e ./*.whl x)
    ptxas=$(find "$tools" -name ptxas -type f | head -1)
    chmod +x "$ptxas"
fi
nvrtc_lib=$(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))' 2>/dev/null || true)
out=$(mktemp -d)
LD_LIBRARY_PATH="${nvrtc_lib}:${LD_LIBRARY_PATH:-}" cargo run -q -p rustorch-cuda --example kernel_ptx -- "$out" "compute_${sm#sm_}"
for f in "$out"/*.ptx; do
    "$ptxas" -v -arch="$sm" -o /dev/null "$f" 2>&1 |
        awk -v pat="$pattern" -F"'" '
            /Compiling entry function/ { name = $2 }
            /bytes stack frame/ && name ~ pat { frame = $0; sub(/^ +/, "", frame) }
            /Used [0-9]+ registers/ && name ~ pat { sub(/.*: /, ""); print name ": " $0 "; " frame }'
done
rm -rf "$out"
