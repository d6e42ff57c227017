"""One SpeculativeModel used from several threads at once gives each call its own, correct output."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import specdec
from specdec.drafters import CompositeDrafter, ModelDrafter
from tiny_models import VOCAB, make_model, perturbed_copy


def _prompts(n: int) -> list[torch.Tensor]:
    gen = torch.Generator(device="cpu").manual_seed(11)
    return [torch.randint(3, VOCAB, (1, 3 + 2 * i), generator=gen, device="cpu") for i in range(n)]


@pytest.mark.parametrize("kind", ["model", "composite", "prompt-lookup"])
def test_concurrent_calls_match_sequential_generate(kind):
    model = make_model("llama")
    draft = {"model": lambda: ModelDrafter(perturbed_copy(model, 0.05)),
             "composite": lambda: CompositeDrafter(ModelDrafter(perturbed_copy(model, 0.05))),
             "prompt-lookup": lambda: "prompt-lookup"}[kind]()
    spec = specdec.SpeculativeModel(model, draft, num_draft_tokens=3)
    prompts = _prompts(6)
    kwargs = dict(max_new_tokens=24, do_sample=False, eos_token_id=None)
    expected = [model.generate(p, **kwargs) for p in prompts]
    jobs = prompts * 3  # several rounds, so calls overlap in every phase
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda p: spec.generate(p, **kwargs), jobs))
    for i, got in enumerate(results):
        assert torch.equal(got, expected[i % len(prompts)]), f"call {i} differs"


@pytest.mark.parametrize("kind", ["head", "model"])
def test_concurrent_calls_with_captured_phases(kind):
    """``compile_verifier="graphs"`` / ``compile_drafter="graphs"``: concurrent calls borrow their own pooled caches,
    each with its own graphs (a graph writes into the buffers it was captured with), and stay exact."""
    from specdec.drafters.eagle import EagleDrafter
    from test_eagle import _random_head

    model = make_model("llama")
    draft = EagleDrafter(_random_head(model, "eagle3"), model) if kind == "head" else \
        ModelDrafter(perturbed_copy(model, 0.05))
    spec = specdec.SpeculativeModel(model, draft, num_draft_tokens=3, compile_verifier="graphs",
                                    compile_drafter="graphs")
    prompts = _prompts(6)
    kwargs = dict(max_new_tokens=24, do_sample=False, eos_token_id=None)
    expected = [model.generate(p, **kwargs) for p in prompts]
    jobs = prompts * 3
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda p: spec.generate(p, **kwargs), jobs))
    for i, got in enumerate(results):
        assert torch.equal(got, expected[i % len(prompts)]), f"call {i} differs"
    pooled = [c for caches in spec.verifier.static._free.values() for c in caches]
    assert pooled and all(c.graphs.recaptures == 0 and c.graphs.failed is None for c in pooled)
