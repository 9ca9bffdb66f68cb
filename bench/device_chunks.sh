#!/usr/bin/env bash
# Prompt speed of rustorch-cli at several micro-batch / feed-forward chunk sizes, against
# llama.cpp's AMX build, on the device host: rounds of one `bench -p P -n 0` per setting, in
# turn, so that the host's drifting speed affects every setting alike (the host is noisy: one
# setting's runs vary by 20% between rounds). Run from the repo root with .device-bin/ carried
# (DEVICE_BUNDLE_XZ=1 tools/device_bundle.sh); it makes SmolLM2-shape Q4_1 with mkmodel.py when
# $MODELS_DIR lacks it (as bench/device_issue5.sh does).
#
# usage: bench/device_chunks.sh [-r ROUNDS] [-p 512] [-c 2,3] [-t 2] [-m MODEL.gguf] [SETTING ...]
#   SETTING: UBATCH/FFN_CHUNK rows, e.g. 256/128 (RUSTORCH_UBATCH / RUSTORCH_FFN_CHUNK), or
#            "default" (neither set); default settings: default 256/128 256/256 512/512
# Prints one line per round (t/s of each setting, mean ± sd of its 3 repetitions) and the means
# over the rounds. The bits do not depend on the setting (crates/rustorch-llm/tests/batching.rs).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
rounds=5
n_prompt=512
cpus=2,3
threads=2
model=""
bin="${DEVICE_BIN:-$root/.device-bin}"
models_dir="${MODELS_DIR:-/tmp/rustorch-bench-models}"
settings=()

usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
    case "$1" in
        -r) rounds="$2"; shift 2 ;;
        -p) n_prompt="$2"; shift 2 ;;
        -c) cpus="$2"; shift 2 ;;
        -t) threads="$2"; shift 2 ;;
        -m) model="$2"; shift 2 ;;
        -h|--help) usage 0 ;;
        -*) echo "device_chunks: unknown option $1" >&2; usage 2 ;;
        *) settings+=("$1"); shift ;;
    esac
done
[ ${#settings[@]} -gt 0 ] || settings=(default 256/128 256/256 512/512)
for s in "${settings[@]}"; do
    [[ "$s" = default || "$s" =~ ^[0-9]+/[0-9]+$ ]] || { echo "device_chunks: bad setting $s (UBATCH/FFN_CHUNK or default)" >&2; exit 2; }
done
log() { echo "device_chunks: $*" >&2; }

# shellcheck source=../tools/device_lib.sh
source "$root/tools/device_lib.sh"
bin="$(device_bundle "$bin")"
for f in "$bin/rustorch-cli" "$bin/llama-amx/llama-bench"; do
    [ -e "$f" ] || { log "missing $f: run tools/device_bundle.sh and carry .device-bin"; exit 1; }
done
if [ -z "$model" ]; then
    model="$models_dir/smollm2-shape-q4_1.gguf"
    if [ ! -s "$model" ]; then
        device_gguf "$bin"
        mkdir -p "$models_dir"
        log "making $model (mkmodel.py smollm2, llama-quantize Q4_1)"
        python3 "$bin/mkmodel.py" smollm2 "$models_dir/smollm2-f16.gguf" >&2
        "$bin/llama-noamx/llama-quantize" "$models_dir/smollm2-f16.gguf" "$model" Q4_1 "$(nproc)" > /dev/null
        rm -f "$models_dir/smollm2-f16.gguf"
    fi
fi

# The t/s column of a llama-bench-shaped table's pp row: "mean±sd".
tps() { awk -F'|' -v t="pp$n_prompt" '$0 ~ t" " { gsub(/ /, "", $8); print $8 }'; }
run_ours() {
    local s="$1" env=()
    [ "$s" = default ] || env=(RUSTORCH_UBATCH="${s%/*}" RUSTORCH_FFN_CHUNK="${s#*/}")
    env "${env[@]}" taskset -c "$cpus" "$bin/rustorch-cli" bench -m "$model" -t "$threads" -p "$n_prompt" -n 0 -r 3 2>/dev/null | tps
}

declare -A sum=()
echo "pp$n_prompt t/s, $threads threads on cores $cpus, $model"
echo "round | llama.cpp AMX | ${settings[*]}"
for r in $(seq 1 "$rounds"); do
    a="$(taskset -c "$cpus" "$bin/llama-amx/llama-bench" -m "$model" -t "$threads" -p "$n_prompt" -n 0 -r 3 2>/dev/null | tps)"
    [ -n "$a" ] || { log "llama-bench gave no pp$n_prompt result"; exit 1; }
    line="$r | $a"
    sum[amx]=$(python3 -c "print(${sum[amx]:-0} + float('$a'.split('±')[0]))")
    for s in "${settings[@]}"; do
        v="$(run_ours "$s")"
        [ -n "$v" ] || { log "rustorch-cli bench gave no pp$n_prompt result at $s"; exit 1; }
        line+=" | $v"
        sum[$s]=$(python3 -c "print(${sum[$s]:-0} + float('$v'.split('±')[0]))")
    done
    echo "$line"
done
means="mean | $(python3 -c "print(f'{${sum[amx]} / $rounds:.2f}')")"
for s in "${settings[@]}"; do
    means+=" | $(python3 -c "print(f'{${sum[$s]} / $rounds:.2f}')")"
done
echo "$means"
