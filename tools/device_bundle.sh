#!/usr/bin/env bash
# Fills .device-bin/ (git-ignored) with what bench/device_issue5.sh needs on the device host,
# which has no network and no Rust toolchain (its python3 has numpy and pyyaml, not gguf):
#
#   rustorch-cli             $RUSTORCH_CLI or target/release/rustorch-cli, stripped
#   llama-noamx/             llama-bench, llama-quantize, llama-completion, llamacpp-greedy
#                            (GCC, no AMX), stripped
#   llama-amx/               llama-bench, llama-completion, llamacpp-greedy (clang, AMX) and the
#                            libomp.so.5 they load, stripped (llama-completion: greedy text to
#                            compare; llamacpp-greedy: tools/llamacpp_diff.py --llama-bin/--amx-bin)
#   mkmodel.py               $MKMODEL or ../shared/tools/mkmodel.py (random-weight GGUF models)
#   whl/gguf-*.whl           the gguf package mkmodel.py imports (pure Python)
#   time                     GNU time (for the peak RSS), in case the host lacks /usr/bin/time
#   BUNDLE.txt               where each piece came from (device_issue5.sh quotes it)
#
# Both llama.cpp builds come from tools/build_llamacpp_device.sh (built when not cached).
# test-backend-ops goes in too with DEVICE_BUNDLE_TESTS=1 (about 2x5 MiB more). The real
# SmolLM2-135M Q4_1 file (94 MiB) does not fit the 64 MiB that a device call carries, so the
# device makes its models with mkmodel.py. With DEVICE_BUNDLE_XZ=1 the binaries are stored
# xz-compressed (NAME.xz, about 10 MiB in all instead of 44; bench/device_issue5.sh unpacks them
# to /tmp), for when the working tree grows. Fails when the folder exceeds 60 MiB, or when it and
# the working tree that travels with it (tracked and untracked, not ignored) exceed 64 MiB.
#
# usage: tools/device_bundle.sh          then carry [".device-bin"] in the device call
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/.device-bin"
limit_mib=60
gguf_version="${GGUF_VERSION:-0.19.0}"
log() { echo "device_bundle: $*" >&2; }

cli="${RUSTORCH_CLI:-$root/target/release/rustorch-cli}"
[ -x "$cli" ] || { log "no rustorch-cli at $cli (set RUSTORCH_CLI)"; exit 1; }
mkmodel="${MKMODEL:-$root/../shared/tools/mkmodel.py}"
[ -f "$mkmodel" ] || { log "no mkmodel.py at $mkmodel (set MKMODEL)"; exit 1; }

declare -A dirs=()
while read -r variant dir; do
    dirs[$variant]="$dir"
done < <("$root/tools/build_llamacpp_device.sh" noamx,amx | tail -n 2)
if [ -z "${dirs[noamx]:-}" ] || [ -z "${dirs[amx]:-}" ]; then
    log "tools/build_llamacpp_device.sh failed"; exit 1
fi

rm -rf "$out"
mkdir -p "$out/llama-noamx" "$out/llama-amx" "$out/whl"
strip -o "$out/rustorch-cli" "$cli"
tests=()
[ "${DEVICE_BUNDLE_TESTS:-0}" = 1 ] && tests=(test-backend-ops)
for t in llama-bench llama-quantize llama-completion llamacpp-greedy "${tests[@]}"; do
    strip -o "$out/llama-noamx/$t" "${dirs[noamx]}/$t"
done
for t in llama-bench llama-completion llamacpp-greedy "${tests[@]}"; do
    strip -o "$out/llama-amx/$t" "${dirs[amx]}/$t"
done
strip --strip-unneeded -o "$out/llama-amx/libomp.so.5" "${dirs[amx]}/libomp.so.5"
cp "$mkmodel" "$out/mkmodel.py"
cp /usr/bin/time "$out/time"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform any -d "$out/whl" "gguf==$gguf_version" >&2

{
    echo "bundled $(date -u '+%Y-%m-%d %H:%M UTC') from $(git -C "$root" rev-parse --short HEAD)" \
        "($(git -C "$root" status --porcelain --untracked-files=no | wc -l) files changed)"
    echo "rustorch-cli: $cli, built $(date -u -r "$cli" '+%Y-%m-%d %H:%M UTC'), sha256 $(sha256sum "$cli" | cut -c1-12)"
    echo "llama.cpp: llama-cpp-python $(basename "$(dirname "$(dirname "${dirs[noamx]}")")" | sed 's/^llamacpp-//')'s sources;" \
        "noamx: GCC $(gcc -dumpfullversion), -march=sapphirerapids without AMX;" \
        "amx: $(clang --version | head -n 1 | sed 's/ (.*//'), -march=sapphirerapids with ggml's AMX"
    echo "gguf $gguf_version (for mkmodel.py)"
} > "$out/BUNDLE.txt"

# The amx binaries must still find the carried libomp next to themselves.
for t in "$out"/llama-amx/llama-bench "$out"/llama-amx/llama-completion "$out"/llama-amx/llamacpp-greedy "$out"/llama-amx/test-backend-ops; do
    [ -e "$t" ] || continue
    [ "$(ldd "$t" | awk '/libomp/ {print $3}')" = "$out/llama-amx/libomp.so.5" ] \
        || { log "$t does not load the carried libomp.so.5"; exit 1; }
done
if [ "${DEVICE_BUNDLE_XZ:-0}" = 1 ]; then
    for f in "$out/rustorch-cli" "$out"/llama-*/*; do
        xz -6 -T0 "$f"
    done
fi

du -ab "$out" | sort -k2 | awk '{printf "%9.1f MiB  %s\n", $1 / 1048576, $2}' >&2
total=$(du -sb "$out" | cut -f1)
log "total $((total / 1048576)) MiB (limit $limit_mib MiB)"
[ "$total" -le $((limit_mib * 1048576)) ] || { log "too large for a device call"; exit 1; }
tree=$(cd "$root" && { git ls-files -z; git ls-files -z --others --exclude-standard; } \
    | xargs -0 -r du -cb 2>/dev/null | awk '$2 == "total" {s += $1} END {print s + 0}')
log "with the working tree ($((tree / 1048576)) MiB): $(((total + tree) / 1048576)) MiB of the 64 a device call carries"
[ $((total + tree)) -le $((64 * 1048576)) ] || { log "working tree + bundle too large for a device call"; exit 1; }
