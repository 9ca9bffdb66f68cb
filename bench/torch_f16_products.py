#!/usr/bin/env python3
"""PyTorch's one-row F16 products on TinyLlama-1.1B's decode shapes, as a
reference for how fast the GPU reads F16 weights in launches of a decode
step's sizes (our fused kernels: docs/BENCHMARKS.md).

For each shape: `copies` distinct weights (more bytes than the L2 holds, so
every read comes from memory) multiplied in turn by one f16 row, the calls
recorded in one CUDA graph and replayed; then a whole step's products (22
layers of Q/K/V, output, gate + up, down, and the output head) in one graph.
Prints us a launch and TB/s (weight bytes / time).

    python3 bench/torch_f16_products.py        # on the device host (PyTorch with CUDA)
"""
import torch

D, F, QKV, V, L = 2048, 5632, 2560, 32000, 22


def graph_time(fn, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps  # us a replay


def main():
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(0), "torch", torch.__version__)
    for name, rows, cols in [("Q/K/V", QKV, D), ("output", D, D), ("gate+up", 2 * F, D), ("down", D, F)]:
        copies = max(8, int(600e6 // (rows * cols * 2)))
        ws = [torch.randn(rows, cols, device=dev, dtype=torch.float16) for _ in range(copies)]
        x = torch.randn(1, cols, device=dev, dtype=torch.float16)

        def run():
            for w in ws:
                torch.nn.functional.linear(x, w)

        us = graph_time(run) / copies
        mb = rows * cols * 2 / 1e6
        print(f"{name:8} {rows:>6} x {cols:<5} {mb:6.1f} MB  {us:7.2f} us a launch  {mb / us:5.2f} TB/s")
        del ws
    layers = [
        (torch.randn(QKV, D, device=dev, dtype=torch.float16), torch.randn(D, D, device=dev, dtype=torch.float16),
         torch.randn(2 * F, D, device=dev, dtype=torch.float16), torch.randn(D, F, device=dev, dtype=torch.float16))
        for _ in range(L)
    ]
    head = torch.randn(V, D, device=dev, dtype=torch.float16)
    x = torch.randn(1, D, device=dev, dtype=torch.float16)
    h = torch.randn(1, F, device=dev, dtype=torch.float16)

    def step():
        for wqkv, wo, wgu, wd in layers:
            torch.nn.functional.linear(x, wqkv)
            torch.nn.functional.linear(x, wo)
            torch.nn.functional.linear(x, wgu)
            torch.nn.functional.linear(h, wd)
        torch.nn.functional.linear(x, head)

    total = sum(w.numel() * 2 for lw in layers for w in lw) + head.numel() * 2
    us = graph_time(step)
    print(f"a step's products: {L} layers x 4 + head, {total / 1e6:.0f} MB: {us:.1f} us ({total / 1e6 / us:.2f} TB/s)")


if __name__ == "__main__":
    main()
