#!/usr/bin/env bash
# Builds llama.cpp's command-line tools (test-backend-ops, llama-quantize, llama-completion,
# llama-perplexity, llama-bench, llama-tokenize) and the greedy program of
# tools/llamacpp_diff.py (llamacpp-greedy, tools/llamacpp_greedy.cpp) from the sources that the
# PyPI package `llama-cpp-python` vendors, for use as the reference in benchmarks, fixture
# scripts and the differential check.
#
# usage: tools/build_llamacpp.sh [--amx] [VERSION]
# Prints the directory holding the binaries on its last line.
#
# Cache: $RUSTORCH_CACHE (default ~/.cache/rustorch)/llamacpp-VERSION, build/ or build-amx/;
# nothing is rebuilt when every tool is there (and llamacpp-greedy matches its source).
# Builds with $JOBS jobs (default nproc).
#
# Default build: GCC, CPU-only, native (-march=native), and AMX switched off: GCC 12
# miscompiles ggml's AMX path, and AMX gives different logits. This is our usual reference.
#
# --amx: llama.cpp as a native build with AMX runs it (ggml-cpu/amx multiplies Q4_0, Q4_1 and
# Q8_0 weights with tile products), for machines whose CPU has AMX-INT8 and whose kernel grants
# the tile state (arch_prctl(ARCH_REQ_XCOMP_PERM)): clang (apt-get install clang when missing),
# GGML_NATIVE=ON (-march=native), ggml's threads instead of OpenMP (no libomp needed), and GCC's
# macro names __AMX_INT8__/__AMX_TILE__/__AMX_BF16__ defined where clang spells them
# __AMXINT8__ etc. (clang before 18; ggml compiles its AMX code under __AMX_INT8__ &&
# __AVX512VNNI__). Exits with status 3, building nothing, when the CPU or the kernel lacks AMX.
# tools/build_llamacpp_device.sh cross-builds the same two variants for the device host.
set -euo pipefail

amx=0
if [ "${1:-}" = --amx ]; then
    amx=1
    shift
fi
version="${1:-0.3.36}"
cache="${RUSTORCH_CACHE:-$HOME/.cache/rustorch}/llamacpp-$version"
build="$cache/build"
[ "$amx" = 1 ] && build="$cache/build-amx"
bin="$build/bin"
tools=(test-backend-ops llama-quantize llama-perplexity llama-bench llama-tokenize llama-completion llamacpp-greedy)
jobs="${JOBS:-$(nproc)}"
log() { echo "build_llamacpp: $*" >&2; }

# shellcheck source=tools/llamacpp_src.sh
. "$(dirname "$0")/llamacpp_src.sh"

if [ "$amx" = 1 ]; then
    # Checked before the cache: binaries built here earlier must not run where AMX is not granted.
    if ! grep -qw amx_int8 /proc/cpuinfo || ! grep -qw amx_tile /proc/cpuinfo; then
        log "--amx: this CPU has no AMX-INT8/AMX-TILE ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'))"
        exit 3
    fi
    # Linux (5.16 and later) hands out the AMX tile data state only on request; ggml asks the
    # same way at startup. SYS_arch_prctl = 158, ARCH_REQ_XCOMP_PERM = 0x1023, XTILEDATA = 18.
    if ! python3 -c 'import ctypes, sys; sys.exit(ctypes.CDLL(None, use_errno=True).syscall(158, 0x1023, 18) != 0)'; then
        log "--amx: the kernel ($(uname -r)) does not grant the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM)"
        exit 3
    fi
fi

have_all=1
grep -qs RUSTORCH_LLAMACPP_THREADS "$bin/test-backend-ops" || have_all=0
for t in "${tools[@]}"; do [ -x "$bin/$t" ] || have_all=0; done
llamacpp_greedy_current "$cache" "$bin" || have_all=0
if [ "$have_all" = 1 ]; then
    echo "$bin"
    exit 0
fi

llamacpp_src "$cache" "$version"
command -v cmake >/dev/null || python3 -m pip install --quiet cmake >&2

common=(
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF
)
if [ "$amx" = 0 ]; then
    no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    cmake -S "$cache/src" -B "$build" "${common[@]}" -DGGML_OPENMP=ON \
        -DCMAKE_C_FLAGS="$no_amx" -DCMAKE_CXX_FLAGS="$no_amx" >&2
else
    if ! command -v clang >/dev/null || ! command -v clang++ >/dev/null; then
        log "installing clang with apt-get"
        sudo=()
        [ "$(id -u)" = 0 ] || sudo=(sudo)
        { "${sudo[@]}" apt-get update -qq && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang; } >&2
    fi
    # What -march=native turns on here, as the compiler sees it.
    defined="$(echo | clang -march=native -dM -E -)"
    flags=""
    for m in TILE INT8 BF16; do
        if grep -q "__AMX${m}__" <<< "$defined" && ! grep -q "__AMX_${m}__" <<< "$defined"; then
            flags="$flags -D__AMX_${m}__=1"
        fi
    done
    for m in __AVX512VNNI__ "__AMX_\?INT8__" "__AMX_\?TILE__"; do
        grep -q "$m" <<< "$defined" || { log "--amx: clang -march=native does not define $m (clang $(clang -dumpversion))"; exit 1; }
    done
    cmake -S "$cache/src" -B "$build" "${common[@]}" -DGGML_OPENMP=OFF \
        -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
        -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" >&2
fi
cmake --build "$build" -j "$jobs" --target "${tools[@]}" >&2
if [ "$amx" = 1 ]; then
    # ggml-cpu/amx is compiled in only when the macros above reached it: its tile instructions
    # must be in the binary, or this build would silently be a second no-AMX one.
    amx_ops="$(objdump -d --no-show-raw-insn "$bin/llamacpp-greedy" | grep -cE '\s(tdpbssd|tdpbusd|ldtilecfg|tileloadd)\s' || true)"
    [ "$amx_ops" -gt 0 ] || { log "--amx: no AMX instructions in llamacpp-greedy"; exit 1; }
fi
echo "$bin"
