#!/usr/bin/env bash
# Makes crates/rustorch-cli/tests/fixtures/flash_attn.json: greedy continuations from llama.cpp's
# llama-completion (tools/build_llamacpp.sh: native, no AMX) with flash attention on (its default
# on the CPU) and off, for the real SmolLM2-135M-Instruct Q4_1 and Gemma-3-270M Q4_K_M files
# (tools/fetch_models.py), so that tests/flash_attn.rs can check `rustorch-cli -fa on` and
# `-fa off` against both.
#
# The prompts take each of GGML's flash-attention paths: a short one (fewer than 64 positions:
# the one-row path for the prompt and every generated token), 151 tokens (the tiled path), and
# 519-523 tokens (a first micro-batch of 512 positions through the tiled path, the 7-11 left
# through the one-row path, then generation over a cache that llama.cpp pads to 768 positions:
# the split-keys path, in two threads' chunks). The texts are the start of the GPL-3 fixture.
# It also records llama-perplexity's final estimate with -fa on and off (see below).
#
# usage: tools/gen_flash_fixtures.sh            (repo root; writes the fixture in place)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bin="$(tools/build_llamacpp.sh | tail -n 1)"
eval "$(python3 tools/fetch_models.py --print-env)"
out=crates/rustorch-cli/tests/fixtures/flash_attn.json
threads=2
ctx=1024
gpl=crates/rustorch-llm/tests/fixtures/GPL-3
# The CPU llama.cpp runs on decides parts of its arithmetic (tools/cpu_record.py); an assignment,
# so that `set -e` stops the script if it cannot be read.
cpu="$(python3 tools/cpu_record.py)"
utf8() { python3 -c 'import sys; sys.stdout.write(sys.stdin.buffer.read().decode("utf-8", "replace"))'; }
prompts=("Once upon a time" "$(head -c 700 "$gpl")" "$(head -c 2300 "$gpl")")
n_gens=(48 48 32)
{
    echo '{'
    echo '  "generator": "tools/gen_flash_fixtures.sh",'
    echo "  \"llama_cpp\": \"llama-cpp-python 0.3.36 sources, llama-completion -c $ctx -t $threads --temp 0\","
    echo "  \"cpu\": $cpu,"
    echo "  \"ctx\": $ctx,"
    echo '  "models": ['
    first_model=1
    for model in smollm2 gemma3; do
        case "$model" in
            smollm2) f="$RUSTORCH_SMOLLM2_GGUF" ;;
            gemma3) f="$RUSTORCH_GEMMA3_GGUF" ;;
        esac
        [ "$first_model" = 1 ] || echo '    ,'
        first_model=0
        echo "    {\"model\": \"$model\", \"sha256\": \"$(sha256sum "$f" | cut -c1-64)\", \"cases\": ["
        for i in "${!prompts[@]}"; do
            p="${prompts[$i]}" n="${n_gens[$i]}"
            on="$("$bin/llama-completion" -m "$f" -p "$p" -n "$n" -c "$ctx" --temp 0 -t "$threads" \
                -no-cnv --no-display-prompt --no-warmup -fa on 2>/dev/null | utf8)"
            off="$("$bin/llama-completion" -m "$f" -p "$p" -n "$n" -c "$ctx" --temp 0 -t "$threads" \
                -no-cnv --no-display-prompt --no-warmup -fa off 2>/dev/null | utf8)"
            [ "$i" = 0 ] || echo '      ,'
            python3 -c 'import json, sys; print("      " + json.dumps({"prompt": sys.argv[1], "n_gen": int(sys.argv[2]), "fa_on": sys.argv[3], "fa_off": sys.argv[4]}, ensure_ascii=False))' \
                "$p" "$n" "$on" "$off"
        done
        echo '    ]}'
    done
    echo '  ],'
    # llama-perplexity at its defaults (-b 2048, -ub 512): chunks shorter than a batch go as
    # parallel sequences, each micro-batch taking an equal share of every sequence, so 20 chunks
    # of 128 are a group of 16 (32 rows each per micro-batch: the one-row path) then a group of 4
    # (128 rows: tiled); chunks of 512 go four at a time (tiled). Then other batch sizes: -b 256
    # -ub 100 at -c 512 decodes each chunk in two calls of micro-batches of 100, 100 and 56 positions
    # (the last through the one-row path, unlike one call of 512 in micro-batches of 100);
    # -b 512 -ub 64 at -c 128 takes groups of four chunks, 16 positions of each per micro-batch.
    # (The test passes llama's -b as --batch-size: -b picks the backend in rustorch-cli.)
    echo '  "perplexity": ['
    first=1
    for model in smollm2:"-c 128 --chunks 20" gemma3:"-c 512 --chunks 4" \
        smollm2:"-c 512 --chunks 2 -b 256 -ub 100" smollm2:"-c 128 --chunks 6 -b 512 -ub 64"; do
        name="${model%%:*}" args="${model#*:}"
        case "$name" in
            smollm2) f="$RUSTORCH_SMOLLM2_GGUF" ;;
            gemma3) f="$RUSTORCH_GEMMA3_GGUF" ;;
        esac
        for fa in on off; do
            # shellcheck disable=SC2086
            final="$("$bin/llama-perplexity" -m "$f" -f "$gpl" $args -t "$threads" -fa "$fa" 2>&1 \
                | grep -o 'Final estimate: PPL = .*')"
            [ "$first" = 1 ] || echo '    ,'
            first=0
            python3 -c 'import json, sys; print("    " + json.dumps({"model": sys.argv[1], "args": sys.argv[2].split(), "fa": sys.argv[3], "final": sys.argv[4]}))' \
                "$name" "$args" "$fa" "$final"
        done
    done
    echo '  ]'
    echo '}'
} > "$out.partial"
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$out.partial"
mv "$out.partial" "$out"
echo "gen_flash_fixtures: wrote $out" >&2
