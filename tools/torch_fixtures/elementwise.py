"""Elementwise ops: unary math and activations, clamp, binary arithmetic with
broadcasting and type promotion, tensor-scalar arithmetic, comparisons and
where.

Args of each case:
  kind   "unary" | "clamp" | "binary" | "scalar" | "compare" | "compare_scalar"
         | "where" | "trunc_div" (integer division through the raw op)
  op     the op's name (the Tensor method on the Rust side)
  views  per input, a list of views applied before the op, each one of
         ["t", d0, d1], ["narrow", dim, start, len], ["expand", shape],
         ["step", dim, step] (every step-th element along dim)
  min, max           clamp bounds (null when absent, "nan" for NaN)
  scalar, scalar_kind  the scalar operand of "scalar"/"compare_scalar" cases,
                     "float" | "int" | "bool" (Python float / int / bool)
"""
import math

import torch
import torch.nn.functional as F

from .common import case, rand, randint, randn

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.uint8]
NAME = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
        torch.int64: "i64", torch.int32: "i32", torch.uint8: "u8", torch.bool: "bool", torch.complex64: "c64"}

UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu, "softplus": F.softplus,
}
BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
    "maximum": torch.maximum, "minimum": torch.minimum,
}
COMPARE = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}
SCALAR = {"add": lambda x, s: x + s, "sub": lambda x, s: x - s, "mul": lambda x, s: x * s,
          "div": lambda x, s: x / s, "pow": lambda x, s: x ** s}

NAN, INF = float("nan"), float("inf")


def view(x, views):
    """The views the Rust side applies with transpose / narrow / expand / slice."""
    for v in views or []:
        if v[0] == "t":
            x = x.transpose(v[1], v[2])
        elif v[0] == "narrow":
            x = x.narrow(v[1], v[2], v[3])
        elif v[0] == "expand":
            x = x.expand(*v[1])
        elif v[0] == "step":
            idx = [slice(None)] * x.dim()
            idx[v[1]] = slice(None, None, v[2])
            x = x[tuple(idx)]
        else:
            raise ValueError(v)
    return x


def unary_input(op, shape, dtype):
    """Inputs in each op's interesting range."""
    if op in ("log", "sqrt", "rsqrt"):
        return rand(*shape, dtype=dtype, lo=0.05, hi=20.0)
    if op == "softplus":
        return randn(*shape, dtype=dtype, scale=12.0)
    if op in ("sin", "cos"):
        return randn(*shape, dtype=dtype, scale=8.0)
    if op == "exp":
        return randn(*shape, dtype=dtype, scale=4.0)
    return randn(*shape, dtype=dtype, scale=3.0)


# Special values per op, and those PyTorch itself gets wrong (left out).
SPECIAL = [NAN, INF, -INF, 0.0, -0.0, 1e-30, -1e-30, 1e-3, 30.0, -30.0, 100.0, -100.0, 20.0, 20.5, -5.5, 0.5]
SPECIAL_SKIP = {
    # PyTorch's f32 gelu returns NaN at +inf (its erf polynomial), we return inf.
    "gelu": [INF],
}


def unary_cases():
    out = []
    for op, f in UNARY.items():
        for dt in FLOATS:
            x = unary_input(op, (4, 6), dt)
            out.append(case(f"{op}_{NAME[dt]}", [x], f(x), kind="unary", op=op, views=[[]]))
        vals = [v for v in SPECIAL if not any(v == s or (math.isnan(v) and math.isnan(s)) for s in SPECIAL_SKIP.get(op, []))]
        x = torch.tensor(vals, dtype=torch.float32)
        out.append(case(f"{op}_f32_special", [x], f(x), kind="unary", op=op, views=[[]]))
        xd = x.double()
        out.append(case(f"{op}_f64_special", [xd], f(xd), kind="unary", op=op, views=[[]]))
    # A dense sweep for the activations and transcendental functions, where
    # our polynomials and PyTorch's differ most.
    sweep = torch.linspace(-12.0, 12.0, 481, dtype=torch.float32)
    for op in ("exp", "tanh", "sigmoid", "gelu", "gelu_tanh", "silu", "softplus", "sin", "cos"):
        out.append(case(f"{op}_f32_sweep", [sweep], UNARY[op](sweep), kind="unary", op=op, views=[[]]))
    pos = torch.logspace(-30, 30, 241, dtype=torch.float32)
    for op in ("log", "sqrt", "rsqrt"):
        out.append(case(f"{op}_f32_sweep", [pos], UNARY[op](pos), kind="unary", op=op, views=[[]]))
    # Integers keep their dtype for neg, abs and relu (and wrap like PyTorch).
    for dt in INTS:
        if dt == torch.uint8:
            x = randint(0, 256, 4, 6, dtype=dt)
        else:
            x = randint(-50, 50, 4, 6, dtype=dt)
            x[0, 0] = torch.iinfo(dt).min
        for op in ("neg", "abs", "relu"):
            out.append(case(f"{op}_{NAME[dt]}", [x], UNARY[op](x), kind="unary", op=op, views=[[]]))
    z = torch.complex(randn(3, 4), randn(3, 4))
    for op in ("neg", "exp"):
        out.append(case(f"{op}_c64", [z], UNARY[op](z), kind="unary", op=op, views=[[]]))
    # Math on integer and bool tensors computes in f32, as in PyTorch.
    xi = randint(1, 40, 3, 5)
    for op in ("exp", "sqrt", "sigmoid", "sin", "log", "tanh"):
        out.append(case(f"{op}_i64_to_f32", [xi], UNARY[op](xi), kind="unary", op=op, views=[[]]))
    xb = torch.tensor([True, False, True])
    out.append(case("cos_bool_to_f32", [xb], torch.cos(xb), kind="unary", op="cos", views=[[]]))
    # Non-contiguous inputs.
    for op, dt in (("gelu", torch.float32), ("exp", torch.float32), ("silu", torch.float16),
                   ("tanh", torch.bfloat16), ("sin", torch.float64), ("neg", torch.int32)):
        x = randn(5, 7, dtype=torch.float64, scale=3.0).to(dt) if dt != torch.int32 else randint(-9, 9, 5, 7, dtype=dt)
        vs = [["t", 0, 1]]
        out.append(case(f"{op}_{NAME[dt]}_transposed", [x], UNARY[op](view(x, vs)), kind="unary", op=op, views=[vs]))
    x = randn(6, 10, scale=3.0)
    for vs, tag in (([["narrow", 1, 2, 5]], "narrowed"), ([["step", 0, 2]], "stepped"),
                    ([["narrow", 1, 3, 1], ["expand", [6, 4]]], "expanded")):
        out.append(case(f"silu_f32_{tag}", [x], F.silu(view(x, vs)), kind="unary", op="silu", views=[vs]))
    xh = randn(6, 10, dtype=torch.float16, scale=3.0)
    vs = [["step", 1, 3]]
    out.append(case("gelu_f16_stepped", [xh], F.gelu(view(xh, vs)), kind="unary", op="gelu", views=[vs]))
    e = torch.zeros(0, 3)
    out.append(case("exp_f32_empty", [e], torch.exp(e), kind="unary", op="exp", views=[[]]))
    s = torch.tensor(-1.5)
    out.append(case("relu_f32_scalar0d", [s], torch.relu(s), kind="unary", op="relu", views=[[]]))
    return out


def clamp_cases():
    out = []

    def add(name, x, lo, hi, views=None):
        # JSON has no NaN: a NaN bound is written as the string "nan".
        enc = lambda b: "nan" if isinstance(b, float) and math.isnan(b) else b
        out.append(case(name, [x], torch.clamp(view(x, views), min=lo, max=hi), kind="clamp", op="clamp",
                        min=enc(lo), max=enc(hi), views=[views or []]))

    for dt in FLOATS:
        x = randn(4, 6, dtype=dt, scale=3.0)
        add(f"clamp_{NAME[dt]}_both", x, -1.0, 2.0)
        add(f"clamp_{NAME[dt]}_min", x, -0.5, None)
        add(f"clamp_{NAME[dt]}_max", x, None, 0.25)
    x = torch.tensor([NAN, INF, -INF, -3.0, 0.0, 5.0, 1.5])
    add("clamp_f32_special", x, -1.0, 2.0)
    add("clamp_f32_min_above_max", x, 3.0, -2.0)
    add("clamp_f32_nan_bound", x, NAN, None)
    add("clamp_f32_transposed", randn(4, 6, scale=3.0), -1.0, 1.0, [["t", 0, 1]])
    for dt in INTS:
        x = randint(0, 200, 4, 6, dtype=dt) if dt == torch.uint8 else randint(-100, 100, 4, 6, dtype=dt)
        add(f"clamp_{NAME[dt]}_both", x, 10, 90)
        add(f"clamp_{NAME[dt]}_max", x, None, 50)
    xi = randint(-10, 10, 3, 5)
    out.append(case("clamp_i64_fractional_bound_to_f32", [xi], torch.clamp(xi, min=-2.5, max=3.5), kind="clamp",
                    op="clamp", min=-2.5, max=3.5, views=[[]]))
    return out


def binary_input(op, dt, shape, second=False):
    if dt == torch.bool:
        return randint(0, 2, *shape, dtype=torch.bool)
    if dt == torch.complex64:
        return torch.complex(randn(*shape), randn(*shape))
    if dt in INTS:
        if op == "pow":
            return randint(0, 4, *shape, dtype=dt) if second else randint(0 if dt == torch.uint8 else -5, 6, *shape, dtype=dt)
        if dt == torch.uint8:
            return randint(0, 256, *shape, dtype=dt)
        return randint(-1000, 1000, *shape, dtype=dt)
    if op == "pow":
        return rand(*shape, dtype=dt, lo=-2.0, hi=2.5) if second else rand(*shape, dtype=dt, lo=0.1, hi=4.0)
    x = randn(*shape, dtype=torch.float64, scale=3.0)
    if op == "div" and second:
        x = torch.where(x.abs() < 0.05, torch.full_like(x, 0.5), x)
    return x.to(dt)


BINARY_DTYPES = {
    "add": INTS + FLOATS + [torch.complex64],
    "sub": INTS + FLOATS + [torch.complex64],
    "mul": INTS + FLOATS + [torch.complex64],
    "div": FLOATS + [torch.complex64],
    "pow": INTS + FLOATS,
    "maximum": [torch.bool] + INTS + FLOATS,
    "minimum": [torch.bool] + INTS + FLOATS,
}


def binary_cases():
    out = []

    def add(name, op, a, b, va=None, vb=None):
        r = BINARY[op](view(a, va), view(b, vb))
        out.append(case(name, [a, b], r, kind="binary", op=op, views=[va or [], vb or []]))

    for op, dts in BINARY_DTYPES.items():
        for dt in dts:
            add(f"{op}_{NAME[dt]}", op, binary_input(op, dt, (4, 6)), binary_input(op, dt, (4, 6), True))
    # Integer wrap-around and true division of integers (-> f32, with inf/nan).
    a = torch.tensor([2**31 - 1, -(2**31), 7, -7, 0, 5], dtype=torch.int32)
    b = torch.tensor([1, -1, 2, 2, 0, 0], dtype=torch.int32)
    for op in ("add", "sub", "mul", "div"):
        add(f"{op}_i32_edges", op, a, b)
    add("div_i64_to_f32", "div", randint(-50, 50, 3, 4), randint(1, 9, 3, 4))
    add("div_u8_to_f32", "div", randint(0, 255, 3, 4, dtype=torch.uint8), randint(0, 3, 3, 4, dtype=torch.uint8))
    add("pow_u8_wraps", "pow", torch.tensor([3, 2, 255, 0], dtype=torch.uint8), torch.tensor([6, 7, 2, 0], dtype=torch.uint8))
    # NaN and signed zeros for maximum/minimum, inf arithmetic, pow edges.
    x = torch.tensor([NAN, 1.0, NAN, -0.0, 0.0, INF, -INF, 2.0])
    y = torch.tensor([1.0, NAN, NAN, 0.0, -0.0, 3.0, 5.0, -INF])
    for op in ("maximum", "minimum", "add", "sub", "mul", "div", "pow"):
        add(f"{op}_f32_special", op, x, y)
    add("maximum_f16_special", "maximum", x.half(), y.half())
    add("minimum_bf16_special", "minimum", x.bfloat16(), y.bfloat16())
    add("pow_f32_negative_base", "pow", torch.tensor([-2.0, -2.0, -8.0, 0.0, 0.0, -1.5]),
        torch.tensor([2.0, 3.0, 1.0 / 3.0, 0.0, -1.0, 0.5]))
    # Broadcasting.
    add("add_f32_bcast_3d", "add", randn(4, 1, 5), randn(3, 1))
    add("mul_f32_row_bcast", "mul", randn(6, 8), randn(8))
    add("sub_f32_col_bcast", "sub", randn(6, 1), randn(6, 8))
    add("div_f32_scalar0d_lhs", "div", torch.tensor(2.5), randn(3, 4))
    add("maximum_i64_scalar0d_rhs", "maximum", randint(-9, 9, 3, 4), torch.tensor(0))
    add("add_f16_bcast", "add", randn(2, 3, 1, dtype=torch.float16), randn(1, 4, dtype=torch.float16))
    add("mul_bf16_bcast", "mul", randn(5, 1, dtype=torch.bfloat16), randn(1, 7, dtype=torch.bfloat16))
    add("add_c64_bcast", "add", torch.complex(randn(3, 1), randn(3, 1)), torch.complex(randn(4), randn(4)))
    add("pow_f32_bcast_exponent_row", "pow", rand(3, 4, lo=0.5, hi=3.0), torch.tensor([0.5, 2.0, -1.0, 3.0]))
    add("add_f32_size1_dims", "add", randn(1, 1, 3), randn(2, 1, 1))
    add("add_f32_empty", "add", torch.zeros(0, 3), randn(3))
    # Non-contiguous operands.
    add("add_f32_transposed", "add", randn(5, 4), randn(4, 5), [["t", 0, 1]], None)
    add("mul_f32_both_transposed", "mul", randn(5, 4), randn(5, 4), [["t", 0, 1]], [["t", 0, 1]])
    add("sub_f16_transposed", "sub", randn(5, 4, dtype=torch.float16), randn(4, 5, dtype=torch.float16), [["t", 0, 1]], None)
    add("maximum_f32_narrowed", "maximum", randn(4, 9), randn(4, 3), [["narrow", 1, 2, 3]], None)
    add("div_f64_stepped", "div", randn(8, 3, dtype=torch.float64), randn(4, 3, dtype=torch.float64), [["step", 0, 2]], None)
    add("add_i32_expanded", "add", randint(-9, 9, 1, 5, dtype=torch.int32), randint(-9, 9, 4, 5, dtype=torch.int32),
        [["expand", [4, 5]]], None)
    add("pow_bf16_transposed", "pow", rand(3, 5, dtype=torch.bfloat16, lo=0.5, hi=2.0),
        rand(5, 3, dtype=torch.bfloat16, lo=-1.0, hi=2.0), None, [["t", 0, 1]])
    # Type promotion.
    add("add_i64_f32", "add", randint(-9, 9, 3, 4), randn(3, 4))
    add("div_i32_i32_to_f32", "div", randint(-20, 20, 3, 4, dtype=torch.int32), randint(1, 7, 3, 4, dtype=torch.int32))
    add("add_f16_bf16_to_f32", "add", randn(3, 4, dtype=torch.float16), randn(3, 4, dtype=torch.bfloat16))
    add("mul_u8_i32", "mul", randint(0, 20, 3, 4, dtype=torch.uint8), randint(-20, 20, 3, 4, dtype=torch.int32))
    add("add_bool_i32", "add", randint(0, 2, 3, 4, dtype=torch.bool), randint(-5, 5, 3, 4, dtype=torch.int32))
    add("add_bool_bool_is_or", "add", randint(0, 2, 3, 4, dtype=torch.bool), randint(0, 2, 3, 4, dtype=torch.bool))
    add("mul_bool_bool_is_and", "mul", randint(0, 2, 3, 4, dtype=torch.bool), randint(0, 2, 3, 4, dtype=torch.bool))
    add("div_bool_bool_to_f32", "div", torch.tensor([True, False, True]), torch.tensor([True, True, False]))
    add("sub_i64_f16", "sub", randint(-9, 9, 3, 4), randn(3, 4, dtype=torch.float16))
    add("mul_f32_f64", "mul", randn(3, 4), randn(3, 4, dtype=torch.float64))
    add("add_f32_c64", "add", randn(3, 4), torch.complex(randn(3, 4), randn(3, 4)))
    add("pow_i64_f32", "pow", randint(1, 5, 3, 4), rand(3, 4, lo=-1.0, hi=2.0))
    add("maximum_i32_f16", "maximum", randint(-5, 5, 3, 4, dtype=torch.int32), randn(3, 4, dtype=torch.float16))
    # Integer truncating division through the raw op (the Tensor API divides truly).
    for dt in (torch.int32, torch.int64, torch.uint8):
        lo = 0 if dt == torch.uint8 else -100
        a = randint(lo, 100, 3, 5, dtype=dt)
        b = randint(1, 9, 3, 5, dtype=dt)
        if dt != torch.uint8:
            b = b * torch.where(randint(0, 2, 3, 5, dtype=torch.bool), 1, -1).to(dt)
        out.append(case(f"trunc_div_{NAME[dt]}", [a, b], torch.div(a, b, rounding_mode="trunc"), kind="trunc_div",
                        op="div", views=[[], []]))
    return out


def scalar_cases():
    out = []

    def add(name, op, x, s, kind):
        out.append(case(name, [x], SCALAR[op](x, s), kind="scalar", op=op, scalar=s, scalar_kind=kind, views=[[]]))

    xf = randn(3, 4, scale=2.0)
    xi = randint(-9, 9, 3, 4)
    for op in ("add", "sub", "mul", "div"):
        add(f"{op}_scalar_f32_float", op, xf, 2.5, "float")
        add(f"{op}_scalar_i64_float_to_f32", op, xi, 2.5, "float")
        add(f"{op}_scalar_i64_int", op, xi, 3, "int")
    add("mul_scalar_f16_float_keeps_f16", "mul", randn(3, 4, dtype=torch.float16), 0.1, "float")
    add("add_scalar_bf16_float_keeps_bf16", "add", randn(3, 4, dtype=torch.bfloat16), 1.25, "float")
    add("add_scalar_bool_int_to_i64", "add", randint(0, 2, 3, 4, dtype=torch.bool), 2, "int")
    add("mul_scalar_u8_int_keeps_u8", "mul", randint(0, 60, 3, 4, dtype=torch.uint8), 3, "int")
    add("sub_scalar_f64_float", "sub", randn(3, 4, dtype=torch.float64), 0.1, "float")
    add("add_scalar_i32_bool", "add", randint(-5, 5, 3, 4, dtype=torch.int32), True, "bool")
    xp = rand(3, 4, lo=0.1, hi=3.0)
    for e in (2.0, 3.0, 0.5, -0.5, -1.0, -2.0, 1.7, 0.0, 1.0):
        add(f"pow_scalar_f32_{e}", "pow", xp, e, "float")
    for e in (2.0, 0.5, -1.0, 1.3):
        add(f"pow_scalar_f16_{e}", "pow", xp.half(), e, "float")
        add(f"pow_scalar_bf16_{e}", "pow", xp.bfloat16(), e, "float")
        add(f"pow_scalar_f64_{e}", "pow", xp.double(), e, "float")
    add("pow_scalar_i64_int", "pow", xi, 2, "int")
    add("pow_scalar_i64_float_to_f32", "pow", xi, 2.0, "float")
    add("pow_scalar_f32_negative_base", "pow", torch.tensor([-2.0, -0.5, 0.0, -0.0, NAN]), 2.0, "float")
    return out


def compare_cases():
    out = []

    def add(name, op, a, b, va=None, vb=None):
        r = COMPARE[op](view(a, va), view(b, vb))
        out.append(case(name, [a, b], r, kind="compare", op=op, views=[va or [], vb or []]))

    for dt in FLOATS + INTS + [torch.bool]:
        # Small integer-valued data so that ties occur.
        if dt == torch.bool:
            a, b = randint(0, 2, 4, 5, dtype=dt), randint(0, 2, 4, 5, dtype=dt)
        else:
            a, b = randint(0, 4, 4, 5).to(dt), randint(0, 4, 4, 5).to(dt)
        for op in COMPARE:
            add(f"{op}_{NAME[dt]}", op, a, b)
    z1 = torch.complex(randint(0, 2, 3, 4).float(), randint(0, 2, 3, 4).float())
    z2 = torch.complex(randint(0, 2, 3, 4).float(), randint(0, 2, 3, 4).float())
    for op in ("eq", "ne"):
        add(f"{op}_c64", op, z1, z2)
    x = torch.tensor([NAN, NAN, 1.0, INF, -INF, 0.0])
    y = torch.tensor([NAN, 1.0, NAN, INF, INF, -0.0])
    for op in COMPARE:
        add(f"{op}_f32_special", op, x, y)
    add("lt_f32_bcast", "lt", randn(4, 1), randn(5))
    add("ge_i64_f32_promoted", "ge", randint(-3, 3, 3, 4), randn(3, 4))
    add("eq_f32_transposed", "eq", randint(0, 3, 4, 3).float(), randint(0, 3, 3, 4).float(), [["t", 0, 1]], None)
    add("ne_f16_scalar0d", "ne", randint(0, 3, 3, 4).half(), torch.tensor(1.0, dtype=torch.float16))

    def adds(name, op, x, s, kind):
        out.append(case(name, [x], COMPARE[op](x, s), kind="compare_scalar", op=op, scalar=s, scalar_kind=kind,
                        views=[[]]))

    xf = randn(3, 4)
    xi = randint(-3, 3, 3, 4)
    for op in COMPARE:
        adds(f"{op}_scalar_f32", op, xf, 0.25, "float")
        adds(f"{op}_scalar_i64_int", op, xi, 1, "int")
    adds("eq_scalar_i64_float", "eq", xi, 2.5, "float")
    adds("lt_scalar_i64_float", "lt", xi, 0.5, "float")
    return out


def where_cases():
    out = []

    def add(name, c, a, b, views=None):
        vs = views or [[], [], []]
        r = torch.where(view(c, vs[0]), view(a, vs[1]), view(b, vs[2]))
        out.append(case(name, [c, a, b], r, kind="where", op="where", views=vs))

    c = randint(0, 2, 3, 4, dtype=torch.bool)
    for dt in FLOATS + INTS + [torch.bool, torch.complex64]:
        add(f"where_{NAME[dt]}", c, binary_input("add", dt, (3, 4)), binary_input("add", dt, (3, 4)))
    add("where_f32_bcast", randint(0, 2, 4, 1, dtype=torch.bool), randn(1, 5), torch.tensor(-1.0))
    add("where_f32_bcast_cond_row", randint(0, 2, 5, dtype=torch.bool), randn(3, 5), randn(3, 1))
    add("where_i32_f32_promoted", c, randint(-9, 9, 3, 4, dtype=torch.int32), randn(3, 4))
    add("where_f32_transposed", randint(0, 2, 4, 3, dtype=torch.bool), randn(3, 4), randn(4, 3),
        [[["t", 0, 1]], [], [["t", 0, 1]]])
    add("where_f16_stepped", randint(0, 2, 6, 4, dtype=torch.bool), randn(6, 4, dtype=torch.float16),
        randn(3, 4, dtype=torch.float16), [[["step", 0, 2]], [["step", 0, 2]], []])
    return out


def cases():
    return unary_cases() + clamp_cases() + binary_cases() + scalar_cases() + compare_cases() + where_cases()
