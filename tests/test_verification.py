"""specdec.verification: one verify pass over a chain or a tree, what it accepts, and what the cache keeps.

The pass runs on a real cache session of a tiny model; the expected tokens are the model's own greedy ones.
"""

import torch

from specdec.arguments import prepare_generation
from specdec.protocol import Commit, DraftChain, Rows
from specdec.trees.tree import DraftTree
from specdec.verification import verify
from specdec.runners import CausalLMRunner
from tiny_models import make_model

PROMPT = torch.tensor([[5, 9, 14, 3, 7]])


def _greedy(model, n: int) -> list[int]:
    out = model.generate(PROMPT, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, PROMPT.shape[1]:].tolist()


def _pass(model, drafts):
    """Prefill the prompt, commit the model's first token, then verify ``drafts`` after it."""
    runner = CausalLMRunner(model)
    setup = prepare_generation(model, PROMPT, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    cache, prompt = runner.prefill(PROMPT, None, 64)
    first = int(prompt.logits.argmax(-1))
    rows = Rows.from_list([torch.cat([PROMPT[0], torch.tensor([first])])])
    fed = cache.counts
    return cache, rows, fed, verify(cache, rows, drafts, setup, (), None)


def _next_logits_equal_a_fresh_forward(model, cache, rows, v):
    """The cache invariant: it holds every committed token but the newest, so feeding that one gives the logits
    of a fresh forward over the whole row."""
    row = torch.cat([rows[0], v.tokens[0, : int(v.accepted[0]) + 1]]).unsqueeze(0)
    step = cache.forward(row[:, -1:])
    fresh = model(row).logits[:, -1]
    assert torch.allclose(step.logits[:, -1], fresh, atol=1e-4)


def test_a_chain_of_the_models_own_tokens_is_accepted_whole():
    model = make_model("llama")
    greedy = _greedy(model, 5)
    cache, rows, fed, v = _pass(model, DraftChain(torch.tensor([greedy[1:4]])))
    assert v.accepted.tolist() == [3] and v.tokens[0].tolist() == greedy[1:5]  # 3 drafts + the bonus token
    v.keep(cache, Commit(rows, v.accepted, v.accepted + 1))
    assert cache.counts.tolist() == [fed.item() + 4]
    _next_logits_equal_a_fresh_forward(model, cache, rows, v)


def test_a_wrong_first_draft_commits_the_verifiers_token_and_rolls_back():
    model = make_model("llama")
    greedy = _greedy(model, 3)
    wrong = (greedy[1] + 1) % 90 + 3
    cache, rows, fed, v = _pass(model, DraftChain(torch.tensor([[wrong, greedy[2]]])))
    assert v.accepted.tolist() == [0] and v.tokens[0, 0].item() == greedy[1]
    v.keep(cache, Commit(rows, v.accepted, v.accepted + 1))
    assert cache.counts.tolist() == [fed.item() + 1]  # the root only: the rejected drafts are gone
    _next_logits_equal_a_fresh_forward(model, cache, rows, v)


def test_a_tree_keeps_its_accepted_branch_in_place():
    """Root's children: a wrong token first, then the right one with the right grandchild; the right branch is
    accepted (path = its node indices) and gathered into place in the cache."""
    model = make_model("gpt2")
    greedy = _greedy(model, 4)
    wrong = (greedy[1] + 1) % 90 + 3
    tree = DraftTree(tokens=torch.tensor([[wrong, greedy[1], greedy[2]]]), parents=torch.tensor([[-1, -1, 1]]))
    cache, rows, fed, v = _pass(model, tree)
    assert v.accepted.tolist() == [2] and v.path[0].tolist() == [1, 2]
    assert v.tokens[0, :3].tolist() == greedy[1:4]
    v.keep(cache, Commit(rows, v.accepted, v.accepted + 1))
    _next_logits_equal_a_fresh_forward(model, cache, rows, v)
