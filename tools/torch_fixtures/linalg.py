"""Matrix products: torch.matmul / mm / bmm.

Each case stores its operands contiguously; `views` lists, per operand, the
view ops (transpose, narrow, expand, permute) the Rust test applies before
the product, exactly as done here, so strided operands are covered.
"""
import torch

from torch_fixtures.common import case, randn

F32, F64, F16, BF16, C64 = torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64


def apply_views(t, spec):
    for v in spec:
        kind = v[0]
        if kind == "transpose":
            t = t.transpose(v[1], v[2])
        elif kind == "narrow":
            t = t.narrow(v[1], v[2], v[3])
        elif kind == "expand":
            t = t.expand(*v[1])
        elif kind == "permute":
            t = t.permute(*v[1])
        else:
            raise ValueError(kind)
    return t


def operand(shape, dtype, scale=1.0):
    if dtype == C64:
        return torch.complex(randn(*shape, dtype=F32, scale=scale), randn(*shape, dtype=F32, scale=scale))
    return randn(*shape, dtype=dtype, scale=scale)


def mm_case(name, a, b, op="matmul", views=((), ())):
    va, vb = apply_views(a, views[0]), apply_views(b, views[1])
    fn = {"matmul": torch.matmul, "mm": torch.mm, "bmm": torch.bmm}[op]
    return case(name, [a, b], fn(va, vb), op=op, views=[list(map(list, views[0])), list(map(list, views[1]))])


def cases():
    out = []
    for dt, tag in [(F32, "f32"), (F64, "f64"), (F16, "f16"), (BF16, "bf16"), (C64, "c64")]:
        out.append(mm_case(f"2d_{tag}", operand((5, 7), dt), operand((7, 3), dt)))
        out.append(mm_case(f"odd_{tag}", operand((17, 33), dt), operand((33, 19), dt)))
        out.append(mm_case(f"batch_bcast_{tag}", operand((2, 1, 3, 4), dt), operand((5, 4, 6), dt)))
        out.append(mm_case(f"vec_mat_{tag}", operand((4,), dt), operand((4, 5), dt)))
        out.append(mm_case(f"mat_vec_{tag}", operand((3, 4), dt), operand((4,), dt)))
        out.append(mm_case(f"dot_{tag}", operand((6,), dt), operand((6,), dt)))
        out.append(
            mm_case(f"transposed_{tag}", operand((6, 4), dt), operand((5, 6), dt), views=((("transpose", 0, 1),), (("transpose", 0, 1),)))
        )
    # Long inner dimension: f16/bf16 must accumulate in f32 and round once.
    for dt, tag in [(F16, "f16"), (BF16, "bf16"), (F32, "f32")]:
        out.append(mm_case(f"long_k_{tag}", operand((3, 600), dt, 0.5), operand((600, 4), dt, 0.5)))
    # Batch shapes and 1-D operands against batches.
    out.append(mm_case("batch_same_f32", operand((3, 4, 5), F32), operand((3, 5, 2), F32)))
    out.append(mm_case("batch_lhs_only_f32", operand((2, 3, 4, 5), F32), operand((5, 6), F32)))
    out.append(mm_case("batch_rhs_only_f32", operand((4, 5), F32), operand((2, 3, 5, 6), F32)))
    out.append(mm_case("vec_batch_f32", operand((4,), F32), operand((2, 4, 5), F32)))
    out.append(mm_case("batch_vec_f32", operand((2, 3, 4), F32), operand((4,), F32)))
    out.append(mm_case("batch_bcast_both_f32", operand((3, 1, 2, 4), F32), operand((1, 5, 4, 3), F32)))
    # Strided operands.
    out.append(
        mm_case("batch_transposed_lhs_f32", operand((2, 4, 3), F32), operand((2, 4, 5), F32), views=((("transpose", 1, 2),), ()))
    )
    out.append(
        mm_case(
            "linear_weight_t_f32",
            operand((2, 3, 8), F32),
            operand((6, 8), F32),
            views=((), (("transpose", 0, 1),)),
        )
    )
    out.append(
        mm_case("narrowed_f32", operand((5, 9), F32), operand((4, 12), F32), views=((("narrow", 1, 2, 4),), (("narrow", 1, 3, 7),)))
    )
    out.append(
        mm_case("expanded_rhs_f32", operand((3, 2, 4), F32), operand((1, 4, 5), F32), views=((), (("expand", [3, 4, 5]),)))
    )
    out.append(
        mm_case("expanded_rows_f32", operand((1, 4), F32), operand((4, 5), F32), views=((("expand", [3, 4]),), ()))
    )
    out.append(
        mm_case(
            "permuted_batch_f32",
            operand((3, 2, 4), F32),
            operand((2, 4, 5), F32),
            views=((("permute", [1, 0, 2]),), ()),
        )
    )
    out.append(
        mm_case(
            "batch_transposed_c64",
            operand((2, 5, 3), C64),
            operand((2, 4, 5), C64),
            views=((("transpose", 1, 2),), (("transpose", 1, 2),)),
        )
    )
    out.append(
        mm_case("transposed_long_bf16", operand((300, 4), BF16, 0.5), operand((6, 300), BF16, 0.5), views=((("transpose", 0, 1),), (("transpose", 0, 1),)))
    )
    # Aliases.
    out.append(mm_case("mm_f32", operand((4, 6), F32), operand((6, 3), F32), op="mm"))
    out.append(mm_case("bmm_f64", operand((3, 4, 6), F64), operand((3, 6, 2), F64), op="bmm"))
    # Edge cases: empty dims, size-1 dims, non-finite values.
    out.append(mm_case("empty_k_f32", operand((3, 0), F32), operand((0, 4), F32)))
    out.append(mm_case("empty_m_f32", operand((0, 4), F32), operand((4, 3), F32)))
    out.append(mm_case("empty_batch_f32", operand((0, 2, 4), F32), operand((4, 3), F32)))
    out.append(mm_case("ones_f32", operand((1, 1), F32), operand((1, 1), F32)))
    a = operand((3, 4), F32)
    a[0, 1] = float("inf")
    a[2, 2] = float("nan")
    out.append(mm_case("nonfinite_f32", a, operand((4, 2), F32)))
    return out
