#!/usr/bin/env bash
# Where rustorch-cli -b cuda spends its GPU time, on the device host (after
# `bash bench/device_cuda_llm.sh quick`, whose TinyLlama-shaped models and unpacked rustorch-cli
# this reads: /tmp/rt33/models/quick-tinyllama-TYPE.gguf, /tmp/rt33/bin/rustorch-cli).
#
#   bash bench/device_cuda_profile.sh times [TYPE...]     ncu gpu__time_duration of every kernel of
#                                                          one recorded decode step, summed by kernel
#                                                          (default Q4_K_M; F16 is the f16 file;
#                                                          SMOL-TYPE, in every command: SmolLM2-shaped)
#   bash bench/device_cuda_profile.sh kernel NAME [TYPE]  ncu's full set for one launch of kernel
#                                                          NAME (a regex) in decode steps (in a
#                                                          512-token prompt pass with NCU_PROMPT=1)
#   bash bench/device_cuda_profile.sh stalls NAME [TYPE]  ncu's stall reasons (cycles a warp waited per
#                                                          instruction issued, by reason), instructions,
#                                                          warps and duration of one launch of NAME in
#                                                          decode steps (NCU_SKIP, default 100, launches first)
#   bash bench/device_cuda_profile.sh prompt [TYPE...]    ncu gpu__time_duration of the kernels of
#                                                          a 512-token prompt pass, summed by kernel
#   bash bench/device_cuda_profile.sh ops [TYPE...]       RUSTORCH_PROFILE=1 of a 512-token prompt
#                                                          pass: time per op, and outside ops
#   bash bench/device_cuda_profile.sh timeline [TYPE...]  kernel timeline of bench's decode steps as
#                                                          they ran (CUPTI): per kernel, its share
#                                                          of a step's time as run (end after the
#                                                          previous kernel's end), its own duration
#                                                          and its start before that end (PDL overlap)
#   bash bench/device_cuda_profile.sh ab VAR=V... [-- TYPE...]
#                                                          tg128 of rustorch-cli bench with each
#                                                          setting in turn, in one run (for example
#                                                          RUSTORCH_CUDA_FUSED_ROPE=0 RUSTORCH_CUDA_FUSED_ROPE=1;
#                                                          several variables at once: A=1+B=2;
#                                                          AB_ARGS="-d 1024": after 1024 positions;
#                                                          the setting BASE: the build packed in
#                                                          .device-base by tools/pack_device_base.sh,
#                                                          e.g. BASE NONE for the old and new code)
#
# ncu runs with --clock-control none --cache-control none: each kernel alone, no cache flush, so a
# step's sum is above its time in a run (launches overlap there). Tables go to stdout; ncu's CSV to
# $OUT (or /tmp/rt33/logs).
set -uo pipefail
W=/tmp/rt33
CLI=$W/bin/rustorch-cli
OUTDIR=${OUT:-$W/logs}
mkdir -p "$OUTDIR"
export RUSTORCH_CUDA_CACHE=${RUSTORCH_CUDA_CACHE:-/tmp/rustorch-cuda-cache}
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
[ -x "$CLI" ] || { echo "device_cuda_profile: no $CLI (run bash bench/device_cuda_llm.sh quick first)" >&2; exit 2; }

model() { # TYPE (TinyLlama-shaped, from quick) or SMOL-TYPE (SmolLM2-shaped, made here) -> file
    local f="$W/models/quick-tinyllama-$1.gguf"
    [ "$1" = F16 ] && f="$W/models/quick-tinyllama-f16.gguf"
    if [[ "$1" == SMOL-* ]]; then
        local ty=${1#SMOL-} src="$W/models/quick-smollm2-f16.gguf"
        f="$W/models/quick-smollm2-$ty.gguf"
        [ "$ty" = F16 ] && f="$src"
        [ -f "$src" ] || PYTHONPATH="$W/py/gguf-py" python3 "$W/py/rustorch/mkmodel.py" smollm2 "$src" > /dev/null || return 1
        [ -f "$f" ] || "$CLI" quantize "$src" "$f" "$ty" > "$W/logs/quick-quantize-smol-$ty.log" 2>&1 || return 1
    fi
    [ -f "$f" ] || { echo "device_cuda_profile: no $f (QUICK_TYPES of quick)" >&2; return 1; }
    echo "$f"
}
gen() { # FILE: a short greedy generation
    "$CLI" -m "$1" -b cuda -p "Once upon a time" -n 12 --temp 0
}

# ncu's CSV (--csv --print-units base, gpu__time_duration.sum) summed by kernel, the most time first
# (the first $TOP lines, all by default): MODE step, one decode step, from one `copy_into_b8` (the
# step's position, copied into place by its first kernels) to the next; MODE prompt, the second
# half of the launches (bench's timed pass, after its warm-up pass).
sum_kernels() { # CSV MODE
    python3 - "$1" "$2" <<'PY'
import collections, csv, os, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
h = {k: j for j, k in enumerate(rows[head])}
seq = [(r[h["Kernel Name"]], float(r[h["Metric Value"]].replace(",", "")))
       for r in rows[head + 1:] if r[h["Metric Name"]] == "gpu__time_duration.sum"]
if sys.argv[2] == "step":
    starts = [i for i, (n, _) in enumerate(seq) if n.startswith("copy_into_b8")]
    if len(starts) < 2:
        sys.exit(f"fewer than two decode steps in {len(seq)} kernels: raise NCU_COUNT")
    a, b, what = starts[0], starts[1], "one decode step"
else:
    a, b, what = len(seq) // 2, len(seq), "one prompt pass"
agg = collections.defaultdict(lambda: [0, 0.0])
for n, t in seq[a:b]:
    agg[n[:48]][0] += 1
    agg[n[:48]][1] += t
print(f"{what}: {b - a} kernels, {sum(t for _, t in seq[a:b]) / 1000:.1f} us")
print(f"{'kernel':<50}{'calls':>6}{'us':>9}{'us each':>9}")
top = int(os.environ.get("TOP", "0")) or None
for n, (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]:
    print(f"{n:<50}{c:>6}{t / 1000:>9.1f}{t / c / 1000:>9.2f}")
PY
}

case "${1:-}" in
times | prompt)
    mode=$1
    shift
    for ty in "${@:-Q4_K_M}"; do
        f=$(model "$ty") || exit 2
        csv="$OUTDIR/ncu-$mode-$ty.csv"
        if [ "$mode" = times ]; then
            run=(--launch-skip "${NCU_SKIP:-1000}" --launch-count "${NCU_COUNT:-800}"
                "$CLI" -m "$f" -b cuda -p "Once upon a time" -n 12 --temp 0)
            part=step
        else
            # bench runs the pass twice (a warm-up, then the timed one): sum_kernels takes the second.
            run=("$CLI" bench -m "$f" -b cuda -p 512 -n 0 -r 1)
            part=prompt
        fi
        timeout 300 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
            --print-units base "${run[@]}" > "$csv" 2> "${csv%.csv}.err"
        echo "== $ty"
        sum_kernels "$csv" "$part"
    done
    ;;
kernel)
    name=${2:?kernel name (a regex)}
    f=$(model "${3:-Q4_K_M}") || exit 2
    csv="$OUTDIR/ncu-kernel.csv"
    run=("$CLI" -m "$f" -b cuda -p "Once upon a time" -n 12 --temp 0)
    [ "${NCU_PROMPT:-0}" = 1 ] && run=("$CLI" bench -m "$f" -b cuda -p 512 -n 0 -r 1)
    timeout 300 ncu --clock-control none --cache-control none --set full -k "regex:$name" \
        --launch-skip "${NCU_SKIP:-60}" --launch-count 1 --csv --page details \
        "${run[@]}" > "$csv" 2> "$OUTDIR/ncu-kernel.err"
    python3 - "$csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
h = {k: j for j, k in enumerate(rows[head])}
for r in rows[head + 1:]:
    if r[h["Metric Name"]]:
        print(f"{r[h['Section Name']][:24]:<26}{r[h['Metric Name']]:<50}{r[h['Metric Value']]} {r[h['Metric Unit']]}")
PY
    ;;
stalls)
    name=${2:?kernel name (a regex)}
    f=$(model "${3:-Q4_K_M}") || exit 2
    csv="$OUTDIR/ncu-stalls.csv"
    timeout 300 ncu --clock-control none --cache-control none -k "regex:$name" \
        --launch-skip "${NCU_SKIP:-100}" --launch-count 1 --csv --page raw \
        --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,gpu__time_duration.sum,smsp__inst_executed.sum,smsp__warps_launched.sum,smsp__cycles_active.max" \
        "$CLI" -m "$f" -b cuda -p "Once upon a time" -n 12 --temp 0 > "$csv" 2> "$OUTDIR/ncu-stalls.err"
    python3 - "$csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
i = next(i for i, r in enumerate(rows) if r[0] == "ID")
head, values = rows[i], rows[i + 2]
print(values[head.index("Kernel Name")])
out = []
for k, x in zip(head, values):
    try:
        v = float(x.replace(",", ""))
    except ValueError:
        continue
    if "stalled" in k:
        if v >= 0.05:
            out.append(("stall " + k.replace("smsp__average_warps_issue_stalled_", "").replace("_per_issue_active.ratio", ""), v))
    elif k.startswith(("gpu__time_duration.sum", "smsp__inst_executed.sum", "smsp__warps_launched.sum", "smsp__cycles_active.max")):
        out.append((k, v))
for k, v in sorted(out, key=lambda t: (t[0].startswith("stall"), -t[1])):
    print(f"  {k:<40}{v:,.2f}")
PY
    ;;
ops)
    shift
    types=("$@")
    [ ${#types[@]} -gt 0 ] || types=(Q4_K_M F16)
    for ty in "${types[@]}"; do
        f=$(model "$ty") || exit 2
        echo "== $ty"
        RUSTORCH_PROFILE=1 "$CLI" bench -m "$f" -b cuda -p 512 -n 0 -r 2 2>&1 | grep -A20 "^profile"
    done
    ;;
timeline)
    shift
    # A CUPTI injection library (tools/build_cupti_trace.sh, carried in .device-tools) records the
    # kernels as they ran: this host has no Nsight Systems.
    LIB=${CUPTI_TRACE_LIB:-$PWD/.device-tools/libcupti_trace.so}
    [ -f "$LIB" ] || { echo "device_cuda_profile: no $LIB (bash tools/build_cupti_trace.sh, carry .device-tools)" >&2; exit 2; }
    for ty in "${@:-Q4_K_M}"; do
        f=$(model "$ty") || exit 2
        csv="$OUTDIR/timeline-$ty.csv"
        # shellcheck disable=SC2086 # AB_ARGS: extra bench arguments (-d 1024)
        CUDA_INJECTION64_PATH=$LIB CUPTI_TRACE_OUT=$csv timeout 300 "$CLI" bench -m "$f" -b cuda -p 16 -n 128 -r 1 \
            ${AB_ARGS:-} > "$csv.log" 2>&1 || { tail -5 "$csv.log"; continue; }
        echo "== $ty ($(awk -F'|' '/tg128/ {print $(NF-1)}' "$csv.log" | tr -s ' ') t/s traced)"
        python3 - "$csv" <<'PY'
import collections, statistics, sys
seq = []
for line in open(sys.argv[1]):
    s, e, n = line.rstrip("\n").split(",", 2)
    seq.append((int(s), int(e), n))
seq.sort()
# Runs of kernels split where the GPU waited more than 15 us for the host; a step's recording is
# one long run (the host's own small launches between steps make short ones).
cuts = [0] + [i for i in range(1, len(seq)) if seq[i][0] - max(e for _, e, _ in seq[max(i - 8, 0):i]) > 15000]
runs = list(zip(cuts, cuts[1:] + [len(seq)]))
long = [b - a for a, b in runs if b - a >= 50]
if not long:
    sys.exit(f"no run of 50 kernels in {len(seq)}")
size = statistics.mode(long)
steps = [(a, b) for a, b in runs if b - a == size and a > 0][-100:]
if len(steps) < 20:
    sys.exit(f"only {len(steps)} decode steps in {len(seq)} kernels")
share = collections.defaultdict(float); dur = collections.defaultdict(float)
early = collections.defaultdict(float); calls = collections.Counter()
total = gaps = 0.0
prev = None
for a, b in steps:
    last_end = seq[a - 1][1]
    if prev is not None:
        total += seq[b - 1][1] - prev
    prev = seq[b - 1][1]
    gaps += max(seq[a][0] - last_end, 0)
    for i in range(a, b):
        s, e, n = seq[i]
        n = n[:44]
        share[n] += max(e - last_end, 0); dur[n] += e - s; early[n] += max(last_end - s, 0)
        calls[n] += 1
        last_end = max(last_end, e)
k = len(steps)
print(f"{k} decode steps of {size} kernels: {total / (k - 1) / 1000:.1f} us from one step's end to the next's "
      f"({(k - 1) * 1e9 / total:.0f} t/s traced), the recording's first kernel {gaps / k / 1000:.1f} us after the "
      "kernel before it")
print("share: the kernel's end after the previous end (its cost as run); dur: its own start to end;")
print("early: how long it started before the previous kernel ended (overlapped launch)")
print(f"{'kernel':<46}{'calls':>6}{'share us':>10}{'dur us':>9}{'early us':>10}")
for n in sorted(share, key=lambda n: -share[n]):
    print(f"{n:<46}{calls[n] / k:>6.0f}{share[n] / k / 1000:>10.1f}{dur[n] / k / 1000:>9.1f}{early[n] / k / 1000:>10.1f}")
PY
    done
    ;;
ab)
    shift
    settings=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do settings+=("$1"); shift; done
    [ "${1:-}" = "--" ] && shift
    [ ${#settings[@]} -gt 0 ] || { echo "usage: $0 ab VAR=V... [-- TYPE...]" >&2; exit 2; }
    base_cli=$W/base/rustorch-cli
    if printf '%s\n' "${settings[@]}" | grep -qx BASE; then
        root=$(cd "$(dirname "$0")/.." && pwd)
        [ -f "$root/.device-base/rustorch-cli.xz" ] || { echo "device_cuda_profile: no .device-base (tools/pack_device_base.sh)" >&2; exit 2; }
        rm -rf "$W/base" && mkdir -p "$W/base/cache"
        xz -dc "$root/.device-base/rustorch-cli.xz" > "$base_cli" && chmod +x "$base_cli"
        tar -xJf "$root/.device-base/kcache.tar.xz" -C "$W/base/cache"
    fi
    for ty in "${@:-Q4_K_M}"; do
        f=$(model "$ty") || exit 2
        for s in "${settings[@]}"; do
            # A setting of several variables joins them with '+' (A=1+B=2);
            # BASE runs the packed base build with its own kernels, NONE nothing set.
            cli=$CLI vars=()
            case $s in
                BASE) cli=$base_cli vars=(RUSTORCH_CUDA_CACHE="$W/base/cache") ;;
                NONE) ;;
                *) IFS='+' read -ra vars <<< "$s" ;;
            esac
            # shellcheck disable=SC2086 # AB_ARGS: extra bench arguments, split on spaces (-d 1024)
            tg=$(env "${vars[@]}" "$cli" bench -m "$f" -b cuda -p 512 -n 128 -r 3 ${AB_ARGS:-} 2>/dev/null | awk -F'|' '/tg128/ {print $(NF-1)}')
            echo "$ty $s: tg128 $tg t/s"
        done
    done
    ;;
*)
    sed -n '2,20p' "$0" >&2
    exit 2
    ;;
esac
