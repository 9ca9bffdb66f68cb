#!/usr/bin/env bash
# Builds llama.cpp's command-line tools (test-backend-ops, llama-quantize, llama-completion,
# llama-perplexity, llama-bench, llama-tokenize) from the sources that the
# PyPI package `llama-cpp-python` vendors, for use as the reference in
# benchmarks and fixture scripts.
#
# usage: tools/build_llamacpp.sh [VERSION]
# Prints the directory holding the binaries on its last line.
#
# Cache: $RUSTORCH_CACHE (default ~/.cache/rustorch)/llamacpp-VERSION.
# The build is CPU-only, native (-march=native), and AMX is switched off:
# GCC 12 miscompiles ggml's AMX path, and AMX gives different logits.
set -euo pipefail

version="${1:-0.3.36}"
cache="${RUSTORCH_CACHE:-$HOME/.cache/rustorch}/llamacpp-$version"
bin="$cache/build/bin"
tools=(test-backend-ops llama-quantize llama-perplexity llama-bench llama-tokenize llama-completion)

have_all=1
grep -qs RUSTORCH_LLAMACPP_THREADS "$bin/test-backend-ops" || have_all=0
for t in "${tools[@]}"; do [ -x "$bin/$t" ] || have_all=0; done
if [ "$have_all" = 1 ]; then
    echo "$bin"
    exit 0
fi

# shellcheck source=tools/llamacpp_src.sh
. "$(dirname "$0")/llamacpp_src.sh"
llamacpp_src "$cache" "$version"
command -v cmake >/dev/null || python3 -m pip install --quiet cmake >&2

no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
cmake -S "$cache/src" -B "$cache/build" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_OPENMP=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF \
    -DCMAKE_C_FLAGS="$no_amx" -DCMAKE_CXX_FLAGS="$no_amx" >&2
cmake --build "$cache/build" -j "$(nproc)" --target "${tools[@]}" >&2
echo "$bin"
