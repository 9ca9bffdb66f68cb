#!/usr/bin/env python3
"""Quantized matvec/matmul speed: RusTorch against llama.cpp, in one run on
the same machine, reported as GB/s of weights streamed beside this
machine's measured memory read bandwidth.

usage: python3 bench/compare_llamacpp_quant.py [--threads N] [--filter REGEX] [--rounds R]
                                               [--skip-rust] [--skip-llamacpp] [--llamacpp-bin DIR]
--rounds R runs both sides R times, alternating, and reports the median of
each side and the spread of the per-round ratios: on a noisy machine one
run of each can differ by 20% from the next.
RUSTORCH_BENCH_CPUS=0,1 pins llama.cpp to those cores (pin the whole script
with taskset too, so both sides run on the same cores).

RusTorch: `cargo bench -p rustorch-cpu --bench quant_matmul` (criterion; mean
time from target/criterion/<group>/<id>/new/estimates.json).
llama.cpp: `test-backend-ops perf -b CPU --test-file F`, where F lists one
MUL_MAT per (type, shape) in the format test-backend-ops reads, so both run
exactly the same shapes. Its binaries come from tools/build_llamacpp.sh
(built from the llama-cpp-python sources, without AMX), which lets
RUSTORCH_LLAMACPP_THREADS set its thread count.
Both include quantizing the f32 activations in each product.
"""
import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent

# name, ggml type id, block size, bytes per block
TYPES = [
    ("F32", 0, 1, 4), ("F16", 1, 1, 2), ("BF16", 30, 1, 2),
    ("Q4_0", 2, 32, 18), ("Q4_1", 3, 32, 20), ("Q5_0", 6, 32, 22), ("Q5_1", 7, 32, 24),
    ("Q8_0", 8, 32, 34), ("Q8_1", 9, 32, 36),
    ("Q2_K", 10, 256, 84), ("Q3_K", 11, 256, 110), ("Q4_K", 12, 256, 144),
    ("Q5_K", 13, 256, 176), ("Q6_K", 14, 256, 210), ("Q8_K", 15, 256, 292),
    ("IQ4_NL", 20, 32, 18), ("IQ4_XS", 23, 256, 136),
]
# group, rows (outputs), cols (inputs), batch (activation rows)
SHAPES = [("qmatvec", 4096, 4096, 1), ("qmatvec", 5632, 2048, 1), ("qmatmul", 4096, 4096, 512)]
GGML_OP_MUL_MAT = 29
# Weight types llama.cpp's CPU backend cannot multiply (no vec_dot; its test
# harness aborts trying to fill them), shown as "-" in its columns.
LLAMACPP_UNSUPPORTED = {"Q8_1", "Q8_K"}


def bench_id(group, name, rows, cols, batch):
    shape = f"{rows}x{cols}" if batch == 1 else f"{rows}x{cols}x{batch}"
    return f"{group}/{name}_{shape}"


def weight_bytes(bs, ts, rows, cols):
    return rows * cols // bs * ts


def target_dir():
    return pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))


def criterion_seconds(bid):
    path = target_dir() / "criterion" / bid / "new" / "estimates.json"
    if not path.exists():
        return None
    with open(path) as f:
        return json.load(f)["mean"]["point_estimate"] * 1e-9


def median(values):
    """Median of floats; a non-float entry ("unsupported") is passed through."""
    if not all(isinstance(v, float) for v in values):
        return values[0]
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def run_rust(threads, filt):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    cmd = ["cargo", "bench", "-p", "rustorch-cpu", "--bench", "quant_matmul", "--"]
    if filt:
        cmd.append(filt)
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)


def llamacpp_bin(override=None):
    if override:
        return pathlib.Path(override)
    out = subprocess.run(["bash", str(ROOT / "tools" / "build_llamacpp.sh")], check=True,
                         capture_output=True, text=True).stdout
    return pathlib.Path(out.strip().splitlines()[-1])


def run_llamacpp(threads, cases, bin_dir=None):
    """cases: list of (bench id, name, type id, bs, ts, rows, cols, batch) -> {id: seconds}"""
    lines = []
    for bid, name, tid, bs, ts, rows, cols, batch in cases:
        if name in LLAMACPP_UNSUPPORTED:
            continue
        row_bytes = cols // bs * ts
        w_nb = [ts, row_bytes, row_bytes * rows, row_bytes * rows]
        x_nb = [4, 4 * cols, 4 * cols * batch, 4 * cols * batch]
        tag = bid.replace("/", ".")
        lines.append(" ".join(map(str, [
            GGML_OP_MUL_MAT, 0, rows, batch, 1, 1, 0, 2,
            tid, cols, rows, 1, 1, *w_nb,
            0, cols, batch, 1, 1, *x_nb,
            tag])))
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(lines) + "\n")
        path = f.name
    exe = llamacpp_bin(bin_dir) / "test-backend-ops"
    env = dict(os.environ, RUSTORCH_LLAMACPP_THREADS=str(threads))
    cmd = [str(exe), "perf", "-b", "CPU", "--test-file", path]
    if os.environ.get("RUSTORCH_BENCH_CPUS"):
        # Pin to the same cores as the RusTorch run (e.g. "0,1").
        cmd = ["taskset", "-c", os.environ["RUSTORCH_BENCH_CPUS"]] + cmd
    print("+", " ".join(cmd), file=sys.stderr)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True).stdout
    os.unlink(path)
    times = {}
    for line in out.splitlines():
        m = re.search(r"name=([\w.]+).*?([\d.]+) us/run", line)
        if m:
            times[m.group(1).replace(".", "/", 1)] = float(m.group(2)) * 1e-6
        elif "MUL_MAT" in line and "not supported" in line:
            m = re.search(r"name=([\w.]+)", line)
            if m:
                times[m.group(1).replace(".", "/", 1)] = "unsupported"
    if not times:
        print(out, file=sys.stderr)
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--filter", default="")
    ap.add_argument("--rounds", type=int, default=1,
                    help="alternate RusTorch and llama.cpp this many times; report medians")
    ap.add_argument("--skip-rust", action="store_true")
    ap.add_argument("--skip-llamacpp", action="store_true")
    ap.add_argument("--llamacpp-bin", help="folder with test-backend-ops (default: tools/build_llamacpp.sh)")
    args = ap.parse_args()

    cases = []
    for group, rows, cols, batch in SHAPES:
        for name, tid, bs, ts in TYPES:
            bid = bench_id(group, name, rows, cols, batch)
            if re.search(args.filter, bid):
                cases.append((bid, name, tid, bs, ts, rows, cols, batch))

    ours_runs = {bid: [] for bid, *_ in cases}
    llama_runs = {bid: [] for bid, *_ in cases}
    for _ in range(max(1, args.rounds)):
        if not args.skip_rust:
            run_rust(args.threads, args.filter)
            for bid in ours_runs:
                t = criterion_seconds(bid)
                if t:
                    ours_runs[bid].append(t)
        if not args.skip_llamacpp:
            for bid, t in run_llamacpp(args.threads, cases, args.llamacpp_bin).items():
                if bid in llama_runs:
                    llama_runs[bid].append(t)
    if not args.skip_rust and args.filter and "membw" not in args.filter:
        run_rust(args.threads, "membw")
    llama = {bid: median(ts) for bid, ts in llama_runs.items() if ts}
    ours_of = {bid: median(ts) for bid, ts in ours_runs.items() if ts}
    if args.skip_rust:
        ours_of = {bid: criterion_seconds(bid) for bid in ours_runs}

    bw = criterion_seconds("membw/read_1GiB")
    bw_gbs = (1 << 30) / bw / 1e9 if bw else None
    print(f"\nthreads: {args.threads}; memory read bandwidth (membw/read_1GiB): "
          + (f"{bw_gbs:.1f} GB/s" if bw_gbs else "not measured"))
    print("GB/s = bytes of weights / time per product (activation quantization included)\n")
    if args.rounds > 1:
        print(f"{args.rounds} alternating rounds: times are medians; 'rounds' gives the lowest and "
              "highest per-round ratio\n")
    print("| benchmark | weights | RusTorch | GB/s | llama.cpp | GB/s | speed ratio (llama.cpp time / RusTorch time) | RusTorch % of bandwidth |"
          + (" rounds |" if args.rounds > 1 else ""))
    print("|---|---|---|---|---|---|---|---|" + ("---|" if args.rounds > 1 else ""))
    for bid, name, tid, bs, ts, rows, cols, batch in cases:
        wb = weight_bytes(bs, ts, rows, cols)
        ours = ours_of.get(bid)
        ref = llama.get(bid)
        cell = lambda t: f"{t * 1e3:.3f} ms" if isinstance(t, float) else (t or "-")
        gbs = lambda t: f"{wb / t / 1e9:.1f}" if isinstance(t, float) else "-"
        ratio = f"{ref / ours:.2f}x" if isinstance(ref, float) and ours else "-"
        frac = f"{wb / ours / 1e9 / bw_gbs * 100:.0f}%" if ours and bw_gbs else "-"
        spread = ""
        if args.rounds > 1:
            pairs = [r / o for o, r in zip(ours_runs[bid], llama_runs[bid])
                     if isinstance(r, float)]
            spread = f" {min(pairs):.2f}-{max(pairs):.2f}x |" if pairs else " - |"
        print(f"| {bid} | {wb / 2**20:.1f} MiB | {cell(ours)} | {gbs(ours)} | {cell(ref)} | {gbs(ref)} | {ratio} | {frac} |{spread}")


if __name__ == "__main__":
    main()
