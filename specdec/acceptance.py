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
