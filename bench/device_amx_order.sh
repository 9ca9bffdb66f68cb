#!/usr/bin/env bash
# Greedy output of rustorch-cli against llama.cpp's two device builds, on the device host (AMX):
# with RUSTORCH_GGML_ORDER=amx against the clang AMX build, and with the default (reference) order
# against the GCC build without AMX. Run from the repo root with .device-bin/ carried
# (DEVICE_BUNDLE_XZ=1 tools/device_bundle.sh). Random-weight models (mkmodel.py) have nearly
# flat logits, so a product that differs in one bit soon changes the greedy tokens: equal text
# over N tokens is a sharp test of equal arithmetic. Both run with -fa off by default, or with
# flash attention (-f on: llama.cpp's default on the CPU, which sums attention in another order).
#
# usage: bench/device_amx_order.sh [-m MODELS] [-n 48] [-t 2] [-f off|on]
#   MODELS: comma-separated, of tinyllama-q8_0 (default), smollm2-shape-q4_1 (compare_llamacpp.sh names)
# Prints one line per model and build: "same" or "DIFFERENT" (then both texts); exits 1 on any
# difference. A carried .device-bin/rustorch_core_tests (the library's unit tests, stripped)
# runs first, filtered to the AMX-order and tile tests.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
models="tinyllama-q8_0"
n_gen=48
threads=2
fa=off
while [ $# -gt 0 ]; do
    case "$1" in
        -m) models="$2"; shift 2 ;;
        -n) n_gen="$2"; shift 2 ;;
        -t) threads="$2"; shift 2 ;;
        -f) fa="$2"; shift 2 ;;
        *) echo "device_amx_order: unknown option $1" >&2; exit 2 ;;
    esac
done
log() { echo "device_amx_order: $*" >&2; }
bin="${DEVICE_BIN:-$root/.device-bin}"
# shellcheck source=../tools/device_lib.sh
source "$root/tools/device_lib.sh"
bin="$(device_bundle "$bin")"

if [ -x "$bin/rustorch_core_tests" ]; then
    log "unit tests: amx_order and amx"
    "$bin/rustorch_core_tests" amx 2>&1 | tail -n 20
fi

device_gguf "$bin"
export RUSTORCH_CLI="$bin/rustorch-cli" LLAMA_BIN="$bin/llama-noamx" MKMODEL="$bin/mkmodel.py"
export BENCH_MODELS_DIR="${MODELS_DIR:-/tmp/rustorch-bench-models}" QUANT_THREADS="$(nproc)"
bash bench/compare_llamacpp.sh -m "$models" -p 1 -n 0 -r 1 -t "$threads" --models-only >/dev/null 2>&1 \
    || { log "making the models failed"; exit 1; }

prompt="Once upon a time"
status=0
IFS=, read -r -a list <<< "$models"
for m in "${list[@]}"; do
    f="$BENCH_MODELS_DIR/$m.gguf"
    [ -f "$f" ] || { log "no model $f"; exit 1; }
    for build in amx noamx; do
        order=reference
        [ "$build" = amx ] && order=amx
        # llama.cpp prints a stray byte token as it is, rustorch as U+FFFD: compare both as
        # UTF-8 with replacement characters.
        theirs="$("$bin/llama-$build/llama-completion" -m "$f" -p "$prompt" -n "$n_gen" --temp 0 -t "$threads" \
            -no-cnv --no-display-prompt --no-warmup -fa "$fa" 2>/dev/null \
            | python3 -c 'import sys; sys.stdout.write(sys.stdin.buffer.read().decode("utf-8", "replace"))' || true)"
        ours="$(RUSTORCH_GGML_ORDER=$order "$bin/rustorch-cli" -m "$f" -p "$prompt" -n "$n_gen" --temp 0 -fa "$fa" \
            -t "$threads" 2>/dev/null || true)"
        # Both end with a newline or not; compare the generated text itself.
        if [ "$(printf '%s' "$theirs" | tr -d '\n')" = "$(printf '%s' "$ours" | tr -d '\n')" ] && [ -n "$ours" ]; then
            echo "$m: RUSTORCH_GGML_ORDER=$order vs llama.cpp $build build: same ($n_gen tokens)"
        else
            echo "$m: RUSTORCH_GGML_ORDER=$order vs llama.cpp $build build: DIFFERENT"
            echo "  llama.cpp: $(printf '%q' "$theirs")"
            echo "  rustorch:  $(printf '%q' "$ours")"
            status=1
        fi
    done
done
exit "$status"
