#!/usr/bin/env bash
# Packs, HERE, what the device host (no network, no Rust) needs to build llama.cpp's CUDA tools
# and to make issue 33's benchmark models: .device-llamacpp/src.tar.xz (git-ignored, about
# 2.3 MB: 23 MB of sources), carried to the device and unpacked there by tools/build_llamacpp_cuda_device.sh.
#
# usage: tools/pack_llamacpp_src.sh [VERSION]      (llama-cpp-python's version, default 0.3.36)
#
# Inside (one top folder, llamacpp-src/):
#   - llama.cpp's sources as llama-cpp-python VERSION vendors them (tools/llamacpp_src.sh's cache,
#     fetched with pip on first use), cut to what a CUDA build of llama-bench, llama-perplexity,
#     llama-completion, llama-quantize, llama-tokenize and llamacpp-greedy configures and compiles:
#     the top CMakeLists.txt, LICENSE, cmake/, include/, src/, common/, vendor/ (every folder that
#     vendor/CMakeLists.txt adds), ggml/ with only its CPU and CUDA backends (ggml/src adds a
#     backend's folder only when GGML_<BACKEND>=ON), and tools/ with only those tools' folders and
#     a tools/CMakeLists.txt that adds only them (llama.cpp's adds a dozen tools unconditionally).
#     Configure with LLAMA_BUILD_TESTS/EXAMPLES/SERVER/APP=OFF (tests/, examples/, pocs/, app/ and
#     tools/server are dropped).
#   - tools/rustorch-greedy: the repo's tools/llamacpp_greedy.cpp with one change in this copy
#     only: mparams.n_gpu_layers comes from $LLAMACPP_GREEDY_NGL (default 0, as the repo's file:
#     CPU only), so that the CUDA build can put every layer on the GPU (LLAMACPP_GREEDY_NGL=99).
#   - gguf-py/gguf (llama.cpp's own gguf package, for mkmodel.py; needs numpy and pyyaml, which
#     the device image has) and rustorch/mkmodel.py (../shared/tools/mkmodel.py, or $MKMODEL).
#   - PACK_INFO: version, date, sha256 of the greedy source.
# Prints the archive's path and size; fails when it is over 15 MiB (carry is 64 MiB per call).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
version="${1:-0.3.36}"
cache="${RUSTORCH_CACHE:-$HOME/.cache/rustorch}/llamacpp-$version"
out_dir="$root/.device-llamacpp"
out="$out_dir/src.tar.xz"
log() { echo "pack_llamacpp_src: $*" >&2; }

# shellcheck source=tools/llamacpp_src.sh
. "$here/llamacpp_src.sh"
llamacpp_src "$cache" "$version"
src="$cache/src"

mkmodel="${MKMODEL:-}"
for m in "$mkmodel" "$root/tools/mkmodel.py" "$root/../shared/tools/mkmodel.py"; do
    if [ -n "$m" ] && [ -f "$m" ]; then mkmodel="$m"; break; fi
done
[ -f "$mkmodel" ] || { log "mkmodel.py not found (../shared/tools/mkmodel.py; or set MKMODEL)"; exit 1; }

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
dst="$stage/llamacpp-src"
mkdir -p "$dst"

copy() { # PATH... relative to $src
    local p
    for p in "$@"; do
        [ -e "$src/$p" ] || { log "missing in the sources: $p"; exit 1; }
        mkdir -p "$dst/$(dirname "$p")"
        cp -a "$src/$p" "$dst/$p"
    done
}

copy CMakeLists.txt LICENSE cmake include src common vendor
# ggml: its build files and headers, the backend-independent sources, the CPU and CUDA backends.
copy ggml/CMakeLists.txt ggml/cmake ggml/include ggml/src/ggml-cpu ggml/src/ggml-cuda
find "$src/ggml/src" -maxdepth 1 -type f -printf '%f\n' | while read -r f; do copy "ggml/src/$f"; done
# Only the tools that are built.
tools=(llama-bench completion perplexity quantize tokenize rustorch-greedy)
for t in "${tools[@]}"; do copy "tools/$t"; done
{
    echo "# Written by tools/pack_llamacpp_src.sh (RusTorch): only the tools the device builds."
    echo "find_package(Threads REQUIRED)"
    echo "llama_add_compile_flags()"
    for t in "${tools[@]}"; do echo "add_subdirectory($t)"; done
} > "$dst/tools/CMakeLists.txt"

# Every subdirectory that the kept CMakeLists.txt files add must be there, except those added only
# under options the device build turns off (LLAMA_BUILD_TESTS/EXAMPLES/APP/MTMD, GGML's own
# tests and examples, which are off when ggml is a subproject).
conditional=" tests examples pocs app tools/mtmd "
missing=0
while IFS= read -r cml; do
    d="$(dirname "$cml")"
    while read -r sub; do
        case "$sub" in *'$'*) continue ;; esac # a variable: checked by the configure itself
        case "$conditional" in *" $sub "*) [ "$d" = "$dst" ] || [ "$d" = "$dst/ggml" ] && continue ;; esac
        [ -d "$d/$sub" ] || { log "${cml#"$dst"/} adds $sub, which is not packed"; missing=1; }
    done < <(grep -hoE '^\s*add_subdirectory\(\s*[^ )]+' "$cml" | sed -E 's/.*\(\s*//')
done < <(find "$dst" -name CMakeLists.txt -not -path '*/ggml/src/*')
[ "$missing" = 0 ] || exit 1

# The greedy program: layers on the GPU from $LLAMACPP_GREEDY_NGL (this copy only).
g="$dst/tools/rustorch-greedy/llamacpp_greedy.cpp"
[ "$(grep -c 'mparams.n_gpu_layers = 0;' "$g")" = 1 ] \
    || { log "llamacpp_greedy.cpp: expected one 'mparams.n_gpu_layers = 0;' to patch"; exit 1; }
sed -i 's|mparams.n_gpu_layers = 0;|mparams.n_gpu_layers = getenv("LLAMACPP_GREEDY_NGL") ? atoi(getenv("LLAMACPP_GREEDY_NGL")) : 0; // RusTorch device pack: -ngl from the environment|' "$g"
grep -q '<cstdlib>' "$g" || { log "llamacpp_greedy.cpp no longer includes <cstdlib>"; exit 1; }

mkdir -p "$dst/gguf-py" "$dst/rustorch"
cp -a "$src/gguf-py/gguf" "$dst/gguf-py/gguf"
cp "$mkmodel" "$dst/rustorch/mkmodel.py"
find "$dst" -name __pycache__ -prune -exec rm -rf {} +

{
    echo "llama-cpp-python $version (llama.cpp as it vendors it)"
    echo "packed $(date -u +%Y-%m-%dT%H:%M:%SZ) by tools/pack_llamacpp_src.sh"
    echo "llamacpp_greedy.cpp sha256 $(sha256sum "$here/llamacpp_greedy.cpp" | cut -d' ' -f1) (+ LLAMACPP_GREEDY_NGL patch)"
    echo "mkmodel.py sha256 $(sha256sum "$mkmodel" | cut -d' ' -f1)"
} > "$dst/PACK_INFO"

mkdir -p "$out_dir"
tar -C "$stage" --owner=0 --group=0 --sort=name -cf - llamacpp-src | xz -9 -T1 > "$out.partial"
mv "$out.partial" "$out"
size="$(stat -c %s "$out")"
log "$(du -sh "$dst" | cut -f1) of sources -> $out ($((size / 1024)) KiB)"
[ "$size" -le $((15 * 1024 * 1024)) ] || { log "over 15 MiB: too large to carry beside the rest"; exit 1; }
echo "$out"
