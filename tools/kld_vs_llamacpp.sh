#!/usr/bin/env bash
# `rustorch-cli perplexity --kl-divergence-base / --kl-divergence` against
# llama-perplexity's, both on the CPU of this machine: the base files the two
# write for BASE_MODEL must be byte-identical, and the KL-divergence report
# of Q_MODEL against llama.cpp's base must print the same figures from both
# programs (llama.cpp's stdout also carries an ETA line, dropped here).
# llama.cpp comes from tools/build_llamacpp.sh (built on first use).
#
# usage: tools/kld_vs_llamacpp.sh BASE_MODEL Q_MODEL [TEXT] [CTX] [CHUNKS]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
base_model="$1"
q_model="$2"
text="${3:-$root/crates/rustorch-llm/tests/fixtures/GPL-3}"
ctx="${4:-128}"
chunks="${5:-4}"
llama="$(bash "$root/tools/build_llamacpp.sh" | tail -1)"
cli="$root/target/release/rustorch-cli"
cargo build --release -q -p rustorch-cli --manifest-path "$root/Cargo.toml"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
common=(-c "$ctx" -t "$(nproc)" -fa off)
"$llama/llama-perplexity" -m "$base_model" -f "$text" --chunks "$chunks" "${common[@]}" \
    --kl-divergence-base "$work/llama.kld" > /dev/null 2>&1
"$cli" perplexity -m "$base_model" -f "$text" --chunks "$chunks" "${common[@]}" -b cpu \
    --kl-divergence-base "$work/ours.kld" > /dev/null 2>&1
if cmp -s "$work/llama.kld" "$work/ours.kld"; then
    echo "base files: byte-identical ($(stat -c %s "$work/ours.kld") bytes)"
else
    echo "base files differ: $(cmp "$work/llama.kld" "$work/ours.kld" | head -1)"
fi
"$llama/llama-perplexity" -m "$q_model" "${common[@]}" --kl-divergence-base "$work/llama.kld" --kl-divergence \
    2> /dev/null | grep -v "minutes$" | grep -v '^$' > "$work/llama.txt"
"$cli" perplexity -m "$q_model" "${common[@]}" -b cpu --kl-divergence-base "$work/llama.kld" --kl-divergence \
    2> /dev/null | grep -v '^$' > "$work/ours.txt"
if diff "$work/llama.txt" "$work/ours.txt" > "$work/diff.txt"; then
    echo "KL-divergence reports: identical ($(wc -l < "$work/ours.txt") lines)"
else
    echo "KL-divergence reports differ:"
    cat "$work/diff.txt"
fi
grep -E "Mean    KLD|Same top p" "$work/ours.txt"
