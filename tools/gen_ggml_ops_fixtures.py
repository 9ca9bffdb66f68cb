#!/usr/bin/env python3
"""Write fixtures of llama.cpp's attention and SwiGLU, computed inside a real model.

tests/ggml_ops.rs (rustorch-core) feeds llama.cpp's own inputs to `Tensor::cached_attention`
and `Tensor::swiglu` and requires llama.cpp's outputs bit for bit. The tensors come from the
graph callbacks of llama-cpp-python 0.3.36 (tools/llamacpp_dump.py explains the mechanism;
settings as tools/gen_llamacpp_fixtures.py: n_ctx 512, 2 threads, no flash attention, F16 cache)
while it evaluates a prompt as one batch and then decodes greedily one token at a time, so
both of GGML's f16 product paths are covered (tinyBLAS for the batch, ggml_vec_dot_f16 for
single tokens).

    python3 tools/gen_ggml_ops_fixtures.py MODEL.gguf   # the SmolLM2 Q4_1 file (tools/fetch_models.py)

For layers LAYERS of the model and each evaluation, it writes into
crates/rustorch-core/tests/fixtures/ggml_ops/ little-endian f32 files, listed with their
shapes (numpy order) in index.json:
  e<i>-l<layer>-q_pre.bin    Qcur before RoPE          [T, Hq, D]  (also k_pre)
  e<i>-l<layer>-q.bin        Qcur after RoPE           [T, Hq, D]
  e<i>-l<layer>-k.bin        Kcur after RoPE (f32, before the cache's f16 rounding) [T, Hkv, D]
  e<i>-l<layer>-v.bin        Vcur (f32)                [T, Hkv, Dv]
  e<i>-l<layer>-kqv_out.bin  attention output          [T, Hq * Dv]
  e<i>-l<layer>-gate.bin, -up.bin, -swiglu.bin         ffn_gate, ffn_up, ffn_swiglu [T, F]
index.json also records the tokens, the attention scale, the RoPE base and the KV-cache length
llama.cpp attended over (n_kv) per evaluation. rustorch-llm's model::rope tests use q_pre/q
and k_pre/k (RoPE with llama.cpp's angle tables and rounding).
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llamacpp_dump import GgmlTensor, read_tensor  # noqa: E402

LAYERS = [0, 7]
PROMPT = "The quick brown fox jumps over the lazy dog. Then"
DECODE = 2
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "rustorch-core",
                   "tests", "fixtures", "ggml_ops")


def main():
    import ctypes
    import llama_cpp
    from llama_cpp import Llama
    from llama_cpp._internals import LlamaContext

    model = sys.argv[1]
    wanted = {f"{n}-{il}" for il in LAYERS
              for n in ["Qcur", "Kcur", "Vcur", "kq", "kqv_out", "ffn_gate", "ffn_up", "ffn_swiglu"]}
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
    meta = llm.metadata
    arch = meta["general.architecture"]
    head_dim = int(meta.get(f"{arch}.attention.key_length",
                            int(meta[f"{arch}.embedding_length"]) // int(meta[f"{arch}.attention.head_count"])))

    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        if f.endswith(".bin"):
            os.remove(os.path.join(OUT, f))
    index = {"source": os.path.basename(model), "llama_cpp_python": llama_cpp.__version__,
             "prompt": PROMPT, "layers": LAYERS, "scale": 1.0 / np.sqrt(head_dim),
             "rope_base": float(meta[f"{arch}.rope.freq_base"]), "evals": []}
    batch = llm.tokenize(PROMPT.encode(), add_bos=True, special=True)
    n_past = 0
    for e in range(DECODE + 1):
        state["nodes"] = {}
        llm.eval(batch)
        nodes = state["nodes"]
        files = {}
        for il in LAYERS:
            picks = {
                "q_pre": nodes[f"Qcur-{il}"][-2],  # the [T, Hq, D] view of the projection
                "k_pre": nodes[f"Kcur-{il}"][-2],
                "q": nodes[f"Qcur-{il}"][-1],      # the last Qcur node is the RoPE output
                "k": nodes[f"Kcur-{il}"][-1],
                "v": nodes[f"Vcur-{il}"][-1],      # [T, Hkv, Dv] view of the projection
                "kqv_out": nodes[f"kqv_out-{il}"][-1],
                "gate": nodes[f"ffn_gate-{il}"][-1],
                "up": nodes[f"ffn_up-{il}"][-1],
                "swiglu": nodes[f"ffn_swiglu-{il}"][-1],
            }
            for key, a in picks.items():
                # Drop GGML's unused outer dimensions: [T, H, D] or [T, features].
                keep = 3 if key in ("q", "k", "v", "q_pre", "k_pre") else 2
                a = np.ascontiguousarray(a, dtype=np.float32).reshape(a.shape[-keep:])
                name = f"e{e}-l{il}-{key}.bin"
                a.astype("<f4").tofile(os.path.join(OUT, name))
                files[name] = list(a.shape)
        n_kv = int(nodes[f"kq-{LAYERS[0]}"][-1].shape[-1])
        index["evals"].append({"tokens": list(batch), "n_past": n_past, "n_kv": n_kv, "files": files})
        n_past += len(batch)
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),))
        batch = [int(np.argmax(logits))]
    with open(os.path.join(OUT, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    total = sum(os.path.getsize(os.path.join(OUT, x)) for x in os.listdir(OUT))
    print(f"wrote {len(os.listdir(OUT))} files, {total} bytes, into {OUT}")


if __name__ == "__main__":
    main()
