#!/usr/bin/env python3
"""Sums an executor trace (RUSTORCH_TRACE=1, stderr of rustorch-cli) by op: where a forward pass spends its time.

usage: trace_summary.py TRACE.txt [--shapes] [--top N]
  --shapes: one line per op and operand shapes (else per op)
"""
import collections
import re
import sys

UNIT_MS = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}


def main():
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        sys.exit(0 if args else 2)
    shapes = "--shapes" in args
    top = int(args[args.index("--top") + 1]) if "--top" in args else 25
    total, count = collections.defaultdict(float), collections.Counter()
    with open(args[0], encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.startswith("[rustorch trace]"):
                continue
            fields = [x.strip() for x in line.split("|")]
            m = re.match(r"([\d.]+)\s*(ns|µs|us|ms|s)$", fields[-1])
            if not m:
                continue
            key = f"{fields[1]} {fields[2]}" if shapes else fields[1]
            total[key] += float(m.group(1)) * UNIT_MS[m.group(2)]
            count[key] += 1
    whole = sum(total.values()) or 1.0
    for key, ms in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{ms:10.1f} ms {100 * ms / whole:5.1f}%  x{count[key]:<5} {key}")
    print(f"{whole:10.1f} ms in all traced ops")


if __name__ == "__main__":
    main()
