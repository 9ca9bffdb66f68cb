#!/usr/bin/env python3
"""Write llama-tokenize's output for `rustorch-cli tokenize`'s test.

For each model and text this runs llama.cpp's `llama-tokenize` (built by
tools/build_llamacpp.sh) with the flag sets the CLI accepts (none, --ids,
--no-bos, --no-parse-special) and records its whole stdout, base64-encoded
since pieces of byte tokens need not be UTF-8. The test
(crates/rustorch-cli/tests/tokenize.rs) runs `rustorch-cli tokenize` with the
same arguments and requires the same bytes.

The text is passed with -p as the CLI gets it, plus --no-escape so that
llama.cpp does not turn backslash sequences into control characters (the
CLI takes the text verbatim).

Usage:
  eval "$(python3 tools/fetch_models.py --print-env)"
  python3 tools/gen_cli_fixtures.py [--bin PATH]
"""
import argparse
import base64
import hashlib
import json
import os
import subprocess
import sys

from cpu_record import cpu_record

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
OUT = os.path.join(ROOT, "crates", "rustorch-cli", "tests", "fixtures", "tokenize.json")
DEFAULT_BIN = os.path.expanduser("~/.cache/rustorch/llamacpp-0.3.36/build/bin/llama-tokenize")
MODELS = {"smollm2": "RUSTORCH_SMOLLM2_GGUF", "gemma3": "RUSTORCH_GEMMA3_GGUF"}
TEXTS = [
    "The capital of France is",
    "<|im_start|>user\nHello, world!<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nWhy is the sky blue?<end_of_turn>\n<start_of_turn>model\n",
    "  Leading spaces, tabs\tand 12345 digits; émigré naïve 你好 🦀 ok",
    "fn main() { println!(\"hi\"); }\n\n\n",
]
FLAGS = [[], ["--ids"], ["--no-bos"], ["--no-parse-special"]]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=DEFAULT_BIN)
    args = ap.parse_args()
    cases = []
    models = {}
    for name, env in MODELS.items():
        path = os.environ.get(env)
        if not path:
            sys.exit(f"{env} is not set: eval \"$(python3 tools/fetch_models.py --print-env)\"")
        models[name] = {"file": os.path.basename(path), "sha256": sha256(path)}
        for text in TEXTS:
            for flags in FLAGS:
                cmd = [args.bin, "-m", path, "-p", text, "--log-disable", "--no-escape", *flags]
                res = subprocess.run(cmd, capture_output=True, check=False)
                if res.returncode != 0:
                    sys.exit(f"llama-tokenize failed ({res.returncode}): {res.stderr.decode(errors='replace')}")
                cases.append({
                    "model": name,
                    "text": text,
                    "flags": flags,
                    "stdout_b64": base64.b64encode(res.stdout).decode(),
                })
    doc = {
        "generator": "tools/gen_cli_fixtures.py",
        "command": "llama-tokenize -m MODEL -p TEXT --log-disable --no-escape [FLAGS]",
        "llama_cpp": "0.3.36 (llama-cpp-python's sources, tools/build_llamacpp.sh)",
        # Recorded as by every generator that runs llama.cpp (tools/cpu_record.py), though
        # tokenization does no arithmetic that depends on the CPU.
        "cpu": cpu_record(),
        "models": models,
        "cases": cases,
    }
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {os.path.relpath(OUT, ROOT)}")


if __name__ == "__main__":
    main()
