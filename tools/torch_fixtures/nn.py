"""Normalization, rotary embeddings and attention.

Every case names its op in args["op"]; views on inputs are described as in
index.py (args["views"]). References:
- layer_norm, rms_norm, batch_norm, scaled_dot_product_attention: the
  torch.nn.functional ops themselves, on the same dtype.
- rope: both formulas written with plain torch ops -- Hugging Face Llama's
  rotate_half for NeoX, Meta Llama's complex multiplication for
  interleaved -- evaluated in float64 on the (rounded) inputs and rounded
  once to the input dtype, which is the semantics of a fused kernel.
- rope_cos_sin: theta^(-2i/R) angles and their cos/sin in float64.
"""
import torch
import torch.nn.functional as F

from . import common
from .common import case, randn, rand, randint
from .index import apply_view

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
SHORT = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16"}


def layer_norm_cases():
    out = []
    for dt in FLOATS:
        s = SHORT[dt]
        x = randn(5, 24, dtype=dt)
        w, b = randn(24, dtype=dt), randn(24, dtype=dt)
        out.append(case(f"layer_norm_{s}", [x, w, b], F.layer_norm(x, [24], w, b, 1e-5), op="layer_norm", k=1, w=True, b=True, eps=1e-5))
        out.append(case(f"layer_norm_{s}_noaffine", [x], F.layer_norm(x, [24], None, None, 1e-5), op="layer_norm", k=1, w=False, b=False, eps=1e-5))
        x = randn(2, 3, 4, 5, dtype=dt)
        w, b = randn(4, 5, dtype=dt), randn(4, 5, dtype=dt)
        out.append(case(f"layer_norm_{s}_2dims", [x, w, b], F.layer_norm(x, [4, 5], w, b, 1e-6), op="layer_norm", k=2, w=True, b=True, eps=1e-6))
    x = randn(4, 33)
    w, b = randn(33), randn(33)
    out.append(case("layer_norm_weight_only", [x, w], F.layer_norm(x, [33], w, None, 1e-5), op="layer_norm", k=1, w=True, b=False, eps=1e-5))
    out.append(case("layer_norm_bias_only", [x, b], F.layer_norm(x, [33], None, b, 1e-5), op="layer_norm", k=1, w=False, b=True, eps=1e-5))
    # Whole tensor normalized (k = rank), long rows, large mean.
    x = randn(3, 70) * 3
    out.append(case("layer_norm_all_dims", [x], F.layer_norm(x, [3, 70], None, None, 1e-5), op="layer_norm", k=2, w=False, b=False, eps=1e-5))
    # Rows with a large common offset: PyTorch's own f32 kernel is off by
    # up to 7e-5 here (it rounds x * rstd and mean * rstd separately), so
    # the reference is the float64 result rounded to f32.
    x = randn(3, 100) + 1000.0
    ref = F.layer_norm(x.double(), [100], None, None, 1e-5).float()
    out.append(case("layer_norm_large_mean", [x], ref, op="layer_norm", k=1, w=False, b=False, eps=1e-5))
    # Non-contiguous x: transposed, permuted over two normalized dims.
    base = randn(16, 6)
    w, b = randn(16), randn(16)
    out.append(case("layer_norm_transposed", [base, w, b], F.layer_norm(base.t(), [16], w, b, 1e-5), op="layer_norm", k=1, w=True, b=True, eps=1e-5, views={"0": [["t", 0, 1]]}))
    base = randn(8, 3, 2)
    w = randn(2, 8)
    out.append(case("layer_norm_permuted_2dims", [base, w], F.layer_norm(base.permute(1, 2, 0), [2, 8], w, None, 1e-5), op="layer_norm", k=2, w=True, b=False, eps=1e-5, views={"0": [["permute", [1, 2, 0]]]}))
    # Edge cases: size-1 rows (variance 0), a NaN row, an empty batch.
    x = randn(5, 1)
    w, b = randn(1), randn(1)
    out.append(case("layer_norm_size1", [x, w, b], F.layer_norm(x, [1], w, b, 1e-5), op="layer_norm", k=1, w=True, b=True, eps=1e-5))
    x = randn(3, 8)
    x[1, 2] = float("nan")
    out.append(case("layer_norm_nan_row", [x], F.layer_norm(x, [8], None, None, 1e-5), op="layer_norm", k=1, w=False, b=False, eps=1e-5))
    x = randn(0, 8)
    out.append(case("layer_norm_empty", [x], F.layer_norm(x, [8], None, None, 1e-5), op="layer_norm", k=1, w=False, b=False, eps=1e-5))
    return out


def rms_norm_cases():
    out = []
    for dt in FLOATS:
        s = SHORT[dt]
        x = randn(6, 40, dtype=dt)
        w = randn(40, dtype=dt)
        out.append(case(f"rms_norm_{s}", [x, w], F.rms_norm(x, [40], w, 1e-6), op="rms_norm", w=True, eps=1e-6))
        out.append(case(f"rms_norm_{s}_noweight", [x], F.rms_norm(x, [40], None, 1e-5), op="rms_norm", w=False, eps=1e-5))
        x = randn(2, 3, 17, dtype=dt)
        w = randn(17, dtype=dt)
        out.append(case(f"rms_norm_{s}_3d", [x, w], F.rms_norm(x, [17], w, 1e-5), op="rms_norm", w=True, eps=1e-5))
    x = randn(2, 300)
    w = randn(300)
    out.append(case("rms_norm_long_rows", [x, w], F.rms_norm(x, [300], w, 1e-6), op="rms_norm", w=True, eps=1e-6))
    base = randn(12, 5)
    w = randn(12)
    out.append(case("rms_norm_transposed", [base, w], F.rms_norm(base.t(), [12], w, 1e-6), op="rms_norm", w=True, eps=1e-6, views={"0": [["t", 0, 1]]}))
    base = randn(4, 10)
    out.append(case("rms_norm_narrowed", [base], F.rms_norm(base.narrow(1, 3, 6), [6], None, 1e-6), op="rms_norm", w=False, eps=1e-6, views={"0": [["narrow", 1, 3, 6]]}))
    x = torch.zeros(2, 8)
    x[1] = randn(8)
    out.append(case("rms_norm_zero_row", [x], F.rms_norm(x, [8], None, 1e-6), op="rms_norm", w=False, eps=1e-6))
    x = randn(3, 8)
    x[2, 5] = float("nan")
    out.append(case("rms_norm_nan_row", [x], F.rms_norm(x, [8], None, 1e-6), op="rms_norm", w=False, eps=1e-6))
    v = randn(9)
    out.append(case("rms_norm_1d", [v], F.rms_norm(v, [9], None, 1e-6), op="rms_norm", w=False, eps=1e-6))
    x = randn(0, 4)
    out.append(case("rms_norm_empty", [x], F.rms_norm(x, [4], None, 1e-6), op="rms_norm", w=False, eps=1e-6))
    return out


def batch_norm_cases():
    out = []
    for dt in FLOATS:
        s = SHORT[dt]
        for shape in ([2, 3, 4, 5], [4, 3], [2, 3, 7]):
            c = shape[1]
            x = randn(*shape, dtype=dt)
            m, v = randn(c, dtype=dt), rand(c, dtype=dt, lo=0.5, hi=2.0)
            w, b = randn(c, dtype=dt), randn(c, dtype=dt)
            tag = "x".join(map(str, shape))
            out.append(
                case(f"batch_norm_{s}_{tag}", [x, m, v, w, b], F.batch_norm(x, m, v, w, b, training=False, eps=1e-5), op="batch_norm", w=True, b=True, eps=1e-5)
            )
        x = randn(2, 3, 4, dtype=dt)
        m, v = randn(3, dtype=dt), rand(3, dtype=dt, lo=0.5, hi=2.0)
        out.append(case(f"batch_norm_{s}_noaffine", [x, m, v], F.batch_norm(x, m, v, None, None, training=False, eps=1e-3), op="batch_norm", w=False, b=False, eps=1e-3))
    x = randn(2, 4, 3)
    m, v, w, b = randn(4), rand(4, lo=0.5, hi=2.0), randn(4), randn(4)
    out.append(case("batch_norm_weight_only", [x, m, v, w], F.batch_norm(x, m, v, w, None, training=False, eps=1e-5), op="batch_norm", w=True, b=False, eps=1e-5))
    out.append(case("batch_norm_bias_only", [x, m, v, b], F.batch_norm(x, m, v, None, b, training=False, eps=1e-5), op="batch_norm", w=False, b=True, eps=1e-5))
    # Channels-last storage viewed as [N, C, H, W].
    base = randn(2, 3, 4, 5)
    m, v, w, b = randn(5), rand(5, lo=0.5, hi=2.0), randn(5), randn(5)
    x = base.permute(0, 3, 1, 2)
    out.append(
        case("batch_norm_channels_last", [base, m, v, w, b], F.batch_norm(x, m, v, w, b, training=False, eps=1e-5), op="batch_norm", w=True, b=True, eps=1e-5, views={"0": [["permute", [0, 3, 1, 2]]]})
    )
    x = randn(0, 3, 2)
    m, v = randn(3), rand(3, lo=0.5, hi=2.0)
    out.append(case("batch_norm_empty", [x, m, v], F.batch_norm(x, m, v, None, None, training=False, eps=1e-5), op="batch_norm", w=False, b=False, eps=1e-5))
    return out


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_neox_ref(x, cos, sin):
    """Hugging Face Llama's apply_rotary_pos_emb on the first R features."""
    r = 2 * cos.shape[-1]
    xr, xp = x[..., :r], x[..., r:]
    c, s = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    return torch.cat((xr * c + rotate_half(xr) * s, xp), -1)


def rope_interleaved_ref(x, cos, sin):
    """Meta Llama's apply_rotary_emb: pairs as complex numbers times e^(i angle)."""
    r = 2 * cos.shape[-1]
    xr, xp = x[..., :r], x[..., r:]
    xc = torch.view_as_complex(xr.reshape(*xr.shape[:-1], -1, 2).contiguous())
    rotated = torch.view_as_real(xc * torch.complex(cos, sin)).flatten(-2)
    return torch.cat((rotated, xp), -1)


def tables(positions, r, theta, dtype):
    inv = theta ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    ang = torch.tensor(positions, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rope_ref(layout, x, cos, sin):
    f = rope_neox_ref if layout == "neox" else rope_interleaved_ref
    return f(x.double(), cos.double(), sin.double()).to(x.dtype)


def rope_cases():
    out = []
    for dt in FLOATS:
        s = SHORT[dt]
        for layout in ("neox", "interleaved"):
            # Full rotary on [B, H, T, D], positions offset as after a prefix.
            x = randn(2, 3, 5, 8, dtype=dt)
            cos, sin = tables(range(7, 12), 8, 10000.0, dt)
            out.append(case(f"rope_{layout}_{s}", [x, cos, sin], rope_ref(layout, x, cos, sin), op="rope", layout=layout))
            # Partial rotary (R = 6 of D = 10) on [T, D].
            x = randn(4, 10, dtype=dt)
            cos, sin = tables(range(4), 6, 500.0, dt)
            out.append(case(f"rope_{layout}_{s}_partial", [x, cos, sin], rope_ref(layout, x, cos, sin), op="rope", layout=layout))
    for layout in ("neox", "interleaved"):
        # q stored [B, T, H, D] and viewed as [B, H, T, D].
        base = randn(2, 6, 4, 16)
        cos, sin = tables(range(6), 12, 10000.0, torch.float32)
        x = base.transpose(1, 2)
        out.append(
            case(f"rope_{layout}_transposed", [base, cos, sin], rope_ref(layout, x, cos, sin), op="rope", layout=layout, views={"0": [["t", 1, 2]]})
        )
        # Large positions (a long context).
        x = randn(1, 3, 64)
        cos, sin = tables([0, 4095, 100000], 64, 1e6, torch.float32)
        out.append(case(f"rope_{layout}_far", [x, cos, sin], rope_ref(layout, x, cos, sin), op="rope", layout=layout))
    # Tables that are column slices of wider ones (non-contiguous).
    for layout in ("neox", "interleaved"):
        x = randn(2, 5, 12)
        cw, sw = tables(range(3, 8), 16, 10000.0, torch.float32)
        cos, sin = cw.narrow(1, 0, 5), sw.narrow(1, 0, 5)
        views = {"1": [["narrow", 1, 0, 5]], "2": [["narrow", 1, 0, 5]]}
        out.append(case(f"rope_{layout}_sliced_tables", [x, cw, sw], rope_ref(layout, x, cos, sin), op="rope", layout=layout, views=views))
    x = randn(1, 0, 8)
    cos, sin = tables([], 8, 10000.0, torch.float32)
    out.append(case("rope_empty", [x, cos, sin], rope_ref("neox", x, cos, sin), op="rope", layout="neox"))
    # The tables themselves.
    for dt in FLOATS:
        pos = [0, 1, 2, 17, 1000, 32767]
        cos, sin = tables(pos, 16, 10000.0, dt)
        out.append(case(f"rope_cos_sin_{SHORT[dt]}", [], [cos, sin], op="rope_cos_sin", positions=pos, rot_dims=16, theta=10000.0, dtype=SHORT[dt]))
    cos, sin = tables(list(range(9)), 6, 1e6, torch.float64)
    out.append(case("rope_cos_sin_seq", [], [cos, sin], op="rope_cos_sin", seq_len=9, rot_dims=6, theta=1e6, dtype="f64"))
    return out


def causal_from_end(tq, tk):
    # Query i sees keys 0..=i + tk - tq (bottom-right aligned causal mask).
    return torch.ones(tq, tk, dtype=torch.bool).tril(diagonal=tk - tq)


def sdpa_case(name, dt, b, hq, hkv, tq, tk, d, dv, mask="none", scale=None, mask_shape=None, views=None):
    q, k, v = randn(b, hq, tq, d, dtype=dt), randn(b, hkv, tk, d, dtype=dt), randn(b, hkv, tk, dv, dtype=dt)
    base = [q, k, v]
    views = views or {}
    q, k, v = [apply_view(t, views.get(str(i), [])) for i, t in enumerate(base)]
    kw = dict(scale=scale, enable_gqa=hq != hkv)
    inputs = list(base)
    if mask == "none":
        ref = F.scaled_dot_product_attention(q, k, v, **kw)
    elif mask == "causal":
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw)
    elif mask == "causal_from_end":
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_from_end(tq, tk), **kw)
    elif mask == "bool":
        m = randint(0, 4, *mask_shape) > 0
        m[..., 0, :] = False  # a fully masked query row
        inputs.append(m)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kw)
    elif mask == "float":
        m = randn(*mask_shape, dtype=dt)
        m[..., 1, ::2] = float("-inf")
        inputs.append(m)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kw)
    else:
        raise ValueError(mask)
    args = dict(op="sdpa", mask=mask, views=views)
    if scale is not None:
        args["scale"] = scale
    return case(name, inputs, ref, **args)


def sdpa_cases():
    out = []
    for dt in FLOATS:
        s = SHORT[dt]
        out.append(sdpa_case(f"sdpa_{s}", dt, 2, 2, 2, 4, 6, 8, 8))
        out.append(sdpa_case(f"sdpa_{s}_gqa_causal", dt, 1, 4, 2, 5, 5, 16, 8, mask="causal"))
        out.append(sdpa_case(f"sdpa_{s}_decode", dt, 1, 6, 2, 2, 9, 8, 8, mask="causal_from_end"))
        out.append(sdpa_case(f"sdpa_{s}_bool", dt, 2, 2, 1, 3, 7, 8, 4, mask="bool", mask_shape=[3, 7]))
        out.append(sdpa_case(f"sdpa_{s}_float", dt, 2, 2, 2, 3, 5, 8, 8, mask="float", mask_shape=[2, 1, 3, 5]))
    f32 = torch.float32
    # Causal with fewer and more queries than keys (top-left aligned).
    out.append(sdpa_case("sdpa_causal_tq_lt_tk", f32, 1, 2, 2, 3, 7, 8, 8, mask="causal"))
    out.append(sdpa_case("sdpa_causal_tq_gt_tk", f32, 1, 2, 2, 7, 3, 8, 8, mask="causal"))
    # From-end causal with more queries than keys: the first rows see nothing.
    out.append(sdpa_case("sdpa_causal_from_end_tq_gt_tk", f32, 1, 2, 1, 6, 4, 8, 8, mask="causal_from_end"))
    out.append(sdpa_case("sdpa_causal_from_end_square", f32, 2, 2, 2, 5, 5, 8, 8, mask="causal_from_end"))
    out.append(sdpa_case("sdpa_decode_one_query", f32, 1, 4, 2, 1, 21, 16, 16, mask="causal_from_end"))
    # Custom scale, D != Dv, long rows (SIMD chunks plus a remainder).
    out.append(sdpa_case("sdpa_scale", f32, 1, 2, 2, 3, 4, 8, 8, scale=0.3))
    out.append(sdpa_case("sdpa_scale_causal", f32, 1, 2, 2, 4, 4, 24, 40, mask="causal", scale=1.7))
    out.append(sdpa_case("sdpa_long", f32, 1, 1, 1, 2, 40, 35, 19))
    # Mask broadcast from several shapes.
    out.append(sdpa_case("sdpa_bool_full_mask", f32, 2, 2, 2, 3, 4, 8, 8, mask="bool", mask_shape=[2, 2, 3, 4]))
    out.append(sdpa_case("sdpa_bool_per_head", f32, 1, 4, 2, 3, 4, 8, 8, mask="bool", mask_shape=[4, 1, 4]))
    out.append(sdpa_case("sdpa_float_2d", f32, 1, 2, 2, 3, 6, 8, 8, mask="float", mask_shape=[3, 6]))
    # q, k, v stored [B, T, H, D] and viewed as [B, H, T, D].
    t12 = [["t", 1, 2]]
    q, k, v = randn(2, 5, 4, 8), randn(2, 7, 2, 8), randn(2, 7, 2, 8)
    kw = dict(enable_gqa=True)
    ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, **kw)
    out.append(case("sdpa_transposed_gqa_causal", [q, k, v], ref, op="sdpa", mask="causal", views={"0": t12, "1": t12, "2": t12}))
    # A float mask row of -inf everywhere gives zeros too.
    q, k, v = randn(1, 2, 3, 8), randn(1, 2, 4, 8), randn(1, 2, 4, 8)
    m = randn(3, 4)
    m[2] = float("-inf")
    out.append(case("sdpa_float_row_all_masked", [q, k, v, m], F.scaled_dot_product_attention(q, k, v, attn_mask=m), op="sdpa", mask="float"))
    # A mask stored transposed ([Tk, Tq] viewed as [Tq, Tk]).
    mt = randint(0, 3, 4, 3) > 0
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mt.t())
    out.append(case("sdpa_bool_transposed_mask", [q, k, v, mt], ref, op="sdpa", mask="bool", views={"3": [["t", 0, 1]]}))
    # No keys at all.
    out.append(sdpa_case("sdpa_no_keys", f32, 1, 2, 2, 3, 0, 8, 8))
    return out


def cases():
    # Reseed so this family's data does not depend on which families ran
    # before it in the same process.
    common._gen.manual_seed(1002)
    return layer_norm_cases() + rms_norm_cases() + batch_norm_cases() + rope_cases() + sdpa_cases()
