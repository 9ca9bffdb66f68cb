#!/usr/bin/env bash
# Builds tools/cupti_trace.c (a CUPTI kernel-timeline injection library) here, without a GPU, into
# .device-tools/libcupti_trace.so, for bench/device_cuda_profile.sh timeline on the device host
# (which has libcupti.so.13 but neither Nsight Systems nor CUPTI's headers). Headers come from the
# PyPI wheels nvidia-cuda-cupti, nvidia-cuda-runtime and nvidia-cuda-crt (CUDA 13.0, the device's driver).
set -euo pipefail
cd "$(dirname "$0")/.."
W=${CUPTI_WHEELS:-$HOME/.cache/rustorch/cupti13}
if [ ! -f "$W/nvidia/cu13/include/cupti.h" ] || [ ! -f "$W/nvidia/cu13/include/crt/host_defines.h" ]; then
    python3 -m pip install --quiet --no-deps --target "$W" nvidia-cuda-cupti==13.0.85 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88
fi
mkdir -p .device-tools
gcc -O2 -shared -fPIC -o .device-tools/libcupti_trace.so tools/cupti_trace.c -I "$W/nvidia/cu13/include" \
    -L "$W/nvidia/cu13/lib" -l:libcupti.so.13
echo ".device-tools/libcupti_trace.so"
