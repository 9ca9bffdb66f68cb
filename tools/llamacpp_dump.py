#!/usr/bin/env python3
"""Dump llama.cpp's intermediate tensors (graph callbacks) while it evaluates a prompt.

A debugging tool for fidelity work: it shows exactly what llama.cpp computed at every named
node of its graph, so that a RusTorch op can be fed llama.cpp's inputs and compared with its
output bit for bit (tools/gen_ggml_ops_fixtures.py turns some of these into committed fixtures).

    python3 tools/llamacpp_dump.py MODEL.gguf "prompt text" OUTDIR [--decode N] [--only kq,Qcur]

Evaluates the prompt as one batch (as llama.cpp's generation does, logits for the last position
only), then N greedy decode steps one token at a time. Each evaluation writes into OUTDIR/eval<i>/
one file per computed node: `<name>#<k>.npy`, where <name> is llama.cpp's node name (for example
`Qcur-0`, `kq-0`, `kq_soft_max-0`) and k counts earlier nodes of the same name in that evaluation
(Qcur-0#0 is the projection, Qcur-0#1 the same after RoPE). f32 and f16 nodes are saved with
numpy's shape in GGML's reverse order (ne[3], ne[2], ne[1], ne[0]), strides respected; other
types are skipped. OUTDIR/eval<i>/tokens.json holds the tokens of that evaluation.

Settings are those of tools/gen_llamacpp_fixtures.py: n_ctx 512, 2 threads, flash attention
off, F16 KV cache.
"""
import argparse
import ctypes
import json
import os

import numpy as np


class GgmlTensor(ctypes.Structure):
    # struct ggml_tensor of ggml 0.25 (ggml/include/ggml.h), up to the fields we read.
    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


GGML_TYPES = {0: np.float32, 1: np.float16}


def read_tensor(t):
    dtype = GGML_TYPES[t.type]
    item = np.dtype(dtype).itemsize
    ne = [int(t.ne[i]) for i in range(4)]
    nb = [int(t.nb[i]) for i in range(4)]
    span = sum((ne[i] - 1) * nb[i] for i in range(4)) + item
    raw = (ctypes.c_uint8 * span).from_address(t.data)
    base = np.frombuffer(raw, dtype=np.uint8)
    view = np.lib.stride_tricks.as_strided(
        base.view(dtype) if span % item == 0 else np.frombuffer(bytes(raw) + b"\0" * item, dtype=dtype),
        shape=ne[::-1],
        strides=nb[::-1],
    )
    # A copy: the memory belongs to llama.cpp and is reused by later nodes.
    return np.array(view, copy=True, order="C")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("prompt")
    ap.add_argument("outdir")
    ap.add_argument("--decode", type=int, default=0, help="greedy decode steps after the prompt")
    ap.add_argument("--only", default=None, help="comma-separated node names or name stems to keep")
    args = ap.parse_args()

    import llama_cpp
    from llama_cpp import Llama
    from llama_cpp._internals import LlamaContext

    want = set(args.only.split(",")) if args.only else None
    state = {"dir": None, "seen": {}}

    def callback(tp, ask, _user):
        t = ctypes.cast(tp, ctypes.POINTER(GgmlTensor)).contents
        name = t.name.decode(errors="replace")
        if ask:
            return want is None or name in want or name.split("-")[0] in want
        if t.type not in GGML_TYPES or not t.data:
            return True
        k = state["seen"].get(name, 0)
        state["seen"][name] = k + 1
        np.save(os.path.join(state["dir"], f"{name}#{k}.npy"), read_tensor(t))
        return True

    cb = llama_cpp.ggml_backend_sched_eval_callback(callback)
    llm = Llama(model_path=args.model, n_ctx=512, n_threads=2, n_threads_batch=2, n_batch=512,
                verbose=False, flash_attn=False)
    # cb_eval is read when the context is created: rebuild the context with it.
    params = llm.context_params
    params.cb_eval = cb
    params.cb_eval_user_data = None
    llm._ctx = LlamaContext(model=llm._model, params=params, verbose=False)

    tokens = llm.tokenize(args.prompt.encode(), add_bos=True, special=True)
    batches = [tokens]
    for step in range(args.decode + 1):
        d = os.path.join(args.outdir, f"eval{step}")
        os.makedirs(d, exist_ok=True)
        state["dir"], state["seen"] = d, {}
        llm.eval(batches[-1])
        with open(os.path.join(d, "tokens.json"), "w") as f:
            json.dump({"tokens": batches[-1], "n_past_before": sum(len(b) for b in batches[:-1])}, f)
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),))
        batches.append([int(np.argmax(logits))])
    print("evaluations:", [len(b) for b in batches[:-1]], "tokens:", tokens)


if __name__ == "__main__":
    main()
