#!/usr/bin/env python3
"""Write PyTorch reference outputs for RusTorch's CPU ops.

usage: python3 tools/gen_torch_fixtures.py [FAMILY ...]

Each family is a module tools/torch_fixtures/FAMILY.py with a `cases()`
function. Its cases are written to
crates/rustorch-conformance/fixtures/torch/FAMILY.json, which is committed;
the conformance suites in crates/rustorch-conformance/src/suites/torch_FAMILY.rs replay them.
Needs the `torch` package (the CPU build is enough). Inputs come from a
seeded generator, so re-running gives the same files for the same torch.
"""
import importlib
import json
import os
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "rustorch-conformance" / "fixtures" / "torch"
sys.path.insert(0, str(ROOT / "tools"))


def main():
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    families = sys.argv[1:] or sorted(
        p.stem for p in (ROOT / "tools" / "torch_fixtures").glob("*.py") if p.stem not in ("__init__", "common")
    )
    OUT.mkdir(parents=True, exist_ok=True)
    for fam in families:
        mod = importlib.import_module(f"torch_fixtures.{fam}")
        cases = mod.cases()
        names = [c["name"] for c in cases]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise SystemExit(f"{fam}: duplicate case names {sorted(dup)}")
        doc = {"generator": "tools/gen_torch_fixtures.py", "torch": torch.__version__, "family": fam, "cases": cases}
        path = OUT / f"{fam}.json"
        with open(path, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
        print(f"{fam}: {len(cases)} cases -> {os.path.relpath(path, ROOT)} ({path.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
