#!/usr/bin/env bash
# Issue 33's checks on the device host (H200, no Rust, no network): rustorch-cli -b cuda against
# llama.cpp's CUDA build of the same sources, on the same GPU, in the same run.
#
#   kld     llama-perplexity -ngl 99 (its default -fa) writes the base logits of each model on a fixed
#           text (crates/rustorch-llm/tests/fixtures/GPL-3, -c 512); rustorch-cli perplexity -b cuda
#           --kl-divergence-base F --kl-divergence reads them, with -ngl all, 0 and half the layers
#           (partial offload), and "mmq" (KLD_NGLS: every layer, the prompt products in llama.cpp
#           CUDA's own MMQ arithmetic). Bound: llama.cpp's own spread (its CUDA -ub 1, CUDA -ub 256 and
#           CPU-only runs against the same base; see part_kld), PPL at most 0.5% above llama.cpp CUDA's.
#   greedy  llamacpp-greedy (LLAMACPP_GREEDY_NGL=99) against rustorch-cli greedy -b cuda: 48 tokens
#           on tools/llamacpp_diff_prompts.json's CI subset (22 prompts, 2 long), rendered as
#           tools/llamacpp_diff.py renders them; a prompt passes when identical, or when the first
#           difference comes where llama.cpp's top-1/top-2 logit margin is below 0.05; the model
#           passes with at most as many other divergences as llama.cpp's CPU-only build has against
#           its CUDA build (+2), since llama.cpp itself is not one reference across devices.
#   speed   llama-bench -ngl 99 -fa 1 -p 512 -n 128 against rustorch-cli bench -b cuda -p 512 -n 128
#           (JSON from both): tg128 >= 1.5x, pp512 >= 1.0x; the fraction of the GPU's memory
#           bandwidth (measured here with PyTorch) that tg128 reaches (bytes per token from
#           rustorch-cli bench); peak GPU memory of each (nvidia-smi); load time; tg128 on -b cpu.
#
# Models (names used on the command line; default: the set of the part):
#   kld, greedy: smollm2-q4_1 (SmolLM2-135M-Instruct Q4_1, carried), its requantized smollm2-q8_0,
#                smollm2-q4_k_m, smollm2-q5_k_m, smollm2-q6_k, smollm2-f16 (llama-quantize
#                --allow-requantize here), gemma3-q4_k_m (Gemma-3-270M, carried)
#   speed:       tinyllama-q4_k_m, tinyllama-q8_0, tinyllama-q4_0, tinyllama-f16 and
#                smollm2rand-q4_k_m: mkmodel.py's random-weight TinyLlama-1.1B and SmolLM2-135M
#                shapes, quantized with llama-quantize here
#
# Call by call (each call runs one command of at most 600 s; the machine goes back after 30 s
# idle, and /tmp with it; docs/BENCHMARKS.md, "Issue 33 on the device", has the whole sequence):
#   bash bench/device_cuda_llm.sh stash               # keeps the carried pieces (models, llama.cpp
#                                                     # bundle) in /tmp/rt33/store; every command does
#   bash bench/device_cuda_llm.sh models start        # joins the carried models, then in the
#                                                     # background: mkmodel.py, llama-quantize (waits
#                                                     # for the llama.cpp build or bundle)
#   bash bench/device_cuda_llm.sh models wait 300     # (or status)
#   bash bench/device_cuda_llm.sh kld [MODEL...]
#   bash bench/device_cuda_llm.sh greedy [MODEL...]
#   bash bench/device_cuda_llm.sh speed [MODEL...]
#   bash bench/device_cuda_llm.sh warm                # rustorch's kernels compiled once (~76 s)
#   bash bench/device_cuda_llm.sh smoke [MODEL]       # generation op by op and as CUDA graphs, compared
#   bash bench/device_cuda_llm.sh quick               # a new build without llama.cpp: TinyLlama
#                                                     # shapes benched, recorded vs op-by-op text
#   bash bench/device_cuda_llm.sh graphs [MODEL...]   # greedy op by op against recorded steps (tokens, logits)
#   bash bench/device_cuda_llm.sh info                # what is here: binaries, models, jobs
#
# What it reads: .device-cli/rustorch-cli.xz (rustorch-cli built with --features cuda, stripped;
# unpacked once into /tmp/rt33/bin, again whenever a carried copy differs); llama.cpp's programs
# from /tmp/llamacpp-cuda/bin (tools/build_llamacpp_cuda_device.sh's build of this session, or the
# bundle .device-llamacpp-cuda/llamacpp-cuda.tar.xz.NN carried back in, in one call or stashed over
# several; tools/build_llamacpp_cuda_here.sh builds that bundle off the device, CUDA 13.0 from
# PyPI wheels, so no device minutes go to building); models from .device-model/smollm2.part.* and
# .device-model/gemma3.part.* (the files of tools/fetch_models.py split in pieces, checked against
# its sizes and sha256 once joined);
# mkmodel.py and gguf-py from .device-llamacpp/src.tar.xz (tools/pack_llamacpp_src.sh).
# Tables go to stdout (markdown) and to $OUT/llm-PART.md; raw logs to /tmp/rt33/logs.
# Environment: KLD_CTX (512), KLD_CHUNKS (all of the text), KLD_NGLS ("all 0 half"),
# GREEDY_PROMPTS (ci | all), GREEDY_N (48), BENCH_REPS (5), SPEED_CPU (1: also tg128 on -b cpu),
# SPEED_WARM (1: one untimed rustorch-cli start per model first), SPEED_GRAPHS (1: also tg128 with
# every decode step op by op, RUSTORCH_CUDA_GRAPHS=0; the default records them as a CUDA graph).
# Exit status: 0 when every check of the part passed, 1 when one failed, 2 when something to run
# it with is missing.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
W=/tmp/rt33
L=/tmp/llamacpp-cuda
LB="$L/bin"
CLI="$W/bin/rustorch-cli"
mkdir -p "$W"/{store,models,kld,greedy,logs,bin,prompts,py}
log() { echo "device_cuda_llm: $*" >&2; }

CORRECT=(smollm2-q4_1 smollm2-q8_0 smollm2-q4_k_m smollm2-q5_k_m smollm2-q6_k smollm2-f16 gemma3-q4_k_m)
SPEED=(tinyllama-q4_k_m tinyllama-q8_0 tinyllama-q4_0 tinyllama-f16 smollm2rand-q4_k_m)
# The carried real models: name, file it becomes, size, sha256 (tools/fetch_models.py's pins).
SOURCES=(
    "smollm2 smollm2-q4_1 98362432 b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    "gemma3 gemma3-q4_k_m 253113024 a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
)

# llama.cpp's programs find their libraries through RUNPATH $ORIGIN too; $LB may appear later.
export LD_LIBRARY_PATH="$LB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
export RUSTORCH_CUDA_CACHE=/tmp/rustorch-cuda-cache
# rustorch's kernels as machine code made off the device (crates/rustorch-cuda/examples/
# kernel_cache.rs with the device's NVRTC version, packed in .device-kcache/kcache.tar.xz): the
# first start loads them instead of compiling for a minute or more. A version mismatch only misses.
if [ -f "$root/.device-kcache/kcache.tar.xz" ] && ! cmp -s "$root/.device-kcache/kcache.tar.xz" "$W/kcache.tar.xz"; then
    mkdir -p "$RUSTORCH_CUDA_CACHE" && tar -xJf "$root/.device-kcache/kcache.tar.xz" -C "$RUSTORCH_CUDA_CACHE" \
        && cp "$root/.device-kcache/kcache.tar.xz" "$W/kcache.tar.xz"
fi

# Carried pieces into the store (the next call's tree may not carry them again).
stash_carried() {
    local f
    for f in "$root"/.device-model/*.part.* "$root"/.device-llamacpp-cuda/llamacpp-cuda.tar.xz.* "$@"; do
        [ -f "$f" ] || continue
        if ! cmp -s "$f" "$W/store/$(basename "$f")"; then
            cp "$f" "$W/store/" && log "stashed $(basename "$f") ($(stat -c %s "$f") bytes)"
        fi
    done
}

ensure_cli() {
    local xz="$root/.device-cli/rustorch-cli.xz"
    if [ -f "$xz" ] && ! cmp -s "$xz" "$W/bin/rustorch-cli.xz"; then
        xz -dc "$xz" > "$CLI.tmp" && chmod +x "$CLI.tmp" && mv "$CLI.tmp" "$CLI" && cp "$xz" "$W/bin/rustorch-cli.xz" \
            && log "rustorch-cli unpacked from .device-cli/rustorch-cli.xz"
    fi
    [ -x "$CLI" ] || { log "no rustorch-cli: carry .device-cli (rustorch-cli built with --features cuda, xz)"; return 1; }
}

# llama.cpp's programs: this session's build, or the carried bundle's pieces (.00, .01, ...).
ensure_llama() {
    [ -f "$L/READY" ] && [ -x "$LB/llama-bench" ] && return 0
    local pieces=("$W"/store/llamacpp-cuda.tar.xz.*)
    if [ -f "${pieces[0]}" ]; then
        if cat "${pieces[@]}" | xz -t 2>/dev/null; then
            # Unpacked aside, then moved in: the models job may be unpacking at the same time.
            local tmp="$L/unpack.$$"
            mkdir -p "$tmp" && cat "${pieces[@]}" | tar -xJ -C "$tmp" || { rm -rf "$tmp"; return 1; }
            if [ ! -f "$L/READY" ]; then
                rm -rf "$LB" && mv "$tmp/bin" "$LB" && touch "$L/READY" \
                    && { log "llama.cpp CUDA programs unpacked from ${#pieces[@]} carried pieces"; head -3 "$LB/BUILD_INFO" >&2; }
            fi
            rm -rf "$tmp"
            [ -f "$L/READY" ] && return 0
        else
            log "llama.cpp bundle: ${#pieces[@]} pieces stashed ($(basename "${pieces[-1]}") last), not complete yet"
        fi
    fi
    if [ -f "$L/PID" ] && kill -0 "$(cat "$L/PID")" 2>/dev/null; then
        log "llama.cpp's CUDA build is still running: bash tools/build_llamacpp_cuda_device.sh wait SECONDS"
    else
        log "no llama.cpp CUDA programs: build them (tools/build_llamacpp_cuda_device.sh start) or carry .device-llamacpp-cuda"
    fi
    return 1
}

# mkmodel.py and gguf-py from the source pack (carried), or from the build's unpacked sources.
ensure_py() {
    [ -f "$W/py/rustorch/mkmodel.py" ] && [ -d "$W/py/gguf-py/gguf" ] && return 0
    if [ -f "$L/src/rustorch/mkmodel.py" ] && [ -d "$L/src/gguf-py/gguf" ]; then
        cp -a "$L/src/rustorch" "$L/src/gguf-py" "$W/py/"
    elif [ -f "$root/.device-llamacpp/src.tar.xz" ]; then
        tar -xJf "$root/.device-llamacpp/src.tar.xz" -C "$W/py" --strip-components=1 llamacpp-src/rustorch llamacpp-src/gguf-py
    fi
    [ -f "$W/py/rustorch/mkmodel.py" ] || { log "no mkmodel.py: carry .device-llamacpp (tools/pack_llamacpp_src.sh)"; return 1; }
    python3 -c 'import numpy, yaml' || { log "python3 lacks numpy or yaml (gguf-py needs both)"; return 1; }
}

# The carried real models, joined from their pieces and checked.
join_sources() {
    local line name out size sha pieces
    for line in "${SOURCES[@]}"; do
        read -r name out size sha <<< "$line"
        [ -f "$W/models/$out.gguf" ] && continue
        pieces=("$W"/store/"$name".part.*)
        if [ ! -f "${pieces[0]}" ]; then
            log "$out: no pieces of $name (carry .device-model/$name.part.*)"
            continue
        fi
        local have
        have="$(cat "${pieces[@]}" | wc -c)"
        if [ "$have" != "$size" ]; then
            log "$out: $have of $size bytes stashed so far (${#pieces[@]} pieces)"
            continue
        fi
        local tmp="$W/models/$out.gguf.tmp.$$" # the models job may join at the same time
        cat "${pieces[@]}" > "$tmp"
        if [ "$(sha256sum < "$tmp" | cut -d' ' -f1)" = "$sha" ]; then
            mv "$tmp" "$W/models/$out.gguf" && log "$out: joined and checked ($size bytes)"
        else
            rm -f "$tmp"
            log "$out: the joined pieces do not have tools/fetch_models.py's sha256"
        fi
    done
}

model_file() { echo "$W/models/$1.gguf"; }

n_layers() { # MODEL FILE
    "$CLI" info "$1" 2>/dev/null | awk '$1 ~ /\.block_count$/ {print $NF; exit}'
}

# ---- models: mkmodel.py + llama-quantize, in the background ------------------------------------
make_models() {
    local t0 qt src f
    t0=$(date +%s)
    export PYTHONPATH="$W/py/gguf-py${PYTHONPATH:+:$PYTHONPATH}"
    for shape in tinyllama smollm2; do
        # tinyllama-f16 is itself a bench model; smollm2rand-f16 goes once quantized.
        f="$W/models/tinyllama-f16.gguf"
        [ "$shape" = smollm2 ] && f="$W/models/smollm2rand-f16.gguf"
        [ -f "$f" ] && continue
        [ "$shape" = smollm2 ] && [ -f "$W/models/smollm2rand-q4_k_m.gguf" ] && continue
        echo "mkmodel.py $shape -> $f"
        python3 "$W/py/rustorch/mkmodel.py" "$shape" "$f.tmp" && mv "$f.tmp" "$f" || echo "mkmodel.py $shape failed"
    done
    echo "mkmodel.py done at $(( $(date +%s) - t0 )) s; waiting for llama-quantize"
    local waited=0
    # A carried bundle may still be arriving piece by piece (stash): unpacked once complete.
    until ensure_llama > /dev/null 2>&1 && [ -x "$LB/llama-quantize" ]; do
        sleep 5
        waited=$((waited + 5))
        [ "$waited" -lt 1800 ] || { echo "no llama-quantize after 30 minutes"; echo 1 > "$W/models/DONE"; return; }
    done
    quant() { # SRC OUT TYPE
        [ -f "$2" ] && return 0
        [ -f "$1" ] || { echo "no $1 for $(basename "$2")"; return 1; }
        "$LB/llama-quantize" --allow-requantize "$1" "$2.tmp" "$3" "$(nproc)" > "$W/logs/quantize-$(basename "$2" .gguf).log" 2>&1 \
            && mv "$2.tmp" "$2" && echo "$(basename "$2"): $(stat -c %s "$2") bytes ($(( $(date +%s) - t0 )) s)" \
            || { echo "llama-quantize $3 for $(basename "$2") failed"; return 1; }
    }
    local rc=0
    for qt in Q4_K_M Q8_0 Q4_0; do
        quant "$W/models/tinyllama-f16.gguf" "$W/models/tinyllama-${qt,,}.gguf" "$qt" || rc=1
    done
    quant "$W/models/smollm2rand-f16.gguf" "$W/models/smollm2rand-q4_k_m.gguf" Q4_K_M && rm -f "$W/models/smollm2rand-f16.gguf" || rc=1
    # SmolLM2's pieces may still be arriving (every command of this script stashes what it carries).
    src="$W/models/smollm2-q4_1.gguf"
    waited=0
    until [ -f "$src" ] || [ "$waited" -ge "${MODELS_JOIN_WAIT:-900}" ]; do
        join_sources 2> /dev/null
        [ -f "$src" ] && break
        sleep 5
        waited=$((waited + 5))
    done
    join_sources # Gemma 3 too, if complete; said when not
    for qt in Q8_0 Q4_K_M Q5_K_M Q6_K F16; do
        quant "$src" "$W/models/smollm2-${qt,,}.gguf" "$qt" || rc=1
    done
    echo "models done in $(( $(date +%s) - t0 )) s (status $rc)"
    echo "$rc" > "$W/models/DONE"
}

models_state() {
    local m
    for m in "${CORRECT[@]}" "${SPEED[@]}"; do
        if [ -f "$(model_file "$m")" ]; then
            printf '  %-20s %12d bytes\n' "$m" "$(stat -c %s "$(model_file "$m")")"
        else
            printf '  %-20s missing\n' "$m"
        fi
    done
    if [ -f "$W/models/DONE" ]; then
        echo "models job: done (status $(cat "$W/models/DONE"))"
    elif [ -f "$W/models/PID" ] && kill -0 "$(cat "$W/models/PID")" 2>/dev/null; then
        echo "models job: running; $(tail -1 "$W/logs/models.log")"
    else
        echo "models job: not running"
    fi
}

# ---- reporting -----------------------------------------------------------------------------------
emit() { # PART: stdin (markdown) to stdout and $OUT/llm-PART.md
    if [ -n "${OUT:-}" ]; then tee -a "$OUT/llm-$1.md"; else cat; fi
}

gpu_line() {
    echo "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1); CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) threads"
    [ -f "$LB/BUILD_INFO" ] && grep -E "^llama-cpp-python|^nvcc" "$LB/BUILD_INFO" | tr '\n' ' ' && echo
    echo "rustorch-cli: $("$CLI" --version 2>/dev/null)"
}

# ---- kld -----------------------------------------------------------------------------------------
# llama.cpp is not one reference to 0.001: on these small models its CUDA build's decode path (-ub 1),
# its CUDA build with micro-batches of 256 (the same MMQ kernels and activation quantization; only
# how the sums are split and ordered changes) and its CPU-only build differ from its CUDA prompt
# logits (-ub 512, the base) by mean KLD 0.004 to 0.022 on the quantized files (H200): every layer
# requantizes its activations to 8 bits, so an f32 rounding difference upstream flips quants, each a
# step of 1/127 of its block's largest value. Each model's bound is therefore llama.cpp's own
# spread: the largest KLD of those runs against the base (at least 0.001), with 10% slack for the
# estimate's noise; the same top token at least as often as the least consistent of them (at most
# 99%); and a perplexity no more than 0.5% above llama.cpp CUDA's (a lower one is not a loss of
# quality).
llama_spread() { # MODEL FILE BASE: llama.cpp's own runs against its base, into $W/kld/MODEL.spread3
    local m="$1" f="$2" base="$3" out="$W/kld/$1.spread3" how
    [ -s "$out" ] && return 0
    for how in cuda-ub1 cuda-ub256 cpu-only; do
        if [ "$how" != cpu-only ]; then
            "$LB/llama-perplexity" -m "$f" -f "$text" -c "$ctx" "${chunks[@]}" -ngl 99 -ub "${how#cuda-ub}" \
                --kl-divergence-base "$base" --kl-divergence > "$W/logs/kld-$m-$how.txt" 2>&1
        else
            CUDA_VISIBLE_DEVICES= "$LB/llama-perplexity" -m "$f" -f "$text" -c "$ctx" "${chunks[@]}" -t "$(nproc)" \
                --kl-divergence-base "$base" --kl-divergence > "$W/logs/kld-$m-$how.txt" 2>&1
        fi || { log "$m: llama-perplexity $how failed (logs/kld-$m-$how.txt)"; return 1; }
    done
    printf '%s\n' "$W/logs/kld-$m-cuda-ub1.txt" "$W/logs/kld-$m-cuda-ub256.txt" "$W/logs/kld-$m-cpu-only.txt" > "$out"
}

part_kld() {
    local text="$root/crates/rustorch-llm/tests/fixtures/GPL-3" ctx="${KLD_CTX:-512}"
    local chunks=() tsv="$W/logs/kld.tsv" m f base n g ngl mmq t0 rc=0
    [ -n "${KLD_CHUNKS:-}" ] && chunks=(--chunks "$KLD_CHUNKS")
    : > "$tsv"
    for m in "$@"; do
        f="$(model_file "$m")"
        [ -f "$f" ] || { printf '%s\tmissing\n' "$m" >> "$tsv"; continue; }
        base="$W/kld/$m.c$ctx${KLD_CHUNKS:+.k$KLD_CHUNKS}.kld"
        if [ ! -s "$base" ]; then
            t0=$(date +%s%N)
            "$LB/llama-perplexity" -m "$f" -f "$text" -c "$ctx" "${chunks[@]}" -ngl 99 \
                --kl-divergence-base "$base.tmp" > "$W/logs/kld-$m-llama.log" 2>&1 && mv "$base.tmp" "$base" \
                || { printf '%s\tllama-perplexity failed (logs/kld-%s-llama.log)\n' "$m" "$m" >> "$tsv"; rc=1; continue; }
            log "$m: llama.cpp base logits in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
        fi
        llama_spread "$m" "$f" "$base" || rc=1
        local lppl
        lppl="$(grep -oE 'Final estimate: PPL = [0-9.]+' "$W/logs/kld-$m-llama.log" | awk '{print $NF}')"
        n="$(n_layers "$f")"
        for g in ${KLD_NGLS:-all 0 half}; do
            ngl="$g" mmq=0
            [ "$g" = half ] && ngl=$(( ${n:-2} / 2 ))
            # "mmq": every layer, the prompt products in llama.cpp CUDA's MMQ arithmetic (ops/mmq.rs).
            [ "$g" = mmq ] && ngl=all mmq=1
            t0=$(date +%s%N)
            RUSTORCH_CUDA_MMQ=$mmq "$CLI" perplexity -m "$f" -b cuda -ngl "$ngl" -c "$ctx" --kl-divergence-base "$base" --kl-divergence \
                > "$W/logs/kld-$m-ngl$g.txt" 2> "$W/logs/kld-$m-ngl$g.err" \
                || { printf '%s\t%s\tfailed: %s\n' "$m" "$g" "$(tail -1 "$W/logs/kld-$m-ngl$g.err")" >> "$tsv"; rc=1; continue; }
            printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$m" "$([ "$g" = mmq ] && echo "all, MMQ" || echo "$ngl")" "${n:-?}" "${lppl:-?}" \
                "$(( ($(date +%s%N) - t0) / 1000000 ))" "$W/logs/kld-$m-ngl$g.txt" >> "$tsv"
        done
    done
    python3 - "$tsv" "$W/kld" <<'PY' || rc=1
import os, re, sys
bad = False
def grab(text, pat):
    m = re.search(pat, text, re.M)
    return float(m.group(1)) if m else None
def stats(text):
    return {
        "kld": grab(text, r"^Mean\s+KLD:\s*([-0-9.eE+]+)"),
        "k99": grab(text, r"^99\.0%\s+KLD:\s*([-0-9.eE+]+)"),
        "kmax": grab(text, r"^Maximum KLD:\s*([-0-9.eE+]+)"),
        "same": grab(text, r"^Same top p:\s*([-0-9.eE+]+)"),
        "ratio": grab(text, r"^Mean PPL\(Q\)/PPL\(base\)\s*:\s*([-0-9.eE+]+)"),
    }
def spread(model):
    """llama.cpp's own runs against its base: (cuda -ub 1, cuda -ub 256, cpu-only) stats, or None."""
    path = f"{sys.argv[2]}/{model}.spread3"
    if not os.path.exists(path):
        return None
    runs = [stats(open(p.strip()).read()) for p in open(path) if p.strip()]
    return runs if len(runs) == 3 and all(r["kld"] is not None and r["same"] is not None for r in runs) else None
f = lambda v, d: "?" if v is None else f"{v:.{d}f}"
print("| model | -ngl | layers | mean KLD | 99% KLD | max KLD | same top % | PPL(Q)/PPL(base) | llama.cpp's own: CUDA -ub 1 / CUDA -ub 256 / CPU-only KLD, same top % | bound KLD / same top | llama PPL | ms | verdict |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for line in open(sys.argv[1]):
    p = line.rstrip("\n").split("\t")
    if len(p) < 6:
        print(f"| {p[0]} | {' '.join(p[1:])} |" + " |" * 10 + " FAIL |")
        bad = True
        continue
    m, ngl, n, lppl, ms, path = p
    s = stats(open(path).read())
    sp = spread(m)
    if sp:
        kld_bound = 1.1 * max([0.001] + [r["kld"] for r in sp])
        same_bound = min([99.0] + [r["same"] for r in sp])
        own = " / ".join(f"{r['kld']:.6f}" for r in sp) + ", " + " / ".join(f"{r['same']:.2f}" for r in sp)
    else:
        kld_bound, same_bound, own = 0.001, 99.0, "?"
    ok = None not in (s["kld"], s["same"], s["ratio"]) and s["kld"] <= kld_bound and s["same"] >= same_bound and s["ratio"] <= 1.005
    # The MMQ rows are a measurement (the opt-in path in llama.cpp's arithmetic), not a check.
    info = "MMQ" in ngl
    bad |= not ok and not info
    verdict = ("within" if ok else "outside") + " (info)" if info else ("pass" if ok else "FAIL")
    print(f"| {m} | {ngl} | {n} | {f(s['kld'], 6)} | {f(s['k99'], 6)} | {f(s['kmax'], 6)} | {f(s['same'], 3)} | {f(s['ratio'], 6)} "
          f"| {own} | {kld_bound:.6f} / {same_bound:.2f} | {lppl} | {ms} | {verdict} |")
print()
print("base: llama-perplexity CUDA -ngl 99 (-ub 512, default -fa). bound: mean KLD <= 1.1 x max(0.001, llama.cpp CUDA -ub 1's, "
      "its CUDA -ub 256's (the same kernels, another batch split), its CPU-only's), same top >= min(99%, theirs), "
      "PPL(Q)/PPL(base) <= 1.005 (each of theirs against the same base). -ngl \"all, MMQ\": RUSTORCH_CUDA_MMQ=1")
sys.exit(1 if bad else 0)
PY
    return $rc
}

# ---- greedy --------------------------------------------------------------------------------------
render_prompts() { # FAMILY: prints the prompts file
    local out="$W/prompts/$1-${GREEDY_PROMPTS:-ci}.jsonl"
    [ -s "$out" ] || python3 - "$root/tools" "$1" "${GREEDY_PROMPTS:-ci}" "$out" <<'PY' || return 1
import json, sys
sys.path.insert(0, sys.argv[1])
import llamacpp_diff as d
family, which, out = sys.argv[2], sys.argv[3], sys.argv[4]
doc, prompts = d.load_prompts(d.PROMPTS_FILE)
chosen = d.select_prompts(doc, prompts, which == "ci", None)
max_chars = doc.get("tinyllama_max_chars") if family == "tinyllama" else None
with open(out, "w", encoding="utf-8") as f:
    for p in d.render(chosen, family, max_chars):
        f.write(json.dumps(p, ensure_ascii=False) + "\n")
PY
    echo "$out"
}

part_greedy() {
    local n="${GREEDY_N:-48}" m f fam prompts rc=0 t0 tl to
    local list="$W/logs/greedy.list"
    : > "$list"
    for m in "$@"; do
        f="$(model_file "$m")"
        [ -f "$f" ] || { printf '%s missing\n' "$m" >> "$list"; continue; }
        fam="${m%%-*}"
        [ "$fam" = smollm2rand ] && fam=smollm2
        prompts="$(render_prompts "$fam")" || { printf '%s prompts\n' "$m" >> "$list"; rc=1; continue; }
        t0=$(date +%s%N)
        LLAMACPP_GREEDY_NGL=99 "$LB/llamacpp-greedy" -m "$f" -f "$prompts" -n "$n" -c 4096 -t "$(nproc)" \
            > "$W/greedy/$m-llama.jsonl" 2> "$W/logs/greedy-$m-llama.err" \
            || { printf '%s llamacpp-greedy-failed\n' "$m" >> "$list"; rc=1; continue; }
        tl=$(( ($(date +%s%N) - t0) / 1000000 ))
        # llama.cpp's own spread: its CPU-only build against its CUDA run, by the same rule.
        CUDA_VISIBLE_DEVICES= LLAMACPP_GREEDY_NGL=0 "$LB/llamacpp-greedy" -m "$f" -f "$prompts" -n "$n" -c 4096 -t "$(nproc)" \
            > "$W/greedy/$m-llamacpu.jsonl" 2> "$W/logs/greedy-$m-llamacpu.err" || rm -f "$W/greedy/$m-llamacpu.jsonl"
        t0=$(date +%s%N)
        "$CLI" greedy -m "$f" -f "$prompts" -n "$n" -c 4096 -b cuda \
            > "$W/greedy/$m-ours.jsonl" 2> "$W/logs/greedy-$m-ours.err" \
            || { printf '%s rustorch-cli-greedy-failed\n' "$m" >> "$list"; rc=1; continue; }
        to=$(( ($(date +%s%N) - t0) / 1000000 ))
        printf '%s ok %s %s %s\n' "$m" "$prompts" "$tl" "$to" >> "$list"
    done
    python3 - "$root/tools" "$list" "$W/greedy" <<'PY' || rc=1
import json, sys
sys.path.insert(0, sys.argv[1])
import llamacpp_diff as d
d.MARGIN = 0.05  # issue 33's bound for a tolerated divergence on the GPU
bad, notes = False, []
print("| model | prompts | identical | tolerated (margin < 0.05) | diverged | llama.cpp CPU-only vs its CUDA: diverged | llama.cpp ms | rustorch ms | verdict |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for line in open(sys.argv[2]):
    p = line.split()
    m = p[0]
    if p[1] != "ok":
        print(f"| {m} | {p[1]} | | | | | | FAIL |")
        bad = True
        continue
    ids = [json.loads(l)["id"] for l in open(p[2], encoding="utf-8") if l.strip()]
    try:
        ref = d.parse_output(open(f"{sys.argv[3]}/{m}-llama.jsonl").read(), "llamacpp-greedy", ids)
        ours = d.parse_output(open(f"{sys.argv[3]}/{m}-ours.jsonl").read(), "rustorch-cli greedy", ids)
    except d.Failure as e:
        print(f"| {m} | {len(ids)} | | | | | | FAIL: {e} |")
        bad = True
        continue
    count = {"identical": 0, "tolerated": 0, "diverged": 0, "tokenizer": 0}
    for i in ids:
        v, detail = d.compare_one(ref[i], ours[i])
        count[v] += 1
        if detail:
            notes.append(f"- {m} {i}: {v}: {detail}")
    # llama.cpp's CPU-only build against its CUDA build, by the same rule: its own spread.
    own = None
    try:
        cpu = d.parse_output(open(f"{sys.argv[3]}/{m}-llamacpu.jsonl").read(), "llamacpp-greedy (CPU)", ids)
        own = sum(1 for i in ids if d.compare_one(ref[i], cpu[i])[0] in ("diverged", "tokenizer"))
    except (OSError, d.Failure):
        pass
    # At most llama.cpp's own count of divergences at non-ties (+2 for the small sample), or none.
    ok = count["tokenizer"] == 0 and count["diverged"] <= (own + 2 if own is not None else 0)
    bad |= not ok
    extra = f" ({count['tokenizer']} tokenizer)" if count["tokenizer"] else ""
    print(f"| {m} | {len(ids)} | {count['identical']} | {count['tolerated']} | {count['diverged']}{extra} | {'?' if own is None else own} | {p[3]} | {p[4]} | {'pass' if ok else 'FAIL'} |")
print()
print("\n".join(notes) if notes else "every prompt identical")
sys.exit(1 if bad else 0)
PY
    return $rc
}

# ---- speed ---------------------------------------------------------------------------------------
# Peak GPU memory while a command runs (nvidia-smi every 100 ms), in MiB above the idle figure.
with_gpu_mem() { # OUTFILE_MIB CMD...
    local out="$1" base pid
    shift
    base="$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$out.samples" 2>/dev/null &
    pid=$!
    "$@"
    local rc=$?
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    sort -n "$out.samples" | tail -1 | awk -v b="$base" '{print $1 - b}' > "$out"
    return $rc
}

part_speed() {
    local reps="${BENCH_REPS:-5}" m f rc=0 list="$W/logs/speed.list"
    : > "$list"
    python3 - > "$W/logs/membw.txt" 2>&1 <<'PY'
import torch
n = 1 << 31  # bytes: 2 GiB, far beyond the 60 MB L2
a = torch.empty(n // 4, dtype=torch.float32, device="cuda").uniform_()
b = torch.empty_like(a)
def best(fn, reps=20):
    fn(); torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); e.synchronize()
        ts.append(s.elapsed_time(e) / 1e3)
    return min(ts)
copy = 2 * n / best(lambda: b.copy_(a)) / 1e9
read = n / best(lambda: a.sum()) / 1e9
print(f"membw_copy_gbps {copy:.1f}")
print(f"membw_read_gbps {read:.1f}")
PY
    for m in "$@"; do
        f="$(model_file "$m")"
        [ -f "$f" ] || { printf '%s missing\n' "$m" >> "$list"; continue; }
        # Untimed first start: kernels compiled (cached in $RUSTORCH_CUDA_CACHE) and the file in the
        # page cache, so that load_ms is a warm start's.
        [ "${SPEED_WARM:-1}" = 1 ] && "$CLI" bench -m "$f" -b cuda -p 16 -n 2 -r 1 > /dev/null 2>&1
        with_gpu_mem "$W/logs/speed-$m-llama.mib" "$LB/llama-bench" -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -r "$reps" -o json \
            > "$W/logs/speed-$m-llama.json" 2> "$W/logs/speed-$m-llama.err" \
            || { printf '%s llama-bench-failed\n' "$m" >> "$list"; rc=1; continue; }
        with_gpu_mem "$W/logs/speed-$m-ours.mib" "$CLI" bench -m "$f" -b cuda -p 512 -n 128 -r "$reps" -o json \
            > "$W/logs/speed-$m-ours.json" 2> "$W/logs/speed-$m-ours.err" \
            || { printf '%s rustorch-cli-bench-failed\n' "$m" >> "$list"; rc=1; continue; }
        if [ "${SPEED_CPU:-1}" = 1 ]; then
            "$CLI" bench -m "$f" -b cpu -p 0 -n 128 -r 2 -o json > "$W/logs/speed-$m-cpu.json" 2> "$W/logs/speed-$m-cpu.err" \
                || rm -f "$W/logs/speed-$m-cpu.json"
        fi
        # Decode steps op by op (the default records them as a CUDA graph; its stderr says if
        # recording was turned off).
        if [ "${SPEED_GRAPHS:-1}" = 1 ]; then
            RUSTORCH_CUDA_GRAPHS=0 "$CLI" bench -m "$f" -b cuda -p 0 -n 128 -r "$reps" -o json \
                > "$W/logs/speed-$m-graphs.json" 2> "$W/logs/speed-$m-graphs.err" || rm -f "$W/logs/speed-$m-graphs.json"
        fi
        printf '%s ok\n' "$m" >> "$list"
    done
    python3 - "$list" "$W/logs" <<'PY' || rc=1
import json, os, sys
logs = sys.argv[2]
bw = {}
for l in open(f"{logs}/membw.txt"):
    p = l.split()
    if len(p) == 2 and p[0].startswith("membw_"):
        bw[p[0]] = float(p[1])
gbps = max(bw.values()) if bw else None
def tests(path):
    out = {}
    try:
        for t in json.load(open(path)):
            key = f"pp{t['n_prompt']}" if t["n_gen"] == 0 else f"tg{t['n_gen']}"
            out[key] = t
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return out
def mib(path):
    try:
        return float(open(path).read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
bad = False
print("| model | llama pp512 t/s | ours pp512 t/s | pp ratio | llama tg128 t/s | ours tg128 t/s | tg ratio | ours tg128 op by op (ratio) | ours -b cpu tg128 | BW fraction ours / llama | GPU MiB ours / llama | weights+KV MiB | load ms | verdict |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for line in open(sys.argv[1]):
    p = line.split()
    m = p[0]
    if p[1] != "ok":
        print(f"| {m} | {p[1]} |" + " |" * 11 + " FAIL |")
        bad = True
        continue
    ll, us, cpu = tests(f"{logs}/speed-{m}-llama.json"), tests(f"{logs}/speed-{m}-ours.json"), tests(f"{logs}/speed-{m}-cpu.json")
    gr = tests(f"{logs}/speed-{m}-graphs.json")
    g = lambda d, k: d.get(k, {}).get("avg_ts")
    lpp, upp, ltg, utg, ctg = g(ll, "pp512"), g(us, "pp512"), g(ll, "tg128"), g(us, "tg128"), g(cpu, "tg128")
    rpp = upp / lpp if upp and lpp else None
    rtg = utg / ltg if utg and ltg else None
    ok = rpp is not None and rtg is not None and rpp >= 1.0 and rtg >= 1.5
    bad |= not ok
    bpt = us.get("tg128", {}).get("bytes_per_token")
    frac = lambda ts: f"{bpt * ts / (gbps * 1e9):.1%}" if bpt and ts and gbps else "?"
    t = us.get("tg128") or us.get("pp512") or {}
    wkv = (t.get("model_size", 0) + t.get("kv_bytes", 0)) / 2**20 if t else None
    f = lambda v, d=1: "?" if v is None else f"{v:.{d}f}"
    gtg = g(gr, "tg128")
    rec = f"{f(gtg)} ({f(gtg / ltg, 2)})" if gtg and ltg else "?"
    print(f"| {m} | {f(lpp)} | {f(upp)} | {f(rpp, 2)} | {f(ltg)} | {f(utg)} | {f(rtg, 2)} | {rec} | {f(ctg)} | {frac(utg)} / {frac(ltg)} "
          f"| {f(mib(f'{logs}/speed-{m}-ours.mib'), 0)} / {f(mib(f'{logs}/speed-{m}-llama.mib'), 0)} | {f(wkv, 0)} | {f(t.get('load_ms'), 0)} | {'pass' if ok else 'FAIL'} |")
print()
print(f"memory bandwidth measured here (PyTorch, 2 GiB): copy {bw.get('membw_copy_gbps', '?')} GB/s (read + write), "
      f"read {bw.get('membw_read_gbps', '?')} GB/s; fractions use {gbps} GB/s and rustorch-cli's bytes per token for both programs")
print("bounds: tg128 >= 1.5x llama.cpp, pp512 >= 1.0x (llama-bench -ngl 99 -fa 1 -p 512 -n 128, rustorch-cli bench -b cuda); "
      "GPU MiB: peak nvidia-smi memory.used above idle (100 ms samples; includes the CUDA context)")
sys.exit(1 if bad else 0)
PY
    return $rc
}

# ---- main ----------------------------------------------------------------------------------------
cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
stash)
    stash_carried "${@/#/$root/}"
    ls -l "$W/store"
    ;;
models)
    stash_carried
    case "${1:-start}" in
    start)
        join_sources
        ensure_py || exit 2
        if [ -f "$W/models/PID" ] && kill -0 "$(cat "$W/models/PID")" 2>/dev/null; then
            models_state
            exit 0
        fi
        ensure_llama >/dev/null 2>&1 # a carried bundle is unpacked here, before the job waits for it
        rm -f "$W/models/DONE"
        cp "$0" "$W/llm.sh"
        setsid nohup bash "$W/llm.sh" _models > "$W/logs/models.log" 2>&1 < /dev/null &
        echo $! > "$W/models/PID"
        log "models job started (log $W/logs/models.log)"
        ;;
    status)
        models_state
        ;;
    wait)
        t0=$(date +%s)
        while [ ! -f "$W/models/DONE" ] && [ $(( $(date +%s) - t0 )) -lt "${2:-300}" ]; do
            [ -f "$W/models/PID" ] && kill -0 "$(cat "$W/models/PID")" 2>/dev/null || break
            sleep 5
        done
        models_state
        cat "$W/logs/models.log"
        ;;
    *)
        echo "usage: $0 models start | status | wait SECONDS" >&2
        exit 2
        ;;
    esac
    ;;
_models)
    make_models
    ;;
kld|greedy|speed)
    stash_carried
    ensure_cli || exit 2
    ensure_llama || exit 2
    join_sources
    [ $# -gt 0 ] || { if [ "$cmd" = speed ]; then set -- "${SPEED[@]}"; else set -- "${CORRECT[@]}"; fi; }
    {
        echo "### $cmd ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
        echo
        gpu_line
        echo
    } | emit "$cmd"
    "part_$cmd" "$@" | emit "$cmd"
    exit "${PIPESTATUS[0]}"
    ;;
warm)
    # NVRTC compiles rustorch's kernels at the first start (about 76 s on the H200 host; cached in
    # $RUSTORCH_CUDA_CACHE after): done here on mkmodel.py's tiny model, e.g. while llama.cpp builds.
    ensure_cli || exit 2
    ensure_py || exit 2
    f="$W/models/tiny-f16.gguf"
    [ -f "$f" ] || PYTHONPATH="$W/py/gguf-py" python3 "$W/py/rustorch/mkmodel.py" tiny "$f" || exit 2
    t0=$(date +%s)
    "$CLI" bench -m "$f" -b cuda -p 16 -n 2 -r 1 > "$W/logs/warm.log" 2>&1 || { tail -5 "$W/logs/warm.log"; exit 1; }
    log "rustorch-cli -b cuda first start (kernel cache $RUSTORCH_CUDA_CACHE) took $(( $(date +%s) - t0 )) s"
    ;;
graphs)
    # Recorded decode steps (the default) against op-by-op steps (RUSTORCH_CUDA_GRAPHS=0): rustorch-cli greedy on
    # the greedy prompts, both ways; per model, prompts with identical tokens, the largest top-1 logit
    # difference over the steps both took alike, and whether the steps were recorded at all.
    stash_carried
    ensure_cli || exit 2
    join_sources
    [ $# -gt 0 ] || set -- smollm2-q4_1 smollm2-q4_k_m
    {
        echo "### graphs ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
        echo
        gpu_line
        echo
        echo "| model | prompts | same tokens | max top-1 logit diff | recorded? | op-by-op ms | recorded ms |"
        echo "| --- | --- | --- | --- | --- | --- | --- |"
    } | emit graphs
    rc=0
    for m in "$@"; do
        f="$(model_file "$m")"
        [ -f "$f" ] || { echo "| $m | missing | | | | | |" | emit graphs; rc=1; continue; }
        fam="${m%%-*}"
        [ "$fam" = smollm2rand ] && fam=smollm2
        prompts="$(render_prompts "$fam")" || { rc=1; continue; }
        ms=()
        for g in 0 1; do
            t0=$(date +%s%N)
            RUSTORCH_CUDA_GRAPHS=$g "$CLI" greedy -m "$f" -f "$prompts" -n "${GREEDY_N:-48}" -c 4096 -b cuda \
                > "$W/greedy/$m-g$g.jsonl" 2> "$W/logs/graphs-$m-g$g.err" || rc=1
            ms+=($(( ($(date +%s%N) - t0) / 1000000 )))
        done
        rec="yes"
        grep -q "op by op" "$W/logs/graphs-$m-g1.err" && rec="no: $(grep -m1 "op by op" "$W/logs/graphs-$m-g1.err" | cut -c1-160)"
        python3 - "$W/greedy/$m-g0.jsonl" "$W/greedy/$m-g1.jsonl" "$m" "$rec" "${ms[0]}" "${ms[1]}" <<'PY' | emit graphs || rc=1
import json, sys
a = {r["id"]: r for r in map(json.loads, filter(str.strip, open(sys.argv[1])))}
b = {r["id"]: r for r in map(json.loads, filter(str.strip, open(sys.argv[2])))}
same, worst = 0, 0.0
for i, ra in a.items():
    rb = b.get(i)
    if rb is None:
        continue
    same += ra["tokens"] == rb["tokens"]
    for ta, tb, xa, xb in zip(ra["tokens"], rb["tokens"], ra["top"], rb["top"]):
        if ta != tb:
            break
        worst = max(worst, abs(xa[1] - xb[1]))
print(f"| {sys.argv[3]} | {len(a)} | {same} | {worst:.4f} | {sys.argv[4]} | {sys.argv[5]} | {sys.argv[6]} |")
sys.exit(0 if len(a) == len(b) and a else 1)
PY
    done
    exit $rc
    ;;
quick)
    # A new build's check without llama.cpp (after bench/device_cuda.sh): TinyLlama-1.1B-shaped
    # random weights from mkmodel.py, quantized by rustorch-cli (QUICK_TYPES, default Q4_K_M F16),
    # `rustorch-cli bench -b cuda -p 512 -n 128 -r QUICK_REPS` for each, and greedy text with
    # recorded decode steps against op by op on the first.
    ensure_cli || exit 2
    ensure_py || exit 2
    f16="$W/models/quick-tinyllama-f16.gguf"
    [ -f "$f16" ] || PYTHONPATH="$W/py/gguf-py" python3 "$W/py/rustorch/mkmodel.py" tinyllama "$f16" > /dev/null || exit 2
    rc=0
    first=""
    for ty in ${QUICK_TYPES:-Q4_K_M F16}; do
        f="$W/models/quick-tinyllama-$ty.gguf"
        [ "$ty" = F16 ] && f="$f16"
        [ -f "$f" ] || "$CLI" quantize "$f16" "$f" "$ty" > "$W/logs/quick-quantize-$ty.log" 2>&1 || { log "quantize $ty failed"; rc=1; continue; }
        first="${first:-$f}"
        "$CLI" bench -m "$f" -b cuda -p 512 -n 128 -r "${QUICK_REPS:-3}" 2> "$W/logs/quick-bench-$ty.err" | tail -2 || rc=1
    done
    [ -n "$first" ] || exit 1
    for g in 0 1; do
        RUSTORCH_CUDA_GRAPHS=$g "$CLI" -m "$first" -b cuda -p "Once upon a time" -n 48 --temp 0 \
            > "$W/logs/quick-$g.txt" 2> "$W/logs/quick-$g.err" || { log "generation (graphs=$g) failed"; tail -3 "$W/logs/quick-$g.err"; rc=1; }
    done
    if cmp -s "$W/logs/quick-0.txt" "$W/logs/quick-1.txt"; then echo "quick: recorded steps give the op-by-op text"; else
        echo "quick: recorded and op-by-op texts differ (random weights: near-ties flip; compare with kld/greedy)"; fi
    exit $rc
    ;;
smoke)
    # rustorch-cli -b cuda on one model (default: the tiny one of `warm`), decode steps op by op
    # (RUSTORCH_CUDA_GRAPHS=0) and recorded as a CUDA graph (the default): the text of each, whether
    # they agree.
    ensure_cli || exit 2
    f="${1:+$(model_file "$1")}"
    f="${f:-$W/models/tiny-f16.gguf}"
    [ -f "$f" ] || { log "smoke: no $f (run warm first)"; exit 2; }
    for g in 0 1; do
        RUSTORCH_CUDA_GRAPHS=$g "$CLI" -m "$f" -b cuda -p "Once upon a time" -n "${SMOKE_N:-64}" --temp 0 \
            > "$W/logs/smoke-$g.txt" 2> "$W/logs/smoke-$g.err"
        echo "RUSTORCH_CUDA_GRAPHS=$g: exit $?"
        tail -4 "$W/logs/smoke-$g.err"
    done
    if cmp -s "$W/logs/smoke-0.txt" "$W/logs/smoke-1.txt"; then echo "smoke: same text"; else
        echo "smoke: texts differ"; head -c 600 "$W/logs/smoke-0.txt"; echo; echo ---; head -c 600 "$W/logs/smoke-1.txt"; echo; fi
    ;;
info)
    stash_carried
    ensure_cli && gpu_line
    ensure_llama && echo "llama.cpp: $LB" && head -4 "$LB/BUILD_INFO"
    join_sources
    models_state
    ls -l "$W/store"
    ;;
*)
    sed -n '2,50p' "$0"
    exit 2
    ;;
esac
