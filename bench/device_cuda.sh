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
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
rc=0
"$bin/kernels_compile" --nocapture 2>&1 | tail -5 || rc=1
# The coverage lines (what ran on the GPU, what the backend declines) and the verdicts; a
# failing check's own messages are in /tmp/rustorch-cuda-conformance.log.
"$bin/conformance" --nocapture --test-threads 1 > /tmp/rustorch-cuda-conformance.log 2>&1 || rc=1
grep -E "random cases ran|fixture comparisons|checks need|checks failed|differ from the CPU|^test result|^failures|^    cuda::" \
    /tmp/rustorch-cuda-conformance.log | cut -c1-2000
echo "== single ops, RusTorch vs PyTorch (median ms; ratio = PyTorch time / RusTorch time, >1 is faster)"
"$bin/cuda_bench" 20 > /tmp/rt.txt 2>&1 || { cat /tmp/rt.txt; rc=1; }
python3 "$root/bench/torch_cuda_ops.py" 20 > /tmp/pt.txt 2>&1 || { cat /tmp/pt.txt; rc=1; }
python3 - <<'PY'
rt = dict(l.split() for l in open("/tmp/rt.txt") if len(l.split()) == 2)
pt = dict(l.split() for l in open("/tmp/pt.txt") if len(l.split()) == 2)
print(f"{'case':<22}{'rustorch ms':>13}{'torch ms':>11}{'ratio':>8}")
for k in rt:
    if k in pt:
        r, p = float(rt[k]), float(pt[k])
        print(f"{k:<22}{r:>13.4f}{p:>11.4f}{p / r:>8.2f}")
    else:
        # RusTorch-only cases (the quantized products).
        print(f"{k:<22}{float(rt[k]):>13.4f}{'-':>11}{'-':>8}")
PY
exit $rc
