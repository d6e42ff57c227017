"""PARD training (An et al., ICLR 2026; AMD-AGI/PARD's ``pard_train.py``): a causal LM learns to predict ``k`` tokens
from one forward, mask tokens standing in for the tokens it has not seen.

Each sequence ``x_0 .. x_{L-1}`` is trained with ``copies - 1`` masked copies in one forward. Item ``(j, t)``: copy
``j`` at position ``t`` (position id ``t``) holds ``x_t`` for ``j = 0`` and the mask token otherwise, and predicts
``x_{t+1}`` from the real tokens up to ``x_{t-j}`` and the masks of copies ``j-1 .. 1`` at positions ``t-1 .. t-j+1``:
exactly what the ``j``-th mask after ``x_{t-j}`` sees when drafting. Conditional drop-token (COD) keeps every item of
copy 0 and a random ``max(keep^j, floor)`` share of copy ``j``'s, each with the item of copy ``j - 1`` before it (which
it attends to).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PardExample:
    """One sequence laid out for a PARD training forward (``N`` items)."""

    input_ids: torch.Tensor  # [N]
    position_ids: torch.Tensor  # [N]
    labels: torch.Tensor  # [N] the token each item predicts (-100: none)
    allowed: torch.Tensor  # [N, N] bool: which items each item attends to
    copies: torch.Tensor  # [N] the copy each item belongs to (0: the real tokens)


def pard_example(ids: list[int], copies: int, masks: list[int], keep: float = 0.7, floor: float = 0.2,
                 generator: torch.Generator | None = None) -> PardExample:
    """The items of sequence ``ids`` with ``copies - 1`` masked copies (copy ``j`` holds ``masks[j - 1]``, the last
    mask repeating), under COD with ``keep`` and ``floor`` (``keep=1``: every item)."""
    length = len(ids)
    chosen = [list(range(length))]
    for j in range(1, copies):
        # an item needs the previous copy's item one position back, a real token to see (t >= j) and a target
        reachable = [t + 1 for t in chosen[-1] if j <= t + 1 <= length - 2]
        count = min(len(reachable), int(length * max(keep ** j, floor)))
        if count == 0:
            break
        order = torch.randperm(len(reachable), generator=generator, device="cpu")[:count].sort().values.tolist()
        chosen.append([reachable[i] for i in order])
    copy = torch.tensor([j for j, ts in enumerate(chosen) for _ in ts], dtype=torch.long, device="cpu")  # a layout
    pos = torch.tensor([t for ts in chosen for t in ts], dtype=torch.long, device="cpu")
    seq = torch.tensor(ids, dtype=torch.long, device="cpu")
    mask_of = torch.tensor([0] + [masks[min(j - 1, len(masks) - 1)] for j in range(1, copies)], dtype=torch.long,
                           device="cpu")
    input_ids = torch.where(copy == 0, seq[pos], mask_of[copy])
    labels = torch.where(pos + 1 < length, seq[(pos + 1).clamp(max=length - 1)], -100)
    jq, tq, jk, tk = copy[:, None], pos[:, None], copy[None, :], pos[None, :]
    real = (jk == 0) & (tk <= tq - jq)
    diagonal = (jk >= 1) & (jk <= jq) & (jq - jk == tq - tk)
    return PardExample(input_ids, pos, labels, real | diagonal, copy)


def pard_loss(model: torch.nn.Module, example: PardExample) -> torch.Tensor:
    """Mean cross-entropy of ``model`` on ``example``'s items with a target (one forward, its own 4-D mask)."""
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    bias = torch.zeros(example.allowed.shape, dtype=dtype, device=device)
    bias.masked_fill_(~example.allowed.to(device), torch.finfo(dtype).min)
    logits = model(input_ids=example.input_ids.to(device)[None], position_ids=example.position_ids.to(device)[None],
                   attention_mask=bias[None, None], use_cache=False).logits[0]
    return torch.nn.functional.cross_entropy(logits.float(), example.labels.to(device), ignore_index=-100)
