"""``specdec SUB --help`` imports neither torch nor transformers, for every subcommand (issue 51).

Each probe runs ``main([SUB, "--help"])`` in a fresh interpreter, so modules other tests imported do not hide an
import; the subcommands are read from :func:`specdec.cli.build_parser`, so a new one is covered without a change
here. The negative controls show that the probe does see torch and transformers when they are imported.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from specdec.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
#: the heavy libraries ``--help`` must not import
HEAVY = ("torch", "transformers")
#: prefix of the probe's report line on stderr
MARK = "PROBE "

PROBE = """\
import json, sys
{before}
from specdec.cli import main
try:
    main({argv!r})
    code = 0
except SystemExit as e:
    code = e.code
print({mark!r} + json.dumps({{"code": code, "loaded": [m for m in {heavy!r} if m in sys.modules]}}), file=sys.stderr)
"""


def _subcommands() -> list[str]:
    """Every subcommand of the ``specdec`` parser (``build_parser("")``: what ``main`` builds for ``--help``)."""
    parser = build_parser("")
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(subs) == 1
    return list(subs[0].choices)


SUBCOMMANDS = _subcommands()


def _probe(argv: list[str], before: str = "") -> tuple[dict, str]:
    """Run ``main(argv)`` in a fresh interpreter (after ``before``); its report and stdout."""
    code = PROBE.format(before=before, argv=argv, mark=MARK, heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith(MARK)]
    assert len(lines) == 1, done.stderr
    return json.loads(lines[0][len(MARK):]), done.stdout


def test_every_subcommand_is_probed():
    # the subcommands issue 51 found slow are among those read from the parser
    assert {"demo", "generate", "plan", "quant-report", "eval", "train-head", "head-report",
            "export-head"} <= set(SUBCOMMANDS)


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_help_imports_neither_torch_nor_transformers(sub):
    report, out = _probe([sub, "--help"])
    assert report["code"] in (0, None)
    assert out.startswith(f"usage: specdec {sub}"), out[:200]
    assert report["loaded"] == [], f"specdec {sub} --help imported {report['loaded']}"


def test_top_level_help_imports_neither():
    report, out = _probe(["--help"])
    assert report["code"] in (0, None) and out.startswith("usage: specdec")
    assert report["loaded"] == []


@pytest.mark.parametrize("module", HEAVY)
def test_the_probe_sees_an_import(module):
    """Negative control: the same probe, after importing the library itself, reports it."""
    report, out = _probe([SUBCOMMANDS[0], "--help"], before=f"import {module}")
    assert report["code"] in (0, None) and out.startswith("usage: specdec")
    assert module in report["loaded"]
