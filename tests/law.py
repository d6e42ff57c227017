"""The sampling law's check: a chi-square of sampled continuations against the verifier's exact distribution."""

from __future__ import annotations

import torch
from scipy.stats import chisquare

from specdec.arguments import prepare_generation

ALPHA = 1e-3  # a correct implementation fails this with probability 0.001 per test (seeds are fixed anyway)


def chi2(counts: dict, probs: dict, n: int) -> float:
    """Chi-square p-value, pooling cells whose expected count is below 5 into one."""
    obs, exp, pool_o, pool_e = [], [], 0.0, 0.0
    for key, p in probs.items():
        if p * n >= 5:
            obs.append(counts.get(key, 0))
            exp.append(p * n)
        else:
            pool_o += counts.get(key, 0)
            pool_e += p * n
    assert sum(counts.get(k, 0) for k in counts if k not in probs) == 0, "sampled an impossible outcome"
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    scale = sum(obs) / sum(exp)
    return chisquare(obs, [e * scale for e in exp]).pvalue


def exact_joint(model, prompt: torch.Tensor, steps: int, **sampling) -> dict:
    """P(t1..t_steps) under the verifier's processed distribution, by enumeration."""
    setup = prepare_generation(model, prompt, do_sample=True, max_new_tokens=steps, **sampling)
    probs = {(): 1.0}
    for _ in range(steps):
        nxt = {}
        for prefix, mass in probs.items():
            ids = torch.cat([prompt, torch.tensor([prefix], dtype=torch.long, device=prompt.device).reshape(1, -1)], dim=1)
            with torch.no_grad():
                logits = model(ids).logits[:, -1].float()
            dist = torch.softmax(setup.processors(ids, logits), dim=-1)[0]
            for tok, pr in enumerate(dist.tolist()):
                if pr > 0:
                    nxt[prefix + (tok,)] = mass * pr
        probs = nxt
    return probs


def sampled_law(verifier, draft, rows: int = 2400, **options) -> tuple[float, object]:
    """The chi-square p-value of ``rows`` sampled 3-token continuations of a fixed prompt (T=0.9, top-k 6, seed 11)
    through ``specdec.SpeculativeModel(verifier, draft, **options)`` against the verifier's exact joint law, and that
    model (its ``last_stats``)."""
    import specdec

    prompt, steps = torch.tensor([[3, 1, 4, 3, 1]]), 3
    spec = specdec.SpeculativeModel(verifier, draft, **options)
    sampling = dict(temperature=0.9, top_k=6)
    out = spec.generate(prompt.expand(rows, -1), max_new_tokens=steps, do_sample=True,
                        generator=torch.Generator().manual_seed(11), **sampling)
    return chi2(tally(out[:, prompt.shape[1]:].tolist()), exact_joint(verifier, prompt, steps, **sampling), rows), spec


def tally(rows: list[list[int]]) -> dict:
    """How often each continuation occurs."""
    counts: dict = {}
    for row in rows:
        counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    return counts


def flat_q(propose):
    """``propose`` whose sampled chains report a flat ``q`` over the same support, not the distribution their drafts
    were drawn from: the negative control of a drafter's law test (monkeypatch it over the drafter's ``propose``)."""

    def flattened(self, rows, k, ctx):
        chain = propose(self, rows, k, ctx)
        if chain.probs is not None:
            q = (chain.probs > 0).float()
            chain.probs = q / q.sum(dim=-1, keepdim=True)
        return chain

    return flattened
