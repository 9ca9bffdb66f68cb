#!/usr/bin/env bash
# Fills .device-cuda/ (git-ignored) with what bench/device_cuda.sh runs on the device host (no
# Rust there): the rustorch-cuda test binaries (kernel compile check, conformance suite) and
# its cuda_bench, cuda_transfers and host_costs examples, built
# here without a GPU, stripped and xz-compressed (about 3 MiB), and the path they were built at
# (their fixtures are read from there). Then: carry [".device-cuda"], run bench/device_cuda.sh.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/.device-cuda"
rm -rf "$out" && mkdir -p "$out"
cd "$root"
cargo test -p rustorch-cuda --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])
' | while read -r name exe; do
    strip -o "$out/$name" "$exe"
    xz -T2 -6 -f "$out/$name"
done
for ex in cuda_bench cuda_transfers host_costs; do
    cargo build --release -p rustorch-cuda --example "$ex" 2>/dev/null
    strip -o "$out/$ex" "$root/target/release/examples/$ex"
    xz -T2 -6 -f "$out/$ex"
done
echo "$root" > "$out/BUILT_AT"
ls -la "$out" >&2
