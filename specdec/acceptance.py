"""Acceptance rules: which draft tokens to keep, and the token the verifier adds after them.

Both rules take the verifier's *processed* scores over the ``k + 1`` positions of one verify pass
(position ``j`` predicts the token after draft ``j``; position ``k`` is the bonus position) and
return, per row, the number ``n`` of accepted draft tokens and a ``[batch, k + 1]`` tensor whose
first ``n + 1`` entries are the tokens to commit. Nothing here knows about models or caches.
"""

from __future__ import annotations

import torch


def greedy_accept(draft_tokens: torch.Tensor, target_scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Longest prefix of the draft equal to the verifier's argmax, then the verifier's own token.

    Args:
        draft_tokens: ``[batch, k]`` proposed token ids.
        target_scores: ``[batch, k + 1, vocab]`` processed verifier scores.

    Returns:
        ``(num_accepted [batch], tokens [batch, k + 1])``; ``tokens[r, :n_r + 1]`` is what row ``r`` commits.
    """
    target = target_scores.argmax(dim=-1)
    k = draft_tokens.shape[1]
    matches = (draft_tokens == target[:, :k]).long()
    num_accepted = matches.cumprod(dim=-1).sum(dim=-1)
    # target[:, :n] equals the accepted drafts, target[:, n] is the correction (or the bonus when n == k).
    return num_accepted, target


def one_hot(index: torch.Tensor, classes: int, dtype: torch.dtype) -> torch.Tensor:
    """``one_hot(index, classes)`` in ``dtype`` by a scatter: ``torch.nn.functional.one_hot`` validates the ids on a
    CPU with two device reads."""
    out = torch.zeros(index.shape + (classes,), dtype=dtype, device=index.device)
    return out.scatter_(-1, index.unsqueeze(-1), 1)


def draft_distribution(scores: torch.Tensor) -> torch.Tensor:
    """The drafter's ``q = softmax(scores)`` over the last dimension, always a distribution.

    A row that is not one (NaN or inf scores from a broken drafter, or every token masked) becomes
    one-hot on its best finite score (token 0 if none). Any ``q`` the draft is sampled from keeps
    rejection sampling exact, so a drafter's garbage costs acceptance, never a crash. No device sync.
    """
    p = torch.softmax(scores, dim=-1)
    bad = ~torch.isfinite(p).all(dim=-1, keepdim=True)
    best = torch.nan_to_num(scores, nan=float("-inf"), posinf=float("-inf")).argmax(dim=-1)
    return torch.where(bad, one_hot(best, p.shape[-1], p.dtype), p)


def rejection_accept(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative rejection sampling (Leviathan et al. 2023; Chen et al. 2023).

    Draft token ``d_j ~ q_j`` is accepted with probability ``min(1, p_j(d_j) / q_j(d_j))``; at the first
    rejection the replacement is drawn from ``norm(max(0, p_j - q_j))``; if all ``k`` are accepted a bonus
    token is drawn from ``p_k``. Every committed token is then distributed exactly as the verifier's ``p``.
    A greedy drafter passes one-hot ``q``.

    Args:
        draft_tokens: ``[batch, k]`` ids sampled from ``draft_probs``.
        draft_probs: ``[batch, k, vocab]`` the drafter's processed probabilities ``q``.
        target_probs: ``[batch, k + 1, vocab]`` the verifier's processed probabilities ``p``.
        generator: optional RNG for reproducible runs.

    Returns:
        ``(num_accepted [batch], tokens [batch, k + 1])`` as in :func:`greedy_accept`.
    """
    batch, k = draft_tokens.shape
    if draft_probs.shape[:2] != (batch, k) or target_probs.shape[:2] != (batch, k + 1):
        raise ValueError(
            f"shape mismatch: drafts {tuple(draft_tokens.shape)}, q {tuple(draft_probs.shape)}, p {tuple(target_probs.shape)}"
        )
    index = draft_tokens.unsqueeze(-1)
    p_draft = target_probs[:, :k].gather(-1, index).squeeze(-1)
    q_draft = draft_probs.gather(-1, index).squeeze(-1)
    u = torch.rand((batch, k), generator=generator, device=draft_tokens.device, dtype=target_probs.dtype)
    # A q that is no distribution (NaN, inf, negative: a broken custom drafter) rejects its draft, and the
    # token is drawn from p there: exact whatever the drafter did.
    valid = (torch.isfinite(draft_probs) & (draft_probs >= 0)).all(dim=-1)
    # u < p/q, written without the division so q == 0 (impossible for a sampled token) cannot produce nan.
    accepted = ((u * q_draft < p_draft) & valid).long()
    num_accepted = accepted.cumprod(dim=-1).sum(dim=-1)

    rows = torch.arange(batch, device=draft_tokens.device)
    stop = num_accepted.clamp(max=k - 1) if k > 0 else num_accepted
    p_stop = target_probs[rows, num_accepted]
    if k > 0:
        residual = (target_probs[rows, stop] - draft_probs[rows, stop]).clamp_min(0)
        mass = residual.sum(dim=-1, keepdim=True)
        # A zero residual means p == q at that position, where rejection cannot happen; fall back to p.
        usable = (mass > 0) & valid[rows, stop].unsqueeze(-1)
        residual = torch.where(usable, residual / mass.clamp_min(torch.finfo(mass.dtype).tiny), target_probs[rows, stop])
        rejected = (num_accepted < k).unsqueeze(-1)
        final_dist = torch.where(rejected, residual, p_stop)
    else:
        final_dist = p_stop
    next_token = torch.multinomial(final_dist, num_samples=1, generator=generator).squeeze(-1)

    tokens = torch.cat([draft_tokens, next_token.unsqueeze(-1)], dim=-1)
    tokens[rows, num_accepted] = next_token
    return num_accepted, tokens


def block_accept(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification (Sun et al. 2024, arXiv 2403.10444, Algorithm 2): the chain is judged as a block.

    With ``p_0 = 1`` and ``p_i = min(1, p_{i-1} P_i(d_i) / q_i(d_i))``, the kept length is the largest ``i`` whose
    coin falls below ``h_i`` (``h_k = p_k``; below ``k``: ``h_i = Z_i / (Z_i + 1 - p_i)``, where
    ``Z_i = sum_x max(0, p_i P_{i+1}(x) - q_{i+1}(x))``), not the first rejection; the token after it is drawn from
    ``norm(max(0, p_i P_{i+1} - q_{i+1}))`` (from ``P_{k+1}`` when all ``k`` are kept). Every committed token is
    distributed as the verifier's ``P``, and no rule that sees only this draft keeps more in expectation (the
    paper's Theorem 2). With one-hot ``q`` (a drafter's deterministic drafts) it keeps as many as
    :func:`rejection_accept` in expectation: both are optimal there, and the loop then runs the cheaper token rule
    (``verification.verify_chain``). Same arguments and return as :func:`rejection_accept`.
    """
    batch, k = draft_tokens.shape
    if k == 0 or draft_probs.shape[:2] != (batch, k) or target_probs.shape[:2] != (batch, k + 1):
        return rejection_accept(draft_tokens, draft_probs, target_probs, generator)  # one rule (and its errors)
    valid = (torch.isfinite(draft_probs) & (draft_probs >= 0)).all(dim=-1)  # a broken q: its draft is rejected
    q_all = torch.where(valid.unsqueeze(-1), draft_probs, torch.zeros_like(draft_probs))
    index = draft_tokens.unsqueeze(-1)
    p_draft = target_probs[:, :k].gather(-1, index).squeeze(-1)
    q_draft = q_all.gather(-1, index).squeeze(-1)
    # P/q capped at 1 step by step; q == 0 for a drafted token (impossible when sampled from q) reads as "accept"
    ratio = torch.where(q_draft > 0, p_draft / q_draft.clamp_min(torch.finfo(q_draft.dtype).tiny),
                        (p_draft > 0).to(p_draft.dtype)) * valid
    weights = [torch.ones(batch, dtype=target_probs.dtype, device=target_probs.device)]
    for i in range(k):
        weights.append(torch.clamp(weights[-1] * ratio[:, i], max=1.0))
    w = torch.stack(weights, dim=1)  # [batch, k + 1]: p_0 .. p_k
    # residual masses Z_i (i = 0 .. k - 1) of max(0, p_i P_{i+1} - q_{i+1}); the last position has none
    residual = (w[:, :k, None] * target_probs[:, :k] - q_all).clamp_min(0)
    mass = residual.sum(dim=-1)
    denom = mass[:, 1:] + 1 - w[:, 1:k]
    h = torch.where(denom > 0, mass[:, 1:] / denom.clamp_min(torch.finfo(denom.dtype).tiny), torch.ones_like(denom))
    h = torch.cat([h, w[:, k:]], dim=1)  # [batch, k]: h_1 .. h_k
    u = torch.rand((batch, k), generator=generator, device=draft_tokens.device, dtype=target_probs.dtype)
    positions = torch.arange(1, k + 1, device=draft_tokens.device)
    num_accepted = ((u < h) * positions).amax(dim=-1)  # the last position whose coin passed, 0 if none did

    rows = torch.arange(batch, device=draft_tokens.device)
    stop = num_accepted.clamp(max=k - 1)
    res, res_mass = residual[rows, stop], mass[rows, stop].unsqueeze(-1)
    # a zero residual cannot be where the block stops (h = 0 there); the verifier's P then, as a guard
    res = torch.where(res_mass > 0, res / res_mass.clamp_min(torch.finfo(res_mass.dtype).tiny), target_probs[rows, stop])
    final_dist = torch.where((num_accepted < k).unsqueeze(-1), res, target_probs[rows, num_accepted])
    next_token = torch.multinomial(final_dist, num_samples=1, generator=generator).squeeze(-1)
    tokens = torch.cat([draft_tokens, next_token.unsqueeze(-1)], dim=-1)
    tokens[rows, num_accepted] = next_token
    return num_accepted, tokens


#: how a sampled chain is verified, by name (``SpeculativeModel(verify=...)``, ``specdec eval --verify``)
CHAIN_RULES = {"token": rejection_accept, "block": block_accept}
