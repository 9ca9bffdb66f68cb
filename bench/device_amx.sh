#!/usr/bin/env bash
# AMX against AVX-512 VNNI for the quantized batch kernels, on a host with AMX (the device host),
# with binaries built here: one binary, two levels (RUSTORCH_QUANT_ISA), alternated in one run.
#
#   1. the kernels' bit-exactness tests at every level the host has (quant::matmul unit tests:
#      amx_panels_equal_vnni_panels, the x8 layout, ...);
#   2. the criterion bench `qmatmul/<TYPE>_4096x4096x512` at both levels, alternated;
#   3. end to end: a TinyLlama-1.1B-shaped Q4_K_M model (mkmodel.py, then `rustorch-cli quantize`,
#      which picks llama-quantize's types) `rustorch-cli bench -p 512 -n 0` at both levels.
#
# Fill .device-bin first (here):
#   cargo build --release -p rustorch-cli
#   cargo bench --no-run -p rustorch-cpu --bench quant_matmul    # prints the bench binary
#   cargo test --no-run -p rustorch-cpu --lib                     # prints the test binary
#   strip -o .device-bin/rustorch-cli target/release/rustorch-cli
#   strip -o .device-bin/quant_matmul <bench binary>; strip -o .device-bin/core_tests <test binary>
#   cp ../shared/tools/mkmodel.py .device-bin/
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform any -d .device-bin/whl gguf==0.19.0
# then on the device: bash bench/device_amx.sh [-t TYPES] [-r ROUNDS] [-c CPUS]  (carry .device-bin)
#   TYPES: the bench's weight types (default Q4_K,Q6_K,Q2_K); CPUS: cores to pin to (default 2,3)
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/.device-bin"
types="Q4_K,Q6_K,Q2_K"
rounds=2
cpus="2,3"
while [ $# -gt 0 ]; do
    case "$1" in
        -t) types="$2"; shift 2 ;;
        -r) rounds="$2"; shift 2 ;;
        -c) cpus="$2"; shift 2 ;;
        *) echo "device_amx: unknown option $1" >&2; exit 2 ;;
    esac
done
threads=$(( $(tr -cd ',' <<< "$cpus" | wc -c) + 1 ))
pin=(taskset -c "$cpus")
export RAYON_NUM_THREADS="$threads"

echo "== host"
grep -m1 "model name" /proc/cpuinfo
grep -o -w 'amx_tile\|amx_int8\|avx512_vnni\|avx512vbmi' /proc/cpuinfo | sort -u | tr '\n' ' '; echo

echo "== bit-exactness (quant::matmul unit tests)"
(cd "$root/crates/rustorch-cpu" && "$bin/core_tests" qmatmul 2>&1 | grep -E "amx|interleav|test result|FAILED|panicked|skipped")

echo "== kernels: qmatmul 4096x4096x512, $threads threads on cores $cpus"
filter="qmatmul/($(tr ',' '|' <<< "$types"))_4096x4096x512"
for r in $(seq "$rounds"); do
    for isa in avx512vnni amx; do
        echo "-- round $r, RUSTORCH_QUANT_ISA=$isa"
        RUSTORCH_QUANT_ISA=$isa "${pin[@]}" "$bin/quant_matmul" --bench "$filter" 2>&1 | grep -E "^qmatmul|time:"
    done
done

echo "== end to end: TinyLlama-shaped Q4_K_M, pp512"
work=/tmp/device_amx
mkdir -p "$work"
if [ ! -f "$work/tinyllama-q4_k_m.gguf" ]; then
    python3 -m pip install --quiet --no-index --no-deps --target "$work/py" "$bin"/whl/gguf-*.whl
    PYTHONPATH="$work/py" python3 "$bin/mkmodel.py" tinyllama "$work/tinyllama-f16.gguf" >/dev/null
    "$bin/rustorch-cli" quantize "$work/tinyllama-f16.gguf" "$work/tinyllama-q4_k_m.gguf" Q4_K_M --threads "$(nproc)" 2>&1 | tail -1
    rm -f "$work/tinyllama-f16.gguf"
fi
for r in $(seq "$rounds"); do
    for isa in avx512vnni amx; do
        echo "-- round $r, RUSTORCH_QUANT_ISA=$isa"
        RUSTORCH_QUANT_ISA=$isa "${pin[@]}" "$bin/rustorch-cli" bench -m "$work/tinyllama-q4_k_m.gguf" -t "$threads" -p 512 -n 0 -r 2 2>&1 | grep pp512
    done
done
