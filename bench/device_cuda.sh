#!/usr/bin/env bash
# Runs the CUDA backend's tests on the device host (no Rust there): the
# kernel compile check, the conformance suite in strict mode, and single-op
# timings against PyTorch on the same GPU in the same run, from the
# stripped, xz-compressed test binaries that tools/device_bundle_cuda.sh
# puts in .device-cuda/ (carry [".device-cuda"]).
#
# The test binaries read fixtures from the path they were built at; a link
# from there to this checkout makes them find them.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin=/tmp/rustorch-cuda-bin
mkdir -p "$bin"
for f in "$root"/.device-cuda/*.xz; do
    xz -dc "$f" > "$bin/$(basename "$f" .xz)" && chmod +x "$bin/$(basename "$f" .xz)"
done
built_at=$(cat "$root/.device-cuda/BUILT_AT")
if [ "$built_at" != "$root" ] && [ ! -e "$built_at" ]; then
    mkdir -p "$(dirname "$built_at")" && ln -s "$root" "$built_at"
fi
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export RUSTORCH_CUDA_CACHE=/tmp/rustorch-cuda-cache RUSTORCH_REQUIRE_NVRTC=1
# Machine code made here in advance (examples/kernel_cache.rs with the device's NVRTC version):
# the first start loads it instead of compiling (a minute or more of device time).
if [ -f "$root/.device-kcache/kcache.tar.xz" ]; then
    mkdir -p "$RUSTORCH_CUDA_CACHE" && tar -xJf "$root/.device-kcache/kcache.tar.xz" -C "$RUSTORCH_CUDA_CACHE"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
rc=0
# The compile check of every kernel for two architectures runs in CI (NVRTC from the wheel); here
# only on request, as it spends device minutes in NVRTC.
if [ "${DEVICE_CUDA_COMPILE:-0}" = 1 ]; then
    "$bin/kernels_compile" --nocapture 2>&1 | tail -5 || rc=1
fi
# The coverage lines (what ran on the GPU, what the backend declines) and the verdicts; a
# failing check's own messages are in /tmp/rustorch-cuda-conformance.log.
"$bin/conformance" --nocapture --test-threads 1 > /tmp/rustorch-cuda-conformance.log 2>&1 || rc=1
grep -E "random cases ran|fixture comparisons|checks need|checks failed|differ from the CPU|^test result|^failures|^    cuda::" \
    /tmp/rustorch-cuda-conformance.log | cut -c1-2000
# The fused norm + products kernels of the quantized types are off by default (slower there,
# src/ops/norm_products.rs): the suite's ops again with them on.
RUSTORCH_CUDA_NORM_PRODUCTS_QUANT=1 "$bin/conformance" --nocapture --test-threads 1 random_other \
    > /tmp/rustorch-cuda-conformance-nq.log 2>&1 || rc=1
grep -E "^test result|^failures|^    cuda::" /tmp/rustorch-cuda-conformance-nq.log | sed 's/^/norm-products-quant: /' | cut -c1-2000
# Faults on the GPU itself: out of memory under a cap, and a real kernel
# fault (each in its own process: the fault spoils the CUDA context); recorded
# passes (CUDA graphs) replayed with new inputs, and what cannot be recorded; the MMQ products
# (llama.cpp CUDA's arithmetic for prompts, which the suite leaves out) against the exact product.
for t in out_of_memory lost_device capture mmq; do
    # A panic's message follows its "panicked at" line: the two lines after it are kept.
    "$bin/$t" --nocapture 2>&1 | awk '/panicked/ {n = 3} n > 0 {print; n--; next} /^test |skipped/' || rc=1
done
# The decode attention that rotates its inputs and writes the caches itself, switched off: it
# declines, and the ops run one by one.
RUSTORCH_CUDA_ROPE_ATTENTION=0 "$bin/capture" --nocapture the_attention_with_its_rope 2>&1 |
    grep -E "^test |panicked" | sed 's/^/rope-attention-off: /' || rc=1
# Single-op timings and transfers (issue 32's tables): DEVICE_CUDA_BENCH=0 leaves them out.
[ "${DEVICE_CUDA_BENCH:-1}" = 1 ] || exit $rc
echo "== single ops, RusTorch vs PyTorch (median ms; ratio = PyTorch time / RusTorch time, >1 is faster)"
"$bin/cuda_bench" 20 > /tmp/rt.txt 2>&1 || { cat /tmp/rt.txt; rc=1; }
python3 "$root/bench/torch_cuda_ops.py" 20 > /tmp/pt.txt 2>&1 || { cat /tmp/pt.txt; rc=1; }
python3 - <<'PY'
rt = dict(l.split() for l in open("/tmp/rt.txt") if len(l.split()) == 2)
pt = dict(l.split() for l in open("/tmp/pt.txt") if len(l.split()) == 2)
print(f"{'case':<34}{'rustorch ms':>13}{'torch ms':>11}{'ratio':>8}")
for k in rt:
    if k.endswith("_gbps"):
        # Not a time: the weight bytes the product read per second.
        print(f"{k:<34}{float(rt[k]):>13.1f} GB/s")
    elif k in pt:
        r, p = float(rt[k]), float(pt[k])
        print(f"{k:<34}{r:>13.4f}{p:>11.4f}{p / r:>8.2f}")
    else:
        # RusTorch-only cases (the quantized products).
        print(f"{k:<34}{float(rt[k]):>13.4f}{'-':>11}{'-':>8}")
PY
echo "== transfers from/to pageable host memory (GB/s, median): the driver's pageable copy, pinned staging,"
echo "   mapped memory read by a kernel, and auto (what upload/download pick for the size)"
"$bin/cuda_transfers" > /tmp/tr.txt 2>&1 || { cat /tmp/tr.txt; rc=1; }
python3 - <<'PY'
rows = {}
for l in open("/tmp/tr.txt"):
    p = l.split()
    if len(p) == 5 and p[0] == "transfer":
        rows.setdefault((p[1], int(p[2])), {})[p[3]] = float(p[4])
methods = ["pageable", "pinned", "mapped", "auto"]
print(f"{'direction':<10}{'size':>12}" + "".join(f"{m:>10}" for m in methods))
for (d, size), r in sorted(rows.items(), key=lambda kv: (kv[0][0] != "up", kv[0][1])):
    label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
    print(f"{d:<10}{label:>12}" + "".join(f"{r.get(m, float('nan')):>10.2f}" for m in methods))
PY
exit $rc
