#!/usr/bin/env python3
"""Run RusTorch's CPU benchmarks and the same shapes through PyTorch in one
run, on the same machine, and print throughput ratios (RusTorch / PyTorch,
higher is better).

usage: python3 bench/compare_torch.py [--threads N] [--rounds R] [--filter SUBSTR]
                                    [--cpus 2,3] [--bench-bin PATH]

--cpus pins both sides (this process and the bench it starts) to the listed
cores, for a machine with more cores than the comparison uses. --bench-bin runs
a cpu_ops bench binary built elsewhere (for a machine without a Rust toolchain:
`cargo bench -p rustorch-cpu --bench cpu_ops --no-run` prints its path).

Shared machines drift: a neighbour's build can halve either side's speed for
seconds at a time. So the two sides are interleaved: for each benchmark, R
rounds of (RusTorch, then PyTorch), each a short measurement, and the table
shows the median over rounds of each side and the ratio of the medians, plus
the spread (min-max ratio over rounds) so a noisy result shows as noisy.

RusTorch side: the criterion bench binary of `cargo bench -p rustorch-cpu
--bench cpu_ops` (built once), run per round with a filter for one benchmark;
its median per round is read from target/criterion/<id>/new/estimates.json.
PyTorch side: torch.utils.benchmark with the same thread count.
Both use the threads given (default: every core). Needs `torch` (CPU build is enough).
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.utils import benchmark

ROOT = pathlib.Path(__file__).resolve().parent.parent


def torch_cases():
    """id -> (setup returning globals, statement); ids match benches/cpu_ops.rs."""
    g = torch.Generator().manual_seed(0)

    def rn(*s, dtype=torch.float32):
        return torch.randn(*s, generator=g).to(dtype)

    cases = {}
    for n in (512, 1024, 2048):
        cases[f"matmul_f32/{n}"] = (lambda n=n: {"a": rn(n, n), "b": rn(n, n)}, "a @ b")
    cases["matmul_f16/1024"] = (lambda: {"a": rn(1024, 1024, dtype=torch.float16), "b": rn(1024, 1024, dtype=torch.float16)}, "a @ b")
    for r, c in ((4096, 1024), (64, 32000)):
        cases[f"softmax_f32/{r}x{c}"] = (lambda r=r, c=c: {"x": rn(r, c), "F": F}, "F.softmax(x, -1)")
    for r, c in ((4096, 4096), (512, 2048)):
        cases[f"rms_norm_f32/{r}x{c}"] = (lambda r=r, c=c: {"x": rn(r, c), "w": rn(c), "F": F}, "F.rms_norm(x, (x.shape[-1],), w, 1e-5)")
    n = 1 << 22
    ew = lambda: {"a": rn(n), "b": rn(n), "F": F, "torch": torch}
    cases["elementwise_f32/add_4M"] = (ew, "a + b")
    cases["elementwise_f32/mul_4M"] = (ew, "a * b")
    cases["elementwise_f32/silu_4M"] = (ew, "F.silu(a)")
    cases["elementwise_f32/gelu_4M"] = (ew, "F.gelu(a)")
    cases["elementwise_f32/exp_4M"] = (ew, "torch.exp(a)")
    cases["conv2d_f32/resnet_8x64x56x56_k3"] = (lambda: {"x": rn(8, 64, 56, 56), "w": rn(64, 64, 3, 3), "F": F}, "F.conv2d(x, w, padding=1)")
    return cases


def criterion_median_ns(bench_id):
    path = ROOT / "target" / "criterion" / bench_id / "new" / "estimates.json"
    if not path.exists():
        return None
    with open(path) as f:
        return json.load(f)["median"]["point_estimate"]


def build_bench(env):
    """Builds the criterion bench once; returns the path of its binary."""
    cmd = ["cargo", "bench", "-p", "rustorch-cpu", "--bench", "cpu_ops", "--no-run",
           "--message-format", "json"]
    print("+", " ".join(cmd), file=sys.stderr)
    out = subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("target", {}).get("name") == "cpu_ops" \
                and msg.get("executable"):
            return msg["executable"]
    sys.exit("could not find the cpu_ops bench binary in cargo's output")


def run_ours(binary, bench_id, env, seconds):
    # Criterion matches the filter as a regex: anchor it to this one id.
    cmd = [binary, "--bench", "--noplot", "--warm-up-time", "0.5", "--measurement-time", str(seconds),
           "^" + bench_id + "$"]
    subprocess.run(cmd, cwd=ROOT / "crates" / "rustorch-cpu", env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return criterion_median_ns(bench_id)


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per benchmark")
    ap.add_argument("--seconds", type=float, default=1.0, help="measurement time per side per round")
    ap.add_argument("--filter", default="", help="comma-separated substrings; a benchmark runs if its id has one")
    ap.add_argument("--cpus", default="", help="comma-separated cores to pin both sides to")
    ap.add_argument("--bench-bin", default="", help="prebuilt cpu_ops bench binary (skips the build)")
    args = ap.parse_args()

    if args.cpus:
        # Inherited by the bench processes started below, so both sides share the same cores.
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads), CARGO_TARGET_DIR=str(ROOT / "target"))
    binary = os.path.abspath(args.bench_bin) if args.bench_bin else build_bench(env)
    torch.set_num_threads(args.threads)
    rows = []
    for bid, (setup, stmt) in torch_cases().items():
        if args.filter and not any(f in bid for f in args.filter.split(",")):
            continue
        timer = benchmark.Timer(stmt=stmt, globals=setup(), num_threads=args.threads)
        ours, theirs = [], []
        for _ in range(args.rounds):
            o = run_ours(binary, bid, env, args.seconds)
            if o is None:
                break
            ours.append(o)
            theirs.append(timer.blocked_autorange(min_run_time=args.seconds).median * 1e9)
        rows.append((bid, ours, theirs))
        if ours:
            print(f"{bid}: ours {median(ours) / 1e6:.3f} ms, torch {median(theirs) / 1e6:.3f} ms", file=sys.stderr)

    pinned = f", pinned to cores {args.cpus}" if args.cpus else ""
    print(f"\nthreads: {args.threads}{pinned}, torch {torch.__version__}, {args.rounds} interleaved rounds of "
          f"{args.seconds:g} s per side\n")
    print("| benchmark | RusTorch (median) | PyTorch (median) | ratio of medians (PyTorch / RusTorch) | per-round ratio min-max |")
    print("|---|---|---|---|---|")
    for bid, ours, theirs in rows:
        if not ours:
            print(f"| {bid} | (no result) | - | - | - |")
            continue
        per_round = [t / o for o, t in zip(ours, theirs)]
        print(f"| {bid} | {median(ours) / 1e6:.3f} ms | {median(theirs) / 1e6:.3f} ms | "
              f"{median(theirs) / median(ours):.2f}x | {min(per_round):.2f}-{max(per_round):.2f}x |")


if __name__ == "__main__":
    main()
