"""Convolution and pooling: conv1d, conv2d, conv_transpose2d, max_pool2d,
avg_pool2d.

Inputs are stored contiguously; `views` (as in linalg.py) lists view ops the
Rust test applies to the input image before the op, for strided inputs.
Inputs: x, weight, then bias when `has_bias`.
"""
import torch
import torch.nn.functional as F

from torch_fixtures.common import case, randn
from torch_fixtures.linalg import apply_views

F32, F64, F16, BF16 = torch.float32, torch.float64, torch.float16, torch.bfloat16
DTYPES = [(F32, "f32"), (F64, "f64"), (F16, "f16"), (BF16, "bf16")]


def conv2d_case(name, x, w, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, views=()):
    y = F.conv2d(apply_views(x, views), w, bias, stride, padding, dilation, groups)
    ins = [x, w] + ([bias] if bias is not None else [])
    return case(name, ins, y, op="conv2d", stride=list(stride), padding=list(padding), dilation=list(dilation),
                groups=groups, has_bias=bias is not None, views=[list(v) for v in views])


def conv1d_case(name, x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, views=()):
    y = F.conv1d(apply_views(x, views), w, bias, stride, padding, dilation, groups)
    ins = [x, w] + ([bias] if bias is not None else [])
    return case(name, ins, y, op="conv1d", stride=stride, padding=padding, dilation=dilation, groups=groups,
                has_bias=bias is not None, views=[list(v) for v in views])


def convt_case(name, x, w, bias=None, stride=(1, 1), padding=(0, 0), output_padding=(0, 0), dilation=(1, 1), groups=1):
    if x.dtype == F16:
        # PyTorch's f16 conv_transpose2d on the CPU rounds partial sums to
        # f16 (its output differs from the exact result rounded once in
        # ~40% of elements); the reference is the same op in f64 on the
        # same f16 inputs, rounded once, which is what every other f16
        # kernel here (and PyTorch's bf16 one) produces.
        up = lambda t: None if t is None else t.double()
        y = F.conv_transpose2d(up(x), up(w), up(bias), stride, padding, output_padding, groups, dilation).to(F16)
    else:
        y = F.conv_transpose2d(x, w, bias, stride, padding, output_padding, groups, dilation)
    ins = [x, w] + ([bias] if bias is not None else [])
    return case(name, ins, y, op="conv_transpose2d", stride=list(stride), padding=list(padding),
                output_padding=list(output_padding), dilation=list(dilation), groups=groups,
                has_bias=bias is not None, views=[])


def pool_case(name, kind, x, kernel, stride, padding, count_include_pad=True, views=()):
    xv = apply_views(x, views)
    if kind == "max_pool2d":
        y = F.max_pool2d(xv, kernel, stride, padding)
    else:
        y = F.avg_pool2d(xv, kernel, stride, padding, count_include_pad=count_include_pad)
    return case(name, [x], y, op=kind, kernel=list(kernel), stride=list(stride), padding=list(padding),
                count_include_pad=count_include_pad, views=[list(v) for v in views])


def cases():
    out = []
    for dt, tag in DTYPES:
        r = lambda *s: randn(*s, dtype=dt)
        out.append(conv2d_case(f"conv2d_3x3_pad_bias_{tag}", r(2, 3, 7, 8), r(4, 3, 3, 3), r(4), padding=(1, 1)))
        out.append(conv2d_case(f"conv2d_stride_groups_{tag}", r(1, 4, 9, 7), r(6, 2, 3, 2), None, (2, 1), (1, 0), (1, 1), 2))
        out.append(conv1d_case(f"conv1d_stride_pad_bias_{tag}", r(2, 3, 11), r(4, 3, 3), r(4), stride=2, padding=1))
        out.append(convt_case(f"convt_stride_outpad_{tag}", r(2, 4, 4, 5), r(4, 3, 3, 3), r(3), (2, 2), (1, 1), (1, 1)))
        out.append(pool_case(f"max_pool_{tag}", "max_pool2d", r(2, 3, 7, 8), (3, 3), (2, 2), (1, 1)))
        out.append(pool_case(f"avg_pool_{tag}", "avg_pool2d", r(2, 3, 7, 8), (3, 2), (2, 1), (1, 1), False))

    r = lambda *s: randn(*s, dtype=F32)
    # conv2d: every parameter alone and together.
    out.append(conv2d_case("conv2d_plain", r(2, 3, 6, 5), r(2, 3, 3, 3)))
    out.append(conv2d_case("conv2d_stride2_pad_asym", r(2, 3, 9, 8), r(4, 3, 3, 3), r(4), (2, 2), (1, 2)))
    out.append(conv2d_case("conv2d_dilation", r(1, 2, 10, 9), r(3, 2, 3, 3), r(3), (1, 1), (2, 1), (2, 3)))
    out.append(conv2d_case("conv2d_stride3_dil2", r(2, 2, 13, 12), r(3, 2, 3, 2), None, (3, 2), (1, 1), (2, 2)))
    out.append(conv2d_case("conv2d_groups2", r(2, 4, 6, 6), r(6, 2, 3, 3), r(6), (1, 1), (1, 1), (1, 1), 2))
    out.append(conv2d_case("conv2d_depthwise", r(2, 4, 7, 6), r(4, 1, 3, 3), r(4), (1, 1), (1, 1), (1, 1), 4))
    out.append(conv2d_case("conv2d_depthwise_mult", r(1, 3, 6, 6), r(6, 1, 3, 3), None, (2, 2), (1, 1), (1, 1), 3))
    out.append(conv2d_case("conv2d_pointwise_bias", r(2, 8, 5, 4), r(5, 8, 1, 1), r(5)))
    out.append(conv2d_case("conv2d_pointwise_groups", r(2, 8, 5, 4), r(6, 4, 1, 1), None, groups=2))
    out.append(conv2d_case("conv2d_1x1_stride2", r(1, 3, 7, 7), r(4, 3, 1, 1), r(4), (2, 2)))
    out.append(conv2d_case("conv2d_kernel_eq_input", r(2, 3, 4, 5), r(2, 3, 4, 5), r(2)))
    out.append(conv2d_case("conv2d_pad_only_rows", r(1, 1, 1, 6), r(1, 1, 3, 3), None, (1, 1), (1, 1)))
    # Larger: several threads share the images, f64 checks the arithmetic tightly.
    out.append(conv2d_case("conv2d_batch4_f64", randn(4, 6, 10, 10, dtype=F64), randn(8, 6, 3, 3, dtype=F64),
                           randn(8, dtype=F64), padding=(1, 1)))
    # Strided input: NHWC storage viewed as NCHW, and a narrowed width.
    out.append(conv2d_case("conv2d_nhwc_input", r(2, 6, 5, 3), r(4, 3, 3, 3), r(4), padding=(1, 1),
                           views=(("permute", [0, 3, 1, 2]),)))
    out.append(conv2d_case("conv2d_narrowed_input", r(1, 2, 6, 10), r(3, 2, 2, 2), None, views=(("narrow", 3, 2, 5),)))
    out.append(conv2d_case("conv2d_empty_batch", r(0, 3, 5, 5), r(2, 3, 3, 3), r(2)))
    x = r(1, 2, 5, 5)
    x[0, 0, 2, 2] = float("nan")
    x[0, 1, 0, 0] = float("inf")
    out.append(conv2d_case("conv2d_nonfinite", x, r(2, 2, 3, 3), None, padding=(1, 1)))

    # conv1d.
    out.append(conv1d_case("conv1d_plain", r(2, 3, 9), r(4, 3, 3)))
    out.append(conv1d_case("conv1d_dilation", r(1, 2, 12), r(3, 2, 3), r(3), 1, 2, 3))
    out.append(conv1d_case("conv1d_groups", r(2, 6, 8), r(4, 3, 2), None, 2, 0, 1, 2))
    out.append(conv1d_case("conv1d_depthwise", r(2, 4, 10), r(4, 1, 5), r(4), 1, 2, 1, 4))
    out.append(conv1d_case("conv1d_transposed_input", r(2, 10, 3), r(5, 3, 3), r(5), 1, 1,
                           views=(("transpose", 1, 2),)))

    # conv_transpose2d.
    out.append(convt_case("convt_plain", r(2, 3, 4, 4), r(3, 2, 3, 3)))
    out.append(convt_case("convt_stride2", r(1, 3, 5, 4), r(3, 4, 2, 2), r(4), (2, 2)))
    out.append(convt_case("convt_stride_asym_pad", r(2, 2, 4, 5), r(2, 3, 3, 4), None, (2, 3), (1, 2), (1, 2)))
    out.append(convt_case("convt_groups", r(2, 4, 4, 4), r(4, 2, 3, 3), r(4), (2, 2), (1, 1), (1, 0), groups=2))
    out.append(convt_case("convt_depthwise", r(1, 3, 5, 5), r(3, 1, 3, 3), r(3), (1, 1), (1, 1), groups=3))
    out.append(convt_case("convt_dilation", r(1, 2, 4, 4), r(2, 3, 3, 3), r(3), (2, 2), (2, 1), (1, 1), (2, 2)))
    out.append(convt_case("convt_1x1", r(2, 4, 3, 3), r(4, 5, 1, 1), r(5)))
    out.append(convt_case("convt_batch4_f64", randn(4, 6, 6, 6, dtype=F64), randn(6, 5, 3, 3, dtype=F64),
                          randn(5, dtype=F64), (2, 2), (1, 1), (1, 1)))

    # Pools: stride != kernel, padding, non-square windows.
    x = r(2, 3, 9, 8)
    out.append(pool_case("max_pool_k2", "max_pool2d", x, (2, 2), (2, 2), (0, 0)))
    out.append(pool_case("max_pool_overlap", "max_pool2d", x, (3, 3), (1, 1), (1, 1)))
    out.append(pool_case("max_pool_rect", "max_pool2d", x, (2, 4), (3, 2), (1, 2)))
    out.append(pool_case("avg_pool_k2", "avg_pool2d", x, (2, 2), (2, 2), (0, 0)))
    out.append(pool_case("avg_pool_pad_counted", "avg_pool2d", x, (3, 3), (2, 2), (1, 1), True))
    out.append(pool_case("avg_pool_pad_excluded", "avg_pool2d", x, (3, 3), (2, 2), (1, 1), False))
    out.append(pool_case("avg_pool_rect_counted", "avg_pool2d", x, (4, 2), (1, 3), (2, 1), True))
    out.append(pool_case("avg_pool_overlap_stride1", "avg_pool2d", x, (3, 3), (1, 1), (1, 1), False))
    out.append(pool_case("max_pool_permuted", "max_pool2d", r(2, 6, 5, 3), (2, 2), (1, 2), (1, 0),
                         views=(("permute", [0, 3, 1, 2]),)))
    # Wide rows with a stride: the strided gather runs in several chunks.
    x = r(1, 2, 3, 150)
    out.append(pool_case("max_pool_wide_strided", "max_pool2d", x, (2, 3), (1, 2), (1, 1)))
    out.append(pool_case("avg_pool_wide_strided", "avg_pool2d", x, (3, 3), (2, 2), (1, 1), False))
    out.append(pool_case("avg_pool_empty_batch", "avg_pool2d", r(0, 2, 4, 4), (2, 2), (2, 2), (0, 0)))
    x = r(1, 2, 4, 4)
    x[0, 0, 1, 1] = float("nan")
    x[0, 1, 2, 3] = float("inf")
    x[0, 1, 0, 0] = float("-inf")
    out.append(pool_case("max_pool_nonfinite", "max_pool2d", x, (2, 2), (2, 2), (0, 0)))
    out.append(pool_case("avg_pool_nonfinite", "avg_pool2d", x, (2, 2), (1, 1), (1, 1), True))
    return out
