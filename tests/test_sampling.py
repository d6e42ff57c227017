"""Sampling: speculative output is distributed exactly as the verifier's processed distribution."""


import pytest
import torch
import transformers as tf

import specdec
from specdec.acceptance import greedy_accept, rejection_accept
from law import ALPHA, chi2 as _chi2, exact_joint as _exact_joint
from tiny_models import perturbed_copy


def _hist(tokens: torch.Tensor) -> dict:
    values, counts = torch.unique(tokens, return_counts=True)
    return dict(zip(values.tolist(), counts.tolist()))


@pytest.mark.parametrize("k", [1, 3])
def test_rejection_sampling_recovers_target_at_every_position(k):
    gen = torch.Generator().manual_seed(k)
    vocab, rows = 6, 200_000
    p = torch.distributions.Dirichlet(torch.ones(vocab)).sample((k + 1,))
    q = torch.distributions.Dirichlet(torch.ones(vocab)).sample((k,))
    q[0, 2] = 0.0  # the drafter can never propose token 2 at position 0, the verifier can
    q[0] /= q[0].sum()
    drafts = torch.stack([torch.multinomial(q[j], rows, replacement=True, generator=gen) for j in range(k)], dim=1)
    n, tokens = rejection_accept(drafts, q.expand(rows, k, vocab), p.expand(rows, k + 1, vocab), gen)
    expected_accept0 = torch.minimum(p[0], q[0]).sum().item()
    assert abs((n >= 1).float().mean().item() - expected_accept0) < 0.01
    for j in range(k + 1):
        reached = n >= j  # rows whose j-th committed token exists
        pval = _chi2(_hist(tokens[reached, j]), dict(enumerate(p[j].tolist())), int(reached.sum()))
        assert pval > ALPHA, f"position {j}: p={pval}"


def test_rejection_sampling_test_detects_a_wrong_rule():
    """The same check rejects the naive rule "keep the draft token" (q instead of p)."""
    gen = torch.Generator().manual_seed(0)
    vocab, rows = 6, 50_000
    p = torch.distributions.Dirichlet(torch.ones(vocab)).sample()
    q = torch.distributions.Dirichlet(torch.ones(vocab)).sample()
    drafts = torch.multinomial(q, rows, replacement=True, generator=gen)
    assert _chi2(_hist(drafts), dict(enumerate(p.tolist())), rows) < ALPHA


def test_one_hot_draft_and_greedy_rules():
    p = torch.tensor([[[0.1, 0.6, 0.3], [0.5, 0.25, 0.25]]])
    drafts = torch.tensor([[1]])
    n, tokens = greedy_accept(drafts, p.log())
    assert n.tolist() == [1] and tokens[0, :2].tolist() == [1, 0]
    # one-hot q: acceptance probability is p(draft) = 0.6
    gen = torch.Generator().manual_seed(1)
    rows = 100_000
    q = torch.nn.functional.one_hot(drafts.expand(rows, 1), 3).float()
    n, tokens = rejection_accept(drafts.expand(rows, 1), q, p.expand(rows, 2, 3), gen)
    assert abs(n.float().mean().item() - 0.6) < 0.01
    # after rejecting token 1 the residual is p with token 1 removed: [0.25, 0, 0.75]
    rejected = tokens[n == 0, 0]
    assert (rejected != 1).all()
    assert abs((rejected == 2).float().mean().item() - 0.75) < 0.01


def _tiny_vocab_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = tf.LlamaConfig(vocab_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, initializer_range=0.4,
                            bos_token_id=None, eos_token_id=None, pad_token_id=0)
    return tf.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize(
    "sampling",
    [dict(temperature=1.0, top_k=0, top_p=1.0), dict(temperature=0.7, top_k=5, top_p=0.9, repetition_penalty=1.5)],
    ids=["plain", "temperature-topk-topp-penalty"],
)
@pytest.mark.parametrize("self_draft", [False, True], ids=["perturbed-drafter", "identical-drafter"])
def test_generated_sequences_follow_the_verifier(sampling, self_draft):
    verifier = _tiny_vocab_model(0)
    draft = verifier if self_draft else perturbed_copy(verifier, 0.5)
    prompt = torch.tensor([[3, 1, 4]])
    steps, rows, calls = 3, 1500, 2
    spec = specdec.SpeculativeModel(verifier, draft, num_draft_tokens=2)
    gen = torch.Generator().manual_seed(42)
    samples = []
    for _ in range(calls):
        out = spec.generate(prompt.expand(rows, -1), max_new_tokens=steps, do_sample=True, generator=gen, **sampling)
        samples += [tuple(r) for r in out[:, 3:].tolist()]
    exact = _exact_joint(verifier, prompt, steps, **sampling)
    counts = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    pval = _chi2(counts, exact, len(samples))
    assert pval > ALPHA, f"p={pval}"
    if self_draft:
        assert spec.last_stats.acceptance_rate == pytest.approx(1.0)


def test_single_row_sampling_exercises_multi_token_acceptance():
    """Batch of one: accepted prefixes of every length and the bonus token occur, and the law still holds."""
    verifier = _tiny_vocab_model(1)
    draft = perturbed_copy(verifier, 0.3)
    prompt = torch.tensor([[2, 7]])
    spec = specdec.SpeculativeModel(verifier, draft, num_draft_tokens=3)
    gen = torch.Generator().manual_seed(7)
    sampling = dict(temperature=0.9, top_k=3)
    counts, committed = {}, []
    n = 1500
    for _ in range(n):
        out = spec.generate(prompt, max_new_tokens=4, do_sample=True, generator=gen, **sampling)
        key = tuple(out[0, 2:].tolist())
        counts[key] = counts.get(key, 0) + 1
        committed += spec.last_stats.committed_per_step
    exact = _exact_joint(verifier, prompt, 4, **sampling)
    assert _chi2(counts, exact, n) > ALPHA
    # after the prefill token two drafts fit: rejection at 0, at 1, and the bonus after both all happen
    assert set(committed) == {1, 2, 3}


def test_each_row_of_a_ragged_batch_follows_its_own_distribution():
    """Different prompts, left padded into one batch, each row sampled by its own law (padding never leaks)."""
    verifier = _tiny_vocab_model(2)
    draft = perturbed_copy(verifier, 0.4)
    prompts = [torch.tensor([[5]]), torch.tensor([[1, 6, 2, 7]])]
    rows, steps = 1200, 3
    ids = torch.zeros(2 * rows, 4, dtype=torch.long)
    mask = torch.zeros_like(ids)
    ids[:rows, 3:], mask[:rows, 3:] = prompts[0], 1
    ids[rows:], mask[rows:] = prompts[1], 1
    spec = specdec.SpeculativeModel(verifier, draft, num_draft_tokens=2)
    sampling = dict(temperature=0.8, top_k=4)
    out = spec.generate(ids, attention_mask=mask, max_new_tokens=steps, do_sample=True,
                        generator=torch.Generator().manual_seed(3), pad_token_id=0, **sampling)
    for half, prompt in enumerate(prompts):
        counts = {}
        for r in out[half * rows : (half + 1) * rows, 4:].tolist():
            counts[tuple(r)] = counts.get(tuple(r), 0) + 1
        assert _chi2(counts, _exact_joint(verifier, prompt, steps, **sampling), rows) > ALPHA, f"prompt {half}"
