"""``specdec.metrics.expected_tokens``: the expected tokens per verifier pass, written once (issue 46)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from specdec.metrics import expected_tokens

REPO = Path(__file__).resolve().parent.parent


def test_expected_tokens():
    assert expected_tokens(0.0, 5) == 1.0  # the verifier's own token only
    assert expected_tokens(1.0, 4) == 5.0  # every draft accepted
    assert math.isclose(expected_tokens(0.5, 1), 1.5)
    assert math.isclose(expected_tokens(0.5, 2), 1.75)
    assert math.isclose(expected_tokens(0.9, 4), (1 - 0.9**5) / 0.1)
    assert math.isclose(expected_tokens(0.8, 6), sum(0.8**j for j in range(7)))  # 1 + a + ... + a**k


@pytest.mark.parametrize("a", [0.1, 0.5, 0.9, 0.999])
def test_expected_tokens_rises_with_k_towards_its_limit(a):
    values = [expected_tokens(a, k) for k in range(0, 12)]
    assert values[0] == 1.0 and all(x < y for x, y in zip(values, values[1:]))
    assert values[-1] < 1 / (1 - a)


def test_the_formula_is_written_only_in_metrics():
    """Every user of the formula (adaptive k, tree auto's arms, the simulated drafter, quant-report) imports it."""
    pattern = re.compile(r"\*\*\s*\(\s*k\s*\+\s*1\s*\)")
    found = [str(p.relative_to(REPO)) for folder in ("specdec", "benchmarks") for p in (REPO / folder).rglob("*.py")
             if p.name != "metrics.py" and any(pattern.search(line) and not line.lstrip().startswith(("#", "``"))
                                               for line in _code_lines(p))]
    assert found == []


def _code_lines(path: Path) -> list[str]:
    """``path``'s lines outside docstrings (a docstring may quote the formula)."""
    import ast

    text = path.read_text(encoding="utf-8")
    skip: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant) \
                and isinstance(node.value.value, str):
            skip.update(range(node.lineno, node.end_lineno + 1))
    return [line for number, line in enumerate(text.splitlines(), 1) if number not in skip]
