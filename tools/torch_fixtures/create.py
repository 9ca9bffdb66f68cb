"""Creation ops and dtype casts."""
import torch

from .common import case, randn, rand

F = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def cases():
    out = []
    for dt in [torch.float32, torch.float64, torch.int64, torch.int32, torch.float16, torch.bfloat16]:
        n = str(dt).split(".")[1]
        for (a, b, s) in [(0, 10, 1), (-3, 7.5, 0.5), (5, -5, -1.5), (1, 2, 0.1)]:
            if not dt.is_floating_point and (s != int(s) or a != int(a)):
                continue
            out.append(case(f"arange_{n}_{a}_{b}_{s}", [], torch.arange(a, b, s, dtype=dt), start=a, end=b, step=s))
    for dt in F:
        n = str(dt).split(".")[1]
        for (a, b, k) in [(0.0, 1.0, 11), (-2.5, 7.0, 100), (3.0, 3.0, 4), (1.0, -1.0, 2), (5.0, 6.0, 1)]:
            out.append(case(f"linspace_{n}_{a}_{b}_{k}", [], torch.linspace(a, b, k, dtype=dt), start=a, end=b, steps=k))
    for n in [1, 4]:
        out.append(case(f"eye_{n}", [], torch.eye(n), n=n))
    out.append(case("full_f16", [], torch.full((2, 3), 0.1, dtype=torch.float16), shape=[2, 3], value=0.1))
    out.append(case("full_i32", [], torch.full((4,), -7, dtype=torch.int32), shape=[4], value=-7))
    # Casts between every pair (values chosen so that every conversion is defined in C).
    src = {
        torch.float32: torch.tensor([0.0, 1.5, -2.7, 100.49, 1e-3, 65504.0, 3.14159, -0.0]),
        torch.float64: torch.tensor([0.0, 1.5, -2.7, 100.49, 1e-3, 1e5 + 0.123456789, 3.14159265358979, 2.0 ** -20], dtype=torch.float64),
        torch.int64: torch.tensor([0, 1, -2, 100, 255, 70000, -123456, 7]),
        torch.int32: torch.tensor([0, 1, -2, 100, 255, 70000, -123456, 7], dtype=torch.int32),
        torch.uint8: torch.tensor([0, 1, 2, 100, 255, 128, 7, 64], dtype=torch.uint8),
        torch.bool: torch.tensor([True, False, True, True, False, False, True, False]),
        torch.float16: randn(8, dtype=torch.float16, scale=10),
        torch.bfloat16: randn(8, dtype=torch.bfloat16, scale=10),
    }
    targets = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool]
    for sdt, x in src.items():
        for tdt in targets + ([torch.uint8] if sdt in (torch.uint8, torch.bool) else []):
            if sdt.is_floating_point and not tdt.is_floating_point and tdt != torch.bool:
                y = x.to(tdt)  # truncation toward zero; inputs stay in range
            else:
                y = x.to(tdt)
            sn, tn = str(sdt).split(".")[1], str(tdt).split(".")[1]
            out.append(case(f"cast_{sn}_to_{tn}", [x], y, to=tn))
    # Cast of a non-contiguous view.
    x = randn(3, 4)
    out.append(case("cast_transposed_f32_to_f16", [x], x.t().to(torch.float16), to="float16"))
    # Complex from real.
    x = randn(5)
    out.append(case("cast_f32_to_c64", [x], x.to(torch.complex64), to="complex64"))
    _ = rand
    return out
