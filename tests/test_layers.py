"""The package's shape (docs/design.md, "The map"): no import circle, no upward import, small modules,
and an engine that never asks which kind of drafts or plan it holds.

Imports are read from the source (``ast``): module-level, function-level and ``TYPE_CHECKING`` imports alike.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "specdec"
#: the layers above the library: nothing below them may import them (``training``: head training and reports,
#: applications of the API; the ``heads`` leaf that drafters load stays below)
TOP = ("specdec.api", "specdec.cli", "specdec.eval", "specdec.training")
#: known upward arrows; none may be added
KNOWN_UPWARD: set[tuple[str, str]] = set()


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()

    def owner(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    edges: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for target in targets:
                if target.startswith("specdec") and owner(target) not in ("", name):
                    edges[name].add(owner(target))
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    assert _cycles(_graph()) == []


def test_the_checker_finds_a_circle():
    edges = _graph()
    edges["specdec.protocol"].add("specdec.engine")  # the engine imports protocol: this closes a loop
    assert any("specdec.protocol" in c and "specdec.engine" in c for c in _cycles(edges))


def test_no_upward_import():
    upward = {(m, t) for m, targets in _graph().items() for t in targets
              if t.startswith(TOP) and not m.startswith(TOP) and m != "specdec"}
    assert upward <= KNOWN_UPWARD, sorted(upward - KNOWN_UPWARD)


def test_no_module_over_500_lines():
    big = {str(p.relative_to(ROOT)): n for p in _modules().values() if (n := len(p.read_text().splitlines())) > 500}
    assert big == {}


def test_the_engine_asks_no_kind():
    """No ``isinstance`` in the loop: a plan answers for chains and trees, ``verify`` dispatches on the drafts."""
    calls = [n for n in ast.walk(ast.parse((ROOT / "engine.py").read_text()))
             if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "isinstance"]
    assert calls == []
