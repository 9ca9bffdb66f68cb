#!/usr/bin/env bash
# Runs ON the device host (H200, CUDA at /usr/local/cuda, no network, no Rust): builds llama.cpp's
# CUDA tools (llama-bench, llama-perplexity, llama-completion, llama-quantize, llama-tokenize and
# llamacpp-greedy) from the sources that tools/pack_llamacpp_src.sh packed here into
# .device-llamacpp/src.tar.xz (carry [".device-llamacpp"]), as a background job that outlives the
# call, so that one call starts it and later calls (running other work meanwhile) poll it.
#
#   bash tools/build_llamacpp_cuda_device.sh start        # checks the tools, unpacks, starts; returns
#   bash tools/build_llamacpp_cuda_device.sh status       # running (ninja's progress) / done / failed
#   bash tools/build_llamacpp_cuda_device.sh wait 480     # waits up to 480 s, then as status
#   bash tools/build_llamacpp_cuda_device.sh out 00 01    # those pieces of the bundle into $OUT
#
# status and wait, once the build is done, also copy the bundle into $OUT/llamacpp-cuda/ (when
# $OUT is set): llamacpp-cuda.tar.xz.00, .01, ... (15 MiB pieces: $OUT takes at most 8 files of
# 16 MiB, 64 MiB in all; a bundle over 60 MiB comes back over several calls with `out`). Keep them here in .device-llamacpp-cuda/ (git-ignored) and carry that folder in later
# sessions instead of rebuilding: bench/device_cuda_llm.sh unpacks them (see its header).
#
# Configuration (llama.cpp's CUDA build of issue 33): -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
# (SASS for sm_90 + PTX; $CUDA_ARCH overrides) -DGGML_NATIVE=OFF, Release, CUDA graphs on (llama.cpp's
# default), flash-attention kernels (default set), NCCL off (one GPU; no extra runtime library),
# no curl/OpenSSL, no tests/examples/server/app. The CPU backend gets the flags of the host's CPU
# that also run on any AVX-512 server (Sapphire Rapids, Zen 4): AVX2, FMA, F16C, BMI2 and, when the
# host has them, AVX512F/VBMI/VNNI/BF16; never AMX or AVX512-FP16, so carried binaries run on
# another H200 host's CPU too. OpenMP (llama.cpp's default).
# Shared libraries (BUILD_SHARED_LIBS=ON), with RUNPATH $ORIGIN: the CUDA kernels live once, in
# libggml-cuda.so, instead of once in each of the six programs (static linking would carry them
# six times). The bundle holds the stripped programs, every library of the build they load, and
# libgomp; libcudart/libcublas/libcublasLt come from /usr/local/cuda and libcuda from the driver
# at run time (bench/device_cuda_llm.sh sets LD_LIBRARY_PATH).
#
# Environment: CUDA_ARCH (90; 90-real drops the PTX, same sm_90 code, smaller bundle), CUDA_FLAGS
# (e.g. -allow-unsupported-compiler, should nvcc refuse the host's gcc), CUDA_HOME (/usr/local/cuda).
# tools/build_llamacpp_cuda_here.sh builds the same bundle on a CPU host instead (CUDA from PyPI
# wheels): it sources this file for its functions and sets JOBS, AVX512=OFF, EXTRA_CMAKE (more -D
# options), RUN_LIBS (where ldd finds the CUDA libraries) and BUILD_NOTE (a line of BUILD_INFO).
# Files: /tmp/llamacpp-cuda/{src,build,bin,pack}, log /tmp/llamacpp-cuda/build.log, marker
# /tmp/llamacpp-cuda/DONE (the exit status). A full build takes about 6 minutes on 16 cores.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
W=/tmp/llamacpp-cuda
TARGETS=(llama-bench llama-perplexity llama-completion llama-quantize llama-tokenize llamacpp-greedy)
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
log() { echo "build_llamacpp_cuda_device: $*" >&2; }

# cmake and ninja on PATH, else the ones of python3's pip packages (the device image has both).
find_tool() { # NAME: prints its path or nothing
    local p
    p="$(command -v "$1" 2>/dev/null)" && { echo "$p"; return; }
    p="$(dirname "$(readlink -f "$(command -v python3)")")/$1"
    [ -x "$p" ] && { echo "$p"; return; }
    p="$(python3 -c "import $1, os; print(os.path.join($1.BIN_DIR, '$1'))" 2>/dev/null)"
    [ -n "$p" ] && [ -x "$p" ] && echo "$p"
}

check_tools() { # prints what it found; returns 1 when something needed is missing
    local ok=0 t p
    CMAKE="$(find_tool cmake)"
    NINJA="$(find_tool ninja)"
    NVCC="$CUDA_HOME/bin/nvcc"
    [ -x "$NVCC" ] || NVCC="$(command -v nvcc 2>/dev/null)"
    if [ -n "$CMAKE" ]; then log "cmake: $CMAKE ($("$CMAKE" --version | head -1))"; else log "MISSING: cmake (not on PATH, not in python3's packages): carry the cmake wheel (pip download cmake, see the device README)"; ok=1; fi
    if [ -n "$NINJA" ]; then log "ninja: $NINJA ($("$NINJA" --version))"; else log "ninja not found: Unix Makefiles instead"; fi
    if [ -n "$NVCC" ] && [ -x "$NVCC" ]; then log "nvcc: $NVCC ($("$NVCC" --version | grep -o 'release [0-9.]*'))"; else log "MISSING: nvcc ($CUDA_HOME/bin/nvcc)"; ok=1; fi
    for t in gcc g++ xz strip split tar; do
        p="$(command -v "$t" 2>/dev/null)" || { log "MISSING: $t"; ok=1; continue; }
        [ "$t" = gcc ] && log "gcc: $p ($(gcc -dumpfullversion))"
    done
    for p in "$CUDA_HOME"/lib64/libcudart.so "$CUDA_HOME"/lib64/libcublas.so; do
        [ -e "$p" ] || { log "MISSING: $p (FindCUDAToolkit needs it)"; ok=1; }
    done
    return $ok
}

cpu_flags() { # cmake -D options for ggml-cpu: prints them
    local f=(-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
        -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
    local fl
    fl="$(grep -m1 '^flags' /proc/cpuinfo)"
    if [ "${AVX512:-auto}" = auto ] && grep -qw avx512f <<< "$fl" && grep -qw avx512vbmi <<< "$fl" && grep -qw avx512_vnni <<< "$fl" && grep -qw avx512_bf16 <<< "$fl"; then
        f+=(-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON)
    else
        f+=(-DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF)
    fi
    echo "${f[@]}"
}

# The background job: configure, build, collect. Its stdout/stderr is build.log.
run_build() {
    local t0 rc
    t0=$(date +%s)
    check_tools || { echo 2 > "$W/DONE"; return; }
    local gen=()
    [ -n "$NINJA" ] && gen=(-G Ninja -DCMAKE_MAKE_PROGRAM="$NINJA")
    # shellcheck disable=SC2046 # cpu_flags prints separate words
    "$CMAKE" -S "$W/src" -B "$W/build" "${gen[@]}" \
        -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DGGML_NATIVE=OFF \
        -DCMAKE_CUDA_COMPILER="$NVCC" -DCUDAToolkit_ROOT="$CUDA_HOME" ${CUDA_FLAGS:+"-DCMAKE_CUDA_FLAGS=$CUDA_FLAGS"} \
        -DGGML_CUDA_NCCL=OFF -DGGML_CCACHE=OFF -DGGML_OPENMP=ON $(cpu_flags) \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON \
        ${EXTRA_CMAKE[@]+"${EXTRA_CMAKE[@]}"} \
        || { echo "configure failed"; echo 3 > "$W/DONE"; return; }
    "$CMAKE" --build "$W/build" -j "${JOBS:-$(nproc)}" --target "${TARGETS[@]}" \
        || { echo "build failed"; echo 4 > "$W/DONE"; return; }
    echo "built in $(( $(date +%s) - t0 )) s"
    collect; rc=$?
    [ "$rc" = 0 ] && touch "$W/READY" # bench/device_cuda_llm.sh waits for this
    echo "done in $(( $(date +%s) - t0 )) s (status $rc)"
    echo "$rc" > "$W/DONE"
}

# Stripped programs + the libraries they load from the build (and libgomp) into $W/bin; the
# bundle into $W/pack. Libraries are copied under the name the programs ask for (the soname).
collect() {
    local b="$W/build/bin" t lib name
    local RUN_LIBS="${RUN_LIBS:-$CUDA_HOME/lib64}" # where the CUDA libraries (and libcuda) are found
    rm -rf "${W:?}/bin" "${W:?}/pack" && mkdir -p "$W/bin" "$W/pack"
    for t in "${TARGETS[@]}"; do
        [ -x "$b/$t" ] || { echo "missing $b/$t"; return 5; }
        strip -o "$W/bin/$t" "$b/$t"
        while read -r name lib; do
            case "$lib" in
                "$W"/build/*|*/libgomp.so*) ;;
                *) continue ;;
            esac
            [ -e "$W/bin/$name" ] || strip --strip-unneeded -o "$W/bin/$name" "$(readlink -f "$lib")"
        done < <(LD_LIBRARY_PATH="$b:$RUN_LIBS" ldd "$b/$t" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
    done
    chmod +x "$W/bin"/*
    {
        echo "llama.cpp CUDA build for RusTorch issue 33 ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
        [ -z "${BUILD_NOTE:-}" ] || echo "$BUILD_NOTE"
        cat "$W/src/PACK_INFO"
        echo "nvcc: $("$NVCC" --version | grep -o 'release [0-9.]*, V[0-9.]*')"
        echo "gcc: $(gcc -dumpfullversion); cmake: $("$CMAKE" --version | head -1)"
        echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
        echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
        grep -E '^(CMAKE_CUDA_ARCHITECTURES|GGML_(NATIVE|CUDA|CUDA_GRAPHS|CUDA_FA|CUDA_NCCL|OPENMP|AVX[A-Z0-9_]*|AMX[A-Z_]*|FMA|F16C|BMI2|CUDA_COMPRESSION_MODE)|BUILD_SHARED_LIBS):' "$W/build/CMakeCache.txt"
        echo "files:"
        (cd "$W/bin" && ls -l | tail -n +2)
        echo "llama-bench needs:"
        LD_LIBRARY_PATH="$W/bin:$RUN_LIBS" ldd "$W/bin/llama-bench"
    } > "$W/bin/BUILD_INFO"
    # The programs must load from the bundle alone (plus CUDA's and the system's libraries).
    local t2
    for t2 in "${TARGETS[@]}"; do
        if LD_LIBRARY_PATH="$W/bin:$RUN_LIBS" ldd "$W/bin/$t2" | grep -q 'not found'; then
            echo "$t2 misses libraries:"; LD_LIBRARY_PATH="$W/bin:$RUN_LIBS" ldd "$W/bin/$t2" | grep 'not found'
            return 6
        fi
    done
    # RUNPATH $ORIGIN: found without LD_LIBRARY_PATH too (bench/device_cuda_llm.sh sets it anyway).
    LD_LIBRARY_PATH="$RUN_LIBS" ldd "$W/bin/llama-bench" | grep -q 'not found' \
        && echo "note: the programs find their libraries only with LD_LIBRARY_PATH=$W/bin (no RUNPATH \$ORIGIN)"
    LD_LIBRARY_PATH="$RUN_LIBS" "$W/bin/llama-bench" --list-devices 2>&1 | tail -3
    tar -C "$W" -cf - bin | xz -9 -T"$(nproc)" | split -b 15M -d -a 2 - "$W/pack/llamacpp-cuda.tar.xz."
    du -b "$W"/pack/* | awk '{s += $1; printf "%s %d bytes\n", $2, $1} END {printf "bundle: %.1f MiB compressed\n", s / 1048576}'
    [ "$(ls "$W"/pack | wc -l)" -le 6 ] || echo "WARNING: more than 6 pieces; \$OUT takes at most 8 files"
}

copy_out() { # [PIECE...]: the bundle's pieces (default all) into $OUT/llamacpp-cuda/
    [ -n "${OUT:-}" ] || { echo "\$OUT is not set: nothing copied"; return 0; }
    local p n=0
    mkdir -p "$OUT/llamacpp-cuda"
    if [ $# -eq 0 ]; then
        local all=("$W"/pack/llamacpp-cuda.tar.xz.*)
        set -- "${all[@]##*.}"
    fi
    for p in "$@"; do
        cp "$W/pack/llamacpp-cuda.tar.xz.$p" "$OUT/llamacpp-cuda/" && n=$((n + 1))
    done
    echo "copied $n of $(ls "$W/pack" | wc -l) pieces to \$OUT/llamacpp-cuda/ (keep them here in .device-llamacpp-cuda/)"
}

state() { # prints the state; copies the bundle to $OUT when done
    if [ -f "$W/DONE" ]; then
        local rc
        rc="$(cat "$W/DONE")"
        if [ "$rc" = 0 ]; then
            echo "llama.cpp CUDA build: done, binaries in $W/bin"
            grep -E "built in|done in|bundle:" "$W/build.log"
            local total
            total="$(cat "$W"/pack/llamacpp-cuda.tar.xz.* | wc -c)"
            if [ "$total" -gt $((60 * 1024 * 1024)) ]; then
                echo "the bundle is $((total >> 20)) MiB, more than \$OUT takes in one call: bring it back with"
                echo "  bash $0 out 00 01 02 and then bash $0 out 03 ... (one call each)"
            else
                copy_out
            fi
            return 0
        fi
        echo "llama.cpp CUDA build: FAILED (status $rc); last lines of $W/build.log:"
        grep -E "error|Error|FAILED|MISSING" "$W/build.log" | head -20
        tail -15 "$W/build.log"
        return 1
    fi
    if [ -f "$W/PID" ] && kill -0 "$(cat "$W/PID")" 2>/dev/null; then
        echo "llama.cpp CUDA build: running for $(( $(date +%s) - $(stat -c %Y "$W/PID") )) s; $(grep -oE '^\[[0-9]+/[0-9]+\]' "$W/build.log" | tail -1)"
        return 2
    fi
    echo "llama.cpp CUDA build: not started (or the machine was given back: /tmp is empty)"
    return 3
}

# Sourced (tools/build_llamacpp_cuda_here.sh): the functions only.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

case "${1:-}" in
start)
    mkdir -p "$W"
    if [ -f "$W/DONE" ] && [ "$(cat "$W/DONE")" = 0 ]; then state; exit 0; fi
    if [ -f "$W/PID" ] && kill -0 "$(cat "$W/PID")" 2>/dev/null; then state; exit 0; fi
    check_tools || { log "cannot build here"; exit 3; }
    tarball="$root/.device-llamacpp/src.tar.xz"
    [ -f "$tarball" ] || { log "no $tarball: run tools/pack_llamacpp_src.sh here and carry .device-llamacpp"; exit 2; }
    rm -rf "$W/src" "$W/DONE" "$W/READY" "$W/build.log"
    mkdir -p "$W/src" && tar -xJf "$tarball" -C "$W/src" --strip-components=1 || exit 2
    # The job runs a copy of this script: the repo's copy is replaced by the next call's tree.
    cp "$0" "$W/build.sh"
    setsid nohup bash "$W/build.sh" _run > "$W/build.log" 2>&1 < /dev/null &
    echo $! > "$W/PID"
    sleep 2
    log "started (pid $(cat "$W/PID"), $(nproc) jobs); log $W/build.log"
    head -5 "$W/build.log" >&2
    ;;
_run)
    run_build
    ;;
status)
    state
    ;;
wait)
    limit="${2:-540}"
    t0=$(date +%s)
    while [ ! -f "$W/DONE" ] && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do
        [ -f "$W/PID" ] && kill -0 "$(cat "$W/PID")" 2>/dev/null || break
        sleep 5
    done
    state
    ;;
out)
    shift
    [ -f "$W/DONE" ] && [ "$(cat "$W/DONE")" = 0 ] || { state; exit 1; }
    copy_out "$@"
    ;;
*)
    echo "usage: $0 start | status | wait SECONDS | out [PIECE...]" >&2
    exit 2
    ;;
esac
