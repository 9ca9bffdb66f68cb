#!/usr/bin/env python3
"""Differential check: rustorch-cli's greedy tokens against llama.cpp built on this machine.

  python3 tools/llamacpp_diff.py                  # full sweep: 8 model files x 75 prompts x 48 tokens
  python3 tools/llamacpp_diff.py --ci             # CI's subset: 22 prompts per file (2 of them long)
  python3 tools/llamacpp_diff.py --models smollm2-q4_1,gemma3-q4_k_m --prompts 10 --keep /tmp/diff
  python3 tools/llamacpp_diff.py --compare LLAMA.jsonl OURS.jsonl    # compare two saved outputs

Each model file runs through tools/llamacpp_greedy.cpp (llama.cpp's GCC build without AMX, always;
its clang AMX build too where the CPU and kernel grant AMX) and `rustorch-cli greedy` (with
RUSTORCH_GGML_ORDER=reference against the GCC build, =amx against the AMX build). Per file and
order it prints `FILE ORDER: N identical, N tolerated, N diverged` and one line per prompt that is
not identical. A divergence is tolerated only at a step where llama.cpp's top-1/top-2 margin is
below 0.02. Exit status 1 on an untolerated divergence, a tokenizer mismatch or a failed run.
llama.cpp builds are cached (tools/build_llamacpp.sh; the first one takes several minutes).

On a CPU without AVX-512 (or with --kld) greedy identity is not claimed: RusTorch follows GGML's
AVX-512 lanes on every CPU, and llama.cpp's native build there sums in AVX2's (rustorch-cli devices
says which build it reproduces). Each file is then compared by KL divergence instead: llama-perplexity
writes its logits on a fixed text, and `rustorch-cli perplexity --kl-divergence` against them must
stay as close as llama.cpp's own one-token-at-a-time evaluation (-ub 1, another valid order on the
same CPU) is: mean KLD at most 1.5x its figure + 2e-4, the same top token at most 2 points less
often, perplexity within 1%.
"""
import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time

from cpu_record import cpu_record

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PROMPTS_FILE = os.path.join(ROOT, "tools", "llamacpp_diff_prompts.json")
CACHE = os.environ.get("RUSTORCH_CACHE") or os.path.expanduser("~/.cache/rustorch")

N_GEN = 48
N_CTX = 4096
THREADS = 2
# A divergence is forgiven only where llama.cpp itself nearly tied: its two best logits closer
# than this (an ulp-level difference in a sum can then swap them; above it, a difference that
# large means different arithmetic).
MARGIN = 0.02
LONG_TOKENS = 600

# id -> (source, llama-quantize type of the requantized SmolLM2 file, or None: used as is).
# The fidelity tests' files (tests/llamacpp_model.rs) plus a TinyLlama-shaped one.
MODELS = {
    "smollm2-q4_1": ("smollm2", None),
    "smollm2-q8_0": ("smollm2", "Q8_0"),
    "smollm2-q4_k_m": ("smollm2", "Q4_K_M"),
    "smollm2-q5_k_m": ("smollm2", "Q5_K_M"),
    "smollm2-q6_k": ("smollm2", "Q6_K"),
    "smollm2-f16": ("smollm2", "F16"),
    "gemma3-q4_k_m": ("gemma3", None),
    "tinyllama-q4_k_m": ("tinyllama", None),
}
SOURCE_ENV = {"smollm2": "RUSTORCH_SMOLLM2_GGUF", "gemma3": "RUSTORCH_GEMMA3_GGUF"}

# Chat templates as the models' own render one user turn with the generation prompt (no BOS: the
# tokenizer adds it where the metadata asks). The random-weight TinyLlama file has a synthetic
# vocabulary without chat tokens: ChatML text is as good as any there.
CHAT = {
    "smollm2": "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
    "gemma3": "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n",
    "tinyllama": "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
}


class Failure(Exception):
    """A step that cannot go on (a build, a model, a program run): reported, exit status 1."""


def log(msg):
    print(f"llamacpp_diff: {msg}", file=sys.stderr, flush=True)


# --- prompts -----------------------------------------------------------------------------------


def load_prompts(path):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    with open(os.path.join(ROOT, doc["passage_file"]), encoding="utf-8") as f:
        passage_text = f.read()
    prompts = []
    for p in doc["prompts"]:
        text = p.get("text")
        if "passage" in p:
            start, n = p["passage"]
            if start + n > len(passage_text):
                raise Failure(f"prompt {p['id']}: passage [{start}, {n}] past the end of {doc['passage_file']}")
            text = p.get("prefix", "") + passage_text[start : start + n]
        if not isinstance(text, str) or not text:
            raise Failure(f"prompt {p.get('id')}: no text")
        prompts.append({"id": p["id"], "text": text, "chat": bool(p.get("chat")), "long": bool(p.get("long"))})
    ids = [p["id"] for p in prompts]
    if len(set(ids)) != len(ids):
        raise Failure(f"{path}: duplicate prompt ids")
    unknown = [i for i in doc["ci"] if i not in ids]
    if unknown:
        raise Failure(f"{path}: ci names unknown prompts {unknown}")
    return doc, prompts


def select_prompts(doc, prompts, ci, count):
    chosen = [p for p in prompts if p["id"] in set(doc["ci"])] if ci else list(prompts)
    if ci:
        # The floor for CI: at least 20 prompts per file, two of them long.
        n_long = sum(p["long"] for p in chosen)
        if len(chosen) < 20 or n_long < 2:
            raise Failure(f"the ci subset has {len(chosen)} prompts, {n_long} long (needs >= 20, >= 2 long)")
    if count is not None:
        chosen = chosen[:count]
    return chosen


def render(prompts, family, max_chars):
    """The prompt lines the two programs read, for one model family."""
    out = []
    for p in prompts:
        text = p["text"]
        if max_chars is not None and len(text) > max_chars:
            text = text[:max_chars]
        if p["chat"]:
            text = CHAT[family].format(text)
        out.append({"id": p["id"], "text": text})
    return out


# --- tools and models --------------------------------------------------------------------------


def run_logged(cmd, what, env=None):
    """Runs cmd with its stderr going to ours; returns its stdout. Failure on a non-zero exit."""
    t0 = time.monotonic()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, env=env, text=True)
    if r.returncode != 0:
        raise Failure(f"{what} failed (exit status {r.returncode}): {' '.join(cmd)}")
    return r.stdout, time.monotonic() - t0


def build_llamacpp(amx):
    """The bin folder of tools/build_llamacpp.sh's build, or None when --amx says no AMX here."""
    cmd = ["bash", os.path.join(ROOT, "tools", "build_llamacpp.sh")] + (["--amx"] if amx else [])
    log(f"llama.cpp {'clang AMX' if amx else 'GCC'} build: {' '.join(cmd[1:])} "
        "(cached after the first build, which takes several minutes)")
    t0 = time.monotonic()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if amx and r.returncode == 3:
        return None
    if r.returncode != 0:
        raise Failure(f"tools/build_llamacpp.sh{' --amx' if amx else ''} failed (exit status {r.returncode})")
    lines = r.stdout.strip().splitlines()
    if not lines:
        raise Failure("tools/build_llamacpp.sh printed no folder")
    log(f"  ready in {time.monotonic() - t0:.1f} s: {lines[-1]}")
    return lines[-1]


def greedy_in(folder, flag):
    exe = os.path.join(folder, "llamacpp-greedy")
    if not os.access(exe, os.X_OK):
        raise Failure(f"no executable llamacpp-greedy in {folder} ({flag})")
    return exe


def rustorch_cli(given):
    path = given or os.environ.get("RUSTORCH_CLI")
    if path:
        if not os.access(path, os.X_OK):
            raise Failure(f"no executable rustorch-cli at {path}")
        return path
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    path = os.path.join(target, "release", "rustorch-cli")
    if not os.access(path, os.X_OK):
        log("building rustorch-cli: cargo build --release -p rustorch-cli")
        r = subprocess.run(["cargo", "build", "--release", "-p", "rustorch-cli"], cwd=ROOT, stdout=sys.stderr)
        if r.returncode != 0 or not os.access(path, os.X_OK):
            raise Failure("cargo build --release -p rustorch-cli failed")
    else:
        # Not rebuilt here (CI builds it fresh); say so when sources changed after it was built.
        built = os.path.getmtime(path)
        newer = [
            os.path.join(d, f)
            for top in ("crates",)
            for d, _, files in os.walk(os.path.join(ROOT, top))
            for f in files
            if f.endswith(".rs") and os.path.getmtime(os.path.join(d, f)) > built and "/tests/" not in d + "/"
        ]
        if newer:
            log(f"warning: {len(newer)} source files are newer than {path} (e.g. "
                f"{os.path.relpath(newer[0], ROOT)}): rebuild with cargo build --release -p rustorch-cli")
    return path


def atomic_make(out, make):
    """make(tmp) writes a file; it becomes `out` only when complete, so that an interrupted run
    never leaves a truncated model that a later run would take for a good one."""
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = f"{out}.partial.{os.getpid()}"
    try:
        make(tmp)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def source_model(source):
    var = SOURCE_ENV[source]
    path = os.environ.get(var)
    if not path or not os.path.isfile(path):
        log(f"{var} not set: python3 tools/fetch_models.py --print-env --only {source}")
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "fetch_models.py"), "--print-env", "--only", source],
                           stdout=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise Failure(f"tools/fetch_models.py could not fetch {source}")
        for line in r.stdout.splitlines():
            words = shlex.split(line)  # export VAR=VALUE, quoted as a shell reads it
            if len(words) == 2 and words[0] == "export" and words[1].startswith(var + "="):
                path = words[1].split("=", 1)[1]
        if not path or not os.path.isfile(path):
            raise Failure(f"tools/fetch_models.py gave no file for {var}")
        os.environ[var] = path
    return path


def load_fixture_sha256():
    path = os.path.join(ROOT, "crates", "rustorch-llm", "tests", "fixtures", "llamacpp", "models.json")
    try:
        with open(path, encoding="utf-8") as f:
            return {k: v["sha256"] for k, v in json.load(f).items() if v.get("requant")}
    except (OSError, ValueError, KeyError, AttributeError):
        return {}


FIXTURE_SHA256 = load_fixture_sha256()


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def quantize(quantize_bin, src, out, qtype, threads):
    def make(tmp):
        cmd = [quantize_bin, "--allow-requantize", src, tmp, qtype, str(threads)]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            sys.stderr.write(r.stdout[-4000:])
            raise Failure(f"llama-quantize {qtype} failed: {' '.join(cmd)}")
    log(f"llama-quantize --allow-requantize {os.path.basename(src)} -> {qtype}")
    atomic_make(out, make)


def mkmodel_script():
    for path in (os.environ.get("MKMODEL"), os.path.join(ROOT, "tools", "mkmodel.py"),
                 os.path.join(ROOT, "..", "shared", "tools", "mkmodel.py")):
        if path and os.path.isfile(path):
            return path
    raise Failure("mkmodel.py not found (tools/mkmodel.py, or set MKMODEL)")


def tinyllama_model(quantize_bin, threads):
    """TinyLlama-1.1B's shape with random weights (tools/mkmodel.py, seeded) in Q4_K_M, made the
    way bench/compare_llamacpp.sh makes it and in its cache folder, so both share one file."""
    out = os.path.join(os.environ.get("BENCH_MODELS_DIR") or os.path.join(CACHE, "models", "bench"), "tinyllama-q4_k_m.gguf")
    if os.path.isfile(out):
        return out
    if subprocess.run([sys.executable, "-c", "import gguf, numpy"], stderr=subprocess.DEVNULL).returncode != 0:
        log("installing gguf and numpy with pip (for mkmodel.py)")
        if subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "gguf", "numpy"], stdout=sys.stderr).returncode != 0:
            raise Failure("pip install gguf numpy failed")
    f16 = os.path.join(os.path.dirname(out), "tinyllama-f16.gguf")

    def make_f16(tmp):
        log("making the TinyLlama-shaped F16 model (mkmodel.py, 2.2 GB, once)")
        run_logged([sys.executable, mkmodel_script(), "tinyllama", tmp], "mkmodel.py tinyllama")

    try:
        if not os.path.isfile(f16):
            atomic_make(f16, make_f16)
        quantize(quantize_bin, f16, out, "Q4_K_M", threads)
    finally:
        if os.path.exists(f16):
            os.remove(f16)
    return out


def model_file(model, quantize_bin, threads):
    source, qtype = MODELS[model]
    if source == "tinyllama":
        return tinyllama_model(quantize_bin, threads)
    src = source_model(source)
    if qtype is None:
        return src
    # The fidelity tests' cache (crates/rustorch-llm/tests/common/llamacpp.rs: the same file
    # names, made by rustorch's quantizer), checked against the sha256 of llama-quantize's file
    # that their models.json records: a stale or foreign file is made again, and a new one must
    # match too, so that this check runs on the very files the tests pin.
    out = os.path.join(CACHE, "models", "requant", f"{model}.gguf")
    want = FIXTURE_SHA256.get(model)
    if os.path.isfile(out) and (want is None or sha256_file(out) == want):
        return out
    if os.path.isfile(out):
        log(f"{out}: sha256 differs from models.json's, making it again")
    local = os.path.join(CACHE, "models", "requant", "local", f"{model}.gguf")
    if os.path.isfile(local):
        return local
    quantize(quantize_bin, src, out, qtype, threads)
    if want is not None and sha256_file(out) != want:
        # llama-quantize's K-quant search is float arithmetic that the compiler vectorizes per
        # target: a build for another CPU can write other bytes (seen: Sapphire Rapids against
        # the fixtures' AMD EPYC). Both programs then read this machine's file; the fidelity
        # tests' cache keeps only the pinned bytes.
        os.makedirs(os.path.dirname(local), exist_ok=True)
        os.replace(out, local)
        log(f"note: llama-quantize on this machine wrote {qtype} bytes other than models.json's "
            f"(sha256 {want[:12]}...); comparing on this machine's file {local}")
        return local
    return out


# --- runs and comparison -----------------------------------------------------------------------


def parse_output(text, what, expected_ids):
    results = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            ok = (isinstance(r.get("id"), str) and all(isinstance(r.get(k), list) for k in ("prompt_tokens", "tokens", "top"))
                  and len(r["top"]) == len(r["tokens"]) and all(len(t) == 4 for t in r["top"]))
        except (json.JSONDecodeError, TypeError):
            ok = False
        if not ok:
            raise Failure(f"{what}: line {n} is not a result line: {line[:200]}")
        if r["id"] in results:
            raise Failure(f"{what}: prompt {r['id']} twice")
        results[r["id"]] = r
    if expected_ids is not None:
        missing = [i for i in expected_ids if i not in results]
        extra = [i for i in results if i not in set(expected_ids)]
        if missing or extra:
            raise Failure(f"{what}: missing prompts {missing[:5]}, unexpected {extra[:5]}")
    return results


def margin(top_entry):
    """Top-1 minus top-2 logit of one step; None where a program printed no finite pair."""
    l1, l2 = f32(top_entry[1]), f32(top_entry[3])
    if l1 is None or l2 is None:
        return None
    return l1 - l2


def fmt_margin(m):
    return "n/a" if m is None else f"{m:.4f}"


def compare_one(ref, ours):
    """(verdict, detail): verdict is identical, tolerated, diverged or tokenizer; detail a line."""
    if ref["prompt_tokens"] != ours["prompt_tokens"]:
        a, b = ref["prompt_tokens"], ours["prompt_tokens"]
        k = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
        return "tokenizer", (f"tokenizer mismatch: {len(a)} vs {len(b)} prompt tokens, first difference at "
                             f"{k}: llama.cpp {a[k:k + 3]}, rustorch {b[k:k + 3]}")
    a, b = ref["tokens"], ours["tokens"]
    if a == b:
        return "identical", None
    common = min(len(a), len(b))
    k = next((i for i in range(common) if a[i] != b[i]), None)
    if k is None:
        # Same tokens as far as both went, but one stopped: a stop without an end-of-generation
        # token, or a run past one; never a near-tie.
        who = "llama.cpp" if len(a) < len(b) else "rustorch"
        return "diverged", (f"step {common}: length {len(a)} (llama.cpp) vs {len(b)} (rustorch): {who} stopped "
                            f"after token {(a if len(a) < len(b) else b)[-1]}")
    rm, om = margin(ref["top"][k]), margin(ours["top"][k])
    verdict = "tolerated" if rm is not None and rm < MARGIN else "diverged"
    second = ref["top"][k][2]
    detail = (f"step {k}: llama.cpp {a[k]} (margin {fmt_margin(rm)}, 2nd {second}), rustorch {b[k]} "
              f"(margin {fmt_margin(om)})")
    if b[k] != second:
        # Legitimate only in a near tie of three or more, which the two best alone cannot show.
        detail += ", not llama.cpp's 2nd"
    return verdict, detail


def f32(x):
    """A printed logit as the f32 it stands for: the programs print f32 values in different
    decimal forms (%.9g, or the exact f64 expansion), each of which rounds back to the same f32."""
    if not isinstance(x, (int, float)):
        return None
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return None


def logit_agreement(ref, ours):
    """Steps up to the first token difference where both found the same two ids and f32 logits:
    (equal, compared, largest difference of the top-1 logit)."""
    equal = compared = 0
    worst = 0.0
    for ta, tb, ra, rb in zip(ref["tokens"], ours["tokens"], ref["top"], ours["top"]):
        compared += 1
        a = [ra[0], f32(ra[1]), ra[2], f32(ra[3])]
        b = [rb[0], f32(rb[1]), rb[2], f32(rb[3])]
        equal += a == b and None not in a
        if a[1] is not None and b[1] is not None:
            worst = max(worst, abs(a[1] - b[1]))
        if ta != tb:
            break
    return equal, compared, worst


def compare(name, order, ref, ours, prompts_long, out):
    """Prints the summary and detail lines; returns True when nothing is untolerated."""
    counts = {"identical": 0, "tolerated": 0, "diverged": 0, "tokenizer": 0}
    lines = []
    eq = cmp_steps = 0
    worst = 0.0
    ok = True
    for pid, r in ref.items():
        verdict, detail = compare_one(r, ours[pid])
        counts[verdict] += 1
        if detail:
            lines.append(f"  {pid}: {verdict}: {detail}")
        if verdict in ("diverged", "tokenizer"):
            ok = False
        if verdict != "tokenizer":  # different prompts: logits not comparable
            e, c, w = logit_agreement(r, ours[pid])
            eq, cmp_steps, worst = eq + e, cmp_steps + c, max(worst, w)
        if pid in prompts_long and len(r["prompt_tokens"]) <= LONG_TOKENS:
            lines.append(f"  {pid}: prompt set: a long prompt of only {len(r['prompt_tokens'])} tokens "
                         f"(needs > {LONG_TOKENS})")
            ok = False
    summary = f"{name} {order}: {counts['identical']} identical, {counts['tolerated']} tolerated, {counts['diverged']} diverged"
    if counts["tokenizer"]:
        summary += f", {counts['tokenizer']} tokenizer mismatch"
    print(summary, file=out)
    for line in lines:
        print(line, file=out)
    print(f"  top-2 ids and logits equal bit for bit at {eq} of {cmp_steps} steps up to each first difference "
          f"(largest top-1 logit difference {worst:.3g})", file=out)
    out.flush()
    return ok


def run_greedy(cmd, env, what, expected_ids, keep_path):
    log(f"  {what}...")
    stdout, secs = run_logged(cmd, what, env)
    if keep_path:
        with open(keep_path, "w", encoding="utf-8") as f:
            f.write(stdout)
    log(f"  {what}: {secs:.1f} s")
    return parse_output(stdout, what, expected_ids)


# KL-divergence mode (CPUs whose native llama.cpp build RusTorch does not reproduce).
KLD_TEXT = os.path.join(ROOT, "crates", "rustorch-llm", "tests", "fixtures", "GPL-3")
KLD_CTX = 256
KLD_CHUNKS = 4
# RusTorch may be this much further from llama.cpp's batched logits than llama.cpp's own
# one-token-at-a-time evaluation (-ub 1) is (both are valid summation orders on this CPU; in
# files with quantized activations any rounding difference grows to about the activations'
# quantization noise), plus a floor for files where both are ~1e-6 (F16).
KLD_FACTOR = 1.5
KLD_FLOOR = 2e-4
SAME_TOP_SLACK = 2.0  # percentage points
PPL_RATIO_MAX = 0.01  # |PPL(ours) / PPL(llama.cpp) - 1|


def exact_here(flags):
    """Whether RusTorch claims llama.cpp's native build's bits on this CPU: its arithmetic follows
    GGML's AVX-512 lanes (rustorch-cli devices says so), which a native build takes only where the
    CPU has AVX-512 F and BW."""
    return "avx512f" in flags and "avx512bw" in flags


def kld_report(text, what):
    """Mean KLD, same-top percentage and PPL ratio from a --kl-divergence report."""
    found = {}
    for key, pattern in (("kld", r"Mean\s+KLD:\s+([-0-9.eE+]+)"), ("top", r"Same top p:\s+([-0-9.eE+]+)"),
                         ("ppl", r"Mean PPL\(Q\)/PPL\(base\)\s*:\s+([-0-9.eE+]+)")):
        m = re.search(pattern, text)
        if not m:
            raise Failure(f"{what}: no '{key}' figure in its --kl-divergence report")
        found[key] = float(m.group(1))
    return found


def run_kld(cmd, env, what):
    t0 = time.monotonic()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-4000:])
        raise Failure(f"{what} failed (exit status {r.returncode}): {' '.join(cmd)}")
    log(f"  {what}: {time.monotonic() - t0:.1f} s")
    return r.stdout


def kld_check(model, path, llama_bin, cli, threads, work):
    """Compares one file by KL divergence; prints one verdict line, returns whether it passed."""
    perplexity = os.path.join(llama_bin, "llama-perplexity")
    if not os.access(perplexity, os.X_OK):
        raise Failure(f"no executable llama-perplexity in {llama_bin}")
    base = os.path.join(work, f"{model}.kld")
    common = ["-c", str(KLD_CTX), "-t", str(threads)]
    run_kld([perplexity, "-m", path, "-f", KLD_TEXT, "--chunks", str(KLD_CHUNKS), *common, "--kl-divergence-base", base],
            None, f"{model}: llama-perplexity base logits")
    yard = kld_report(run_kld([perplexity, "-m", path, *common, "-ub", "1", "--kl-divergence-base", base,
                               "--kl-divergence"], None, f"{model}: llama-perplexity -ub 1"), f"{model}: llama.cpp -ub 1")
    env = dict(os.environ, RUSTORCH_GGML_ORDER="reference")
    ours = kld_report(run_kld([cli, "perplexity", "-m", path, "-b", "cpu", *common, "--kl-divergence-base", base,
                               "--kl-divergence"], env, f"{model}: rustorch-cli perplexity"), f"{model}: rustorch-cli")
    kld_max = KLD_FACTOR * yard["kld"] + KLD_FLOOR
    top_min = yard["top"] - SAME_TOP_SLACK
    problems = []
    if not ours["kld"] <= kld_max:
        problems.append(f"mean KLD {ours['kld']:.6f} > {kld_max:.6f}")
    if not ours["top"] >= top_min:
        problems.append(f"same top {ours['top']:.3f}% < {top_min:.3f}%")
    if not abs(ours["ppl"] - 1.0) <= PPL_RATIO_MAX:
        problems.append(f"PPL ratio {ours['ppl']:.6f} off by more than {PPL_RATIO_MAX:.0%}")
    verdict = "FAIL: " + "; ".join(problems) if problems else "ok"
    print(f"{model} kld: rustorch-cli mean KLD {ours['kld']:.6f}, same top {ours['top']:.3f}%, PPL ratio "
          f"{ours['ppl']:.6f}; llama.cpp -ub 1: {yard['kld']:.6f}, {yard['top']:.3f}%, {yard['ppl']:.6f}: {verdict}",
          flush=True)
    return not problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 1)[1])
    ap.add_argument("--ci", action="store_true", help="the CI subset of prompts (fixed: the prompt file's \"ci\" list)")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated ids (default all: {','.join(MODELS)})")
    ap.add_argument("--prompts", type=int, metavar="N", help="only the first N prompts (of the full set or --ci's)")
    ap.add_argument("-t", "--threads", type=int, default=THREADS, help=f"threads of both programs (default {THREADS})")
    ap.add_argument("-n", type=int, default=N_GEN, dest="n_gen", help=f"tokens generated per prompt (default {N_GEN})")
    ap.add_argument("--keep", metavar="DIR", help="write the prompt lines and both programs' JSONL there")
    ap.add_argument("--llama-bin", metavar="DIR", help="prebuilt llamacpp-greedy (and llama-quantize) of the no-AMX build")
    ap.add_argument("--amx-bin", metavar="DIR", help="prebuilt llamacpp-greedy of the AMX build")
    ap.add_argument("--no-amx", action="store_true", help="skip the AMX build even where AMX is available")
    ap.add_argument("--rustorch-cli", metavar="PATH", help="rustorch-cli to test (default $RUSTORCH_CLI or target/release)")
    ap.add_argument("--prompt-file", default=PROMPTS_FILE, help=argparse.SUPPRESS)
    ap.add_argument("--kld", action="store_true",
                    help="compare by KL divergence (the mode of CPUs without AVX-512) even where greedy identity is claimed")
    ap.add_argument("--compare", nargs=2, metavar=("LLAMA", "OURS"), help="only compare two saved JSONL outputs")
    args = ap.parse_args()
    if args.prompts is not None and args.prompts < 1 or args.threads < 1 or args.n_gen < 1:
        ap.error("--prompts, -t and -n must be positive")
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        ap.error(f"unknown models {unknown} (choose from {', '.join(MODELS)})")

    if args.compare:
        try:
            texts = [open(p, encoding="utf-8").read() for p in args.compare]
            ref = parse_output(texts[0], args.compare[0], None)
            ours = parse_output(texts[1], args.compare[1], list(ref))
        except (OSError, Failure) as e:
            log(str(e))
            return 1
        return 0 if compare(os.path.basename(args.compare[1]), "saved", ref, ours, set(), sys.stdout) else 1

    t_start = time.monotonic()
    # The fixtures' record of a CPU (tools/cpu_record.py), whose flag names are Linux's
    # (avx512_fp16, amx_int8).
    cpu = cpu_record()
    flags = set(cpu["flags"])
    print(f"CPU: {cpu['model']} ({cpu['kind']})", flush=True)
    exact = exact_here(flags) and not args.kld
    if not exact:
        why = "--kld" if args.kld else ("this CPU lacks AVX-512: llama.cpp's native build here sums in other lanes, "
                                        "which RusTorch does not reproduce (rustorch-cli devices says so)")
        print(f"mode: KL divergence ({why}); greedy identity is not claimed, so each file's logits are compared "
              f"with llama-perplexity's ({os.path.relpath(KLD_TEXT, ROOT)}, -c {KLD_CTX}, {KLD_CHUNKS} chunks): "
              f"rustorch-cli must be within {KLD_FACTOR}x + {KLD_FLOOR} of the mean KLD, {SAME_TOP_SLACK} points of "
              f"the same-top rate of llama.cpp's own -ub 1 evaluation, and {PPL_RATIO_MAX:.0%} of its perplexity",
              flush=True)
    failed = False
    try:
        doc, all_prompts = load_prompts(args.prompt_file)
        prompts = select_prompts(doc, all_prompts, args.ci, args.prompts)

        # builds: (label, order, llamacpp-greedy)
        builds = []
        gcc_bin = args.llama_bin or build_llamacpp(amx=False)
        builds.append(("llama.cpp GCC (no AMX)", "reference", greedy_in(gcc_bin, "--llama-bin" if args.llama_bin else "build")))
        amx_note = ""
        if args.amx_bin:
            builds.append(("llama.cpp clang AMX", "amx", greedy_in(args.amx_bin, "--amx-bin")))
        elif args.no_amx:
            amx_note = "skipped (--no-amx)"
        elif not exact:
            amx_note = "not used (KL-divergence mode)"
        elif "amx_int8" in flags:
            amx_bin = build_llamacpp(amx=True)
            if amx_bin is None:
                amx_note = "not available (tools/build_llamacpp.sh --amx: see its message above)"
            else:
                builds.append(("llama.cpp clang AMX", "amx", greedy_in(amx_bin, "build")))
        else:
            amx_note = "not available (this CPU has no AMX-INT8)"
        cli = rustorch_cli(args.rustorch_cli)
        compared = "; ".join(f"{label} vs rustorch-cli RUSTORCH_GGML_ORDER={order}" for label, order, _ in builds)
        if exact:
            print(f"compared: {compared}" + (f"; clang AMX build {amx_note}" if amx_note else ""), flush=True)
            print(f"rustorch-cli: {cli}; {len(prompts)} prompts x {args.n_gen} tokens, -c {N_CTX} -t {args.threads}, "
                  f"models: {', '.join(models)}", flush=True)
        else:
            print(f"rustorch-cli: {cli}; -t {args.threads}, models: {', '.join(models)}", flush=True)
        quantize_bin = os.path.join(gcc_bin, "llama-quantize")
    except Failure as e:
        log(str(e))
        return 1

    work = args.keep or tempfile.mkdtemp(prefix="llamacpp_diff.")
    os.makedirs(work, exist_ok=True)
    try:
        for model in models:
            t_model = time.monotonic()
            try:
                if model != "smollm2-q4_1" and model != "gemma3-q4_k_m" and not os.access(quantize_bin, os.X_OK):
                    raise Failure(f"{model} is made with llama-quantize, which is not in {os.path.dirname(quantize_bin)}")
                path = model_file(model, quantize_bin, args.threads)
                if not exact:
                    log(f"{model}: {path}")
                    if not kld_check(model, path, gcc_bin, cli, args.threads, work):
                        failed = True
                    continue
                family = MODELS[model][0]
                max_chars = doc["tinyllama_max_chars"] if family == "tinyllama" else None
                lines = render(prompts, family, max_chars)
                prompt_path = os.path.join(work, f"{model}.prompts.jsonl")
                with open(prompt_path, "w", encoding="utf-8") as f:
                    for line in lines:
                        f.write(json.dumps(line, ensure_ascii=False) + "\n")
                ids = [p["id"] for p in lines]
                long_ids = {p["id"] for p in prompts if p["long"]}
                log(f"{model}: {path}")
                for label, order, exe in builds:
                    tag = "llama-amx" if order == "amx" else "llama-gcc"
                    ref = run_greedy([exe, "-m", path, "-f", prompt_path, "-n", str(args.n_gen), "-c", str(N_CTX),
                                      "-t", str(args.threads)], None, f"{model}: {label}", ids,
                                     os.path.join(work, f"{model}.{tag}.jsonl") if args.keep else None)
                    env = dict(os.environ, RUSTORCH_GGML_ORDER=order)
                    ours = run_greedy([cli, "greedy", "-m", path, "-f", prompt_path, "-n", str(args.n_gen), "-c", str(N_CTX),
                                       "-t", str(args.threads)], env, f"{model}: rustorch-cli ({order} order)", ids,
                                      os.path.join(work, f"{model}.rustorch-{order}.jsonl") if args.keep else None)
                    if not compare(model, order, ref, ours, long_ids, sys.stdout):
                        failed = True
            except Failure as e:
                print(f"{model}: FAILED: {str(e).removeprefix(model + ': ')}", flush=True)
                failed = True
            finally:
                log(f"{model}: {time.monotonic() - t_model:.1f} s (total {time.monotonic() - t_start:.1f} s)")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{'FAIL' if failed else 'ok'}: {time.monotonic() - t_start:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
