#!/usr/bin/env bash
# Old against new rustorch-cli, alternated in one run on one machine: the
# "no loss beyond noise" check of a refactor. Prints pp/tg tokens per second
# of each binary per round and the new/old ratios of the medians and of the
# best runs.
#
# Usage: bench/compare_binaries.sh OLD_CLI NEW_CLI MODEL.gguf [MODEL.gguf...]
# Env: ROUNDS (default 3), THREADS (default 2), PP (512), TG (128).
set -euo pipefail
old=$1 new=$2
shift 2
rounds=${ROUNDS:-3} threads=${THREADS:-2} pp=${PP:-512} tg=${TG:-128}
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs; -t $threads"
for model in "$@"; do
  tmp=$(mktemp -d)
  for r in $(seq "$rounds"); do
    for which in old new; do
      bin=$old
      [ "$which" = new ] && bin=$new
      "$bin" bench -m "$model" -t "$threads" -p "$pp" -n "$tg" -r 1 -o json 2>/dev/null >"$tmp/$which.$r.json"
    done
  done
  python3 - "$tmp" "$rounds" "$(basename "$model")" <<'PY'
import json, statistics, sys
tmp, rounds, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def speeds(which):
    out = {}
    for r in range(1, rounds + 1):
        for t in json.load(open(f"{tmp}/{which}.{r}.json")):
            key = f"pp{t['n_prompt']}" if t["n_prompt"] else f"tg{t['n_gen']}"
            out.setdefault(key, []).append(t["avg_ts"])
    return out
old, new = speeds("old"), speeds("new")
for key in old:
    o, n = statistics.median(old[key]), statistics.median(new[key])
    # On a shared virtual machine slow runs come from neighbours; the best of each is the
    # steadier estimate, the median the usual one: both are printed.
    bo, bn = max(old[key]), max(new[key])
    print(f"{name} {key}: median old {o:.1f} new {n:.1f} t/s, new/old {n / o:.3f}; best new/old {bn / bo:.3f} "
          f"(old {', '.join(f'{x:.1f}' for x in old[key])}; new {', '.join(f'{x:.1f}' for x in new[key])})")
PY
  rm -rf "$tmp"
done
