"""The package's shape (docs/design.md, "The map"): no import circle, no upward import, small modules,
and an engine that never asks which kind of drafts or plan it holds.

Imports are read from the source (``ast``): module-level, function-level and ``TYPE_CHECKING`` imports alike.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "specdec"
#: every module's layer, bottom first (docs/design.md, "The map"): a module imports its own layer or lower ones, never
#: a higher one. A name matches itself and what lies under it; the longest match wins, so a package's ``__init__``
#: (a façade) can sit above its own modules. A new module must be placed here.
LAYERS: tuple[tuple[str, ...], ...] = (
    # leaves: torch-free helpers and self-contained packages (quantized copies, sizing, heads, grammars, prompts)
    ("specdec.errors", "specdec.metrics", "specdec.costs", "specdec.slots", "specdec.transfer", "specdec.acceptance", "specdec.rules", "specdec.stats",
     "specdec.stopping", "specdec.draft_registry", "specdec.trees.modes", "specdec.trees.config", "specdec.sizing",
     "specdec.quant", "specdec.heads", "specdec.constraints", "specdec.prompts", "specdec.models", "specdec.model_cache", "specdec.lazy"),
    ("specdec.runners",),  # a model over a managed cache
    ("specdec.processing", "specdec.arguments", "specdec.protocol", "specdec.committed"),  # the loop's vocabulary
    ("specdec.chains", "specdec.trees", "specdec.verification"),  # plans: chains and trees; one verify pass
    ("specdec.drafters.",),  # the drafters (their modules)
    ("specdec.draft_kinds", "specdec.draft_spec", "specdec.drafters"),  # names -> drafters: the kinds and the resolver
    ("specdec.engine", "specdec.host_trace"),  # the loop
    ("specdec.strategy",),  # a model's plans per call and what they learn
    ("specdec.api", "specdec"),  # the public API
    ("specdec.user_input", "specdec.demo", "specdec.quant_report", "specdec.eval", "specdec.training",
     "specdec.cli"),  # applications
)
#: the layers above the library: nothing below them may import them
TOP = LAYERS[-1]


def layer(module: str) -> int:
    """``module``'s index in :data:`LAYERS` (the longest matching name); -1 if no layer names it."""
    best, found = -1, -1
    for i, names in enumerate(LAYERS):
        for name in names:
            matches = module == name or (module.startswith(name if name.endswith(".") else name + ".")
                                         and not (name == "specdec" and module != "specdec"))
            if matches and len(name) > best:
                best, found = len(name), i
    return found


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


def test_every_module_has_a_layer():
    assert [m for m in _modules() if layer(m) < 0] == []


def test_no_upward_import():
    """No arrow from a layer to a higher one, anywhere in ``specdec/`` (type-only and function-level imports too)."""
    upward = sorted((m, t) for m, targets in _graph().items() for t in targets if layer(t) > layer(m))
    assert upward == []


def test_the_layer_check_finds_an_upward_arrow():
    assert layer("specdec.drafters") > layer("specdec.drafters.model") > layer("specdec.trees.build")
    assert layer("specdec.trees.config") < layer("specdec.trees.build") and layer("specdec") > layer("specdec.engine")
    edges = _graph()
    edges["specdec.draft_registry"].add("specdec.drafters.base")  # the registry once checked builds against Drafter
    assert any(layer(t) > layer(m) for m, targets in edges.items() for t in targets)


def test_quant_is_a_leaf():
    """``quant`` (the quantized copies the drafters build) loads no model, reads no prompt and runs no verifier: its
    report, which does, is the application ``specdec.quant_report`` above it."""
    apps = ("specdec.models", "specdec.prompts", "specdec.runners", *TOP)
    reached = {(m, t) for m, targets in _graph().items() if m.startswith("specdec.quant.") or m == "specdec.quant"
               for t in targets if t.startswith(apps)}
    assert reached == set(), sorted(reached)


def test_no_module_over_500_lines():
    big = {str(p.relative_to(ROOT)): n for p in _modules().values() if (n := len(p.read_text().splitlines())) > 500}
    assert big == {}


def test_the_engine_asks_no_kind():
    """No ``isinstance`` in the loop: a plan answers for chains and trees, ``verify`` dispatches on the drafts."""
    calls = [n for n in ast.walk(ast.parse((ROOT / "engine.py").read_text()))
             if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "isinstance"]
    assert calls == []
