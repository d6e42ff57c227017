"""A call's tree policy: the configuration, and for ``auto`` the sizer that learns from each pass."""

from __future__ import annotations

import torch

from specdec.protocol import DraftContext, DraftPlan, Drafts, Proposer, Rows
from specdec.trees.build import TreeShape
from specdec.trees.config import TreeConfig
from specdec.trees.sizing import TreeSizer


class TreePlan(DraftPlan):
    """A call that drafts trees: each pass asks the drafter for a tree shaped by :meth:`shape` (a chain of
    none when no room is left), and ``auto``'s sizer learns from each tree (:meth:`update`)."""

    def __init__(self, config: TreeConfig, sizer: TreeSizer | None = None, new_tokens: int | None = None,
                 num_draft_tokens: int = 1) -> None:
        """``new_tokens``: the most tokens the call adds per row; ``config`` is capped to what such a call can use
        (:meth:`TreeConfig.for_call`), so its caches are sized by the call, not by the configured depth.
        ``num_draft_tokens``: the call's ``k`` (it sizes the caches' slack for ragged rows, as a chain's does)."""
        if config.mode == "auto" and sizer is None:
            raise ValueError("tree='auto' needs a TreeSizer (a measured verifier cost)")
        self.requested = config  # what the user asked for: what the statistics report
        self.config = config if new_tokens is None else config.for_call(new_tokens)
        self.sizer = sizer
        self.num_draft_tokens = num_draft_tokens

    @property
    def max_drafts(self) -> int:
        return self.config.max_nodes

    @property
    def max_nodes(self) -> int:
        return self.config.max_nodes

    @property
    def extra_slots(self) -> int:
        return self.config.extra_slots

    def check(self, drafter: Proposer) -> None:
        if not drafter.supports_tree:
            raise ValueError(f"{type(drafter).__name__} cannot draft trees: use tree=None (chains) with this drafter")

    def propose(self, drafter: Proposer, rows: Rows, room: int, ctx: DraftContext) -> Drafts:
        if room > 0:
            return drafter.propose_tree(rows, self.shape(room), ctx)
        return drafter.propose(rows, 0, ctx)  # the last token: no room for drafts

    def shape(self, room: int) -> TreeShape:
        """The request for one pass, at most ``room`` tokens deep."""
        return TreeShape(self.config, room, self.sizer)

    def update(self, drafts: Drafts, accepted: torch.Tensor, draft_seconds: float, verify_seconds: float,
               drafter_forwards: int, path: torch.Tensor | None = None) -> None:
        """Calibrate the sizer: which of the tree's nodes the verifier accepted (``path``), against their values."""
        tree = drafts  # a chain of none on the last pass has no values
        if self.sizer is None or tree.values is None or tree.tokens.shape[1] == 0 or path is None:
            return
        self.sizer.update(tree, path, draft_seconds, drafter_forwards)

    def to_dict(self) -> dict:
        """The configuration asked for (``summary.json``'s ``tree``; capping it to the call changes no tree drawn),
        with the sizer's state for ``auto``."""
        data = self.requested.to_dict()
        if self.sizer is not None:
            data.update(calibration=round(self.sizer.calibration, 4), draft_step_s=self.sizer.draft_step,
                        verify_cost=self.sizer.cost.to_dict(), edge_calibration=self.sizer.edges.to_dict())
        return data
