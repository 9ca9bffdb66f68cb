#!/usr/bin/env bash
# Speed of rustorch-cli against llama.cpp on this machine, in one run.
#
# For each model, `llama-bench -t T -p P -n N` and `rustorch-cli bench -t T -p P -n N` run
# interleaved: repetition i of llama.cpp, then repetition i of ours (each a fresh process with
# its own warm-up run), so that a change in the machine's load affects both alike. The table
# gives both tokens/s (mean ± sample sd over the repetitions) and the ratio ours / llama.cpp,
# plus our load time (model file to ready, mean) and our peak RSS (/usr/bin/time -v, largest
# over the repetitions) next to the model file's size and issue 5's memory budget: file + KV
# cache + 15% (the KV cache size is the one `rustorch-cli bench` reports).
# For generation tests a second table sets both programs' speed against the machine's memory
# read bandwidth on the same cores and thread count (`rustorch-cli membw`, measured before and
# after the runs, the better of the two): the bytes a token reads (every weight the step
# multiplies plus the key/value cache it attends, from the file's sizes, the same for both
# programs; `rustorch-cli bench -o json`'s bytes_per_token) times tokens/s, and that rate as a
# share of the bandwidth.
#
# usage: bench/compare_llamacpp.sh [-p 512] [-n 128] [-r 5] [-t 2] [-d 0] [-m MODELS] [-c CPUS]
#   MODELS: comma-separated list of
#           tinyllama-q4_k_m, tinyllama-q8_0, smollm2-q4_1, gemma3-q4_k_m (default: these four),
#           smollm2-shape-q4_1 (made like the TinyLlama ones, at SmolLM2-135M's shape),
#           NAME=PATH or PATH.gguf (any GGUF file, named NAME or by its file name in the table)
#   CPUS: pin both programs to these cores (taskset -c), for a machine with more cores than -t
#   -d: context depth, positions filled before each test (llama-bench's -d; tests `tg128 @ d1024`)
#   quick check: bench/compare_llamacpp.sh -p 32 -n 16 -r 1 -m smollm2-q4_1
#   --models-only: make or fetch the models, then stop
#
# Needs: llama.cpp's tools (tools/build_llamacpp.sh builds or finds them), cargo, python3 with
# numpy and gguf (for the shaped models: ../shared/tools/mkmodel.py, or $MKMODEL),
# /usr/bin/time. Environment: RUSTORCH_CACHE (default ~/.cache/rustorch), CARGO_TARGET_DIR,
# RUSTORCH_CLI (a prebuilt rustorch-cli to use instead of building one), LLAMA_BIN (a folder
# with prebuilt llama-bench and llama-quantize), LLAMA_BIN_AMX (optional: a folder with a second
# llama-bench, e.g. tools/build_llamacpp_device.sh's amx build; each repetition runs it too, and
# the table gains the columns "llama.cpp AMX t/s" and "ratio vs AMX", ours / that build),
# RUSTORCH_SMOLLM2_GGUF / RUSTORCH_GEMMA3_GGUF (model files to use instead of fetching them),
# BENCH_MODELS_DIR (where the shaped models are made and cached), QUANT_THREADS (llama-quantize's
# threads, default -t), TIME_BIN (GNU time, default /usr/bin/time).
#
# The TinyLlama-1.1B-shaped models (random weights: speed does not depend on their values) are
# made once as F16 with mkmodel.py, quantized with llama-quantize to Q4_K_M and Q8_0, and cached
# under $BENCH_MODELS_DIR (default $RUSTORCH_CACHE/models/bench; the F16 file is deleted after);
# smollm2-shape-q4_1 likewise. Only smollm2-q4_1 and gemma3-q4_k_m are ever fetched (network).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
n_prompt=512
n_gen=128
reps=5
threads=2
pin=""
models="tinyllama-q4_k_m,tinyllama-q8_0,smollm2-q4_1,gemma3-q4_k_m"
models_only=0
depth=0

usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
    case "$1" in
        -p) n_prompt="$2"; shift 2 ;;
        -n) n_gen="$2"; shift 2 ;;
        -r) reps="$2"; shift 2 ;;
        -t) threads="$2"; shift 2 ;;
        -d) depth="$2"; shift 2 ;;
        -m) models="$2"; shift 2 ;;
        -c) pin="$2"; shift 2 ;;
        --models-only) models_only=1; shift ;;
        -h|--help) usage 0 ;;
        *) echo "compare_llamacpp: unknown option $1" >&2; usage 2 ;;
    esac
done
for v in "$n_prompt" "$n_gen" "$reps" "$threads" "$depth"; do
    [[ "$v" =~ ^[0-9]+$ ]] || { echo "compare_llamacpp: not a number: $v" >&2; exit 2; }
done
[ "$reps" -ge 1 ] || { echo "compare_llamacpp: -r must be at least 1" >&2; exit 2; }

log() { echo "compare_llamacpp: $*" >&2; }

# chosen: the models' names in the table; given: their files, for those given by path.
IFS=',' read -r -a entries <<< "$models"
chosen=()
declare -A given=()
for m in "${entries[@]}"; do
    case "$m" in
        tinyllama-q4_k_m|tinyllama-q8_0|smollm2-q4_1|gemma3-q4_k_m|smollm2-shape-q4_1) chosen+=("$m") ;;
        *=*) chosen+=("${m%%=*}"); given["${m%%=*}"]="${m#*=}" ;;
        */*|*.gguf) name="$(basename "$m" .gguf)"; chosen+=("$name"); given["$name"]="$m" ;;
        *) log "unknown model $m (choose from tinyllama-q4_k_m, tinyllama-q8_0, smollm2-q4_1, gemma3-q4_k_m, smollm2-shape-q4_1, or give NAME=PATH or a .gguf path)"; exit 2 ;;
    esac
done
for m in "${!given[@]}"; do
    [ -s "${given[$m]}" ] || { log "$m: no model file at ${given[$m]}"; exit 1; }
done
if [ "$(printf '%s\n' "${chosen[@]}" | sort | uniq -d)" != "" ]; then
    log "a model name comes twice in -m $models (name files with NAME=PATH)"; exit 2
fi

cache="${RUSTORCH_CACHE:-$HOME/.cache/rustorch}"
bench_dir="${BENCH_MODELS_DIR:-$cache/models/bench}"

# --- tools ---------------------------------------------------------------------------------
llama_bin="${LLAMA_BIN:-$("$root/tools/build_llamacpp.sh" | tail -n 1)}"
[ -x "$llama_bin/llama-bench" ] || { log "no llama-bench in $llama_bin"; exit 1; }
llama_bin_amx="${LLAMA_BIN_AMX:-}"
if [ -n "$llama_bin_amx" ]; then
    [ -x "$llama_bin_amx/llama-bench" ] || { log "no llama-bench in $llama_bin_amx (LLAMA_BIN_AMX)"; exit 1; }
fi
if [ -n "${RUSTORCH_CLI:-}" ]; then
    cli="$RUSTORCH_CLI"
else
    log "building rustorch-cli (release)"
    (cd "$root" && cargo build --release -p rustorch-cli >&2)
    cli="${CARGO_TARGET_DIR:-$root/target}/release/rustorch-cli"
fi
[ -x "$cli" ] || { log "no rustorch-cli at $cli"; exit 1; }
time_bin="${TIME_BIN:-/usr/bin/time}"
[ -x "$time_bin" ] || { log "$time_bin (GNU time) is needed for the peak memory"; exit 1; }

# --- models --------------------------------------------------------------------------------
model_path() {
    if [ -n "${given[$1]:-}" ]; then echo "${given[$1]}"; return; fi
    case "$1" in
        smollm2-q4_1) echo "$RUSTORCH_SMOLLM2_GGUF" ;;
        gemma3-q4_k_m) echo "$RUSTORCH_GEMMA3_GGUF" ;;
        tinyllama-q4_k_m|tinyllama-q8_0|smollm2-shape-q4_1) echo "$bench_dir/$1.gguf" ;;
        *) log "unknown model $1"; exit 2 ;;
    esac
}

make_shaped() { # SHAPE QTYPE FILE: mkmodel.py's SHAPE as F16, quantized to QTYPE
    local shape="$1" qtype="$2" out="$3"
    [ -s "$out" ] && return 0
    local mkmodel="${MKMODEL:-$root/../shared/tools/mkmodel.py}"
    [ -f "$mkmodel" ] || { log "mkmodel.py not found at $mkmodel (set MKMODEL)"; exit 1; }
    mkdir -p "$bench_dir"
    local f16="$bench_dir/$shape-f16.gguf"
    if [ ! -s "$f16" ]; then
        log "making the $shape-shaped F16 model (mkmodel.py)"
        python3 "$mkmodel" "$shape" "$f16.partial" >&2
        mv "$f16.partial" "$f16"
    fi
    log "llama-quantize $shape -> $qtype"
    "$llama_bin/llama-quantize" "$f16" "$out.partial" "$qtype" "${QUANT_THREADS:-$threads}" >/dev/null 2>&1 \
        || { log "llama-quantize $qtype failed"; exit 1; }
    mv "$out.partial" "$out"
}

only=()
for m in "${chosen[@]}"; do
    [ -n "${given[$m]:-}" ] && continue
    case "$m" in
        smollm2-q4_1) [ -s "${RUSTORCH_SMOLLM2_GGUF:-}" ] || only+=(--only smollm2) ;;
        gemma3-q4_k_m) [ -s "${RUSTORCH_GEMMA3_GGUF:-}" ] || only+=(--only gemma3) ;;
    esac
done
if [ "${#only[@]}" -gt 0 ]; then
    eval "$(python3 "$root/tools/fetch_models.py" --print-env "${only[@]}")"
fi
for m in "${chosen[@]}"; do
    [ -n "${given[$m]:-}" ] && continue
    case "$m" in
        tinyllama-q4_k_m) make_shaped tinyllama Q4_K_M "$(model_path "$m")" ;;
        tinyllama-q8_0) make_shaped tinyllama Q8_0 "$(model_path "$m")" ;;
        smollm2-shape-q4_1) make_shaped smollm2 Q4_1 "$(model_path "$m")" ;;
        *) model_path "$m" >/dev/null ;;
    esac
done
rm -f "$bench_dir/tinyllama-f16.gguf" "$bench_dir/smollm2-f16.gguf"
[ "$models_only" = 1 ] && exit 0

# --- runs ----------------------------------------------------------------------------------
pinned=()
[ -n "$pin" ] && pinned=(taskset -c "$pin")
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
membw() { # the read bandwidth on the benchmark's cores and threads, as JSON in $work/membw.$1.json
    log "memory read bandwidth ($threads threads): rustorch-cli membw"
    "${pinned[@]}" "$cli" membw -t "$threads" -o json > "$work/membw.$1.json" 2> "$work/membw.$1.err" \
        || { cat "$work/membw.$1.err" >&2; log "rustorch-cli membw failed"; exit 1; }
}
membw before
for k in "${!chosen[@]}"; do
    m="${chosen[$k]}"
    path="$(model_path "$m")"
    for ((i = 1; i <= reps; i++)); do
        log "$m: repetition $i/$reps: llama-bench"
        "${pinned[@]}" "$llama_bin/llama-bench" -m "$path" -t "$threads" -p "$n_prompt" -n "$n_gen" -d "$depth" -r 1 -o json \
            > "$work/$k.llama.$i.json" 2> "$work/$k.llama.$i.err" \
            || { cat "$work/$k.llama.$i.err" >&2; log "llama-bench failed on $m"; exit 1; }
        if [ -n "$llama_bin_amx" ]; then
            log "$m: repetition $i/$reps: llama-bench (AMX build)"
            "${pinned[@]}" "$llama_bin_amx/llama-bench" -m "$path" -t "$threads" -p "$n_prompt" -n "$n_gen" -d "$depth" -r 1 -o json \
                > "$work/$k.amx.$i.json" 2> "$work/$k.amx.$i.err" \
                || { cat "$work/$k.amx.$i.err" >&2; log "llama-bench (AMX build) failed on $m"; exit 1; }
        fi
        log "$m: repetition $i/$reps: rustorch-cli bench"
        "$time_bin" -v -o "$work/$k.ours.$i.time" \
            "${pinned[@]}" "$cli" bench -m "$path" -t "$threads" -p "$n_prompt" -n "$n_gen" -d "$depth" -r 1 -o json \
            > "$work/$k.ours.$i.json" 2> "$work/$k.ours.$i.err" \
            || { cat "$work/$k.ours.$i.err" >&2; log "rustorch-cli bench failed on $m"; exit 1; }
    done
done
membw after

# --- table ---------------------------------------------------------------------------------
python3 - "$work" "$reps" "$threads${pin:+, pinned to cores $pin}" "${llama_bin_amx:+amx}" "${chosen[@]}" <<'EOF'
import json, os, re, statistics, sys

work, reps, threads, amx, models = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "amx", sys.argv[5:]

def stats(xs):
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)

def fmt(xs):
    m, s = stats(xs)
    return f"{m:.2f} ± {s:.2f}"

def llama(path, into):
    for t in json.load(open(path)):
        name = f"pp{t['n_prompt']}" if t["n_gen"] == 0 else f"tg{t['n_gen']}"
        if t.get("n_depth", 0):
            name += f" @ d{t['n_depth']}"
        into.setdefault(name, []).extend(t["samples_ts"])

bandwidth = max(json.load(open(f"{work}/membw.{w}.json"))["bytes_per_s"] for w in ("before", "after"))
rows, traffic = [], []
for k, m in enumerate(models):
    theirs, theirs_amx, ours, load_ms, rss_kib, kv = {}, {}, {}, [], [], 0
    per_token = {}
    size = None
    for i in range(1, reps + 1):
        llama(f"{work}/{k}.llama.{i}.json", theirs)
        if amx:
            llama(f"{work}/{k}.amx.{i}.json", theirs_amx)
        for t in json.load(open(f"{work}/{k}.ours.{i}.json")):
            ours.setdefault(t["test"], []).extend(t["samples_ts"])
            load_ms.append(t["load_ms"])
            kv = max(kv, t["kv_bytes"])
            if t.get("bytes_per_token"):
                per_token[t["test"]] = t["bytes_per_token"]
            size = os.path.getsize(t["model_filename"])
        text = open(f"{work}/{k}.ours.{i}.time").read()
        rss_kib.append(int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text).group(1)))
    for name in theirs:
        a, b = stats(theirs[name])[0], stats(ours[name])[0]
        row = [m, name, fmt(theirs[name]), fmt(ours[name]), f"{b / a:.2f}x"]
        if amx:
            c = stats(theirs_amx[name])[0]
            row += [fmt(theirs_amx[name]), f"{b / c:.2f}x"]
        rows.append(row + [f"{statistics.mean(load_ms):.0f}", f"{max(rss_kib) / 1024:.0f}", f"{size / 2**20:.0f}",
                           f"{kv / 2**20:.1f}", f"{(size + kv) * 1.15 / 2**20:.0f}",
                           "yes" if max(rss_kib) * 1024 <= (size + kv) * 1.15 else "NO"])
        if name in per_token:
            rate = lambda tps: f"{tps * per_token[name] / 1e9:.1f} GB/s = {100 * tps * per_token[name] / bandwidth:.0f}%"
            row = [m, name, f"{per_token[name] / 1e6:.1f}", rate(b), rate(a)]
            if amx:
                row.append(rate(stats(theirs_amx[name])[0]))
            traffic.append(row)

head = ["model", "test", "llama.cpp t/s", "rustorch t/s", "ratio"]
if amx:
    head += ["llama.cpp AMX t/s", "ratio vs AMX"]
head += ["load ms", "peak RSS MiB", "file MiB", "KV MiB", "budget MiB", "within"]
def table(head, rows):
    width = [max(len(r[c]) for r in rows + [head]) for c in range(len(head))]
    line = lambda r: "| " + " | ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(r, width))) + " |"
    print(line(head))
    print("| " + " | ".join(("-" * w) if i < 2 else ("-" * (w - 1) + ":") for i, w in enumerate(width)) + " |")
    for r in rows:
        print(line(r))

print(f"threads: {threads}, repetitions: {reps} (interleaved, one process each)")
table(head, rows)
if traffic:
    print()
    print(f"generation against the memory read bandwidth: {bandwidth / 1e9:.1f} GB/s "
          f"(rustorch-cli membw, same cores and threads, best of before and after the runs)")
    head = ["model", "test", "MB per token", "rustorch", "llama.cpp"] + (["llama.cpp AMX"] if amx else [])
    table(head, traffic)
EOF
