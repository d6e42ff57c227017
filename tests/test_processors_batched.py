"""Every context-dependent logits processor, on left-padded batches: token-identical to batched ``generate``.

``generate`` builds some processors from the whole batch (the repetition penalty skips each row's left
padding, read from the attention mask; ``prefix_allowed_tokens_fn`` is told each row's batch index;
the encoder penalties read each row's prompt). specdec applies processors row by row, so each row must
get exactly what ``generate`` gives it, for every drafter kind, chains and trees, and with pad = eos.
(transformers has no frequency-penalty processor; ``repetition_penalty`` is its count-free cousin.)
"""

from __future__ import annotations

import pytest
import torch

import specdec
from test_eagle import _public_eagle3
from tiny_models import VOCAB, make_model, perturbed_copy

LENGTHS = [3, 11, 7, 5]
NEW = 24


def _batch(pad: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A left-padded batch whose prompts repeat tokens (so penalties, n-grams and lookup have work to do)."""
    gen = torch.Generator().manual_seed(seed)
    width = max(LENGTHS)
    ids = torch.full((len(LENGTHS), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, n in enumerate(LENGTHS):
        words = torch.randint(3, VOCAB, (max(2, n // 2),), generator=gen)
        ids[r, width - n:] = words[torch.randint(0, len(words), (n,), generator=gen)]
        mask[r, width - n:] = 1
    return ids, mask


def _allowed(batch_id: int, sent: torch.Tensor) -> list[int]:
    """A constraint that depends on the row and on its context, as prefix_allowed_tokens_fn may."""
    last = int(sent[-1])
    return [t for t in range(VOCAB) if (t + 2 * batch_id + last) % 3 != 0]


PROCESSORS = {
    "repetition_penalty": dict(repetition_penalty=1.3),
    "encoder_repetition_penalty": dict(encoder_repetition_penalty=1.5),
    "no_repeat_ngram": dict(no_repeat_ngram_size=2),
    "encoder_no_repeat_ngram": dict(encoder_no_repeat_ngram_size=2),
    "bad_words": dict(bad_words_ids=[[5], [7, 8], [11, 12, 13]]),
    "sequence_bias": dict(sequence_bias={(5,): -4.0, (7, 8): 6.0, (20, 21, 22): 5.0}),
    "min_new_tokens": dict(min_new_tokens=12),
    "prefix_allowed": dict(prefix_allowed_tokens_fn=_allowed),
}


@pytest.fixture(scope="module")
def model():
    return make_model("llama")


@pytest.fixture(scope="module")
def drafts(model, tmp_path_factory):
    """Every drafter kind (names or objects), for the tiny llama."""
    head = _public_eagle3(tmp_path_factory.mktemp("head"), draft_vocab=VOCAB)
    return {"model": perturbed_copy(model, 0.05), "prompt-lookup": "prompt-lookup", "layer-skip": "layer-skip:1",
            "composite": "composite:bf16", "eagle": f"eagle:{head}"}


def _kwargs(model, ids, mask, pad: int, which: str) -> dict:
    kwargs = dict(attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=pad, eos_token_id=None,
                  **PROCESSORS[which])
    if which == "min_new_tokens" or pad == 2:
        # an EOS the batch would emit early: min_new_tokens must hold it back; with pad == eos, rows stop
        free = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=pad,
                              eos_token_id=None)
        kwargs["eos_token_id"] = 2 if pad == 2 else int(free[1, ids.shape[1] + 3])
    return kwargs


def _check(model, draft, which: str, pad: int, tree=None, seed: int = 0) -> None:
    ids, mask = _batch(pad, seed)
    kwargs = _kwargs(model, ids, mask, pad, which)
    expected = model.generate(ids, **kwargs)
    spec = specdec.SpeculativeModel(model, draft, num_draft_tokens=4, tree=tree)
    got = spec.generate(ids, **kwargs)
    assert torch.equal(got, expected), f"{which} pad={pad} tree={tree}: rows differ " \
        f"{[r for r in range(len(LENGTHS)) if not torch.equal(got[r], expected[r])]}"


@pytest.mark.parametrize("pad", [0, 2], ids=["pad0", "pad-eos"])
@pytest.mark.parametrize("which", sorted(PROCESSORS))
def test_model_drafter_chain(model, drafts, which, pad):
    _check(model, drafts["model"], which, pad)


@pytest.mark.parametrize("tree", ["static", "dynamic", "auto"])
@pytest.mark.parametrize("which", sorted(PROCESSORS))
def test_model_drafter_trees(model, drafts, which, tree):
    _check(model, drafts["model"], which, 0, tree=tree)


@pytest.mark.parametrize("tree", [None, "dynamic"])
@pytest.mark.parametrize("kind", ["prompt-lookup", "layer-skip", "composite", "eagle"])
@pytest.mark.parametrize("which", ["repetition_penalty", "prefix_allowed", "no_repeat_ngram", "encoder_repetition_penalty"])
def test_every_drafter_kind(model, drafts, kind, which, tree):
    _check(model, drafts[kind], which, 0, tree=tree, seed=1)


def test_repetition_penalty_with_pad_eos_every_tree_mode(model, drafts):
    for tree in ("static", "dynamic", "auto"):
        _check(model, drafts["model"], "repetition_penalty", 2, tree=tree, seed=2)


def test_rows_that_finish_keep_their_own_processors(model, drafts):
    """Rows leave the batch at different steps: the rows still running must keep their own processors
    (the row's index in the call's batch, not in the shrinking active batch)."""
    ids, mask = _batch(0, seed=3)
    free = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                          eos_token_id=None, prefix_allowed_tokens_fn=_allowed)
    eos = int(free[0, ids.shape[1] + 2])  # row 0 stops early; later rows are then at other active positions
    kwargs = dict(attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0, eos_token_id=eos,
                  prefix_allowed_tokens_fn=_allowed, repetition_penalty=1.3)
    expected = model.generate(ids, **kwargs)
    got = specdec.SpeculativeModel(model, drafts["model"], num_draft_tokens=4).generate(ids, **kwargs)
    assert torch.equal(got, expected)


def test_context_free_warpers_run_once_per_depth_not_per_node(model, drafts, monkeypatch):
    """Sampling trees: temperature / top-k read only the scores, so a depth's nodes share one call (was one per node)."""
    import transformers.generation.logits_process as lp

    calls = []
    original = lp.TopKLogitsWarper.__call__
    monkeypatch.setattr(lp.TopKLogitsWarper, "__call__", lambda self, ids, scores: calls.append(1) or original(self, ids, scores))
    spec = specdec.SpeculativeModel(model, drafts["model"], num_draft_tokens=4, tree="dynamic")
    ids, _ = _batch(0)
    spec.generate(ids[:1], max_new_tokens=NEW, do_sample=True, top_k=20, temperature=0.8, eos_token_id=None,
                  generator=torch.Generator().manual_seed(0))
    depth, passes = spec.tree.depth, spec.last_stats.verifier_forwards
    assert len(calls) <= 1 + passes * (depth + 2)  # first token; per pass: each depth grown, and the verify pass


def test_context_free_batching_matches_one_call_per_row():
    """The batched warpers give exactly what one call per row gives."""
    from transformers import LogitsProcessorList

    from specdec.processing import RowProcessors

    import transformers.generation.logits_process as lp

    procs = LogitsProcessorList([lp.RepetitionPenaltyLogitsProcessor(1.3), lp.TemperatureLogitsWarper(0.7),
                                 lp.TopKLogitsWarper(5), lp.TopPLogitsWarper(0.9)])
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, VOCAB, generator=gen)
    contexts = [(0, torch.randint(0, VOCAB, (n,), generator=gen)) for n in (3, 5, 5, 8, 2, 9)]
    got = RowProcessors(procs).apply(contexts, logits)
    want = torch.cat([procs(ids.unsqueeze(0), logits[i:i + 1]) for i, (_, ids) in enumerate(contexts)])
    assert torch.equal(got, want)
