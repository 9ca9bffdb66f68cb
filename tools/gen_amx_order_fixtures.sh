#!/usr/bin/env bash
# Makes crates/rustorch-cli/tests/fixtures/amx_order.json ON THE DEVICE HOST (a CPU with AMX):
# greedy continuations from llama.cpp built with AMX (clang, ggml-cpu/amx) and without it (GCC),
# for random-weight models, so that tests/amx_order.rs can check RUSTORCH_GGML_ORDER=amx (and the
# default order) on any machine, AMX or not.
#
# The models are made the way the test makes them: tools/mkmodel.py (F16, seeded), then
# `rustorch-cli quantize`: SmolLM2-135M's shape in Q4_1 and Q8_0 (the two legacy types with AMX
# kernels in llama.cpp that a model's every matrix can take at this shape), and mkmodel.py's
# `kquant` shape (every matrix 512 or 1536 columns: whole K-quant super-blocks) in Q4_K_M (Q4_K
# and Q6_K), Q5_K_M (Q5_K and Q6_K) and IQ4_XS. The fixture records each file's sha256, and the
# test refuses to compare if its own files differ. Random weights give nearly flat logits: a
# product that differs in one bit soon changes the greedy tokens, and the two builds' texts
# differ (the fixture shows it).
#
# usage (device, repo root, .device-bin carried from DEVICE_BUNDLE_XZ=1 tools/device_bundle.sh):
#   OUT=folder bash tools/gen_amx_order_fixtures.sh     -> $OUT/amx_order.json
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out="${OUT:?set OUT to a folder}"
mkdir -p "$out"
n_gen=32
threads=2
bin="${DEVICE_BIN:-$root/.device-bin}"
log() { echo "gen_amx_order_fixtures: $*" >&2; }
# shellcheck source=../tools/device_lib.sh
source "$root/tools/device_lib.sh"
bin="$(device_bundle "$bin")"
device_gguf "$bin"
grep -qw amx_int8 /proc/cpuinfo || { log "this CPU has no AMX-INT8"; exit 1; }

work=/tmp/rustorch-amx-order
mkdir -p "$work"
for shape in smollm2 kquant; do
    [ -f "$work/$shape-f16.gguf" ] || python3 tools/mkmodel.py "$shape" "$work/$shape-f16.gguf" >&2
done
prompts=("Once upon a time" "The meaning of life is" "1, 2, 3, 4," "In the beginning")
# The CPU llama.cpp runs on decides parts of its arithmetic (tools/cpu_record.py); an assignment,
# so that `set -e` stops the script if it cannot be read.
cpu="$(python3 tools/cpu_record.py)"
utf8() { python3 -c 'import sys; sys.stdout.write(sys.stdin.buffer.read().decode("utf-8", "replace"))'; }
{
    echo '{'
    echo '  "generator": "tools/gen_amx_order_fixtures.sh",'
    echo "  \"llama_cpp\": $(grep -m1 '^llama.cpp:' "$bin/BUNDLE.txt" | python3 -c 'import json, sys; print(json.dumps(sys.stdin.read().strip()))'),"
    echo "  \"cpu\": $cpu,"
    echo "  \"n_gen\": $n_gen,"
    echo '  "models": ['
    first_model=1
    for model in smollm2:Q4_1 smollm2:Q8_0 kquant:Q4_K_M kquant:Q5_K_M kquant:IQ4_XS; do
        shape="${model%%:*}" qtype="${model#*:}"
        f="$work/$shape-$qtype.gguf"
        "$bin/rustorch-cli" quantize "$work/$shape-f16.gguf" "$f" "$qtype" >/dev/null 2>&1
        [ "$first_model" = 1 ] || echo '    ,'
        first_model=0
        echo "    {\"shape\": \"$shape\", \"qtype\": \"$qtype\", \"sha256\": \"$(sha256sum "$f" | cut -c1-64)\", \"cases\": ["
        first=1
        for p in "${prompts[@]}"; do
            amx="$("$bin/llama-amx/llama-completion" -m "$f" -p "$p" -n "$n_gen" --temp 0 -t "$threads" \
                -no-cnv --no-display-prompt --no-warmup -fa off 2>/dev/null | utf8)"
            noamx="$("$bin/llama-noamx/llama-completion" -m "$f" -p "$p" -n "$n_gen" --temp 0 -t "$threads" \
                -no-cnv --no-display-prompt --no-warmup -fa off 2>/dev/null | utf8)"
            [ "$first" = 1 ] || echo '      ,'
            first=0
            python3 -c 'import json, sys; print("      " + json.dumps({"prompt": sys.argv[1], "amx": sys.argv[2], "noamx": sys.argv[3]}, ensure_ascii=False))' \
                "$p" "$amx" "$noamx"
        done
        echo '    ]}'
    done
    echo '  ]'
    echo '}'
} > "$out/amx_order.json"
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$out/amx_order.json"
log "wrote $out/amx_order.json"
