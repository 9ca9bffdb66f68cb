#!/usr/bin/env python3
"""Run RusTorch's CPU benchmarks and the same shapes through PyTorch in one
run, on the same machine, and print throughput ratios (RusTorch / PyTorch,
higher is better).

usage: python3 bench/compare_torch.py [--threads N] [--skip-rust] [--filter SUBSTR]

RusTorch side: `cargo bench -p rustorch-core --bench cpu_ops` (criterion);
its mean time per benchmark is read from target/criterion/<id>/new/estimates.json.
PyTorch side: torch.utils.benchmark with the same thread count.
Both use all threads given (default: every core). Needs `torch` (CPU build is enough).
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


def criterion_mean_ns(bench_id):
    path = ROOT / "target" / "criterion" / bench_id / "new" / "estimates.json"
    if not path.exists():
        return None
    with open(path) as f:
        return json.load(f)["mean"]["point_estimate"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--skip-rust", action="store_true", help="reuse the last criterion results")
    ap.add_argument("--filter", default="")
    args = ap.parse_args()

    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    if not args.skip_rust:
        cmd = ["cargo", "bench", "-p", "rustorch-core", "--bench", "cpu_ops", "--", "--noplot"]
        if args.filter:
            cmd.append(args.filter)
        print("+", " ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, cwd=ROOT, env=env, check=True)

    torch.set_num_threads(args.threads)
    rows = []
    for bid, (setup, stmt) in torch_cases().items():
        if args.filter and args.filter not in bid:
            continue
        t = benchmark.Timer(stmt=stmt, globals=setup(), num_threads=args.threads)
        torch_ns = t.blocked_autorange(min_run_time=2.0).median * 1e9
        ours = criterion_mean_ns(bid)
        rows.append((bid, ours, torch_ns))

    print(f"\nthreads: {args.threads}, torch {torch.__version__}\n")
    print("| benchmark | RusTorch | PyTorch | speed ratio (PyTorch time / RusTorch time) |")
    print("|---|---|---|---|")
    for bid, ours, theirs in rows:
        if ours is None:
            print(f"| {bid} | (no result) | {theirs / 1e6:.3f} ms | - |")
        else:
            print(f"| {bid} | {ours / 1e6:.3f} ms | {theirs / 1e6:.3f} ms | {theirs / ours:.2f}x |")


if __name__ == "__main__":
    main()
