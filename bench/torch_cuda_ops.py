"""PyTorch's times for the cases of crates/rustorch-cuda/examples/cuda_bench.rs, on the same GPU,
in the same format (`name milliseconds`, median of REPS runs after warm-up, each ended by a
synchronization), for bench/device_cuda.sh's ratios."""
import sys
import time

import torch

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
dev = torch.device("cuda:0")
# Full-precision f32 products, as RusTorch's cuBLAS call (no TF32).
torch.backends.cuda.matmul.allow_tf32 = False


def timed(name, f):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    ms = []
    for _ in range(reps):
        t = time.perf_counter()
        out = f()
        torch.cuda.synchronize()
        ms.append((time.perf_counter() - t) * 1e3)
        del out
    ms.sort()
    print(f"{name} {ms[len(ms) // 2]:.4f}")


g = torch.Generator(device=dev).manual_seed(0)
n = 4096
for dtype, label in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
    a = torch.randn(n, n, device=dev, generator=g).to(dtype)
    b = torch.randn(n, n, device=dev, generator=g).to(dtype)
    timed(f"matmul_4096_{label}", lambda: a @ b)
big = 64 << 20
x = torch.randn(big, device=dev, generator=g)
y = torch.randn(big, device=dev, generator=g)
timed("add_64M_f32", lambda: x + y)
timed("mul_64M_f32", lambda: x * y)
timed("sum_64M_f32", lambda: x.sum())
rows = x.reshape(big // 4096, 4096)
timed("softmax_64M_f32", lambda: torch.softmax(rows, -1))
timed("rms_norm_64M_f32", lambda: torch.nn.functional.rms_norm(rows, (4096,), eps=1e-6))
