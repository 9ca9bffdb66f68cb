#!/usr/bin/env python3
"""Write fixtures of llama.cpp's attention and SwiGLU, computed inside a real model.

src/suites/ggml_ops.rs (rustorch-conformance) feeds llama.cpp's own inputs to `Tensor::cached_attention`
and `Tensor::swiglu` and requires llama.cpp's outputs bit for bit. The tensors come from the
graph callbacks of llama-cpp-python 0.3.36 (tools/llamacpp_dump.py explains the mechanism;
settings as tools/gen_llamacpp_fixtures.py: n_ctx 512, 2 threads, no flash attention, F16 cache)
while it evaluates a prompt as one batch and then decodes greedily one token at a time, so
both of GGML's f16 product paths are covered (tinyBLAS for the batch, ggml_vec_dot_f16 for
single tokens).

    eval "$(python3 tools/fetch_models.py --print-env)"
    python3 tools/gen_ggml_ops_fixtures.py "$RUSTORCH_SMOLLM2_GGUF" "$RUSTORCH_GEMMA3_GGUF"

For layers LAYERS of the model and each evaluation, it writes into
crates/rustorch-conformance/fixtures/ggml_ops/ little-endian f32 files, listed with their
shapes (numpy order) in index.json:
  e<i>-l<layer>-q_pre.bin    Qcur before RoPE          [T, Hq, D]  (also k_pre)
  e<i>-l<layer>-q.bin        Qcur after RoPE           [T, Hq, D]
  e<i>-l<layer>-k.bin        Kcur after RoPE (f32, before the cache's f16 rounding) [T, Hkv, D]
  e<i>-l<layer>-v.bin        Vcur (f32)                [T, Hkv, Dv]
  e<i>-l<layer>-kqv_out.bin  attention output          [T, Hq * Dv]
  e<i>-l<layer>-gate.bin, -up.bin, -swiglu.bin         ffn_gate, ffn_up, ffn_swiglu [T, F]
  gemma-l<layer>-gate.bin, -up.bin, -geglu.bin   Gemma-3-270M's ffn_gate, ffn_up, ffn_geglu
                                                  for the prompt batch, layers 0 and 9
index.json also records the tokens, the attention scale, the RoPE base and the KV-cache length
llama.cpp attended over (n_kv) per evaluation, and the CPU llama.cpp ran on (`cpu`,
tools/cpu_record.py: its attention arithmetic depends on it). rustorch-llm's model::rope tests use q_pre/q
and k_pre/k (RoPE with llama.cpp's angle tables and rounding).
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_record import cpu_record  # noqa: E402
from llamacpp_dump import GgmlTensor, read_tensor  # noqa: E402

LAYERS = [0, 7]
PROMPT = "The quick brown fox jumps over the lazy dog. Then"
DECODE = 2
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "rustorch-conformance",
                   "fixtures", "ggml_ops")


def capture(model, wanted, prompt, decode):
    """Evaluates `prompt` as one batch, then `decode` greedy tokens one at a time; returns, per
    evaluation, its tokens, n_past and {node name: [arrays in computation order]}."""
    import ctypes
    import llama_cpp
    from llama_cpp import Llama
    from llama_cpp._internals import LlamaContext

    state = {"nodes": {}}

    def callback(tp, ask, _user):
        t = ctypes.cast(tp, ctypes.POINTER(GgmlTensor)).contents
        name = t.name.decode(errors="replace")
        if ask:
            return name in wanted
        state["nodes"].setdefault(name, []).append(read_tensor(t))
        return True

    cb = llama_cpp.ggml_backend_sched_eval_callback(callback)
    llm = Llama(model_path=model, n_ctx=512, n_threads=2, n_threads_batch=2, n_batch=512,
                verbose=False, flash_attn=False)
    params = llm.context_params
    params.cb_eval = cb
    params.cb_eval_user_data = None
    llm._ctx = LlamaContext(model=llm._model, params=params, verbose=False)
    evals = []
    batch = llm.tokenize(prompt.encode(), add_bos=True, special=True)
    n_past = 0
    for _ in range(decode + 1):
        state["nodes"] = {}
        llm.eval(batch)
        evals.append({"tokens": list(batch), "n_past": n_past, "nodes": state["nodes"]})
        n_past += len(batch)
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),))
        batch = [int(np.argmax(logits))]
    return llm.metadata, evals


def save(files, name, a, keep):
    # Drop GGML's unused outer dimensions: [T, H, D] or [T, features].
    a = np.ascontiguousarray(a, dtype=np.float32).reshape(a.shape[-keep:])
    a.astype("<f4").tofile(os.path.join(OUT, name))
    files[name] = list(a.shape)


def main():
    import llama_cpp

    smollm2, gemma = sys.argv[1], sys.argv[2]
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        if f.endswith(".bin"):
            os.remove(os.path.join(OUT, f))

    wanted = {f"{n}-{il}" for il in LAYERS
              for n in ["Qcur", "Kcur", "Vcur", "kq", "kqv_out", "ffn_gate", "ffn_up", "ffn_swiglu"]}
    meta, evals = capture(smollm2, wanted, PROMPT, DECODE)
    arch = meta["general.architecture"]
    head_dim = int(meta[f"{arch}.embedding_length"]) // int(meta[f"{arch}.attention.head_count"])
    index = {"source": os.path.basename(smollm2), "llama_cpp_python": llama_cpp.__version__,
             "cpu": cpu_record(), "prompt": PROMPT, "layers": LAYERS, "scale": 1.0 / np.sqrt(head_dim),
             "rope_base": float(meta[f"{arch}.rope.freq_base"]), "evals": []}
    for e, ev in enumerate(evals):
        nodes, files = ev["nodes"], {}
        for il in LAYERS:
            picks = {
                "q_pre": (nodes[f"Qcur-{il}"][-2], 3),  # the [T, Hq, D] view of the projection
                "k_pre": (nodes[f"Kcur-{il}"][-2], 3),
                "q": (nodes[f"Qcur-{il}"][-1], 3),      # the last Qcur node is the RoPE output
                "k": (nodes[f"Kcur-{il}"][-1], 3),
                "v": (nodes[f"Vcur-{il}"][-1], 3),      # [T, Hkv, Dv] view of the projection
                "kqv_out": (nodes[f"kqv_out-{il}"][-1], 2),
                "gate": (nodes[f"ffn_gate-{il}"][-1], 2),
                "up": (nodes[f"ffn_up-{il}"][-1], 2),
                "swiglu": (nodes[f"ffn_swiglu-{il}"][-1], 2),
            }
            for key, (a, keep) in picks.items():
                save(files, f"e{e}-l{il}-{key}.bin", a, keep)
        n_kv = int(nodes[f"kq-{LAYERS[0]}"][-1].shape[-1])
        index["evals"].append({"tokens": ev["tokens"], "n_past": ev["n_past"], "n_kv": n_kv, "files": files})

    # Gemma 3's GeGLU (the prompt batch only: the op is elementwise).
    gemma_layers = [0, 9]
    wanted = {f"{n}-{il}" for il in gemma_layers for n in ["ffn_gate", "ffn_up", "ffn_geglu"]}
    _, gevals = capture(gemma, wanted, PROMPT, 0)
    files = {}
    for il in gemma_layers:
        for key, node in (("gate", "ffn_gate"), ("up", "ffn_up"), ("geglu", "ffn_geglu")):
            save(files, f"gemma-l{il}-{key}.bin", gevals[0]["nodes"][f"{node}-{il}"][-1], 2)
    index["gemma"] = {"source": os.path.basename(gemma), "layers": gemma_layers, "files": files}

    with open(os.path.join(OUT, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    total = sum(os.path.getsize(os.path.join(OUT, x)) for x in os.listdir(OUT))
    print(f"wrote {len(os.listdir(OUT))} files, {total} bytes, into {OUT}")


if __name__ == "__main__":
    main()
