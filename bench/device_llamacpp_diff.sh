#!/usr/bin/env bash
# tools/llamacpp_diff.py on the device host, whose CPU is an Intel Sapphire Rapids (AVX512-FP16,
# AMX): rustorch-cli against llama.cpp's two builds for that CPU (GCC without AMX, clang with AMX;
# tools/build_llamacpp_device.sh), all eight model files, every prompt. The host has no compiler,
# no network and takes 64 MiB per call, so the pieces arrive over several calls:
#
#   DEVICE_BUNDLE_XZ=1 tools/device_bundle.sh                  here: binaries into .device-bin/
#   cat SmolLM2.gguf gemma3.gguf | split -b 44M -d - .device-models/part.   here, one part per call
#                                              (SmolLM2's file alone when no Gemma sweep runs)
#   bench/device_llamacpp_diff.sh receive      (device) keeps the carried .device-models/part.*
#   bench/device_llamacpp_diff.sh start        (device) joins the parts into the two models
#                                              (sha256 checked) and starts one sweep per model
#                                              file in the background (setsid)
#   bench/device_llamacpp_diff.sh status       (device) progress, then each sweep's summary;
#                                              exit status 1 when any sweep failed
#
# Options of start go to tools/llamacpp_diff.py (e.g. --ci or --prompts 20); DIFF_MODELS=a,b
# starts only those files' sweeps. Threads: 2 per
# sweep as in CI, 4 for the TinyLlama-shaped file (16 cores, eight sweeps at once); the thread
# count changes llama.cpp's arithmetic only where both programs follow it alike.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
work=/tmp/rustorch-diff
parts="$work/parts"
models="$work/models"
log() { echo "device_llamacpp_diff: $*" >&2; }

receive() {
    mkdir -p "$parts"
    local p n=0
    for p in .device-models/part.*; do
        [ -e "$p" ] || continue
        cp "$p" "$parts/"
        n=$((n + 1))
    done
    log "received $n part(s); now $(ls "$parts" | wc -l) part(s), $(du -sh "$parts" | cut -f1)"
}

assemble() {
    mkdir -p "$models"
    # The parts are SmolLM2's file followed by Gemma 3's: split them at the pinned sizes and
    # check the pinned sha256 of tools/fetch_models.py.
    python3 - "$parts" "$models" <<'PY'
import glob, hashlib, os, sys
sys.path.insert(0, "tools")
import fetch_models
parts, out = sys.argv[1], sys.argv[2]
# The files the sweeps need, in the order the parts hold them (SmolLM2 first).
models_list = os.environ.get("DIFF_LIST", "")
needed = ("smollm2", "gemma3") if "gemma3" in models_list else ("smollm2",)
wanted = [m for m in fetch_models.MODELS if m.name in needed]
if all(os.path.getsize(os.path.join(out, m.file)) == m.size for m in wanted
       if os.path.exists(os.path.join(out, m.file))) and all(
        os.path.exists(os.path.join(out, m.file)) for m in wanted):
    # Joined by an earlier start (and checked then): rewriting them would pull them from under
    # the sweeps that have them mapped.
    for m in wanted:
        print(f"export {m.env}={os.path.join(out, m.file)}")
    sys.exit(0)
stream = b"".join(open(p, "rb").read() for p in sorted(glob.glob(os.path.join(parts, "part.*"))))
at = 0
for m in wanted:
    name = m.name
    data = stream[at:at + m.size]
    at += m.size
    if len(data) != m.size or hashlib.sha256(data).hexdigest() != m.sha256:
        sys.exit(f"{name}: the parts do not hold {m.file} (size or sha256 differ)")
    with open(os.path.join(out, m.file), "wb") as f:
        f.write(data)
    print(f"export {m.env}={os.path.join(out, m.file)}")
PY
}

start() {
    local bin env
    # shellcheck source=../tools/device_lib.sh
    source "$root/tools/device_lib.sh"
    # Unpacked once: unpacking again would replace the binaries of sweeps still running.
    bin=/tmp/rustorch-device-bin
    if [ ! -x "$bin/rustorch-cli" ] || [ ! -x "$bin/llama-noamx/llamacpp-greedy" ]; then
        bin="$(device_bundle "$root/.device-bin")"
    fi
    device_gguf "$bin"
    local m t list
    list="${DIFF_MODELS:-smollm2-q4_1,smollm2-q8_0,smollm2-q4_k_m,smollm2-q5_k_m,smollm2-q6_k,smollm2-f16,gemma3-q4_k_m,tinyllama-q4_k_m}"
    # The TinyLlama-shaped file is made here (mkmodel.py): it needs no parts.
    if [ "$list" != tinyllama-q4_k_m ]; then
        env="$(DIFF_LIST="$list" assemble)" || { log "assembling the models failed"; exit 1; }
        eval "$env"
    fi
    export RUSTORCH_CACHE="$work/cache" MKMODEL="$bin/mkmodel.py" PYTHONUNBUFFERED=1
    mkdir -p "$work/logs" "$RUSTORCH_CACHE"
    log "$(cat "$bin/BUNDLE.txt" | tr '\n' ' ')"
    "$bin/rustorch-cli" devices | grep -E "^cpu|llama.cpp build" >&2
    for m in ${list//,/ }; do
        t=2
        [ "$m" = tinyllama-q4_k_m ] && t=4
        rm -f "$work/logs/$m.rc"
        setsid bash -c "python3 tools/llamacpp_diff.py --models $m -t $t \
            --llama-bin $bin/llama-noamx --amx-bin $bin/llama-amx --rustorch-cli $bin/rustorch-cli \
            --keep $work/keep/$m $* > $work/logs/$m.log 2>&1; echo \$? > $work/logs/$m.rc" \
            < /dev/null > /dev/null 2>&1 &
    done
    log "started sweeps of $list; logs in $work/logs"
}

status() {
    local f m bad=0 running=0
    for f in "$work"/logs/*.log; do
        m="$(basename "$f" .log)"
        if [ -f "$work/logs/$m.rc" ]; then
            echo "== $m: exit $(cat "$work/logs/$m.rc")"
            grep -vE '^llamacpp_diff: ' "$f" || true
            [ "$(cat "$work/logs/$m.rc")" = 0 ] || bad=1
        else
            running=$((running + 1))
            echo "== $m: running: $(tail -n 1 "$f")"
        fi
    done
    log "$running sweep(s) still running"
    [ "$running" = 0 ] || return 0
    return "$bad"
}

case "${1:-}" in
    receive) receive ;;
    start) shift; start "$@" ;;
    status) status ;;
    *) log "usage: $0 receive | start [llamacpp_diff.py options] | status"; exit 2 ;;
esac
