"""Drafters written against the protocol of specdec before the :class:`Drafter` base class.

Such an object has ``start(input_ids, attention_mask, max_len)``, ``propose(rows, k, ctx)``,
``commit(rows)``, ``keep_rows(indices)`` and ``finish()``, with rows as a list of 1-D tensors.
It keeps working, wrapped; it is shared by concurrent calls (it owns its state), so subclass
:class:`Drafter` for a drafter that one SpeculativeModel may use from several threads.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from specdec.drafters.base import Commit, DraftContext, Drafter, Proposal, Rows

_METHODS = ("start", "propose", "commit", "keep_rows", "finish")


def is_legacy_drafter(obj: Any) -> bool:
    """Whether ``obj`` implements the old duck-typed drafter protocol."""
    return not isinstance(obj, Drafter) and all(callable(getattr(obj, m, None)) for m in _METHODS)


class LegacyDrafter(Drafter):
    """Adapts an old-protocol drafter to :class:`Drafter`."""

    def __init__(self, inner: Any) -> None:
        warnings.warn(f"{type(inner).__name__} implements specdec's old drafter protocol; subclass "
                      "specdec.drafters.Drafter instead (commit now receives a Commit)", FutureWarning, stacklevel=4)
        self.inner = inner

    @property
    def forwards(self) -> int:  # type: ignore[override]
        return int(getattr(self.inner, "forwards", 0))

    def start(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, max_len: int, *,
              verifier: Any = None, hidden: torch.Tensor | None = None) -> None:
        self.inner.start(input_ids, attention_mask, max_len)

    def propose(self, rows: Rows, k: int, ctx: DraftContext) -> Proposal:
        return self.inner.propose(list(rows), k, ctx)

    def commit(self, update: Commit) -> None:
        self.inner.commit(list(update.rows))

    def keep_rows(self, indices: torch.Tensor) -> None:
        self.inner.keep_rows(indices)

    def finish(self) -> None:
        self.inner.finish()
