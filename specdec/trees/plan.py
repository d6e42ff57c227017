"""A call's tree policy: the configuration, and for ``auto`` the sizer that learns from each pass."""

from __future__ import annotations

import torch

from specdec.trees.build import TreeShape
from specdec.trees.config import TreeConfig
from specdec.trees.sizing import TreeSizer
from specdec.trees.tree import DraftTree


class TreePlan:
    """What the engine asks per pass (:meth:`shape`) and tells after it (:meth:`update`)."""

    def __init__(self, config: TreeConfig, sizer: TreeSizer | None = None, new_tokens: int | None = None) -> None:
        """``new_tokens``: the most tokens the call adds per row; ``config`` is capped to what such a call can use
        (:meth:`TreeConfig.for_call`), so its caches are sized by the call, not by the configured depth."""
        if config.mode == "auto" and sizer is None:
            raise ValueError("tree='auto' needs a TreeSizer (a measured verifier cost)")
        self.requested = config  # what the user asked for: what the statistics report
        self.config = config if new_tokens is None else config.for_call(new_tokens)
        self.sizer = sizer

    def shape(self, room: int) -> TreeShape:
        """The request for one pass, at most ``room`` tokens deep."""
        return TreeShape(self.config, room, self.sizer)

    def update(self, tree: DraftTree, accepted: torch.Tensor, draft_seconds: float, draft_passes: int) -> None:
        """Calibrate the sizer: the drafter's summed node values per row against the drafts accepted."""
        if self.sizer is None or tree.values is None or tree.tokens.shape[1] == 0:
            return
        rows = max(tree.tokens.shape[0], 1)
        predicted = float((tree.values * tree.valid).sum()) / rows
        self.sizer.update(predicted, float(accepted.float().mean()), draft_seconds, draft_passes)

    def to_dict(self) -> dict:
        """The configuration asked for (``summary.json``'s ``tree``; capping it to the call changes no tree drawn),
        with the sizer's state for ``auto``."""
        data = self.requested.to_dict()
        if self.sizer is not None:
            data.update(calibration=round(self.sizer.calibration, 4), draft_step_s=self.sizer.draft_step,
                        verify_cost=self.sizer.cost.to_dict())
        return data
