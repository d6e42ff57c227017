"""PARD: a draft model that proposes ``k`` tokens in one forward (An et al., ICLR 2026, arXiv 2504.18583; AMD-AGI/PARD).

A PARD checkpoint is a small causal LM of the verifier's vocabulary, fine-tuned so that mask tokens appended after the
last real token predict the tokens after it: fed ``[committed..., M x (k - 1)]``, its last ``k`` positions give the
distributions of the next ``k`` tokens, the first from the last real token, the ``i``-th from the ``i - 1``-th mask.
Its config names the mask token (``pard_token``: one id, or one per position). After drafting, the mask positions
are dropped from its cache, so the cache only ever holds committed tokens and a commit has nothing to roll back.

Each position's distribution does not depend on the drafts before it, so a draft sampled from it has exactly that
``q``: sampling stays exact. Trees take each depth's children from that depth's top-ranked tokens (the same for every
parent), with no further forward. It reads no hidden states of the verifier, so one PARD model serves a family.
"""

from __future__ import annotations

from typing import Any

import torch

from specdec.drafters.model import ModelDrafter
from specdec.drafters.scores import chain_of_positions, tree_of_positions
from specdec.errors import SpecdecError
from specdec.protocol import DraftChain, DraftContext, Rows
from specdec.trees.build import TreeShape
from specdec.transfer import upload
from specdec.trees.tree import DraftTree


class PardConfigError(SpecdecError, ValueError):
    """A model named as a PARD drafter whose config names no mask token (``pard_token``)."""


def pard_tokens(config: Any) -> list[int]:
    """The mask token(s) a PARD model's ``config`` names (``pard_token``: an id or a list of ids, one per position)."""
    token = getattr(config, "pard_token", None)
    if token is None or token == -1 or token == [-1]:
        raise PardConfigError(f"{getattr(config, 'name_or_path', '') or 'the draft model'}: its config names no "
                              "pard_token (the mask token a PARD model was trained with); train one with "
                              "specdec train-pard, or use it as a plain draft model")
    return [int(t) for t in token] if isinstance(token, (list, tuple)) else [int(token)]


class PardDrafter(ModelDrafter):
    """Drafts ``k`` tokens per row with one forward of a PARD model (``model``; see the module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model)
        self.masks = pard_tokens(model.config)

    @property
    def captures_graphs(self) -> bool:
        return False

    def compile_graphs(self) -> None:
        raise ValueError("compile_drafter='graphs': a PARD drafter's block forward is not captured yet; use "
                         "compile_drafter=True")

    def _mask_ids(self, n: int) -> list[int]:
        """The ``n`` mask tokens after the last real one (the last listed id repeats past the list)."""
        return [self.masks[min(i, len(self.masks) - 1)] for i in range(n)]

    def _block(self, rows: Rows, n: int) -> torch.Tensor:
        """Feed each row's newly committed tokens and ``n - 1`` mask tokens in one forward; the logits ``[B, n, V]``
        of the last ``n`` positions (the next ``n`` tokens). The masks leave the cache again."""
        pending = [rows[b][fed:] for b, fed in enumerate(self._fed)]
        width = max(len(p) for p in pending)
        masks = upload(self._mask_ids(n - 1), torch.long, rows.device)
        block = torch.zeros(len(rows), width + n - 1, dtype=torch.long, device=rows.device)
        real = torch.zeros(len(rows), width + n - 1, dtype=torch.bool, device=rows.device)
        for b, p in enumerate(pending):  # right-aligned before the masks: every row's masks share the last columns
            block[b, width - len(p): width], real[b, width - len(p):] = p, True
        block[:, width:] = masks
        self.forwards += 1
        extra = {"logits_to_keep": n} if self.runner.keep_logits else {}
        uniform = all(len(p) == width for p in pending)
        logits = self._session.forward(block, None if uniform else real, **extra).logits[:, -n:]
        if n > 1:
            self._session.keep_recent(n - 1, [0] * len(rows))
        self._fed = [rows.length(b) for b in range(len(rows))]
        self._drafts_fed, self._tree_fed = None, None  # nothing drafted stays in the cache: no rollback to do
        return logits

    def propose(self, rows: Rows, k: int, ctx: DraftContext) -> DraftChain:
        if k <= 0:
            return DraftChain(torch.zeros(len(rows), 0, dtype=torch.long, device=rows.device), None)
        return chain_of_positions(self._block(rows, k), rows, ctx)

    def propose_tree(self, rows: Rows, shape: TreeShape, ctx: DraftContext) -> DraftTree:
        return tree_of_positions(self._block(rows, max(shape.depth, 1)), shape, rows, ctx)

    def stats(self) -> dict[str, float]:
        return {}
