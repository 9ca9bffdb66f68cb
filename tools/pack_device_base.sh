#!/usr/bin/env bash
# Packs rustorch-cli and its kernel cache as built from a commit (default
# HEAD) into .device-base/, for `bench/device_cuda_profile.sh ab BASE ...`:
# the working tree's build against that commit's in one run on the device
# (the GPU machine changes between calls, so only one run compares).
# Built in a worktree with the repository's target folder (only the crates
# that differ rebuild); NVRTC 13.0 as tools/../.device-kcache's cache.
# usage: tools/pack_device_base.sh [COMMIT]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
commit="${1:-HEAD}"
wt=$(mktemp -d /tmp/rustorch-base.XXXXXX)
out=$(mktemp -d /tmp/rustorch-base-out.XXXXXX)
cache="$out/kcache"
mkdir -p "$cache"
trap 'git -C "$root" worktree remove --force "$wt" 2>/dev/null || true; rm -rf "$wt" "$out"' EXIT
git -C "$root" worktree add -q --detach "$wt" "$commit"
nvrtc="${XDG_CACHE_HOME:-$HOME/.cache}/rustorch/nvrtc13.0/nvidia/cu13/lib"
(
    cd "$wt"
    CARGO_TARGET_DIR="$root/target" cargo build --release -q -p rustorch-cli --features cuda
    strip -o "$out/rustorch-cli" "$root/target/release/rustorch-cli"
    LD_LIBRARY_PATH="$nvrtc" RUSTORCH_CUDA_CACHE="$cache" CARGO_TARGET_DIR="$root/target" \
        cargo run --release -q -p rustorch-cuda --example kernel_cache -- sm_90
)
mkdir -p "$root/.device-base"
xz -T2 -6 -c "$out/rustorch-cli" > "$root/.device-base/rustorch-cli.xz"
tar -cJf "$root/.device-base/kcache.tar.xz" -C "$cache" .
git -C "$root" rev-parse --short "$commit" > "$root/.device-base/COMMIT"
echo "packed $(cat "$root/.device-base/COMMIT") into .device-base"
