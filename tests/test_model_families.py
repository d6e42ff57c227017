"""The support matrix (docs/models.md): every family of tests/families.py under every mode is exact against
``model.generate``, or refused in one line that names the feature and the reason, and only where
:data:`REFUSALS` says so. ``benchmarks/model_matrix.py`` runs this file and writes docs/models.md from it."""

from __future__ import annotations

import os

import pytest
import torch

import specdec
from specdec.runners.hf import UnsupportedModelError
from families import FAMILIES, MODES, SAMPLING, record
from law import ALPHA, chi2, exact_joint, tally

# (family kind or model_type, mode) -> words the refusal must contain; any other refusal fails the test
REFUSALS: dict[tuple[str, str], str] = {}

_MODELS: dict[str, torch.nn.Module] = {}


def _model(family: str) -> torch.nn.Module:
    if family not in _MODELS:
        _MODELS[family] = FAMILIES[family].build()
    return _MODELS[family]


def _refusal_allowed(family: str, mode: str, err: UnsupportedModelError) -> None:
    message = str(err)
    assert "\n" not in message, f"a refusal is one line: {message!r}"
    words = REFUSALS.get((family, mode)) or REFUSALS.get((FAMILIES[family].kind, mode))
    assert words is not None, f"{family} / {mode} refused where it should run: {message}"
    assert words in message, f"{family} / {mode} refused for another reason: {message}"


def _cell(family: str, mode: str, run) -> None:
    """Run one cell, record its outcome and assert it is exact or an allowed refusal."""
    model = _model(family)
    try:
        got, expected = run(model)
    except UnsupportedModelError as err:
        record(family, mode, "refused", str(err))
        _refusal_allowed(family, mode, err)
        return
    except Exception as err:  # generate itself may fail on a config: reported, not counted
        if _hf_cannot(model):
            record(family, mode, "hf-cannot", f"{type(err).__name__}: {err}")
            pytest.skip(f"transformers' generate cannot run {family}")
        record(family, mode, "error", f"{type(err).__name__}: {err}")
        raise
    same = torch.equal(got, expected)
    record(family, mode, "exact" if same else "differs")
    assert same, f"{family} / {mode}: {got.tolist()} != generate's {expected.tolist()}"
    assert (family, mode) not in REFUSALS, f"{family} / {mode} now runs: drop it from REFUSALS"


def _hf_cannot(model: torch.nn.Module) -> bool:
    try:
        model.generate(torch.ones(1, 3, dtype=torch.long, device=model.device), max_new_tokens=2, do_sample=False)
    except Exception:
        return True
    return False


def _params():
    for family in FAMILIES:
        for mode in MODES.values():
            yield pytest.param(family, mode.name, id=f"{family}-{mode.name}",
                               marks=[pytest.mark.slow] if mode.slow else [])


@pytest.mark.parametrize("family, mode", list(_params()))
def test_cell(family, mode):
    if MODES[mode].slow and not os.environ.get("SPECDEC_MATRIX_JSON"):
        # inductor compiles for minutes per family on a CPU: benchmarks/model_matrix.py runs this column; the
        # "compiled" column (dynamo's eager backend, the same static passes) is its fast twin in every run
        pytest.skip("the inductor column runs from benchmarks/model_matrix.py")
    _cell(family, mode, MODES[mode].run)


def _sampled(model: torch.nn.Module, prompt: torch.Tensor, steps: int, rows: int, **sampling) -> list[list[int]]:
    fast = specdec.SpeculativeModel(model, draft="self:bf16", num_draft_tokens=2)
    out = fast.generate(prompt.expand(rows, -1), max_new_tokens=steps, min_new_tokens=steps, do_sample=True,
                        generator=torch.Generator(device="cpu").manual_seed(0), **sampling)
    return out[:, prompt.shape[1]:].tolist()


_LAW = dict(temperature=1.0, top_k=3)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_sampling_law(family):
    """Rows sampled in one batched call follow the verifier's own law of 3-token continuations (top-3)."""
    prompt, steps, rows = torch.tensor([[5, 9, 14, 5]], device="cpu"), 3, 600

    def run(model):
        samples = _sampled(model, prompt, steps, rows, **_LAW)
        law = exact_joint(model, prompt, steps, min_new_tokens=steps, **_LAW)
        p = chi2(tally(samples), law, rows)
        if p <= ALPHA:
            return torch.tensor([p]), torch.tensor([1.0])  # "differs", with the p-value in the message
        return torch.zeros(1), torch.zeros(1)

    _cell(family, SAMPLING, run)


def test_sampling_law_check_can_fail():
    """Negative control: the same check rejects samples drawn at another temperature."""
    model = _model("llama")
    prompt = torch.tensor([[5, 9, 14, 5]], device="cpu")
    samples = _sampled(model, prompt, 3, 600, temperature=3.0, top_k=3)
    assert chi2(tally(samples), exact_joint(model, prompt, 3, min_new_tokens=3, **_LAW), 600) <= ALPHA
