#!/usr/bin/env python3
"""Write llama.cpp reference fixtures for the rustorch-llm forward pass.

The reference is llama-cpp-python 0.3.36 (llama.cpp built for the CPU, without AMX) and the
llama.cpp tools of the same version (tools/build_llamacpp.sh: llama-quantize, llama-perplexity).
For each model id this writes, into crates/rustorch-llm/tests/fixtures/llamacpp/:

  models.json        per id: source model, requantization type, sha256 and size of the file,
                     the llama.cpp settings, the architecture metadata llama.cpp read, the
                     build's llama_print_system_info() and the CPU it ran on (`cpu`,
                     tools/cpu_record.py: llama.cpp's CPU results depend on it)
  <id>.json          per prompt: text, tokens, 64 greedy ids, their top-1 minus top-2 logit
                     gaps, the 10 largest final-position logits; llama-perplexity's result on
                     the GPL-3 text (tests/fixtures/GPL-3)
  <id>.logits.bin    little-endian f32: the whole final-position logit vector (after the
                     prompt, before any generated token) of prompts 0 and 1, concatenated

Model ids: smollm2-q4_1 and gemma3-q4_k_m are the shipped files ($RUSTORCH_SMOLLM2_GGUF,
$RUSTORCH_GEMMA3_GGUF, tools/fetch_models.py); smollm2-{q8_0,q4_k_m,q5_k_m,q6_k,f16} are the
shipped SmolLM2 Q4_1 file requantized by `llama-quantize --allow-requantize IN OUT TYPE`, written
to ~/.cache/rustorch/llamacpp-requant/ (never committed). rustorch_core::quant::file reproduces
them byte for byte; the Rust tests rebuild them and compare the sha256 recorded here.

Generation protocol (every id): the prompt is tokenized by llama.cpp with add_special=True (BOS
only when the GGUF metadata asks for it, tokenizer.ggml.add_bos_token) and parse_special=True
(special tokens such as <|im_start|> written in the text become their ids). The prompt is
evaluated as one batch (n_batch = n_ubatch = 512, logits requested for the last position only,
as llama.cpp's generation does), then 64 tokens are generated one at a time: each step takes
the argmax of the current logits (numpy argmax: the lowest id among equal maxima) and evaluates
it. Generation does not stop at end-of-generation tokens. `gaps[k]` is top-1 minus top-2 of
the logits that chose `greedy[k]` (k = 0: the logits after the prompt), so a test can tell a
near-tie (small gap) from a real divergence.

Context settings: flash attention off (0.3.36 spells it Llama(flash_attn=False), which sets
llama_context_params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED; llama-perplexity takes
`-fa off`), KV cache F16 (type_k = type_v = GGML_TYPE_F16, the default), n_threads =
n_threads_batch = 2, n_ctx = 512, mmap as llama.cpp defaults (it changes no numbers), weight
repacking (use_extra_bufts) at its default, on, swa_full at llama_context_default_params()'s
true (Gemma 3's sliding-window layers keep all cells and mask; its window, 512, is not reached).

Perplexity: `llama-perplexity -m FILE -f GPL-3 -c 128 --chunks 16 -t 2 -b 128 -fa off`.
The protocol, from tools/perplexity/perplexity.cpp (llama.cpp 0.3.36), function `perplexity`:
  - line 455: add_bos = llama_vocab_get_add_bos(vocab) (the GGUF metadata's add_bos_token);
  - line 473: tokens = common_tokenize(ctx, params.prompt, true): the whole file tokenized
    once, add_special = true (so BOS first when add_bos), parse_special = false (the default
    of common_tokenize, common/common.h:1115);
  - line 491-493: n_chunk = min(--chunks, tokens.size() / n_ctx); chunk i is tokens
    [i*n_ctx, (i+1)*n_ctx) of that one tokenization (chunks do not overlap);
  - line 551: the KV cache is cleared before each chunk;
  - lines 563-579: when add_bos, the FIRST token of each chunk is replaced by BOS for the
    evaluation (then restored): chunk 0 starts with its own BOS anyway, chunk i > 0 loses its
    first text token to BOS; positions are 0..n_ctx-1; with -c 128 -b 128 the chunk is one
    batch (num_batches = 1, n_seq = 1, lines 502-503);
  - line 540: first = n_ctx/2; lines 571-575: logits are requested for positions >= first;
  - lines 608-620, 109-140: process_logits scores positions first .. n_ctx-2, each predicting
    the next token: nll += -(logit[tok] - max_logit - log(sum_exp)) where sum_exp is a double
    sum of expf(logit - max_logit) over the vocabulary (log_softmax, lines 60-70); that is
    n_ctx - 1 - first = 63 tokens per chunk with -c 128;
  - line 622: count += n_ctx - first - 1; line 626 prints the running value exp(nll/count)
    after each chunk as "[i]value," (these are `ppl.running`);
  - lines 641-647: final PPL = exp(nll/count), printed with "+/- " the uncertainty
    sqrt((nll2/count - (nll/count)^2) / (count - 1)) * PPL, where nll2 sums the squares.
The tokenizer of the whole file runs with parse_special = false; GPL-3 has no special tokens.

Usage:
  python3 tools/gen_llamacpp_fixtures.py [--only ID ...] [--skip-ppl] [--bin DIR]
Needs: llama-cpp-python 0.3.36, numpy, the models (eval "$(python3 tools/fetch_models.py
--print-env)"), the llama.cpp tools in ~/.cache/rustorch/llamacpp-0.3.36/build/bin.
"""
import argparse
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time

import numpy as np

from cpu_record import cpu_record

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
FIXTURES = os.path.join(ROOT, "crates", "rustorch-llm", "tests", "fixtures")
OUT = os.path.join(FIXTURES, "llamacpp")
GPL3 = os.path.join(FIXTURES, "GPL-3")
DEFAULT_BIN = os.path.expanduser("~/.cache/rustorch/llamacpp-0.3.36/build/bin")
REQUANT_DIR = os.path.expanduser("~/.cache/rustorch/llamacpp-requant")

N_GEN = 64
N_TOP = 10
N_CTX = 512
N_BATCH = 512
N_THREADS = 2
LOGIT_PROMPTS = [0, 1]
PPL_ARGS = ["-c", "128", "--chunks", "16", "-t", "2", "-b", "128", "-fa", "off"]
QUANTIZE_THREADS = "2"

# id -> (source model, llama-quantize type or None)
MODELS = {
    "smollm2-q4_1": ("smollm2", None),
    "smollm2-q8_0": ("smollm2", "Q8_0"),
    "smollm2-q4_k_m": ("smollm2", "Q4_K_M"),
    "smollm2-q5_k_m": ("smollm2", "Q5_K_M"),
    "smollm2-q6_k": ("smollm2", "Q6_K"),
    "smollm2-f16": ("smollm2", "F16"),
    "gemma3-q4_k_m": ("gemma3", None),
}
SOURCE_ENV = {"smollm2": "RUSTORCH_SMOLLM2_GGUF", "gemma3": "RUSTORCH_GEMMA3_GGUF"}

LONG_TEXT = (
    "The history of the lighthouse is a story about people, light and the sea. Long before "
    "electric lamps, sailors relied on fires lit on hilltops to find their way home after dark. "
    "The ancient Pharos of Alexandria, built in the third century before our era, rose more "
    "than a hundred metres above the harbour and was counted among the wonders of the world. "
    "For centuries afterwards most towers burned wood or coal in open braziers, which were "
    "smoky, dim and hard to keep alight in a storm. In the eighteenth century oil lamps with "
    "reflectors made of polished copper improved matters, and in 1822 the French physicist "
    "Augustin Fresnel designed a lens built from concentric rings of glass prisms. His lens "
    "gathered almost all of the light of a single flame and sent it out as a narrow, powerful "
    "beam that could be seen from more than thirty kilometres away. Keepers wound clockwork "
    "every few hours so that the lens turned and each lighthouse flashed its own pattern, which "
    "let a navigator tell one coast from another. Life at a remote station was lonely: supplies "
    "came by boat when the weather allowed, and families sometimes spent whole winters cut off "
    "from the mainland. Today almost every lighthouse is automated, powered by solar panels and "
    "monitored from far away, yet many towers are kept as museums, and their beams still sweep "
    "across the water every night. When you next stand on a cliff at dusk and watch the first "
    "flash appear on the horizon, remember the keepers who"
)

COMMON_PROMPTS = [
    "The capital of France is",
    "Hello",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Question: What is 17 * 23 + 4?\nAnswer:",
    "Here is a shopping list:\n1. Apples\n2. Bread\n3.",
    "Die Hauptstadt von Deutschland ist Berlin. Die größte Stadt in Bayern ist",
    "Il était une fois, dans un petit village au bord de la mer,",
    "日本の首都は東京です。中国的首都是",
    "I love pizza 🍕 and ice cream 🍦! My favourite emoji is",
    "Line one\n\n\n    indented   with   spaces\n\t\ttabs  \n\n   \nEnd of",
    LONG_TEXT,
    "Once upon a time",
]

CHAT_PROMPTS = {
    "smollm2": [
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the boiling point of water at sea level?<|im_end|>\n"
        "<|im_start|>assistant\n",
        "<|im_start|>user\nWrite a haiku about autumn leaves.<|im_end|>\n"
        "<|im_start|>assistant\nCrimson leaves drifting<|im_end|>\n"
        "<|im_start|>user\nNow translate it into German.<|im_end|>\n"
        "<|im_start|>assistant\n",
    ],
    "gemma3": [
        "<start_of_turn>user\nWhat is the boiling point of water at sea level?<end_of_turn>\n"
        "<start_of_turn>model\n",
        "<start_of_turn>user\nWrite a haiku about autumn leaves.<end_of_turn>\n"
        "<start_of_turn>model\nCrimson leaves drifting<end_of_turn>\n"
        "<start_of_turn>user\nNow translate it into German.<end_of_turn>\n"
        "<start_of_turn>model\n",
    ],
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def source_path(source):
    var = SOURCE_ENV[source]
    p = os.environ.get(var)
    if not p or not os.path.exists(p):
        sys.exit(f"{var} is not set or missing; run: eval \"$(python3 tools/fetch_models.py --print-env)\"")
    return p


def model_file(bin_dir, mid):
    source, qtype = MODELS[mid]
    src = source_path(source)
    if qtype is None:
        return src, None
    os.makedirs(REQUANT_DIR, exist_ok=True)
    out = os.path.join(REQUANT_DIR, f"{source}-{qtype}.gguf")
    cmd = [os.path.join(bin_dir, "llama-quantize"), "--allow-requantize", src, out, qtype, QUANTIZE_THREADS]
    if not os.path.exists(out):
        tmp = out + ".tmp"
        cmd[3] = tmp
        log(f"{mid}: {shlex.join(cmd)}")
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            sys.exit(f"llama-quantize failed: {res.stderr[-2000:]}")
        os.replace(tmp, out)
        cmd[3] = out
    return out, shlex.join(["llama-quantize", "--allow-requantize", os.path.basename(src), os.path.basename(out), qtype])


def settings():
    return {
        "llama_cpp_python": "0.3.36",
        "flash_attn": False,
        "flash_attn_type": "LLAMA_FLASH_ATTN_TYPE_DISABLED",
        "type_k": "f16",
        "type_v": "f16",
        "n_threads": N_THREADS,
        "n_threads_batch": N_THREADS,
        "n_ctx": N_CTX,
        "n_batch": N_BATCH,
        "n_ubatch": N_BATCH,
        "use_mmap": True,
        "use_extra_bufts": True,
        "prompt_eval": "one batch, logits of the last position only",
        "generation": f"{N_GEN} tokens, argmax (lowest id on exact ties), one token per decode, no stop at EOG",
        "tokenize": "add_special=True (BOS per tokenizer.ggml.add_bos_token), parse_special=True",
        # llama_context_default_params() sets swa_full = true: sliding-window layers
        # (Gemma 3) keep every cell; the window is applied by the attention mask.
        # llama-perplexity (common_params) uses swa_full = false.
        "swa_full": True,
    }


def arch_metadata(meta):
    """The `{arch}.*` and a few general/tokenizer keys, as llama.cpp read them (strings)."""
    arch = meta.get("general.architecture", "")
    keep = {}
    for k, v in sorted(meta.items()):
        if k.startswith(arch + ".") or k in (
            "general.architecture",
            "general.file_type",
            "tokenizer.ggml.model",
            "tokenizer.ggml.pre",
            "tokenizer.ggml.add_bos_token",
            "tokenizer.ggml.add_eos_token",
            "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id",
        ):
            keep[k] = v
    return keep


def run_prompts(path, prompts):
    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(
        model_path=path,
        n_ctx=N_CTX,
        n_batch=N_BATCH,
        n_ubatch=N_BATCH,
        n_threads=N_THREADS,
        n_threads_batch=N_THREADS,
        flash_attn=False,
        logits_all=False,
        verbose=False,
    )
    assert llm.context_params.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    assert llm.context_params.type_k == llama_cpp.GGML_TYPE_F16
    assert llm.context_params.type_v == llama_cpp.GGML_TYPE_F16
    assert llm.context_params.swa_full
    n_vocab = llm.n_vocab()
    ctx = llm._ctx.ctx

    def last_logits():
        ptr = llama_cpp.llama_get_logits_ith(ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()

    results = []
    logits_keep = []
    for i, text in enumerate(prompts):
        tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        if len(tokens) + N_GEN > N_CTX:
            sys.exit(f"prompt {i} has {len(tokens)} tokens; n_ctx {N_CTX} is too small")
        # A fresh context for every prompt: clear the KV cache (cells, head and
        # all) and the Python-side token count.
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        llm.reset()
        # Llama.eval with logits_all=False asks for the last position's logits only.
        llm.eval(tokens)
        logits = last_logits()
        if i in LOGIT_PROMPTS:
            logits_keep.append(logits.astype("<f4"))
        order = np.argsort(-logits, kind="stable")[:N_TOP]
        top = [[int(t), float(logits[t])] for t in order]
        greedy, gaps = [], []
        for step in range(N_GEN):
            tok = int(np.argmax(logits))
            second = np.partition(logits, -2)[-2]
            greedy.append(tok)
            gaps.append(float(logits[tok] - second))
            if step + 1 < N_GEN:
                llm.eval([tok])
                logits = last_logits()
        results.append({"text": text, "tokens": [int(t) for t in tokens], "greedy": greedy, "gaps": gaps, "top": top})
    meta = dict(llm.metadata)
    system_info = llama_cpp.llama_print_system_info().decode()
    llm.close()
    return n_vocab, results, logits_keep, meta, system_info


PPL_LINE = re.compile(r"\[(\d+)\]([0-9.]+|nan|inf),")
FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")


def run_perplexity(bin_dir, path):
    cmd = [os.path.join(bin_dir, "llama-perplexity"), "-m", path, "-f", GPL3] + PPL_ARGS
    res = subprocess.run(cmd, capture_output=True, text=True)
    out = res.stdout + res.stderr
    if res.returncode != 0:
        sys.exit(f"llama-perplexity failed ({res.returncode}): {out[-3000:]}")
    running = [float(v) for _, v in PPL_LINE.findall(out)]
    m = FINAL.search(out)
    if not m or len(running) != 16:
        sys.exit(f"cannot parse llama-perplexity output: {out[-3000:]}")
    return {
        "command": shlex.join(["llama-perplexity", "-m", "MODEL", "-f", "crates/rustorch-llm/tests/fixtures/GPL-3"] + PPL_ARGS),
        "text": "crates/rustorch-llm/tests/fixtures/GPL-3",
        "ctx": 128,
        "chunks": 16,
        "batch": 128,
        "threads": 2,
        "flash_attn": "off",
        "scored_per_chunk": 128 - 1 - 128 // 2,
        "running": running,
        "ppl": float(m.group(1)),
        "ppl_err": float(m.group(2)),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", choices=list(MODELS), help="model ids to (re)generate")
    ap.add_argument("--skip-ppl", action="store_true", help="keep the perplexity already in <id>.json")
    ap.add_argument("--ppl-only", action="store_true",
                    help="only run llama-perplexity and store its result in <id>.json")
    ap.add_argument("--bin", default=DEFAULT_BIN, help="llama.cpp build/bin directory")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    models_path = os.path.join(OUT, "models.json")
    models = {}
    if os.path.exists(models_path):
        with open(models_path) as f:
            models = json.load(f)
    t_all = time.time()
    for mid in args.only or list(MODELS):
        t0 = time.time()
        source, qtype = MODELS[mid]
        path, quant_cmd = model_file(args.bin, mid)
        fx_path = os.path.join(OUT, f"{mid}.json")
        if args.ppl_only:
            fx = {}
            if os.path.exists(fx_path):
                with open(fx_path) as f:
                    fx = json.load(f)
            fx["perplexity"] = run_perplexity(args.bin, path)
            with open(fx_path, "w") as f:
                json.dump(fx, f, ensure_ascii=False, indent=1)
                f.write("\n")
            log(f"{mid}: perplexity {time.time() - t0:.1f} s, PPL {fx['perplexity']['ppl']}")
            continue
        prompts = COMMON_PROMPTS + CHAT_PROMPTS[source]
        n_vocab, results, logits_keep, meta, system_info = run_prompts(path, prompts)
        t_gen = time.time() - t0
        old_ppl = None
        if args.skip_ppl and os.path.exists(fx_path):
            with open(fx_path) as f:
                old_ppl = json.load(f).get("perplexity")
        ppl = old_ppl if args.skip_ppl else run_perplexity(args.bin, path)
        t_ppl = time.time() - t0 - t_gen
        fx = {
            "id": mid,
            "generator": "tools/gen_llamacpp_fixtures.py",
            "settings": settings(),
            "n_vocab": n_vocab,
            "n_gen": N_GEN,
            "logits_file": f"{mid}.logits.bin",
            "logits_prompts": LOGIT_PROMPTS,
            "prompts": results,
            "perplexity": ppl,
        }
        with open(fx_path, "w") as f:
            json.dump(fx, f, ensure_ascii=False, indent=1)
            f.write("\n")
        with open(os.path.join(OUT, f"{mid}.logits.bin"), "wb") as f:
            for l in logits_keep:
                f.write(l.tobytes())
        models[mid] = {
            "source": source,
            "source_file": os.path.basename(source_path(source)),
            "source_sha256": sha256_file(source_path(source)),
            "requant": qtype,
            "requant_command": quant_cmd,
            "sha256": sha256_file(path),
            "size": os.path.getsize(path),
            "settings": settings(),
            "system_info": system_info,
            "cpu": cpu_record(),
            "metadata": arch_metadata(meta),
        }
        with open(models_path, "w") as f:
            json.dump(dict(sorted(models.items())), f, ensure_ascii=False, indent=1)
            f.write("\n")
        log(f"{mid}: prompts {t_gen:.1f} s, perplexity {t_ppl:.1f} s"
            + (f", PPL {ppl['ppl']}" if ppl else ""))
    log(f"total {time.time() - t_all:.1f} s")


if __name__ == "__main__":
    main()
