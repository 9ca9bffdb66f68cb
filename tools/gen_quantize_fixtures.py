#!/usr/bin/env python3
"""Writes crates/rustorch-cli/tests/fixtures/quantize.json: what llama.cpp's
`llama-quantize` makes of small llama models, for every file type that
`rustorch-cli quantize` supports.

Two kinds of entries:

- "models": the test models of crates/rustorch-cli/tests/common/model.rs,
  written by RusTorch's GGUF writer through the `quant_input` example (the
  Rust test rebuilds them the same way, so no model is committed). Each is
  quantized for real; the fixture holds, per file type, the SHA-256 of the
  whole output file and, per tensor in file order, "name type sha" with
  the first 16 hex digits of the SHA-256 of its bytes. The test requires the same types and
  the same bytes.
- "configs": larger shapes (16, 32 and 80 layers, grouped-query attention
  or not, tied embeddings, 8 and 4 experts) written here with the `gguf`
  package and zero weights, run through `llama-quantize --dry-run`, which
  prints the type it would give each tensor. The fixture holds the tensor
  list ("name 256x64 F16": dims in GGUF order, type) and, per file type, the chosen
  types; the test feeds the same list to rustorch_core::quant::mix.

usage: tools/gen_quantize_fixtures.py [--llama-quantize PATH]
Needs cargo, numpy and gguf (PyPI), and llama-quantize from
tools/build_llamacpp.sh (found through it when --llama-quantize is not
given). Output is deterministic.
"""
import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import gguf

from cpu_record import cpu_record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "crates/rustorch-cli/tests/fixtures/quantize.json")

FTYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K",
          "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M",
          "Q6_K", "IQ4_NL", "IQ4_XS"]

CONFIGS = {
    # name: (n_layer, dim, n_head, n_head_kv, ffn, vocab, tied, n_expert)
    "l16_gqa4": (16, 256, 8, 2, 768, 256, False, 0),
    "l32_tied": (32, 256, 4, 4, 256, 256, True, 0),
    "l80_gqa8": (80, 256, 8, 1, 256, 256, False, 0),
    "moe8": (4, 256, 8, 8, 256, 256, False, 8),
    "moe4_gqa4": (4, 256, 8, 2, 256, 256, False, 4),
}


def sha(b):
    return hashlib.sha256(b).hexdigest()


def find_llama_quantize(arg):
    if arg:
        return arg
    out = subprocess.run(["bash", os.path.join(ROOT, "tools/build_llamacpp.sh")],
                         check=True, capture_output=True, text=True).stdout
    return os.path.join(out.strip().splitlines()[-1], "llama-quantize")


def tensors_of(path):
    r = gguf.GGUFReader(path)
    return [(t.name, [int(d) for d in t.shape], t.tensor_type.name, bytes(t.data.tobytes()))
            for t in r.tensors]


def quantize_models(lq, tmp):
    subprocess.run(["cargo", "run", "-q", "-p", "rustorch-cli", "--example", "quant_input", "--", tmp],
                   check=True, cwd=ROOT)
    models = {}
    for name in ["gqa8", "tiny_tied"]:
        src = os.path.join(tmp, name + ".gguf")
        with open(src, "rb") as f:
            entry = {"input_sha256": sha(f.read()), "outputs": {}}
        for ft in FTYPES:
            dst = os.path.join(tmp, f"{name}-{ft}.gguf")
            subprocess.run([lq, src, dst, ft, "2"], check=True, capture_output=True)
            with open(dst, "rb") as f:
                file_sha = sha(f.read())
            entry["outputs"][ft] = {
                "file_sha256": file_sha,
                "tensors": [f"{n} {ty} {sha(b)[:16]}" for n, _, ty, b in tensors_of(dst)],
            }
            os.remove(dst)
            print(f"{name} {ft}", file=sys.stderr)
        models[name] = entry
    return models


def write_config_model(path, n_layer, dim, n_head, n_kv, ffn, vocab, tied, n_expert):
    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(256); w.add_embedding_length(dim); w.add_block_count(n_layer)
    w.add_feed_forward_length(ffn); w.add_head_count(n_head); w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(dim // n_head); w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(1); w.add_vocab_size(vocab)
    if n_expert:
        w.add_expert_count(n_expert); w.add_expert_used_count(2)
    f16 = lambda *s: np.zeros(s, dtype=np.float16)
    f32 = lambda *s: np.zeros(s, dtype=np.float32)
    kvd = dim // n_head * n_kv
    w.add_tensor("token_embd.weight", f16(vocab, dim))
    for l in range(n_layer):
        p = f"blk.{l}."
        w.add_tensor(p + "attn_norm.weight", f32(dim))
        w.add_tensor(p + "attn_q.weight", f16(dim, dim))
        w.add_tensor(p + "attn_k.weight", f16(kvd, dim))
        w.add_tensor(p + "attn_v.weight", f16(kvd, dim))
        w.add_tensor(p + "attn_output.weight", f16(dim, dim))
        w.add_tensor(p + "ffn_norm.weight", f32(dim))
        if n_expert:
            w.add_tensor(p + "ffn_gate_inp.weight", f32(n_expert, dim))
            w.add_tensor(p + "ffn_gate_exps.weight", f16(n_expert, ffn, dim))
            w.add_tensor(p + "ffn_up_exps.weight", f16(n_expert, ffn, dim))
            w.add_tensor(p + "ffn_down_exps.weight", f16(n_expert, dim, ffn))
        else:
            w.add_tensor(p + "ffn_gate.weight", f16(ffn, dim))
            w.add_tensor(p + "ffn_up.weight", f16(ffn, dim))
            w.add_tensor(p + "ffn_down.weight", f16(dim, ffn))
    w.add_tensor("output_norm.weight", f32(dim))
    if not tied:
        w.add_tensor("output.weight", f16(vocab, dim))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()


LINE = re.compile(r"^\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[[^\]]*\], type =\s*(\S+), size = .*?(?:\((\S+)\))?\s*$")


def dry_run_types(lq, path, ft):
    p = subprocess.run([lq, "--dry-run", path, ft], check=True, capture_output=True, text=True)
    types = {}
    for line in (p.stdout + p.stderr).splitlines():
        m = LINE.match(line.strip())
        if m:
            name, cur, new = m.groups()
            types[name] = (new or cur).upper()
    return types


def dry_run_configs(lq, tmp):
    configs = {}
    for cname, cfg in CONFIGS.items():
        path = os.path.join(tmp, cname + ".gguf")
        write_config_model(path, *cfg)
        tensors = [(n, dims, ty) for n, dims, ty, _ in tensors_of(path)]
        n_layer, dim, n_head, n_kv, ffn, vocab, tied, n_expert = cfg
        entry = {
            "params": {"n_layer": n_layer, "n_head": n_head, "n_head_kv": n_kv, "n_expert": n_expert},
            "tensors": [f"{n} {'x'.join(map(str, dims))} {ty}" for n, dims, ty in tensors],
            "types": {},
        }
        for ft in FTYPES:
            types = dry_run_types(lq, path, ft)
            if len(types) != len(tensors):
                sys.exit(f"{cname} {ft}: parsed {len(types)} of {len(tensors)} tensors from llama-quantize")
            entry["types"][ft] = " ".join(types[n] for n, _, _ in tensors)
            print(f"{cname} {ft}", file=sys.stderr)
        os.remove(path)
        configs[cname] = entry
    return configs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-quantize")
    args = ap.parse_args()
    lq = find_llama_quantize(args.llama_quantize)
    with tempfile.TemporaryDirectory() as tmp:
        fixture = {
            "llama_cpp": "llama-cpp-python 0.3.36 (vendored llama.cpp), llama-quantize",
            # llama-quantize is built for this CPU (its float rounding steps may contract to FMA).
            "cpu": cpu_record(),
            "models": quantize_models(lq, tmp),
            "configs": dry_run_configs(lq, tmp),
        }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(fixture, f, indent=1, sort_keys=True)
        f.write("\n")
    print(OUT)


if __name__ == "__main__":
    main()
