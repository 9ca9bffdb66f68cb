"""Indexing and joining: index_select, gather, scatter_add, embedding, cat, stack.

Every case names its op in args["op"]. Non-contiguous inputs are described
by args["views"]: {input position: [view, ...]}, applied in order to the
stored (contiguous) input on both sides; see apply_view. Index tensors that
torch does not accept (u8) are stored as u8 and converted to int64 here
for the reference.
"""
import torch
import torch.nn.functional as F

from . import common
from .common import case, randn, randint

DATA_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.uint8,
    torch.bool,
    torch.complex64,
]
SHORT = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.uint8: "u8",
    torch.bool: "bool",
    torch.complex64: "c64",
}


def data(*shape, dtype=torch.float32):
    if dtype == torch.bool:
        return randint(0, 2, *shape).bool()
    if dtype == torch.uint8:
        return randint(0, 256, *shape, dtype=torch.uint8)
    if dtype in (torch.int32, torch.int64):
        return randint(-1000, 1000, *shape, dtype=dtype)
    if dtype == torch.complex64:
        return torch.complex(randn(*shape), randn(*shape))
    return randn(*shape, dtype=dtype)


def apply_view(t, views):
    for v in views:
        kind = v[0]
        if kind == "t":
            t = t.transpose(v[1], v[2])
        elif kind == "narrow":
            t = t.narrow(v[1], v[2], v[3])
        elif kind == "expand":
            t = t.expand(*v[1])
        elif kind == "permute":
            t = t.permute(*v[1])
        elif kind == "slice":
            idx = [slice(None)] * t.dim()
            idx[v[1]] = slice(v[2], v[3], v[4])
            t = t[tuple(idx)]
        else:
            raise ValueError(kind)
    return t


def viewed(inputs, views):
    return [apply_view(t, views.get(str(i), [])) for i, t in enumerate(inputs)]


def as_long(t):
    return t.long() if t.dtype == torch.uint8 else t


def index_select_cases():
    out = []
    for dt in DATA_DTYPES:
        for dim in (0, 1, -1):
            x = data(4, 5, 3, dtype=dt)
            size = x.shape[dim]
            idx = randint(0, size, 6)  # six entries: repeats are certain
            out.append(case(f"index_select_{SHORT[dt]}_d{dim}", [x, idx], x.index_select(dim, idx), op="index_select", dim=dim))
    x = randn(6, 7)
    for it in (torch.int32, torch.uint8):
        idx = randint(0, 7, 9, dtype=it)
        out.append(case(f"index_select_idx_{SHORT[it]}", [x, idx], x.index_select(1, as_long(idx)), op="index_select", dim=1))
    # Non-contiguous sources: transposed, narrowed, strided, broadcast.
    base = randn(5, 8, 3)
    for name, views in [
        ("transposed", [["t", 0, 1]]),
        ("narrowed", [["narrow", 1, 2, 4]]),
        ("strided", [["slice", 1, 0, 8, 3]]),
        ("permuted", [["permute", [2, 0, 1]]]),
    ]:
        x = apply_view(base, views)
        for dim in (0, 1, 2):
            idx = randint(0, x.shape[dim], 5)
            out.append(
                case(f"index_select_{name}_d{dim}", [base, idx], x.index_select(dim, idx), op="index_select", dim=dim, views={"0": views})
            )
    xe = randn(1, 4)
    ie = torch.tensor([0, 2, 2, 1])
    out.append(
        case("index_select_expanded", [xe, ie], xe.expand(3, 4).index_select(0, ie), op="index_select", dim=0, views={"0": [["expand", [3, 4]]]})
    )
    # Edge cases: empty index, index into a size-1 dim, 1-D source.
    x = randn(3, 4)
    e = torch.zeros(0, dtype=torch.int64)
    out.append(case("index_select_empty_index", [x, e], x.index_select(1, e), op="index_select", dim=1))
    z = randn(0, 4)
    out.append(case("index_select_empty_source", [z, torch.tensor([1, 3])], z.index_select(1, torch.tensor([1, 3])), op="index_select", dim=1))
    x1 = randn(1, 5)
    i1 = torch.tensor([0, 0, 0])
    out.append(case("index_select_size1", [x1, i1], x1.index_select(0, i1), op="index_select", dim=0))
    v = randn(7)
    iv = torch.tensor([6, 0, 3])
    out.append(case("index_select_1d", [v, iv], v.index_select(0, iv), op="index_select", dim=0))
    return out


def gather_cases():
    out = []
    for dt in DATA_DTYPES:
        for dim in (0, 1, -1):
            x = data(3, 4, 5, dtype=dt)
            shape = [2, 3, 4]
            shape[dim] = 6
            idx = randint(0, x.shape[dim], *shape)
            out.append(case(f"gather_{SHORT[dt]}_d{dim}", [x, idx], x.gather(dim, idx), op="gather", dim=dim))
    x = randn(4, 6)
    idx = randint(0, 6, 4, 3, dtype=torch.int32)
    out.append(case("gather_idx_i32", [x, idx], x.gather(1, idx), op="gather", dim=1))
    idx8 = randint(0, 4, 2, 6, dtype=torch.uint8)
    out.append(case("gather_idx_u8", [x, idx8], x.gather(0, as_long(idx8)), op="gather", dim=0))
    # Transposed source and transposed index.
    base = randn(6, 4)
    xt = base.t()
    idx = randint(0, 6, 4, 5)
    out.append(case("gather_transposed_src", [base, idx], xt.gather(1, idx), op="gather", dim=1, views={"0": [["t", 0, 1]]}))
    ibase = randint(0, 4, 3, 6)
    out.append(case("gather_transposed_index", [base, ibase], base.gather(1, ibase.t()), op="gather", dim=1, views={"1": [["t", 0, 1]]}))
    xe = randn(1, 5)
    ie = randint(0, 5, 3, 5)
    out.append(case("gather_expanded_src", [xe, ie], xe.expand(4, 5).gather(1, ie), op="gather", dim=1, views={"0": [["expand", [4, 5]]]}))
    e = torch.zeros(3, 0, dtype=torch.int64)
    out.append(case("gather_empty", [x, e], x.gather(1, e), op="gather", dim=1))
    v = randn(8)
    iv = randint(0, 8, 11)
    out.append(case("gather_1d", [v, iv], v.gather(0, iv), op="gather", dim=0))
    return out


def scatter_ref(dst, dim, idx, src):
    # Half types: the exact sum rounded once (our kernel accumulates in
    # f32; torch's CPU kernel rounds after every addition).
    if dst.dtype in (torch.float16, torch.bfloat16):
        return dst.double().scatter_add(dim, idx, src.double()).to(dst.dtype)
    return dst.scatter_add(dim, idx, src)


def scatter_add_cases():
    out = []
    for dt in DATA_DTYPES:
        for dim in (0, 1, -1):
            dst = data(3, 4, 5, dtype=dt)
            shape = [2, 3, 4]
            shape[dim] = 7  # more entries than the dim holds: repeats
            src = data(*[s + 1 for s in shape], dtype=dt)
            idx = randint(0, dst.shape[dim], *shape)
            out.append(
                case(f"scatter_add_{SHORT[dt]}_d{dim}", [dst, idx, src], scatter_ref(dst, dim, idx, src), op="scatter_add", dim=dim)
            )
    dst = randn(5, 6)
    src = randn(5, 6)
    idx = randint(0, 6, 5, 6, dtype=torch.int32)
    out.append(case("scatter_add_idx_i32", [dst, idx, src], dst.scatter_add(1, idx.long(), src), op="scatter_add", dim=1))
    idx8 = randint(0, 5, 4, 6, dtype=torch.uint8)
    out.append(case("scatter_add_idx_u8", [dst, idx8, src], dst.scatter_add(0, idx8.long(), src), op="scatter_add", dim=0))
    # All entries onto one position: a long chain of repeats.
    ones = torch.zeros(10, 4, dtype=torch.int64)
    src = randn(10, 4)
    z = torch.zeros(3, 4)
    out.append(case("scatter_add_all_repeat", [z, ones, src], z.scatter_add(0, ones, src), op="scatter_add", dim=0))
    # u8 wraps around on overflow.
    d8 = torch.tensor([250, 10], dtype=torch.uint8)
    s8 = torch.tensor([10, 200, 100], dtype=torch.uint8)
    i8 = torch.tensor([0, 1, 1])
    out.append(case("scatter_add_u8_wraps", [d8, i8, s8], d8.scatter_add(0, i8, s8), op="scatter_add", dim=0))
    # Transposed destination and source.
    dbase = randn(6, 4)
    sbase = randn(5, 4)
    idx = randint(0, 6, 4, 5)
    d, s = dbase.t(), sbase.t()
    out.append(
        case("scatter_add_transposed", [dbase, idx, sbase], d.scatter_add(1, idx, s), op="scatter_add", dim=1, views={"0": [["t", 0, 1]], "2": [["t", 0, 1]]})
    )
    e = torch.zeros(2, 0, dtype=torch.int64)
    out.append(case("scatter_add_empty_index", [dbase, e, sbase], dbase.scatter_add(1, e, sbase), op="scatter_add", dim=1))
    return out


def embedding_cases():
    out = []
    for dt in DATA_DTYPES:
        w = data(10, 6, dtype=dt)
        ids = randint(0, 10, 2, 3)
        out.append(case(f"embedding_{SHORT[dt]}", [w, ids], F.embedding(ids, w), op="embedding"))
    w = randn(12, 8)
    ids = randint(0, 12, 7, dtype=torch.int32)
    out.append(case("embedding_ids_i32", [w, ids], F.embedding(ids, w), op="embedding"))
    ids8 = randint(0, 12, 2, 2, dtype=torch.uint8)
    out.append(case("embedding_ids_u8", [w, ids8], F.embedding(ids8.long(), w), op="embedding"))
    # A table that is a slice of a larger one (columns 2..7).
    wide = randn(12, 10)
    ids = randint(0, 12, 3, 4)
    out.append(
        case("embedding_narrowed_weight", [wide, ids], F.embedding(ids, wide.narrow(1, 2, 5)), op="embedding", views={"0": [["narrow", 1, 2, 5]]})
    )
    # Transposed table and transposed ids.
    wt = randn(6, 9)
    ids = randint(0, 9, 4, 2)
    out.append(
        case("embedding_transposed", [wt, ids], F.embedding(ids.t(), wt.t()), op="embedding", views={"0": [["t", 0, 1]], "1": [["t", 0, 1]]})
    )
    s = torch.tensor(3)
    out.append(case("embedding_scalar_id", [w, s], F.embedding(s, w), op="embedding"))
    e = torch.zeros(0, dtype=torch.int64)
    out.append(case("embedding_no_ids", [w, e], F.embedding(e, w), op="embedding"))
    return out


def cat_cases():
    out = []
    a, b, c = randn(2, 3, 4), randn(2, 5, 4), randn(2, 1, 4)
    for dim in (1, -2):
        out.append(case(f"cat_three_d{dim}", [a, b, c], torch.cat([a, b, c], dim), op="cat", dim=dim))
    a, b = randn(3, 4), randn(2, 4)
    out.append(case("cat_d0", [a, b], torch.cat([a, b], 0), op="cat", dim=0))
    a, b = randn(3, 2), randn(3, 5)
    out.append(case("cat_last", [a, b], torch.cat([a, b], -1), op="cat", dim=-1))
    for dt in DATA_DTYPES:
        a, b = data(2, 3, dtype=dt), data(2, 2, dtype=dt)
        out.append(case(f"cat_{SHORT[dt]}", [a, b], torch.cat([a, b], 1), op="cat", dim=1))
    # Promotion as torch.cat.
    for x, y in [
        (data(2, 2, dtype=torch.int32), data(3, 2, dtype=torch.float16)),
        (data(2, 2, dtype=torch.bfloat16), data(1, 2, dtype=torch.float16)),
        (data(2, 2, dtype=torch.bool), data(2, 2, dtype=torch.uint8)),
        (data(2, 2, dtype=torch.int64), data(2, 2, dtype=torch.float64)),
    ]:
        out.append(case(f"cat_promote_{SHORT[x.dtype]}_{SHORT[y.dtype]}", [x, y], torch.cat([x, y], 0), op="cat", dim=0))
    # Non-contiguous parts.
    a, b = randn(4, 3), randn(3, 2)
    out.append(case("cat_transposed", [a, b], torch.cat([a.t(), b], 1), op="cat", dim=1, views={"0": [["t", 0, 1]]}))
    # Legacy 1-D empty tensors are skipped; empty along dim is fine too.
    a, e, z = randn(2, 3), torch.zeros(0), randn(0, 3)
    out.append(case("cat_legacy_empty", [e, a, z], torch.cat([e, a, z], 0), op="cat", dim=0))
    a = randn(3)
    out.append(case("cat_single", [a], torch.cat([a], 0), op="cat", dim=0))
    return out


def stack_cases():
    out = []
    a, b, c = randn(2, 3), randn(2, 3), randn(2, 3)
    for dim in (0, 1, 2, -1, -3):
        out.append(case(f"stack_d{dim}", [a, b, c], torch.stack([a, b, c], dim), op="stack", dim=dim))
    x, y = data(4, dtype=torch.int32), data(4, dtype=torch.float32)
    out.append(case("stack_promote", [x, y], torch.stack([x, y], 0), op="stack", dim=0))
    base, other = randn(3, 2), randn(2, 3)
    out.append(case("stack_transposed", [base, other], torch.stack([base.t(), other], 0), op="stack", dim=0, views={"0": [["t", 0, 1]]}))
    return out


def cases():
    # Reseed so this family's data does not depend on which families ran
    # before it in the same process.
    common._gen.manual_seed(1001)
    return index_select_cases() + gather_cases() + scatter_add_cases() + embedding_cases() + cat_cases() + stack_cases()
