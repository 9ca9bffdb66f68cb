#!/usr/bin/env bash
# Compiler launcher (CMAKE_<LANG>_COMPILER_LAUNCHER) for llama.cpp builds made on this machine for
# another CPU (tools/build_llamacpp_device.sh): adds that CPU's flags to ggml-cpu's sources only,
# as GGML_NATIVE=ON adds -march=native to ggml-cpu only. Passing -march to every target instead
# (CMAKE_C_FLAGS) lets GCC contract ggml-base's float code into FMAs that a native build cannot
# use there: `nearest_int(iscale * x)` in quantize_row_q8_K_ref then rounds the exact product, so
# some K-quant activations quantize differently and the build no longer is the native one (seen on
# Sapphire Rapids: Q4_K/Q5_K/Q6_K files diverged from the native build's arithmetic, and
# llama-quantize wrote other K-quant bytes).
#
# usage (by cmake): llamacpp_cpu_launcher.sh [--cpu-flag=FLAG]... COMPILER ARGS...
flags=()
while [[ "${1:-}" == --cpu-flag=* ]]; do
    flags+=("${1#--cpu-flag=}")
    shift
done
for a in "$@"; do
    case "$a" in
        */ggml-cpu/*.c | */ggml-cpu/*.cpp) exec "$@" "${flags[@]}" ;;
    esac
done
exec "$@"
