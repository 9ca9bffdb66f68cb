#!/usr/bin/env python3
"""The CPU a llama.cpp fixture was written on, as the fixtures record it.

llama.cpp's CPU backend is compiled for the CPU at hand (-march=native), and some of its
arithmetic depends on what that CPU has: AVX512-FP16 makes flash attention accumulate values in
half precision (ggml_vec_mad_f16 / ggml_vec_scale_f16), AMX changes the order of quantized
products, AVX512-BF16 the BF16 dot products, and the vector width (AVX-512, AVX2) the order of
f32 sums. So a fixture made by running llama.cpp is only llama.cpp's answer for that kind of CPU,
and every fixture generator that runs llama.cpp records `cpu_record()` next to its results:

  {"arch": "x86_64", "vendor": "AuthenticAMD", "model": "AMD EPYC (family 25, model 17)",
   "flags": ["avx2", "fma", ...],
   "kind": "x86-64 AVX-512 with AVX512-BF16, without AVX512-FP16 or AMX"}

- `model`: /proc/cpuinfo's model name, with the CPU family and model numbers (virtual machines
  often report a bare "AMD EPYC" or "Intel(R) Xeon(R) Processor");
- `flags`: only the /proc/cpuinfo flags (Linux's spelling: avx512vbmi, avx512_fp16) that select
  llama.cpp CPU code paths, in the order of FLAGS;
- `kind`: what of those changes llama.cpp's results (`kind()`). The Rust tests compute the kind
  of the CPU they run on the same way (crates/rustorch-core/tests/common/fixture_cpu.rs, which
  also checks that a record's kind follows from its flags) and say so when it differs from their
  fixtures': they then check RusTorch's reproduction of the fixtures' build, not identity with
  llama.cpp built on the CPU at hand (tools/llamacpp_diff.py checks that).

  python3 tools/cpu_record.py          # this machine's record, JSON on one line (for shell scripts)
"""

import json
import platform
import sys

# /proc/cpuinfo flags that select llama.cpp (ggml-cpu) code paths on x86-64.
FLAGS = [
    "avx2", "fma", "f16c",
    "avx512f", "avx512bw", "avx512vl",
    "avx512_vnni", "avx_vnni", "avx512vbmi", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_int8", "amx_bf16",
]


def _join(names, last):
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" {last} " + names[-1]


def kind(arch, flags):
    """Sums up what of `flags` changes llama.cpp's CPU results.

    The vector width decides the order of f32 sums (GGML_F32_STEP): AVX-512, AVX2 (with FMA, as
    on every AVX2 CPU llama.cpp targets), or neither. On AVX-512 CPUs three extensions change
    results: AVX512-BF16 (BF16 dot products with vdpbf16ps), AVX512-FP16 (half-precision
    flash-attention accumulation) and AMX (AMX-INT8: the AMX buffer's product order). VNNI and
    VBMI only speed up integer work whose results are exact, so they do not appear here.
    Keep in step with `kind` in crates/rustorch-core/tests/common/fixture_cpu.rs.
    """
    if arch != "x86_64":
        return f"{arch} (only x86-64 CPUs are summarized)"
    has = set(flags)
    if "avx512f" in has:
        base = "x86-64 AVX-512"
    elif "avx2" in has and "fma" in has:
        return "x86-64 AVX2"
    elif "avx2" in has:
        return "x86-64 AVX2 without FMA"
    else:
        return "x86-64 without AVX2"
    extras = [("AVX512-BF16", "avx512_bf16" in has), ("AVX512-FP16", "avx512_fp16" in has),
              ("AMX", "amx_tile" in has and "amx_int8" in has)]
    with_ = [n for n, on in extras if on]
    without = [n for n, on in extras if not on]
    parts = [base]
    if with_:
        parts.append(f" with {_join(with_, 'and')}")
    if without:
        parts.append(("," if with_ else "") + f" without {_join(without, 'or')}")
    return "".join(parts)


def cpu_record(cpuinfo_path="/proc/cpuinfo"):
    """This machine's record, from the first processor of /proc/cpuinfo (Linux)."""
    try:
        with open(cpuinfo_path) as f:
            text = f.read()
    except OSError as e:
        sys.exit(f"cpu_record: cannot read {cpuinfo_path} ({e}); fixtures record the CPU from it (Linux)")
    fields = {}
    for line in text.split("\n\n")[0].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    arch = platform.machine()
    name = fields.get("model name") or fields.get("Hardware") or "unknown"
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    present = set((fields.get("flags") or fields.get("Features") or "").split())
    flags = [f for f in FLAGS if f in present]
    return {
        "arch": arch,
        "vendor": fields.get("vendor_id") or fields.get("CPU implementer") or "unknown",
        "model": name,
        "flags": flags,
        "kind": kind(arch, flags),
    }


if __name__ == "__main__":
    print(json.dumps(cpu_record()))
