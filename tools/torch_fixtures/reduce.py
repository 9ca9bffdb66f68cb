"""Reductions and ops along one dim: sum, mean, max (amax), min (amin), prod,
argmax, argmin, var, std, softmax, log_softmax, cumsum, topk, sort.

Args of each case: `op`, the op's parameters (`dims`, `keepdim`, `dim`,
`correction`, `k`, `largest`, `descending`), optional `views` applied to
the input before the op (the Rust test builds the same views), and for
large inputs `gen` instead of stored data (see `gen_input`).
"""
import torch

from .common import case, rand, randint, randn

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int64, torch.int32, torch.uint8]
NAME = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
        torch.int64: "i64", torch.int32: "i32", torch.uint8: "u8", torch.bool: "bool", torch.complex64: "c64"}


def apply_views(x, views):
    """The views the Rust side applies with transpose / narrow / expand."""
    for v in views or []:
        if v[0] == "t":
            x = x.transpose(v[1], v[2])
        elif v[0] == "narrow":
            x = x.narrow(v[1], v[2], v[3])
        elif v[0] == "expand":
            x = x.expand(*v[1])
        else:
            raise ValueError(v)
    return x


def gen_input(spec):
    """Large deterministic inputs rebuilt on both sides instead of stored:
    element i is ((i * mul) % mod - off) / div, in `dtype`."""
    n = 1
    for d in spec["shape"]:
        n *= d
    i = torch.arange(n, dtype=torch.int64)
    v = ((i * spec["mul"]) % spec["mod"] - spec["off"]).to(torch.float64) / spec["div"]
    return v.to(getattr(torch, spec["dtype"])).reshape(spec["shape"])


def run(op, x, a):
    dims = a.get("dims")
    dim_arg = tuple(dims) if dims else None
    kd = a.get("keepdim", False)
    if op in ("sum", "mean", "prod", "max", "min"):
        if op == "prod":
            # torch.prod takes one dim (or none).
            if dim_arg is None:
                out = x.prod()
                return out.reshape([1] * x.dim()) if kd else out
            assert len(dim_arg) == 1
            return x.prod(dim_arg[0], keepdim=kd)
        f = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax, "min": torch.amin}[op]
        if dim_arg is None:
            out = f(x) if op in ("sum", "mean") else f(x, dim=tuple(range(x.dim())))
            return out.reshape([1] * x.dim()) if kd else out
        return f(x, dim=dim_arg, keepdim=kd)
    if op in ("var", "std"):
        f = torch.var if op == "var" else torch.std
        return f(x, dim=dim_arg, correction=a["correction"], keepdim=kd)
    if op in ("argmax", "argmin"):
        return getattr(torch, op)(x, dim=a["dim"], keepdim=kd)
    if op == "softmax":
        return torch.softmax(x, a["dim"])
    if op == "log_softmax":
        return torch.log_softmax(x, a["dim"])
    if op == "cumsum":
        return torch.cumsum(x, a["dim"])
    if op == "sort":
        r = torch.sort(x, dim=a["dim"], descending=a["descending"], stable=True)
        return [r.values, r.indices]
    if op == "topk":
        r = torch.topk(x, a["k"], dim=a["dim"], largest=a["largest"], sorted=True)
        return [r.values, r.indices]
    raise ValueError(op)


def mk(name, x, **a):
    """A case from a contiguous input `x` (views applied from `a`)."""
    return case(name, [x], run(a["op"], apply_views(x, a.get("views")), a), **a)


def mk_gen(name, spec, sample=None, **a):
    """A case on a generated input. With `sample`, only every sample-th
    element of each (flattened) output is stored, to keep the file small."""
    x = gen_input(spec)
    outs = run(a["op"], apply_views(x, a.get("views")), a)
    if sample:
        outs = [o.reshape(-1)[::sample] for o in (outs if isinstance(outs, list) else [outs])]
        a["sample"] = sample
    return case(name, [], outs, gen=spec, **a)


def sample(dtype, *shape, scale=1.0):
    if dtype.is_floating_point:
        return randn(*shape, dtype=dtype, scale=scale)
    if dtype == torch.bool:
        return randint(0, 2, *shape).to(torch.bool)
    if dtype == torch.uint8:
        return randint(0, 20, *shape, dtype=dtype)
    return randint(-20, 20, *shape, dtype=dtype)


def with_nans(x, every=7):
    flat = x.clone().reshape(-1)
    flat[3::every] = float("nan")
    return flat.reshape(x.shape)


def reductions():
    out = []
    dim_sets = [([], False), ([], True), ([1], False), ([-1], True), ([0, 2], False), ([0, -1], True), ([2, 0, 1], False)]
    for dt in FLOATS:
        n = NAME[dt]
        for op in ["sum", "mean", "max", "min"]:
            for dims, kd in dim_sets:
                x = sample(dt, 3, 4, 5)
                out.append(mk(f"{op}_{n}_dims{dims}_kd{int(kd)}", x, op=op, dims=dims, keepdim=kd))
        for op in ["var", "std"]:
            for (dims, kd), corr in zip(dim_sets, [1, 0, 1, 2, 1, 0, 1]):
                x = sample(dt, 3, 4, 5)
                out.append(mk(f"{op}_{n}_dims{dims}_kd{int(kd)}_c{corr}", x, op=op, dims=dims, keepdim=kd, correction=corr))
        for dims, kd in [([], False), ([0], True), ([-1], False)]:
            # Products of values near 1 stay in range; few factors per
            # output since PyTorch multiplies f16/bf16 without widening.
            x = rand(3, 6, dtype=dt, lo=0.6, hi=1.4)
            out.append(mk(f"prod_{n}_dims{dims}_kd{int(kd)}", x, op="prod", dims=dims, keepdim=kd))
    for dt in INTS + [torch.bool]:
        n = NAME[dt]
        for op in ["sum", "max", "min"]:
            for dims, kd in [([], False), ([0], True), ([-1], False), ([0, 2], False)]:
                out.append(mk(f"{op}_{n}_dims{dims}_kd{int(kd)}", sample(dt, 3, 4, 5), op=op, dims=dims, keepdim=kd))
        x = sample(dt, 3, 5) if dt != torch.uint8 else randint(0, 4, 3, 5, dtype=dt)
        if dt in (torch.int64, torch.int32):
            x = randint(-4, 5, 3, 5, dtype=dt)
        out.append(mk(f"prod_{n}_dim1", x, op="prod", dims=[1], keepdim=False))
        out.append(mk(f"prod_{n}_all", x[:, :3], op="prod", dims=[], keepdim=False))
    # complex sums and products
    c = torch.complex(randn(3, 4), randn(3, 4))
    out.append(mk("sum_c64_dim0", c, op="sum", dims=[0], keepdim=False))
    out.append(mk("sum_c64_all", c, op="sum", dims=[], keepdim=False))
    out.append(mk("prod_c64_dim1", c, op="prod", dims=[1], keepdim=True))
    # NaN propagation, non-contiguous views, size-1 and empty dims
    for dt in FLOATS:
        n = NAME[dt]
        x = with_nans(sample(dt, 4, 6), 9)
        for op in ["max", "min", "sum"]:
            out.append(mk(f"{op}_{n}_nan_dim1", x, op=op, dims=[1], keepdim=False))
            out.append(mk(f"{op}_{n}_nan_dim0", x, op=op, dims=[0], keepdim=False))
        out.append(mk(f"sum_{n}_transposed", sample(dt, 4, 5, 6), op="sum", dims=[0], keepdim=False, views=[["t", 0, 2]]))
        out.append(mk(f"var_{n}_transposed", sample(dt, 5, 7), op="var", dims=[1], keepdim=True, correction=1, views=[["t", 0, 1]]))
    out.append(mk("max_f32_narrowed", sample(torch.float32, 4, 9), op="max", dims=[1], keepdim=False, views=[["narrow", 1, 2, 5]]))
    out.append(mk("mean_f32_narrowed_dim0", sample(torch.float32, 6, 9), op="mean", dims=[0], keepdim=False, views=[["narrow", 0, 1, 4], ["t", 0, 1]]))
    out.append(mk("sum_f32_expanded", sample(torch.float32, 1, 5), op="sum", dims=[0], keepdim=False, views=[["expand", [4, 5]]]))
    out.append(mk("min_i32_transposed", sample(torch.int32, 3, 4, 5), op="min", dims=[1, 2], keepdim=True, views=[["t", 1, 2]]))
    # Permuted views of contiguous data are reduced in memory order; results
    # whose kept dims come out in another order get reordered.
    out.append(mk("var_f32_permuted_4d", sample(torch.float32, 2, 3, 4, 5), op="var", dims=[1, 3], keepdim=True,
                  correction=1, views=[["t", 0, 3], ["t", 1, 2]]))
    out.append(mk("max_i64_permuted_4d", sample(torch.int64, 2, 3, 4, 5), op="max", dims=[2], keepdim=False,
                  views=[["t", 0, 3], ["t", 1, 2]]))
    out.append(mk("sum_f32_size1_dim", sample(torch.float32, 3, 1, 4), op="sum", dims=[1], keepdim=False))
    out.append(mk("mean_f32_size1_keep", sample(torch.float32, 3, 1, 4), op="mean", dims=[1, 2], keepdim=True))
    out.append(mk("var_f32_single_elem", sample(torch.float32, 3, 1), op="var", dims=[1], keepdim=False, correction=1))
    out.append(mk("var_f64_correction_gt_n", sample(torch.float64, 2, 3), op="var", dims=[1], keepdim=False, correction=4))
    out.append(mk("sum_f32_empty_dim", torch.zeros(0, 3), op="sum", dims=[0], keepdim=False))
    out.append(mk("sum_i32_empty_dim", torch.zeros(0, 3, dtype=torch.int32), op="sum", dims=[0], keepdim=True))
    out.append(mk("prod_f32_empty_dim", torch.zeros(2, 0), op="prod", dims=[1], keepdim=False))
    out.append(mk("mean_f32_empty_dim", torch.zeros(0, 3), op="mean", dims=[0], keepdim=False))
    out.append(mk("sum_f32_empty_kept", torch.zeros(0, 3), op="sum", dims=[1], keepdim=False))
    out.append(mk("max_f32_empty_kept", torch.zeros(0, 3), op="max", dims=[1], keepdim=False))
    out.append(mk("sum_f32_scalar", torch.tensor(2.5), op="sum", dims=[], keepdim=False))
    # Reduced dims separated by a kept one (gathered path), 4-D.
    out.append(mk("sum_f32_4d_dims02", sample(torch.float32, 2, 3, 4, 5), op="sum", dims=[0, 2], keepdim=False))
    out.append(mk("max_f16_4d_dims13", sample(torch.float16, 2, 3, 4, 5), op="max", dims=[1, 3], keepdim=True))
    out.append(mk("std_f64_4d_dims03", sample(torch.float64, 2, 3, 4, 5), op="std", dims=[0, 3], keepdim=False, correction=1))
    # Longer rows and many rows: blocked sums, outer accumulation.
    # Mostly positive values: a well-conditioned sum, so the tolerance
    # measures our rounding rather than cancellation.
    out.append(mk("sum_f32_long_rows", rand(1, 4200, lo=-0.5, hi=1.5), op="sum", dims=[1], keepdim=False))
    out.append(mk("sum_f32_many_rows_dim0", sample(torch.float32, 300, 3), op="sum", dims=[0], keepdim=False))
    out.append(mk("var_f32_many_rows_dim0", sample(torch.float32, 260, 3, scale=3.0) + 10, op="var", dims=[0], keepdim=False, correction=1))
    out.append(mk("mean_bf16_long_rows", sample(torch.bfloat16, 1, 2200), op="mean", dims=[-1], keepdim=False))
    return out


def args():
    out = []
    for dt in FLOATS + INTS:
        n = NAME[dt]
        for op in ["argmax", "argmin"]:
            x = sample(dt, 3, 4, 5)
            if not dt.is_floating_point:
                x = randint(0, 3, 3, 4, 5, dtype=dt)  # many ties
            for dim, kd in [(0, False), (1, True), (-1, False)]:
                out.append(mk(f"{op}_{n}_dim{dim}_kd{int(kd)}", x, op=op, dim=dim, keepdim=kd))
    for dt in FLOATS:
        n = NAME[dt]
        x = with_nans(sample(dt, 4, 7), 5)
        for op in ["argmax", "argmin"]:
            out.append(mk(f"{op}_{n}_nan_dim1", x, op=op, dim=1, keepdim=False))
            out.append(mk(f"{op}_{n}_nan_dim0", x, op=op, dim=0, keepdim=False))
    ties = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, -1.0, -1.0], [5.0, 5.0, 5.0, 5.0]])
    out.append(mk("argmax_f32_ties_dim1", ties, op="argmax", dim=1, keepdim=False))
    out.append(mk("argmin_f32_ties_dim1", ties, op="argmin", dim=1, keepdim=False))
    out.append(mk("argmax_f32_ties_dim0", ties, op="argmax", dim=0, keepdim=False))
    out.append(mk("argmax_f32_transposed", sample(torch.float32, 4, 6), op="argmax", dim=1, keepdim=False, views=[["t", 0, 1]]))
    out.append(mk("argmin_i64_transposed", randint(0, 4, 5, 6), op="argmin", dim=0, keepdim=True, views=[["t", 0, 1]]))
    out.append(mk("argmax_f32_permuted", sample(torch.float32, 3, 4, 5), op="argmax", dim=1, keepdim=True, views=[["t", 0, 2]]))
    out.append(mk("argmin_bf16_permuted", sample(torch.bfloat16, 3, 4, 5), op="argmin", dim=-1, keepdim=False, views=[["t", 0, 1]]))
    out.append(mk("argmax_f32_size1", sample(torch.float32, 3, 1), op="argmax", dim=1, keepdim=False))
    out.append(mk("argmax_f32_scalar", torch.tensor(1.5), op="argmax", dim=0, keepdim=False))
    return out


def softmaxes():
    out = []
    for dt in FLOATS:
        n = NAME[dt]
        for op in ["softmax", "log_softmax"]:
            for dim in [-1, 0, 1]:
                out.append(mk(f"{op}_{n}_dim{dim}", sample(dt, 2, 3, 11, scale=3.0), op=op, dim=dim))
            out.append(mk(f"{op}_{n}_transposed", sample(dt, 5, 6), op=op, dim=-1, views=[["t", 0, 1]]))
        # Large logits: only a stable formulation gets these right.
        out.append(mk(f"softmax_{n}_large", sample(dt, 2, 40, scale=40.0), op="softmax", dim=-1))
        out.append(mk(f"log_softmax_{n}_large", sample(dt, 2, 40, scale=40.0), op="log_softmax", dim=-1))
    masked = randn(3, 8)
    masked[0, 2:] = float("-inf")
    masked[1, :] = float("-inf")
    masked[2, 5] = float("-inf")
    for op in ["softmax", "log_softmax"]:
        out.append(mk(f"{op}_f32_masked", masked, op=op, dim=1))
        out.append(mk(f"{op}_f32_masked_dim0", masked, op=op, dim=0))
        out.append(mk(f"{op}_f32_nan", with_nans(randn(3, 8), 11), op=op, dim=1))
        out.append(mk(f"{op}_f32_size1", randn(4, 1), op=op, dim=1))
        out.append(mk(f"{op}_f32_empty", torch.zeros(0, 5), op=op, dim=1))
        out.append(mk(f"{op}_f32_scalar", torch.tensor(0.7), op=op, dim=0))
        out.append(mk(f"{op}_f32_long_row", randn(1, 700, scale=4.0), op=op, dim=1))
    return out


def cumsums():
    out = []
    for dt in FLOATS + INTS + [torch.bool]:
        n = NAME[dt]
        for dim in [0, 1, -1]:
            out.append(mk(f"cumsum_{n}_dim{dim}", sample(dt, 3, 4, 5), op="cumsum", dim=dim))
    out.append(mk("cumsum_c64_dim1", torch.complex(randn(3, 4), randn(3, 4)), op="cumsum", dim=1))
    out.append(mk("cumsum_f32_transposed", randn(4, 6), op="cumsum", dim=1, views=[["t", 0, 1]]))
    out.append(mk("cumsum_f32_nan", with_nans(randn(2, 9), 5), op="cumsum", dim=1))
    out.append(mk("cumsum_f32_long", randn(1, 1200), op="cumsum", dim=1))
    out.append(mk("cumsum_f32_empty", torch.zeros(3, 0), op="cumsum", dim=1))
    out.append(mk("cumsum_i64_scalar", torch.tensor(4), op="cumsum", dim=0))
    return out


def sorts():
    out = []
    for dt in FLOATS + INTS + [torch.bool]:
        n = NAME[dt]
        # Few distinct values: plenty of ties to check stability.
        if dt.is_floating_point:
            x = randint(-3, 4, 3, 4, 9).to(dt) / 2
        elif dt == torch.bool:
            x = randint(0, 2, 3, 4, 9).to(dt)
        else:
            x = randint(0, 5, 3, 4, 9, dtype=dt)
        for dim, desc in [(-1, False), (-1, True), (0, False), (1, True)]:
            out.append(mk(f"sort_{n}_dim{dim}_desc{int(desc)}", x, op="sort", dim=dim, descending=desc))
    for dt in FLOATS + INTS:
        n = NAME[dt]
        # Distinct values, so PyTorch's indices are well defined for topk.
        x = torch.randperm(60, generator=torch.Generator().manual_seed(7)).reshape(3, 20).to(dt)
        if dt.is_floating_point:
            x = x / 4 - 7
        for k, dim, largest in [(5, -1, True), (3, -1, False), (2, 0, True), (20, 1, False), (0, 1, True), (1, 0, False)]:
            out.append(mk(f"topk_{n}_k{k}_dim{dim}_l{int(largest)}", x, op="topk", k=k, dim=dim, largest=largest))
    for dt in FLOATS:
        n = NAME[dt]
        x = with_nans(randn(3, 10, dtype=dt), 4)
        out.append(mk(f"sort_{n}_nan_asc", x, op="sort", dim=1, descending=False))
        out.append(mk(f"sort_{n}_nan_desc", x, op="sort", dim=1, descending=True))
        # One NaN per row: PyTorch leaves the order of tied top-k values open.
        x = with_nans(randn(3, 10, dtype=dt), 11)
        out.append(mk(f"topk_{n}_nan_largest", x, op="topk", k=4, dim=1, largest=True))
        out.append(mk(f"topk_{n}_nan_smallest", x, op="topk", k=4, dim=1, largest=False))
    inf = torch.tensor([[1.0, float("inf"), -float("inf"), 0.0, -0.0, 2.0, float("-inf")]])
    out.append(mk("sort_f32_inf_zeros", inf, op="sort", dim=1, descending=False))
    out.append(mk("sort_f32_inf_zeros_desc", inf, op="sort", dim=1, descending=True))
    out.append(mk("sort_f32_transposed", randn(5, 7), op="sort", dim=1, descending=False, views=[["t", 0, 1]]))
    out.append(mk("topk_f32_transposed", randn(5, 7), op="topk", k=3, dim=0, largest=True, views=[["t", 0, 1]]))
    out.append(mk("sort_f32_empty", torch.zeros(0, 4), op="sort", dim=1, descending=False))
    out.append(mk("sort_f32_size1", randn(4, 1), op="sort", dim=1, descending=True))
    out.append(mk("sort_f32_scalar", torch.tensor(3.0), op="sort", dim=0, descending=False))
    return out


def large():
    """Inputs big enough for the parallel and blocked paths (above the
    kernels' thresholds: 2^18 elements for reductions, 2^16 for softmax
    and cumsum, 2^14 for sorts), rebuilt from a formula on both sides.
    Values are multiples of 1/16, so f32 sums of them are exact and any
    difference is a bug, not rounding."""
    out = []

    def spec(shape, dtype="float32", mul=37, mod=101, off=50, div=16):
        return {"shape": shape, "dtype": dtype, "mul": mul, "mod": mod, "off": off, "div": div}

    out.append(mk_gen("large_sum_all_f32", spec([300007]), op="sum", dims=[], keepdim=False))
    out.append(mk_gen("large_max_all_f32", spec([300007]), op="max", dims=[], keepdim=False))
    out.append(mk_gen("large_argmin_f32", spec([1, 300001]), op="argmin", dim=1, keepdim=False))
    out.append(mk_gen("large_argmax_dim0_f32", spec([8001, 40]), op="argmax", dim=0, keepdim=False))
    out.append(mk_gen("large_sum_rows_f32", spec([160, 2051]), op="sum", dims=[1], keepdim=False))
    out.append(mk_gen("large_sum_dim0_f32", spec([8200, 33]), op="sum", dims=[0], keepdim=True))
    out.append(mk_gen("large_sum_dim0_wide_f32", spec([300, 1030]), op="sum", dims=[0], keepdim=False))
    out.append(mk_gen("large_mean_mid_f32", spec([8, 513, 70]), op="mean", dims=[1], keepdim=False))
    out.append(mk_gen("large_min_dim0_f16", spec([7000, 40], "float16"), op="min", dims=[0], keepdim=False))
    out.append(mk_gen("large_sum_all_bf16", spec([300000], "bfloat16"), op="sum", dims=[], keepdim=False))
    out.append(mk_gen("large_var_rows_f64", spec([3, 100000], "float64"), op="var", dims=[1], keepdim=False, correction=1))
    out.append(mk_gen("large_std_dim0_f32", spec([14000, 20]), op="std", dims=[0], keepdim=False, correction=1))
    out.append(mk_gen("large_sum_all_i32", spec([300000], "int32", div=1), op="sum", dims=[], keepdim=False))
    out.append(mk_gen("large_max_dim0_i64", spec([9000, 30], "int64", div=1), op="max", dims=[0], keepdim=False))
    out.append(mk_gen("large_sum_gathered_f32", spec([80, 40, 90]), op="sum", dims=[0, 2], keepdim=False))
    out.append(mk_gen("large_softmax_rows_f32", spec([64, 1031]), sample=97, op="softmax", dim=-1))
    out.append(mk_gen("large_log_softmax_rows_f32", spec([64, 1031]), sample=97, op="log_softmax", dim=-1))
    out.append(mk_gen("large_softmax_rows_f16", spec([48, 1000], "float16"), sample=97, op="softmax", dim=-1))
    out.append(mk_gen("large_softmax_dim0_f32", spec([700, 60]), sample=97, op="softmax", dim=0))
    out.append(mk_gen("large_softmax_mid_bf16", spec([6, 300, 40], "bfloat16"), sample=97, op="softmax", dim=1))
    out.append(mk_gen("large_cumsum_rows_f32", spec([80, 1000]), sample=97, op="cumsum", dim=1))
    out.append(mk_gen("large_cumsum_dim0_i64", spec([1000, 80], "int64", div=1), sample=97, op="cumsum", dim=0))
    out.append(mk_gen("large_sort_rows_f32", spec([40, 1000]), sample=97, op="sort", dim=1, descending=True))
    out.append(mk_gen("large_sort_dim0_i32", spec([1000, 40], "int32", div=1), sample=97, op="sort", dim=0, descending=False))
    # mod 4093 with mul 1237 (coprime) gives distinct values per row.
    out.append(mk_gen("large_topk_rows_f32", spec([40, 1500], mul=1237, mod=4093, off=2000, div=8), op="topk", k=10, dim=1, largest=True))
    return out


def cases():
    return reductions() + args() + softmaxes() + cumsums() + sorts() + large()
