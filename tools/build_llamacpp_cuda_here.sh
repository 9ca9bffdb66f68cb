#!/usr/bin/env bash
# Builds, HERE (no GPU needed), the bundle of llama.cpp's CUDA tools that
# tools/build_llamacpp_cuda_device.sh builds on the device host: the same sources
# (.device-llamacpp/src.tar.xz, made by tools/pack_llamacpp_src.sh when missing), the same CMake
# configuration and the same collect step (that script is sourced for its functions), so that a
# device session carries .device-llamacpp-cuda/llamacpp-cuda.tar.xz.NN instead of spending ~6 of
# its minutes building; bench/device_cuda_llm.sh unpacks them unchanged.
#
#   bash tools/build_llamacpp_cuda_here.sh          # wheels, toolkit, configure, build, collect
#
# CUDA 13.0 (the device's driver 580 and /usr/local/cuda are 13.0) comes from PyPI's wheels,
# fetched with pip into $RUSTORCH_CACHE/cuda13-wheels (~900 MB unpacked, cuBLAS is most of it):
# nvidia-cuda-nvcc/-crt and nvidia-nvvm 13.0.88, nvidia-cuda-runtime 13.0.96, nvidia-cublas
# 13.0.2.14, nvidia-cuda-cccl 13.0.85, unpacked together into one toolkit-like tree
# (nvidia/cu13: bin/nvcc, include with cccl/, lib) to which this script adds lib64 -> lib, the
# libcudart.so/libcublas.so/libcublasLt.so link names and lib64/stubs/libcuda.so(.1): a stub
# made here from cuda.h (every driver function returns CUDA_ERROR_STUB_LIBRARY), because
# libggml-cuda links libcuda (CUDA VMM) and no wheel carries the driver's stub. The bundle does
# not hold it: on the device the driver's libcuda.so.1 is found, and libcudart/libcublas(Lt)
# come from /usr/local/cuda/lib64 (bench/device_cuda_llm.sh sets LD_LIBRARY_PATH).
# ninja and (where the machine has none) cmake from their wheels too (pip --target into the same
# cache).
#
# Differences from the device build, all for running on another machine's OS:
#   - the CPU backend gets AVX2/FMA/F16C/BMI2 only, AVX512=OFF (the device script turns AVX-512
#     on when its host has it; the llama.cpp reference runs are all-GPU, -ngl 99);
#   - libstdc++ is linked statically into every program and library (-static-libstdc++), so no
#     GLIBCXX version of the device's OS matters; libgcc stays the shared libgcc_s.so.1 that
#     every glibc system has (GCC 12's static unwinder needs _dl_find_object, glibc 2.35), and
#     arc4random (glibc 2.36, called by the static libstdc++'s std::random_device) is defined by
#     a small hidden object with getrandom (as tools/build_llamacpp_device.sh does): glibc 2.34;
#   - RUNPATH is $ORIGIN only (the build's install RPATH), without this host's toolkit path;
#   - libgomp.so.1 is this host's (GCC 12), as collect copies it.
# The script checks every bundled file's highest GLIBC_ version (<= 2.34) and that no GLIBCXX
# is needed, runs each program's --help with the stub libcuda (CUDA fails to initialise, the
# CPU backend remains), and writes these facts to BUILD_INFO.
#
# Output: .device-llamacpp-cuda/llamacpp-cuda.tar.xz.NN (git-ignored; old pieces removed first).
# Build tree: $RUSTORCH_CACHE/llamacpp-cuda-here/{src,build,bin,pack}, log build.log there.
# Everything runs under nice 19 with $JOBS jobs (default 2): 31 minutes of compiling on 2 cores
# with cargo builds beside it (session 33), 54 once; the bundle: 3 pieces, 40.6 MiB (libggml-cuda.so 61 MB, sm_90 + PTX).
# Checked here (no GPU): with the stub the programs start, CUDA reports "driver is a stub
# library" and no devices, and llama-perplexity/-quantize/-completion run on the CPU backend.
# Environment: JOBS (2), CUDA_ARCH (90; 90-real: no PTX), RUSTORCH_CACHE (~/.cache/rustorch).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
cache="${RUSTORCH_CACHE:-$HOME/.cache/rustorch}"
wheels="$cache/cuda13-wheels"
WHEELS=(nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88
    nvidia-cuda-runtime==13.0.96 nvidia-cublas==13.0.2.14 nvidia-cuda-cccl==13.0.85)
NINJA_WHEEL=ninja==1.13.2
CMAKE_WHEEL=cmake==4.4.5
export CUDA_HOME="$wheels/root/nvidia/cu13"
renice -n 19 -p $$ > /dev/null # every command below inherits it

# shellcheck source=tools/build_llamacpp_cuda_device.sh
. "$here/build_llamacpp_cuda_device.sh"
W="$cache/llamacpp-cuda-here"
JOBS="${JOBS:-2}"
AVX512=OFF
RUN_LIBS="$CUDA_HOME/lib64:$CUDA_HOME/lib64/stubs"
log() { echo "build_llamacpp_cuda_here: $*" >&2; }

# The wheels, unpacked into one tree; the link names and the libcuda stub added.
toolkit() {
    local w missing=()
    mkdir -p "$wheels/whl"
    for w in "${WHEELS[@]}"; do
        local f="${w%%==*}" v="${w##*==}"
        f="${f//-/_}-$v-"
        compgen -G "$wheels/whl/$f*.whl" > /dev/null || missing+=("$w")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        log "pip download ${missing[*]}"
        python3 -m pip download --quiet --no-deps -d "$wheels/whl" "${missing[@]}" || return 1
        rm -rf "$wheels/root"
    fi
    if [ ! -x "$CUDA_HOME/bin/nvcc" ] || [ ! -f "$wheels/root/UNPACKED" ]; then
        rm -rf "$wheels/root" && mkdir -p "$wheels/root"
        for w in "$wheels"/whl/*.whl; do
            python3 -m zipfile -e "$w" "$wheels/root" || return 1
        done
        chmod +x "$CUDA_HOME"/bin/* "$CUDA_HOME"/nvvm/bin/* 2> /dev/null
        ls "$wheels"/whl > "$wheels/root/UNPACKED"
    fi
    local L="$CUDA_HOME/lib" l
    ln -sfn lib "$CUDA_HOME/lib64"
    for l in cudart cublas cublasLt; do ln -sf "lib$l.so.13" "$L/lib$l.so"; done
    if [ ! -f "$L/stubs/libcuda.so" ]; then
        mkdir -p "$L/stubs"
        # Every function cuda.h declares (under the names its macros give them), returning 34.
        echo '#include <cuda.h>' | gcc -E -P -I"$CUDA_HOME/include" -x c - \
            | grep -oE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' | sed -E 's/[[:space:]]*\($//' | sort -u \
            | awk '{printf "int %s(void) { return 34; /* CUDA_ERROR_STUB_LIBRARY */ }\n", $1}' > "$L/stubs/libcuda_stub.c"
        gcc -shared -fPIC -O1 -Wl,-soname,libcuda.so.1 -o "$L/stubs/libcuda.so" "$L/stubs/libcuda_stub.c" || return 1
        ln -sf libcuda.so "$L/stubs/libcuda.so.1"
        log "libcuda stub: $(grep -c . "$L/stubs/libcuda_stub.c") functions"
    fi
    if [ ! -x "$wheels/ninja/bin/ninja" ]; then
        python3 -m pip install --quiet --target "$wheels/ninja" "$NINJA_WHEEL" || return 1
    fi
    # cmake too, where the machine has none (a fresh one has not).
    if ! command -v cmake > /dev/null 2>&1 && [ ! -x "$wheels/cmake/bin/cmake" ]; then
        python3 -m pip install --quiet --target "$wheels/cmake" "$CMAKE_WHEEL" || return 1
    fi
    export PATH="$wheels/ninja/bin:$wheels/cmake/bin:$PATH"
    # The wheels' bin/ entries are Python scripts that import their package from the --target folder.
    export PYTHONPATH="$wheels/ninja:$wheels/cmake${PYTHONPATH:+:$PYTHONPATH}"
}

# glibc <= 2.34 and no GLIBCXX for every file of the bundle: prints the highest of each.
check_versions() {
    local f g x ok=0 gmax=""
    for f in "$W"/bin/*; do
        [ "$(basename "$f")" = BUILD_INFO ] && continue
        g="$(objdump -T "$f" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1)"
        x="$(objdump -T "$f" | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -n 1)"
        echo "$(basename "$f"): ${g:-no GLIBC} ${x:-no GLIBCXX}; needs $(objdump -p "$f" | awk '$1 == "NEEDED" {printf "%s ", $2}')"
        [ -z "$x" ] || ok=1
        gmax="$(printf '%s\n' "$gmax" "$g" | sort -V | tail -n 1)"
    done
    echo "highest: $gmax"
    [ "$(printf '%s\n' "$gmax" GLIBC_2.34 | sort -V | tail -n 1)" = GLIBC_2.34 ] || ok=1
    return $ok
}

smoke() { # each program starts (CUDA fails on the stub; the CPU backend remains)
    local t ok=0
    for t in "${TARGETS[@]}"; do
        if [ "$t" = llamacpp-greedy ]; then
            LD_LIBRARY_PATH="$RUN_LIBS" "$W/bin/$t" > /dev/null 2>&1 < /dev/null
            [ $? -lt 126 ] || { echo "$t does not start"; ok=1; }
            continue
        fi
        LD_LIBRARY_PATH="$RUN_LIBS" "$W/bin/$t" --help > /dev/null 2>&1 < /dev/null
        [ $? -lt 126 ] || { echo "$t does not start"; ok=1; }
    done
    return $ok
}

t0=$(date +%s)
toolkit || { log "could not assemble the CUDA 13.0 toolkit from wheels in $wheels"; exit 2; }
glibc_here="$(ldd --version | head -1 | grep -oE '[0-9]+\.[0-9]+$')"
compat="$W/compat/glibc_compat.o"
mkdir -p "$W/compat"
cat > "$W/compat/glibc_compat.c" << 'C'
#include <stdint.h>
#include <sys/random.h>
__attribute__((visibility("hidden"))) uint32_t arc4random(void) {
    uint32_t x;
    while (getrandom(&x, sizeof x, 0) != (ssize_t) sizeof x) {}
    return x;
}
C
gcc -O2 -fPIC -c "$W/compat/glibc_compat.c" -o "$compat" || exit 2
# -rpath-link: the programs' link resolves libggml-cuda's libcudart/libcublas/libcuda (the stub)
# there, as RUNPATH holds only $ORIGIN.
link="-static-libstdc++ $compat -Wl,-rpath-link,$CUDA_HOME/lib64:$CUDA_HOME/lib64/stubs"
EXTRA_CMAKE=(
    "-DCMAKE_EXE_LINKER_FLAGS=$link" "-DCMAKE_SHARED_LINKER_FLAGS=$link"
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON "-DCMAKE_INSTALL_RPATH=\$ORIGIN"
)
BUILD_NOTE="built on a CPU host by tools/build_llamacpp_cuda_here.sh: $(. /etc/os-release; echo "$PRETTY_NAME"), glibc $glibc_here, gcc $(gcc -dumpfullversion); CUDA from PyPI wheels: ${WHEELS[*]}; static libstdc++, RUNPATH \$ORIGIN, AVX512 off"

tarball="$root/.device-llamacpp/src.tar.xz"
[ -f "$tarball" ] || bash "$here/pack_llamacpp_src.sh" || exit 2
rm -rf "$W/src" "$W/DONE" "$W/READY"
mkdir -p "$W/src" && tar -xJf "$tarball" -C "$W/src" --strip-components=1 || exit 2
log "building in $W with $JOBS jobs (log $W/build.log)"
run_build > "$W/build.log" 2>&1
rc="$(cat "$W/DONE" 2> /dev/null || echo 9)"
grep -E "^(build_llamacpp_cuda_(device|here)|built in|done in|bundle:)|pieces|WARNING" "$W/build.log" >&2
[ "$rc" = 0 ] || { log "failed (status $rc); see $W/build.log"; tail -20 "$W/build.log" >&2; exit 1; }

# The checks, into BUILD_INFO too; then the bundle again, with that BUILD_INFO.
versions="$(check_versions)"; vrc=$?
echo "$versions" >&2
smoke_out="$(smoke)"; src=$?
[ -z "$smoke_out" ] || echo "$smoke_out" >&2
{
    echo "checked here: every file's highest glibc version and libraries:"
    echo "$versions"
} >> "$W/bin/BUILD_INFO"
[ "$vrc" = 0 ] || { log "a file needs GLIBCXX or glibc > 2.34 (above)"; exit 1; }
[ "$src" = 0 ] || { log "a program does not start here"; exit 1; }
rm -f "$W"/pack/*
tar -C "$W" -cf - bin | xz -9 -T"$JOBS" | split -b 15M -d -a 2 - "$W/pack/llamacpp-cuda.tar.xz."
out="$root/.device-llamacpp-cuda"
mkdir -p "$out" && rm -f "$out"/llamacpp-cuda.tar.xz.* && cp "$W"/pack/llamacpp-cuda.tar.xz.* "$out/"
du -b "$out"/* | awk '{s += $1; printf "%s %d bytes\n", $2, $1} END {printf "bundle: %.1f MiB compressed\n", s / 1048576}'
log "done in $(( $(date +%s) - t0 )) s: carry .device-llamacpp-cuda (bench/device_cuda_llm.sh unpacks it)"
