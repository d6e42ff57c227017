"""The examples: every notebook runs top to bottom and every script runs, at small sizes.

Notebooks execute in a fresh kernel of this very interpreter (nbclient + ipykernel) with
``SPECDEC_NB_SMALL=1``; any cell error fails the test. The model scripts run in-process on the
session's already loaded SmolLM2 (``main(argv, model=..., tokenizer=...)``) to save reloading it;
``kv_cache.py`` needs no model and runs as a real subprocess. The check that notebooks are stored
without outputs is fast and always runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
EXPECTED_NOTEBOOKS = {"01_quickstart", "02_acceptance", "03_kv_cache", "04_two_phases", "05_structured_output"}
PLOTTING_NOTEBOOKS = {"02_acceptance", "03_kv_cache", "04_two_phases"}
KERNEL = "specdec-examples"


def test_notebooks_are_stored_without_outputs():
    assert EXPECTED_NOTEBOOKS <= {p.stem for p in NOTEBOOKS}
    for path in NOTEBOOKS:
        nb = json.loads(path.read_text(encoding="utf-8"))
        for i, cell in enumerate(nb["cells"]):
            if cell["cell_type"] != "code":
                continue
            assert cell.get("outputs") == [], f"{path.name}: code cell {i} has outputs; strip them before committing"
            assert cell.get("execution_count") is None, f"{path.name}: code cell {i} has an execution_count"


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory) -> str:
    """A kernel spec that runs this interpreter, whatever `python` on PATH or installed specs say."""
    pytest.importorskip("ipykernel", reason="notebook tests need ipykernel (pip install nbclient ipykernel)")
    root = tmp_path_factory.mktemp("kernels")
    spec = root / KERNEL
    spec.mkdir()
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"}))
    return str(root)


@pytest.fixture
def small_env(monkeypatch):
    """Environment the kernel inherits: small sizes, and one thread per xdist worker (as conftest does)."""
    monkeypatch.setenv("SPECDEC_NB_SMALL", "1")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path, kernel_dir: str, small_env):
    nbformat = pytest.importorskip("nbformat", reason="notebook tests need nbformat")
    nbclient = pytest.importorskip("nbclient", reason="notebook tests need nbclient")
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    nb = nbformat.read(path, as_version=4)
    km = KernelManager(kernel_name=KERNEL, kernel_spec_manager=KernelSpecManager(kernel_dirs=[kernel_dir]))
    client = nbclient.NotebookClient(nb, km=km, timeout=600, resources={"metadata": {"path": str(EXAMPLES)}})
    client.execute()  # raises CellExecutionError (with the cell's traceback) on any error

    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), "not every cell ran"
    if path.stem in PLOTTING_NOTEBOOKS:
        images = [o for c in code for o in c.outputs if "image/png" in o.get("data", {})]
        assert images, f"{path.name} drew no figure"


def _load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"specdec_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("name", ["quickstart", "acceptance", "two_phases"])
def test_example_script_runs(name: str, smollm2, tmp_path, capsys):
    model, tokenizer = smollm2
    out = tmp_path / f"{name}.png"
    argv = ["--small"] if name == "quickstart" else ["--small", "--out", str(out)]
    assert _load_script(name).main(argv, model=model, tokenizer=tokenizer) == 0
    assert not hasattr(model, "_specdec_original_generate"), "the script left the model patched"
    printed = capsys.readouterr().out
    if name == "quickstart":
        assert "identical to model.generate: True" in printed
    else:
        assert out.stat().st_size > 0 and f"figure saved to {out}" in printed


@pytest.mark.slow
def test_kv_cache_script_runs(tmp_path):
    out = tmp_path / "kv.png"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(EXAMPLES / "kv_cache.py"), "--small", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "max batch" in proc.stdout and out.stat().st_size > 0
