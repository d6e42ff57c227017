"""Every tensor that specdec creates names its device, so the package runs unchanged on CUDA.

A factory call without ``device=`` makes a CPU tensor; adding it to a CUDA tensor raises at the
first step (no GPU runs in CI, so only this scan catches it). Host bookkeeping says ``device="cpu"``.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "specdec"
FACTORIES = {
    "tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "rand", "randn", "randint", "randperm",
    "eye", "linspace", "logspace", "Generator",
}


def _missing_device(source: str) -> list[tuple[int, str]]:
    """(line, call) of every ``torch.FACTORY(...)`` in ``source`` that passes no ``device=`` keyword."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        func = node.func
        if func.attr not in FACTORIES or not (isinstance(func.value, ast.Name) and func.value.id == "torch"):
            continue
        if not any(kw.arg == "device" or kw.arg is None for kw in node.keywords):  # **kwargs may carry it
            found.append((node.lineno, f"torch.{func.attr}"))
    return found


def test_the_scan_catches_a_factory_without_device():
    bad = "import torch\nx = torch.tensor([1, 2])\ny = torch.zeros(3, device='cpu')\ng = torch.Generator()\n"
    assert _missing_device(bad) == [(2, "torch.tensor"), (4, "torch.Generator")]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_tensor_factory_names_its_device(path):
    missing = _missing_device(path.read_text(encoding="utf-8"))
    assert not missing, f"{path.relative_to(PACKAGE.parent)}: tensor factory without device=: " + ", ".join(
        f"line {line} {call}" for line, call in missing)
