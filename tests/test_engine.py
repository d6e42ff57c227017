"""specdec.engine through its protocol (specdec/protocol.py): the loop asks a DraftPlan for each pass's drafts,
verification dispatches on their kind, and the plan hears the outcome; the loop never asks which kind it holds."""

import pytest
import torch

from specdec.arguments import prepare_generation
from specdec.chains import ChainPlan
from specdec.drafters import ModelDrafter, PromptLookupDrafter
from specdec.engine import speculative_generate
from specdec.protocol import DraftPlan, Drafts
from specdec.trees.config import TreeConfig
from specdec.trees.plan import TreePlan
from specdec.verification import verify
from specdec.runners import CausalLMRunner
from tiny_models import make_model, perturbed_copy

IDS = torch.tensor([[5, 9, 14, 3, 7, 5, 9]])


def _setup(model, new=20):
    return prepare_generation(model, IDS, max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)


class Alternating(DraftPlan):
    """A plan of the test's own: k = 1, 3, 1, 3 ... and a record of what it was told."""

    def __init__(self) -> None:
        self.num_draft_tokens = 3
        self.passes = 0
        self.told: list[tuple[int, int]] = []

    def propose(self, drafter, rows, room, ctx) -> Drafts:
        self.passes += 1
        return drafter.propose(rows, min(room, 1 if self.passes % 2 else 3), ctx)

    def update(self, drafts, accepted, draft_seconds, verify_seconds, drafter_forwards, path=None) -> None:
        self.told.append((drafts.num_tokens, int(accepted[0])))


def test_any_draft_plan_drives_the_loop_and_hears_every_pass():
    model = make_model("llama")
    plan = Alternating()
    result = speculative_generate(CausalLMRunner(model), ModelDrafter(perturbed_copy(model, 0.05)), _setup(model), plan)
    assert torch.equal(result.sequences, model.generate(IDS, max_new_tokens=20, do_sample=False, eos_token_id=None))
    assert len(plan.told) == plan.passes == result.stats.verifier_forwards  # the prefill is no verify pass
    assert [k for k, _ in plan.told[:4]] == [1, 3, 1, 3]
    assert all(0 <= a <= k for k, a in plan.told)
    assert result.stats.tree is None and result.stats.num_draft_tokens == 3


def test_chain_and_tree_plans_give_generates_output():
    model = make_model("gpt2")
    expected = model.generate(IDS, max_new_tokens=20, do_sample=False, eos_token_id=None)
    draft = ModelDrafter(perturbed_copy(model, 0.05))
    for plan in (ChainPlan.fixed(4), TreePlan(TreeConfig("dynamic"), new_tokens=20, num_draft_tokens=4)):
        result = speculative_generate(CausalLMRunner(model), draft, _setup(model), plan)
        assert torch.equal(result.sequences, expected)
    assert result.stats.tree["mode"] == "dynamic" and result.stats.mean_tree_tokens > 4


def test_a_tree_plan_refuses_a_drafter_that_cannot_draft_trees():
    class ChainsOnly(PromptLookupDrafter):
        supports_tree = False

    model = make_model("llama")
    with pytest.raises(ValueError, match="cannot draft trees"):
        speculative_generate(CausalLMRunner(model), ChainsOnly(), _setup(model), TreePlan(TreeConfig("static")))


def test_verify_names_what_it_cannot_verify():
    class Strange(Drafts):
        tokens, probs = torch.zeros(1, 1, dtype=torch.long), None

    with pytest.raises(TypeError, match="cannot verify Strange"):
        verify(None, None, Strange(), None, (), None)


def test_plans_size_caches_with_one_formula():
    chain, tree = ChainPlan.fixed(4), TreePlan(TreeConfig("static"), num_draft_tokens=4)
    assert tree.slots(1, 10, 40) == chain.slots(1, 10, 40) + tree.extra_slots
    assert chain.widths == (5,) and tree.widths[-1] == tree.max_nodes + 1
    assert chain.max_drafts == 4 and tree.max_drafts == tree.max_nodes
