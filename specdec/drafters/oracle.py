"""An oracle drafter: it proposes the tokens each row is already known to continue with.

Given the verifier's own greedy output (one plain ``model.generate`` run), every draft is accepted and
drafting costs nothing, so a speculative call measures the engine alone: what a pass of ``k + 1`` tokens
costs beside the verifier's forward, against the ceiling of ``k + 1`` tokens per pass. ``benchmarks/gpu_check.py``
uses it on random-weight models of realistic shapes; tests use it as a drafter whose acceptance is known (1.0).

>>> expected = model.generate(ids, attention_mask=mask, max_new_tokens=64, do_sample=False)
>>> spec = SpeculativeModel(model, OracleDrafter(expected), num_draft_tokens=8)
>>> spec.generate(ids, attention_mask=mask, max_new_tokens=64, do_sample=False)   # == expected
>>> spec.last_stats.acceptance_rate                                                  # 1.0

It is not registered as a drafter name: there is nothing to draft from without the expected tokens.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from specdec.drafters.base import Drafter
from specdec.protocol import DraftContext, DraftChain, Rows


class OracleDrafter(Drafter):
    """Proposes, for each row, the next ``k`` of its expected tokens after the row's committed length.

    Args:
        expected: per row of the batch the call will be given, the whole sequence it should end up as, in
            ``generate``'s layout: the prompt (left padding included) then the new tokens. A ``[B, T]`` tensor
            (what ``model.generate`` returns) or a list of 1-D rows of different lengths.

    Rows are matched by their index in the call's batch (``Rows.owners``), so rows that finish early and leave
    the batch do not shift the others. Where a row's expected tokens run out before ``k``, it proposes what is
    left; a row with fewer than the widest row's count repeats its last expected token (a draft the verifier
    may reject; any proposal is safe). The drafts are deterministic (one-hot ``q``), so under sampling they are
    accepted with the verifier's probability of the expected token, not always.
    """

    def __init__(self, expected: torch.Tensor | Sequence[Sequence[int] | torch.Tensor]) -> None:
        rows = [r.tolist() if isinstance(r, torch.Tensor) else list(r) for r in expected]
        if not rows or any(not r for r in rows):
            raise ValueError("OracleDrafter needs at least one non-empty expected row")
        self._host = rows
        self._lengths = [len(r) for r in rows]
        width = max(self._lengths)
        # one padded host tensor; a copy per device is made on first use and shared by every call's drafter
        self._table = torch.tensor([r + [r[-1]] * (width - len(r)) for r in rows], dtype=torch.long, device="cpu")
        self._on_device: dict[torch.device, torch.Tensor] = {}

    @classmethod
    def from_generate(cls, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                      **generate_kwargs: Any) -> "OracleDrafter":
        """An oracle of ``model``'s greedy output for this batch: one ``model.generate(do_sample=False)`` run."""
        with torch.no_grad():
            out = model.generate(input_ids, attention_mask=attention_mask, **{**generate_kwargs, "do_sample": False})
        sequences = out if isinstance(out, torch.Tensor) else out.sequences
        return cls(sequences)

    @property
    def expected(self) -> list[list[int]]:
        """The expected rows, as given."""
        return [list(r) for r in self._host]

    def _device_table(self, device: torch.device) -> torch.Tensor:
        table = self._on_device.get(device)
        if table is None:
            table = self._on_device[device] = self._table.to(device)
        return table

    def propose(self, rows: Rows, k: int, ctx: DraftContext) -> DraftChain:
        owners = rows.owners
        if any(o >= len(self._lengths) for o in owners):
            raise ValueError(f"OracleDrafter knows {len(self._lengths)} row(s); the call has row {max(owners)}")
        starts = [rows.length(b) for b in range(len(rows))]  # host lengths: no device sync
        counts = [max(0, min(k, self._lengths[o] - s)) for o, s in zip(owners, starts)]
        width = max(counts, default=0)
        if width == 0:
            return DraftChain(torch.zeros(len(rows), 0, dtype=torch.long, device=rows.device))
        # a row with fewer tokens left repeats its last expected one; gather makes a copy of the table's entries
        index = [[min(s + j, self._lengths[o] - 1) for j in range(width)] for o, s in zip(owners, starts)]
        table = self._device_table(rows.device)[torch.tensor(owners, dtype=torch.long, device="cpu").to(rows.device)]
        return DraftChain(table.gather(1, torch.tensor(index, dtype=torch.long, device="cpu").to(rows.device)))
