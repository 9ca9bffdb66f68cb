#!/usr/bin/env bash
# A GGUF model on the GPU against the same binary on the CPU, on the device
# host (no Rust there): greedy continuations with -b cpu, -b cuda and
# partial offloads (-ngl), compared token by token with the margin of the
# CPU's top two logits where they part; then `bench` on both.
#
# The model travels in pieces (carry is 64 MiB per call): each call with
# `stash` keeps its piece in /tmp/rustorch-model; the call that runs puts
# them together. What runs: the rustorch-cli built with --features cuda,
# stripped and xz-compressed into .device-cli/rustorch-cli.xz.
#
#   bash bench/device_cuda_model.sh stash .device-model/smollm2.part.aa
#   bash bench/device_cuda_model.sh run smollm2 .device-model/prompts.jsonl [N_TOKENS]
# QUICK=1 skips -ngl 0 and the CPU bench.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
store=/tmp/rustorch-model
mkdir -p "$store"
case "${1:-}" in
stash)
    shift
    for f in "$@"; do cp "$root/$f" "$store/" && echo "stashed $(basename "$f") ($(stat -c %s "$store/$(basename "$f")") bytes)"; done
    exit 0
    ;;
run) ;;
*)
    echo "usage: $0 stash FILE... | run NAME PROMPTS [N]" >&2
    exit 2
    ;;
esac
name="$2"
prompts="$root/$3"
n="${4:-32}"
for f in "$root"/.device-model/"$name".part.*; do [ -e "$f" ] && cp "$f" "$store/"; done
model="$store/$name.gguf"
cat "$store/$name".part.* > "$model"
echo "model: $name, $(stat -c %s "$model") bytes"
cli=/tmp/rustorch-cli
xz -dc "$root/.device-cli/rustorch-cli.xz" > "$cli" && chmod +x "$cli"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export RUSTORCH_CUDA_CACHE=/tmp/rustorch-cuda-cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
rc=0
"$cli" greedy -m "$model" -f "$prompts" -n "$n" -b cpu > /tmp/g-cpu.jsonl 2>/tmp/g-cpu.err || { cat /tmp/g-cpu.err; rc=1; }
run_gpu() {
    local tag="$1"
    shift
    local t0=$(date +%s%N)
    "$cli" greedy -m "$model" -f "$prompts" -n "$n" -b cuda "$@" > "/tmp/g-$tag.jsonl" 2>"/tmp/g-$tag.err" || {
        tail -5 "/tmp/g-$tag.err"
        rc=1
    }
    grep -E "placement|backend" "/tmp/g-$tag.err" | head -2
    echo "  ($(( ($(date +%s%N) - t0) / 1000000 )) ms)"
}
run_gpu all
[ -n "${QUICK:-}" ] || run_gpu ngl0 -ngl 0
run_gpu ngl10 -ngl 10
python3 - "$n" <<'PY'
import json, sys
def read(p):
    try:
        return {j["id"]: j for j in map(json.loads, open(p))}
    except Exception as e:
        print(f"{p}: {e}")
        return {}
cpu = read("/tmp/g-cpu.jsonl")
import os
for tag in [t for t in ["all", "ngl0", "ngl10"] if os.path.exists(f"/tmp/g-{t}.jsonl")]:
    gpu = read(f"/tmp/g-{tag}.jsonl")
    same = 0
    notes = []
    for pid, c in cpu.items():
        g = gpu.get(pid)
        if g is None:
            notes.append(f"{pid}: missing")
            continue
        if g["tokens"] == c["tokens"]:
            same += 1
            continue
        k = next(i for i, (a, b) in enumerate(zip(c["tokens"] + [None], g["tokens"] + [None])) if a != b)
        top = c["top"][k] if k < len(c["top"]) else None
        margin = top[1] - top[3] if top else float("nan")
        gl = g["top"][k] if k < len(g["top"]) else None
        notes.append(f"{pid}: parts at step {k}, cpu top-2 margin {margin:.4f}, gpu top {gl[0] if gl else None} vs cpu {top[0] if top else None}")
    # Logit distance over the steps both took the same way.
    worst = 0.0
    for pid, c in cpu.items():
        g = gpu.get(pid)
        if not g:
            continue
        for a, b in zip(c["top"], g["top"]):
            if a[0] != b[0]:
                break
            worst = max(worst, abs(a[1] - b[1]))
    print(f"-b cuda {tag}: {same}/{len(cpu)} prompts identical to -b cpu; largest top-1 logit difference {worst:.4f}")
    for n in notes:
        print("   ", n)
PY
echo "== bench (pp512, tg128)"
"$cli" bench -m "$model" -b cuda -p 512 -n 128 -r 3 2>&1 | tail -4 || rc=1
[ -n "${QUICK:-}" ] || "$cli" bench -m "$model" -b cpu -p 512 -n 128 -r 2 2>&1 | tail -3 || rc=1
exit $rc
