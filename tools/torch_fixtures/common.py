"""Shared helpers for fixture families: encoding tensors and building cases."""
import math

import torch

DTYPES = {
    torch.bool: "bool",
    torch.uint8: "u8",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float32: "f32",
    torch.float64: "f64",
    torch.complex64: "c64",
}
BY_NAME = {v: k for k, v in DTYPES.items()}


def _num(x):
    if isinstance(x, bool):
        return int(x)
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
    return x


def enc(t: torch.Tensor) -> dict:
    """A tensor as {dtype, shape, data}; data is flat and row-major, complex
    values are [re, im] pairs flattened, non-finite floats are strings."""
    t = t.detach().contiguous()
    name = DTYPES[t.dtype]
    if t.dtype == torch.complex64:
        flat = torch.view_as_real(t).reshape(-1).tolist()
    elif t.dtype in (torch.float16, torch.bfloat16):
        flat = t.float().reshape(-1).tolist()  # exact: f16/bf16 are subsets of f32
    else:
        flat = t.reshape(-1).tolist()
    return {"dtype": name, "shape": list(t.shape), "data": [_num(x) for x in flat]}


def case(name, inputs, outputs, **args):
    """One fixture: named inputs go to the op with `args`; outputs are what
    PyTorch returned. `outputs` may be one tensor or a list."""
    if isinstance(outputs, torch.Tensor):
        outputs = [outputs]
    return {
        "name": name,
        "args": args,
        "inputs": [enc(t) for t in inputs],
        "outputs": [enc(t) for t in outputs],
    }


_gen = torch.Generator().manual_seed(20261121)


def randn(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=_gen, dtype=torch.float64) * scale).to(dtype)


def rand(*shape, dtype=torch.float32, lo=0.0, hi=1.0):
    return (torch.rand(*shape, generator=_gen, dtype=torch.float64) * (hi - lo) + lo).to(dtype)


def randint(lo, hi, *shape, dtype=torch.int64):
    return torch.randint(lo, hi, shape, generator=_gen).to(dtype)
