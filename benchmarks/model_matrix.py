"""Write docs/models.md, the support matrix, from the results of tests/test_model_families.py.

Runs that test (slow cells included unless ``--fast``) with ``SPECDEC_MATRIX_JSON`` set, so each cell records its
outcome, then renders one table: a row per family, a column per mode, each cell exact, refused (with the reason
below the table), not run by transformers itself, or failing. Nothing in the table is written by hand.

    python benchmarks/model_matrix.py            # every cell (the inductor column takes minutes per family)
    python benchmarks/model_matrix.py --fast     # without the slow (inductor) cells, marked "not run"
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

MARK = {"exact": "exact", "refused": "refused", "hf-cannot": "transformers cannot", "differs": "**DIFFERS**",
        "error": "**ERROR**"}


def run_tests(out: Path, fast: bool) -> int:
    """Run the matrix test, each cell appending its outcome to ``out``; returns pytest's exit status."""
    env = dict(os.environ, SPECDEC_MATRIX_JSON=str(out))
    command = [sys.executable, "-m", "pytest", str(ROOT / "tests" / "test_model_families.py"), "-q",
               "-p", "no:cacheprovider", "-m", "not slow" if fast else ""]
    return subprocess.run(command, cwd=ROOT, env=env).returncode


def render(cells: list[dict], fast: bool, status: int) -> str:
    """The markdown page for these recorded cells."""
    import torch
    import transformers

    from families import FAMILIES, MODES, SAMPLING

    modes = [*MODES, SAMPLING]
    helps = {**{m.name: m.help for m in MODES.values()},
             SAMPLING: "sampling (T=1, top-k 3), bf16 self-copy, 600 rows in one call: chi-square against the "
                       "verifier's exact law of 3-token continuations"}
    table = {(c["family"], c["mode"]): c for c in cells}
    reasons: dict[str, int] = {}
    lines = [
        "# Supported models",
        "",
        "Written by `python benchmarks/model_matrix.py" + (" --fast" if fast else "") + "` from the results of "
        "`tests/test_model_families.py`; do not edit by hand.",
        "",
        f"transformers {transformers.__version__}, torch {torch.__version__}, {platform.machine()} CPU, "
        f"{date.today().isoformat()}; pytest exit status {status}.",
        "",
        "Each family is a tiny random config of that architecture (`tests/families.py`). **exact**: token-identical "
        "to `model.generate(do_sample=False)` (sampling: the law holds). **refused**: `UnsupportedModelError` "
        "with the reason below. **transformers cannot**: `generate` itself fails on the config, not counted. "
        "**not run**: a slow cell left out of this run.",
        "",
        "| family | kind | " + " | ".join(modes) + " |",
        "|---|---|" + "---|" * len(modes),
    ]
    for family, spec in FAMILIES.items():
        row = []
        for mode in modes:
            cell = table.get((family, mode))
            if cell is None:
                row.append("not run")
                continue
            text = MARK.get(cell["outcome"], cell["outcome"])
            if cell["outcome"] in ("refused", "hf-cannot", "differs", "error"):
                # one note per reason: the model's own name in it becomes MODEL
                note = reasons.setdefault(re.sub(rf"(?<!\w){re.escape(family)}(?!\w)", "MODEL", cell["detail"]),
                                          len(reasons) + 1)
                text += f" [{note}]"
            row.append(text)
        lines.append(f"| {family} | {spec.kind} | " + " | ".join(row) + " |")
    lines += ["", "Modes:", ""] + [f"- **{m}**: {helps[m]}" for m in modes]
    if reasons:
        lines += ["", "Reasons:", ""] + [f"{n}. {text}" for text, n in reasons.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="leave out the slow (compiled) cells")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "models.md", help="the page to write")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "cells.jsonl"
        status = run_tests(results, args.fast)
        cells = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    if not cells:
        print("no cell recorded: the test did not run", file=sys.stderr)
        return 1
    args.out.write_text(render(cells, args.fast, status), encoding="utf-8")
    print(f"wrote {args.out} ({len(cells)} cells, pytest exit status {status})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
