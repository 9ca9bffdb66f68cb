#!/usr/bin/env bash
# Builds llama.cpp's llama-bench, llama-quantize, test-backend-ops, llama-completion and the greedy
# program of tools/llamacpp_diff.py (llamacpp-greedy) HERE for the device host's
# CPU (Intel Xeon Sapphire Rapids class: AVX-512 VNNI/BF16/FP16 and AMX), not for this machine,
# from the same llama-cpp-python sources as tools/build_llamacpp.sh, in two variants:
#
#   noamx  GCC, -march=sapphirerapids -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 for ggml-cpu
#          (tools/llamacpp_cpu_launcher.sh: only there, as GGML_NATIVE=ON does), GGML_NATIVE=OFF,
#          OpenMP: what tools/build_llamacpp.sh builds natively, for that CPU (our usual
#          reference: GCC 12 miscompiles ggml's AMX path, and AMX gives different logits)
#   amx    clang, -march=sapphirerapids, GGML_NATIVE=OFF with GGML_AVX512(_VBMI/_VNNI/_BF16)
#          and GGML_AMX_TILE/_INT8/_BF16 on, OpenMP (LLVM's libomp): "llama.cpp built with
#          clang and AMX enabled" (ggml-cpu/amx/, compiled when __AMX_INT8__ and __AVX512VNNI__
#          are defined; clang 14 spells the first __AMXINT8__, so -D__AMX_INT8__=1 etc. are added)
#
# The binaries run on another x86-64 Linux with glibc 2.34 or later without extra files: static
# llama/ggml libraries, static libstdc++, static libgomp (noamx); besides glibc they need only
# libgcc_s.so.1 (as rustorch-cli does), and the amx variant libomp.so.5, which is copied next to
# the binaries (RUNPATH $ORIGIN). Both are checked with ldd and objdump (glibc version; AMX
# instructions in amx's llama-bench, none in noamx's). They are NOT expected to run on this
# machine (AMD Zen 4 lacks AVX-VNNI, AVX512-FP16 and AMX; llama-quantize happens to run).
#
# usage: tools/build_llamacpp_device.sh [VARIANTS] [VERSION]
#   VARIANTS: noamx, amx or noamx,amx (default); VERSION: llama-cpp-python's (default 0.3.36)
# Prints "VARIANT DIR" per variant on its last lines (DIR holds the binaries).
# Cache: $RUSTORCH_CACHE (default ~/.cache/rustorch)/llamacpp-VERSION/device-VARIANT.
# Needs gcc/g++, cmake (pip-installed when missing), and for amx clang and libomp-dev (installed
# with apt-get when missing). Builds with $JOBS jobs (default nproc).
set -euo pipefail

variants="${1:-noamx,amx}"
version="${2:-0.3.36}"
cache="${RUSTORCH_CACHE:-$HOME/.cache/rustorch}/llamacpp-$version"
tools=(llama-bench llama-quantize test-backend-ops llama-completion llamacpp-greedy)
jobs="${JOBS:-$(nproc)}"

log() { echo "build_llamacpp_device: $*" >&2; }

# shellcheck source=tools/llamacpp_src.sh
. "$(dirname "$0")/llamacpp_src.sh"
llamacpp_src "$cache" "$version"
command -v cmake >/dev/null || python3 -m pip install --quiet cmake >&2
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

apt_install() {
    log "installing $* with apt-get"
    if [ "$(id -u)" = 0 ]; then
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"; } >&2
    else
        { sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"; } >&2
    fi
}

# Common configuration: CPU only, static libraries, no network/SSL, no server or examples.
common=(
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF
    -DGGML_NATIVE=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_OPENMP=ON
    -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=ON
    -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF
    -DCMAKE_SKIP_BUILD_RPATH=ON
)
# Runtime: libstdc++ static. libgcc stays the shared libgcc_s.so.1 that every glibc system has
# (rustorch-cli needs it too): GCC 12's static unwinder calls _dl_find_object (glibc 2.35). And
# the static libstdc++'s std::random_device calls arc4random (glibc 2.36): a small object
# defines it with getrandom, so the binaries need glibc 2.34 like rustorch-cli, not 2.36.
compat_obj() { # COMPILER BUILD_DIR: prints the object's path
    mkdir -p "$2"
    cat > "$2/glibc_compat.c" <<'C'
#include <stdint.h>
#include <sys/random.h>
uint32_t arc4random(void) {
    uint32_t x;
    while (getrandom(&x, sizeof x, 0) != (ssize_t) sizeof x) {}
    return x;
}
C
    "$1" -O2 -fPIC -c "$2/glibc_compat.c" -o "$2/glibc_compat.o"
    echo "$2/glibc_compat.o"
}
static_rt="-static-libstdc++"

# The CPU's flags go to ggml-cpu's sources only (tools/llamacpp_cpu_launcher.sh), as a native
# build's -march=native does; the rest is compiled for plain x86-64 as there.
cpu_launcher() { # FLAGS...: prints the launcher as a cmake list
    local launch f
    launch="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/llamacpp_cpu_launcher.sh"
    for f in "$@"; do launch="$launch;--cpu-flag=$f"; done
    echo "$launch"
}

build_noamx() {
    local build="$cache/device-noamx"
    local flags="-march=sapphirerapids -mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    local gomp
    gomp="$(gcc -print-file-name=libgomp.a)"
    [ -f "$gomp" ] || { log "no static libgomp.a for gcc"; exit 1; }
    # OpenMP::OpenMP_C links the library FindOpenMP found: point it at the static archive.
    cmake -S "$cache/src" -B "$build" "${generator[@]}" "${common[@]}" \
        -DCMAKE_C_COMPILER=gcc -DCMAKE_CXX_COMPILER=g++ \
        -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
        -DOpenMP_gomp_LIBRARY="$gomp" \
        -DCMAKE_C_FLAGS="" -DCMAKE_CXX_FLAGS="" \
        -DCMAKE_C_COMPILER_LAUNCHER="$(cpu_launcher $flags)" -DCMAKE_CXX_COMPILER_LAUNCHER="$(cpu_launcher $flags)" \
        -DCMAKE_EXE_LINKER_FLAGS="$static_rt $(compat_obj gcc "$build")" >&2
    cmake --build "$build" -j "$jobs" --target "${tools[@]}" >&2
}

build_amx() {
    local build="$cache/device-amx"
    if ! command -v clang >/dev/null || ! command -v clang++ >/dev/null; then apt_install clang; fi
    local omp_h
    omp_h="$(echo '#include <omp.h>' | clang -x c -E - 2>/dev/null | grep -m1 -o '/[^"]*omp\.h' || true)"
    [ -n "$omp_h" ] || apt_install libomp-dev
    local flags="-march=sapphirerapids"
    # ggml's AMX code is compiled under __AMX_INT8__ && __AVX512VNNI__ (GCC's macro names); clang
    # before 18 names them __AMXINT8__, __AMXTILE__, __AMXBF16__: define GCC's too.
    local defined
    defined="$(echo | clang $flags -dM -E -)"
    local m
    for m in TILE INT8 BF16; do
        grep -q "__AMX${m}__" <<< "$defined" || { log "clang does not know AMX-$m"; exit 1; }
        grep -q "__AMX_${m}__" <<< "$defined" || flags="$flags -D__AMX_${m}__=1"
    done
    # FindOpenMP links libomp.so by its full path (DT_NEEDED libomp.so.5); the binaries look for
    # it next to themselves first. ${ORIGIN} is kept literal through cmake, ninja and the shell.
    cmake -S "$cache/src" -B "$build" "${generator[@]}" "${common[@]}" \
        -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
        -DGGML_AMX_TILE=ON -DGGML_AMX_INT8=ON -DGGML_AMX_BF16=ON \
        -DCMAKE_C_FLAGS="" -DCMAKE_CXX_FLAGS="" \
        -DCMAKE_C_COMPILER_LAUNCHER="$(cpu_launcher $flags)" -DCMAKE_CXX_COMPILER_LAUNCHER="$(cpu_launcher $flags)" \
        -DCMAKE_EXE_LINKER_FLAGS="$static_rt $(compat_obj clang "$build") -Wl,-rpath,'\$ORIGIN'" >&2
    cmake --build "$build" -j "$jobs" --target "${tools[@]}" >&2
    # Carry the OpenMP runtime next to the binaries.
    local lib soname
    lib="$(sed -n 's/^OpenMP_omp_LIBRARY:[A-Z]*=//p' "$build/CMakeCache.txt")"
    [ -f "$lib" ] || { log "amx: FindOpenMP found no libomp ($lib)"; exit 1; }
    soname="$(objdump -p "$lib" | awk '$1 == "SONAME" {print $2}')"
    cp -L "$lib" "$build/bin/$soname"
}

check() { # VARIANT DIR
    local v="$1" dir="$2" t bad glibc
    for t in "${tools[@]}"; do
        [ -x "$dir/$t" ] || { log "$v: $t was not built"; exit 1; }
        # Only the glibc family, libgcc_s (and the carried libomp) may remain, at glibc <= 2.34.
        bad="$(ldd "$dir/$t" | grep -Ev 'linux-vdso|ld-linux|lib(c|m|pthread|dl|rt|gcc_s)\.so|libomp\.so' || true)"
        [ -z "$bad" ] || { log "$v: $t needs more than glibc: $bad"; exit 1; }
        glibc="$(objdump -T "$dir/$t" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1)"
        [ "$(printf '%s\n' "$glibc" GLIBC_2.34 | sort -V | tail -n 1)" = GLIBC_2.34 ] \
            || { log "$v: $t needs $glibc"; exit 1; }
        if [ "$v" = amx ]; then
            # shellcheck disable=SC2016 # a literal $ORIGIN
            readelf -d "$dir/$t" | grep -q 'R.*PATH.*\[\$ORIGIN\]' \
                || { log "amx: $t has no RUNPATH \$ORIGIN"; exit 1; }
            # The carried copy, not a system one, must be the one found.
            [ "$(ldd "$dir/$t" | awk '/libomp/ {print $3}')" = "$dir/libomp.so.5" ] \
                || { log "amx: $t does not load $dir/libomp.so.5"; exit 1; }
        fi
    done
    local amx_ops
    amx_ops="$(objdump -d --no-show-raw-insn "$dir/llama-bench" | grep -cE '\s(tdpbssd|tdpbusd|tdpbf16ps|ldtilecfg|tileloadd|tilezero)\s' || true)"
    if [ "$v" = amx ]; then
        [ "$amx_ops" -gt 0 ] || { log "amx: no AMX instructions in llama-bench"; exit 1; }
    else
        [ "$amx_ops" = 0 ] || { log "noamx: $amx_ops AMX instructions in llama-bench"; exit 1; }
    fi
    log "$v: ok ($amx_ops AMX instructions in llama-bench; ldd: $(ldd "$dir/llama-bench" | awk '{print $1}' | tr '\n' ' '))"
}

IFS=',' read -r -a chosen <<< "$variants"
for v in "${chosen[@]}"; do
    case "$v" in
        noamx|amx) ;;
        *) log "unknown variant $v (noamx, amx)"; exit 2 ;;
    esac
done
for v in "${chosen[@]}"; do
    log "building $v"
    "build_$v"
    check "$v" "$cache/device-$v/bin"
done
for v in "${chosen[@]}"; do
    echo "$v $cache/device-$v/bin"
done
