#!/usr/bin/env bash
# Issue 5's speed comparison on the device host (Intel Xeon with AVX-512 VNNI and AMX, no
# network, no Rust): run from the repo root with .device-bin/ carried (tools/device_bundle.sh
# fills it here). It installs the carried gguf wheel, makes the models with mkmodel.py (random
# weights at the real shapes: F16, then the noamx llama-quantize on all cores) under $MODELS_DIR,
# checks that the AMX build really uses AMX there, and runs bench/compare_llamacpp.sh pinned to
# cores 2-3 with 2 threads: rustorch-cli against llama.cpp built with GCC without AMX (the usual
# reference) and, in the same interleaved repetitions, llama.cpp built with clang and AMX.
#
# usage: bench/device_issue5.sh [-m MODELS] [-p 128,512] [-n 128] [-r 2] [-c 2,3] [-t 2] [-A]
#   MODELS: comma-separated, of tinyllama-q4_k_m (default), tinyllama-q8_0, smollm2-shape-q4_1
#   -p: prompt sizes; one table per size; the generation test (-n) runs with the last one
#       only, the others are prompt-only (-n 0). The issue quotes pp128 for the AMX comparison.
#   -A: leave out the AMX build
# Environment: the same as flags, MODELS, N_PROMPT, N_GEN, REPS, CPUS, THREADS, AMX=0;
# DEVICE_BIN (default .device-bin), MODELS_DIR (default /tmp/rustorch-bench-models), OUT (a
# folder: the tables go to $OUT/issue5.md, the logs next to it).
# rustorch-cli multiplies in llama.cpp's order for this CPU when built natively (the AMX build's on
# the device host) unless RUSTORCH_GGML_ORDER says otherwise; the report names the order.
# TinyLlama Q4_K_M alone at -r 2 takes about 4 minutes on the idle host (model making included).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
models="${MODELS:-tinyllama-q4_k_m}"
prompts="${N_PROMPT:-128,512}"
n_gen="${N_GEN:-128}"
reps="${REPS:-2}"
cpus="${CPUS:-2,3}"
threads="${THREADS:-2}"
amx="${AMX:-1}"
bin="${DEVICE_BIN:-$root/.device-bin}"
models_dir="${MODELS_DIR:-/tmp/rustorch-bench-models}"

usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
    case "$1" in
        -m) models="$2"; shift 2 ;;
        -p) prompts="$2"; shift 2 ;;
        -n) n_gen="$2"; shift 2 ;;
        -r) reps="$2"; shift 2 ;;
        -c) cpus="$2"; shift 2 ;;
        -t) threads="$2"; shift 2 ;;
        -A) amx=0; shift ;;
        -h|--help) usage 0 ;;
        *) echo "device_issue5: unknown option $1" >&2; usage 2 ;;
    esac
done
log() { echo "device_issue5: $*" >&2; }
start=$SECONDS

# --- what was carried ------------------------------------------------------------------------
# shellcheck source=../tools/device_lib.sh
source "$root/tools/device_lib.sh"
bin="$(device_bundle "$bin")"
need=("$bin/rustorch-cli" "$bin/llama-noamx/llama-bench" "$bin/llama-noamx/llama-quantize" "$bin/mkmodel.py")
[ "$amx" = 1 ] && need+=("$bin/llama-amx/llama-bench")
for f in "${need[@]}"; do
    [ -e "$f" ] || { log "missing $f: run tools/device_bundle.sh and carry .device-bin"; exit 1; }
done

if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    report="$OUT/issue5.md"
    logs="$OUT"
else
    logs="$(mktemp -d)"
    report="$logs/issue5.md"
fi

device_gguf "$bin"
python3 -c 'import gguf, numpy' || { log "python3 cannot import gguf and numpy"; exit 1; }

time_bin=/usr/bin/time
[ -x "$time_bin" ] || time_bin="$bin/time"
if ! command -v taskset >/dev/null; then
    log "no taskset: running unpinned"
    cpus=""
fi

# --- the run ---------------------------------------------------------------------------------
{
    echo "## Device host, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores;" \
        "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo
    [ -f "$bin/BUNDLE.txt" ] && { sed 's/^/    /' "$bin/BUNDLE.txt"; echo; }
    echo "Command: bench/device_issue5.sh -m $models -p $prompts -n $n_gen -r $reps -c ${cpus:-none} -t $threads$([ "$amx" = 1 ] || echo ' -A')"
    echo
    devices="$("$bin/rustorch-cli" devices 2>/dev/null || true)"
    echo "rustorch-cli: $(grep '^llama.cpp order' <<< "$devices" || echo 'order unknown')"
    echo
} > "$report"

export RUSTORCH_CLI="$bin/rustorch-cli" LLAMA_BIN="$bin/llama-noamx" MKMODEL="$bin/mkmodel.py"
QUANT_THREADS="$(nproc)"
export BENCH_MODELS_DIR="$models_dir" QUANT_THREADS TIME_BIN="$time_bin"
[ "$amx" = 1 ] && export LLAMA_BIN_AMX="$bin/llama-amx"

# Models first (compare_llamacpp.sh makes them: mkmodel.py + llama-quantize on all cores).
log "making the models ($models) in $models_dir"
bash bench/compare_llamacpp.sh -m "$models" -p 1 -n 0 -r 1 -t "$threads" --models-only 2> "$logs/models.log" \
    || { cat "$logs/models.log" >&2; log "making the models failed"; exit 1; }
log "models ready after $((SECONDS - start)) s"

if [ "$amx" = 1 ]; then
    # ggml falls back to its AVX-512 kernels without a word in the table when the kernel refuses
    # AMX (arch_prctl ARCH_REQ_XCOMP_PERM): look for its AMX weight buffer in a verbose run.
    model_file="$models_dir/${models%%,*}.gguf"
    "$bin/llama-amx/llama-bench" -m "$model_file" -t "$threads" -p 16 -n 0 -r 1 -v > "$logs/amx-check.log" 2>&1 || true
    if grep -q 'AMX model buffer size' "$logs/amx-check.log"; then
        echo "AMX build: weights in ggml's AMX buffer ($(grep -m1 'AMX model buffer size' "$logs/amx-check.log" | sed 's/.*= *//'))." >> "$report"
    else
        echo "AMX build: WARNING, no AMX buffer in its verbose log ($(grep -m1 -i 'amx' "$logs/amx-check.log" || echo 'no AMX line')): it ran without AMX." >> "$report"
    fi
    echo >> "$report"
fi

IFS=',' read -r -a sizes <<< "$prompts"
last=$(( ${#sizes[@]} - 1 ))
for k in "${!sizes[@]}"; do
    p="${sizes[$k]}"
    n=0
    [ "$k" = "$last" ] && n="$n_gen"
    pin=()
    [ -n "$cpus" ] && pin=(-c "$cpus")
    log "pp$p$([ "$n" = 0 ] || echo " tg$n"): bench/compare_llamacpp.sh -p $p -n $n -r $reps -t $threads ${pin[*]} -m $models"
    bash bench/compare_llamacpp.sh -p "$p" -n "$n" -r "$reps" -t "$threads" "${pin[@]}" -m "$models" \
        > "$logs/table-pp$p.md" 2> "$logs/compare-pp$p.log" \
        || { tail -n 30 "$logs/compare-pp$p.log" >&2; log "compare_llamacpp.sh failed (pp$p)"; exit 1; }
    { cat "$logs/table-pp$p.md"; echo; } >> "$report"
    log "pp$p done after $((SECONDS - start)) s"
done
echo "Total $((SECONDS - start)) s." >> "$report"
cat "$report"
