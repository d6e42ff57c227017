"""Drafters that ask for the verifier's hidden states get them from the verify pass itself, and only they."""

import pytest
import torch

import specdec
from specdec.drafters import Commit, Drafter, DraftChain
from tiny_models import make_model

PROMPT = torch.tensor([[5, 9, 14, 3, 27, 8]], device="cpu")


class RecordingDrafter(Drafter):
    """Proposes a fixed token; records the hidden states it is handed with the committed rows."""

    def __init__(self, layers):
        self.hidden_layers = tuple(layers)
        self.seen = []

    def start(self, input_ids, attention_mask, max_len, *, verifier=None, hidden=None):
        self.seen = [("start", input_ids.clone(), hidden)]

    def propose(self, rows, k, ctx):
        return DraftChain(torch.full((len(rows), k), 7, dtype=torch.long, device=rows.device))

    def commit(self, update: Commit):
        self.seen.append(("commit", [r.clone() for r in update.rows], update.added.clone(), update.hidden))

    def for_call(self):
        return self  # the test reads what this very object saw


def _reference(model, row, layers):
    with torch.no_grad():
        states = model(row.unsqueeze(0), output_hidden_states=True).hidden_states
    return torch.cat([states[i][0] for i in layers], dim=-1)


@pytest.mark.parametrize("arch,layers", [("llama", (2,)), ("qwen3", (0, 1, 2)), ("gpt2", (1,))])
def test_hidden_states_are_those_of_the_committed_positions(arch, layers):
    model = make_model(arch)
    drafter = RecordingDrafter(layers)
    spec = specdec.SpeculativeModel(model, drafter, num_draft_tokens=3)
    out = spec.generate(PROMPT, max_new_tokens=12, do_sample=False, eos_token_id=None)
    assert torch.equal(out, model.generate(PROMPT, max_new_tokens=12, do_sample=False, eos_token_id=None))
    _, ids, hidden = drafter.seen[0]
    torch.testing.assert_close(hidden[0], _reference(model, ids[0], layers), rtol=1e-4, atol=1e-4)
    commits = [s for s in drafter.seen if s[0] == "commit"]
    assert commits
    for _, rows, added, hidden in commits:
        row, n = rows[0], int(added[0])
        # the pass fed the previous newest token and the drafts: entries < added are committed positions
        ref = _reference(model, row, layers)
        first = len(row) - n - 1
        torch.testing.assert_close(hidden[0, :n], ref[first : first + n], rtol=1e-4, atol=1e-4)


def test_no_hidden_states_unless_asked(monkeypatch):
    model = make_model("llama")
    seen = []
    original = type(model).forward

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("output_hidden_states"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "forward", spy)
    spec = specdec.SpeculativeModel(model, "prompt-lookup", num_draft_tokens=3)
    spec.generate(PROMPT, max_new_tokens=8, do_sample=False)
    assert seen and not any(seen)
