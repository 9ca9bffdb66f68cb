#!/usr/bin/env python3
"""Sampling fixtures for crates/rustorch-llm/tests/sampling.rs, from llama.cpp's own samplers.

Uses llama-cpp-python 0.3.36's low-level API: llama_sampler_init_penalties / top_k / top_p /
min_p / temp / dist applied with llama_sampler_apply to a llama_token_data_array built from a
logits row, exactly as common_sampler's chain does (penalties, top-k, top-p, min-p,
temperature, dist). Writes, for each case:

- `steps`: after each sampler, the candidates (ids, logits, p in array order) and the sorted
  flag; for steps leaving more than MAX_FULL candidates, only probes (some positions).
- `draws`: the token llama_sampler_init_dist(seed) picks from the final candidates, per seed.
- `chains`: whole generations: a llama_sampler_chain (penalties ... dist) over a sequence of
  logits rows, accepting each picked token, as llama.cpp's generation loop does.

Usage: python3 tools/gen_sampling_fixtures.py (writes crates/rustorch-llm/tests/fixtures/sampling/)
"""

import ctypes
import json
from pathlib import Path

import llama_cpp as L
import numpy as np

from cpu_record import cpu_record

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates/rustorch-llm/tests/fixtures/sampling"
MAX_FULL = 512
SEEDS = list(range(64)) + [12345, 0xDEADBEEF, 0xFFFFFFFE]

DEFAULTS = dict(top_k=40, top_p=0.95, min_p=0.05, min_keep=0, temp=0.8,
                repeat=1.0, freq=0.0, present=0.0, last_n=64)


def sf(x):
    """An f32 as the shortest decimal that reads back to it (serde parses it to the same f32);
    -inf (temperature 0 masks) as null, which JSON has no number for."""
    x = np.float32(x)
    return None if np.isneginf(x) else float(str(x))


def f32list(a):
    return [sf(x) for x in np.asarray(a, dtype=np.float32)]


class Cands:
    def __init__(self, logits):
        n = len(logits)
        self.buf = (L.llama_token_data * n)()
        for i, l in enumerate(np.asarray(logits, dtype=np.float32)):
            self.buf[i].id, self.buf[i].logit, self.buf[i].p = i, float(l), 0.0
        self.arr = L.llama_token_data_array(
            data=ctypes.cast(self.buf, ctypes.POINTER(L.llama_token_data)), size=n, selected=-1, sorted=False)

    def apply(self, smpl):
        L.llama_sampler_apply(smpl, ctypes.byref(self.arr))
        L.llama_sampler_free(smpl)

    def snapshot(self, name, probe_ids):
        n = self.arr.size
        d = self.arr.data
        rec = {"step": name, "size": n, "sorted": bool(self.arr.sorted)}
        if n <= MAX_FULL:
            idx = list(range(n))
            rec["full"] = True
        else:
            idx = sorted(set(range(8)) | set(range(n - 8, n)) | {i for i in probe_ids if i < n})
            rec["full"] = False
        rec["index"] = idx
        rec["ids"] = [d[i].id for i in idx]
        rec["logits"] = [sf(d[i].logit) for i in idx]
        rec["p"] = [sf(d[i].p) for i in idx]
        return rec

    def copy(self):
        c = Cands([0.0])
        n = self.arr.size
        c.buf = (L.llama_token_data * n)()
        ctypes.memmove(c.buf, self.arr.data, n * ctypes.sizeof(L.llama_token_data))
        c.arr = L.llama_token_data_array(
            data=ctypes.cast(c.buf, ctypes.POINTER(L.llama_token_data)), size=n, selected=-1, sorted=self.arr.sorted)
        return c


def penalties(cfg, n_vocab, history):
    s = L.llama_sampler_init_penalties(n_vocab, cfg["last_n"], cfg["repeat"], cfg["freq"], cfg["present"])
    for t in history:
        L.llama_sampler_accept(s, t)
    return s


def single_case(name, logits, history, **over):
    cfg = dict(DEFAULTS, **over)
    n = len(logits)
    c = Cands(logits)
    steps = []
    probes = sorted(set(history))
    c.apply(penalties(cfg, n, history))
    steps.append(c.snapshot("penalties", probes))
    c.apply(L.llama_sampler_init_top_k(cfg["top_k"]))
    steps.append(c.snapshot("top_k", probes))
    c.apply(L.llama_sampler_init_top_p(cfg["top_p"], cfg["min_keep"]))
    steps.append(c.snapshot("top_p", probes))
    c.apply(L.llama_sampler_init_min_p(cfg["min_p"], cfg["min_keep"]))
    steps.append(c.snapshot("min_p", probes))
    c.apply(L.llama_sampler_init_temp(cfg["temp"]))
    steps.append(c.snapshot("temp", probes))
    draws = []
    for seed in SEEDS:
        cc = c.copy()
        s = L.llama_sampler_init_dist(seed)
        L.llama_sampler_apply(s, ctypes.byref(cc.arr))
        L.llama_sampler_free(s)
        draws.append([seed, cc.arr.data[cc.arr.selected].id])
        if seed == 0:
            steps.append(cc.snapshot("dist", probes))
    return {"name": name, "config": cfg, "logits": f32list(logits), "history": history,
            "steps": steps, "draws": draws}


def chain_case(name, rows, seed, prompt, **over):
    cfg = dict(DEFAULTS, **over)
    n = rows.shape[1]
    params = L.llama_sampler_chain_default_params()
    chain = L.llama_sampler_chain_init(params)
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_penalties(n, cfg["last_n"], cfg["repeat"], cfg["freq"], cfg["present"]))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_k(cfg["top_k"]))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_p(cfg["top_p"], cfg["min_keep"]))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_min_p(cfg["min_p"], cfg["min_keep"]))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp(cfg["temp"]))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_dist(seed))
    for t in prompt:  # prompt tokens accepted first, as llama-server does
        L.llama_sampler_accept(chain, t)
    picked = []
    for row in rows:
        c = Cands(row)
        L.llama_sampler_apply(chain, ctypes.byref(c.arr))
        tok = c.arr.data[c.arr.selected].id
        L.llama_sampler_accept(chain, tok)
        picked.append(tok)
    L.llama_sampler_free(chain)
    return {"name": name, "config": cfg, "seed": seed, "prompt": prompt,
            "rows": [f32list(r) for r in rows], "picked": picked}


def main():
    rng = np.random.default_rng(20261121)
    normal = lambda n, scale: (rng.standard_normal(n) * scale).astype(np.float32)
    hist = lambda n, k: [int(x) for x in rng.integers(0, n, k)]
    cases = [
        single_case("defaults_n50", normal(50, 2.0), []),
        single_case("defaults_n5000_peaked", normal(5000, 4.0), []),
        single_case("defaults_flat", normal(300, 0.2), []),
        # Penalties with repeats in the window (last_n 16 of a 40-token history); top-k off so
        # top-p takes llama.cpp's adaptive path (unsorted, > 1024 candidates).
        single_case("penalties_topk_off_n5000", normal(5000, 1.0), hist(60, 40),
                    repeat=1.3, freq=0.1, present=0.2, last_n=16, top_k=0, top_p=0.9, min_p=0.0, temp=1.2),
        # Penalty signs: negative logits are multiplied, positive divided.
        single_case("penalties_signs", normal(64, 3.0), hist(64, 30) + [0, 0, 1],
                    repeat=1.8, freq=0.05, present=0.5, last_n=64, top_k=20, top_p=0.99, min_p=0.01, temp=0.5),
        # Only min-p on unsorted candidates: llama.cpp's in-place filter keeps id order.
        single_case("min_p_unsorted", normal(2000, 2.0), [], top_k=0, top_p=1.0, min_p=0.1, temp=0.7),
        # min_keep forces candidates past the top-p / min-p cuts.
        single_case("min_keep", normal(400, 5.0), [], top_k=100, top_p=0.3, min_p=0.5, min_keep=5, temp=1.0),
        # Top-p small on a small unsorted set (in-place sort path), top-k off.
        single_case("top_p_small_unsorted", normal(700, 1.5), [], top_k=0, top_p=0.5, min_p=0.0, temp=1.0),
        # temp <= 0: the chain keeps the first max only.
        single_case("temp_zero", normal(1000, 1.0), [], temp=0.0),
    ]
    chains = [
        chain_case("chain_defaults", normal(30 * 256, 3.0).reshape(30, 256), 42, []),
        chain_case("chain_penalties", normal(30 * 256, 2.0).reshape(30, 256), 7, hist(256, 20),
                   repeat=1.5, freq=0.3, present=0.4, last_n=8, temp=1.0, top_k=50, top_p=0.9, min_p=0.02),
        chain_case("chain_greedy", normal(20 * 256, 2.0).reshape(20, 256), 3, [], temp=0.0),
    ]
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "llamacpp_samplers.json"
    path.write_text(json.dumps({"generator": "tools/gen_sampling_fixtures.py", "llama_cpp_python": L.__version__,
                                # The samplers' float arithmetic is compiled for this CPU.
                                "cpu": cpu_record(), "cases": cases, "chains": chains}) + "\n")
    print(f"wrote {path}: {len(cases)} cases, {len(chains)} chains, {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
