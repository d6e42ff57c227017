"""A call's tree policy: the configuration, and for ``auto`` the sizer that learns from each pass."""

from __future__ import annotations

import torch

from specdec.protocol import DraftContext, DraftPlan, Drafts, Proposer, Rows, checked
from specdec.trees.build import TreeShape
from specdec.trees.config import TreeConfig
from specdec.trees.auto import TreeSizer
from specdec.trees.tree import DraftTree


class TreePlan(DraftPlan):
    """A call that drafts trees: each pass asks the drafter for a tree shaped by :meth:`shape` (a chain of
    none when no room is left), and ``auto``'s sizer learns from each tree (:meth:`update`). Under sampling
    ``auto`` drafts a sampled chain instead where that has delivered more (:mod:`specdec.trees.arms`)."""

    def __init__(self, config: TreeConfig, sizer: TreeSizer | None = None, new_tokens: int | None = None,
                 num_draft_tokens: int = 1, rule: str = "token") -> None:
        """``new_tokens``: the most tokens the call adds per row; ``config`` is capped to what such a call can use
        (:meth:`TreeConfig.for_call`), so its caches are sized by the call, not by the configured depth.
        ``num_draft_tokens``: the call's ``k`` (it sizes the caches' slack for ragged rows, as a chain's does).
        ``rule``: how sampled trees are verified (:mod:`specdec.rules`)."""
        if config.tree_mode.sized_per_pass and sizer is None:
            raise ValueError(f"tree={config.mode!r} needs a TreeSizer (a measured verifier cost)")
        self.requested = config  # what the user asked for: what the statistics report
        self.config = config if new_tokens is None else config.for_call(new_tokens)
        self.sizer = sizer
        self.num_draft_tokens = num_draft_tokens
        self.rule = rule
        self._arm: str | None = None  # auto under sampling: this pass's arm, "chain" or "tree"

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
        """Ask ``drafter`` for this pass's tree (or chain), checked against what was asked (:func:`checked`)."""
        self._arm = self.sizer.arms.pick() if room > 0 and self._weighs_arms(ctx) else None
        if room <= 0 or self._arm == "chain":  # room 0: the last token, no drafts
            limit = min(self.config.max_depth, room)
            k = self.sizer.arms.chain_length(limit, self.sizer.cost, self.sizer.draft_step) if room > 0 else 0
            return checked(drafter.propose(rows, k, ctx), drafter, rows, ctx, k, k)
        shape = self.shape(room, ctx.do_sample)
        # nodes: the slots the caches keep for one tree pass (a composite adds its lookup's branch to a full tree)
        return checked(drafter.propose_tree(rows, shape, ctx), drafter, rows, ctx, self.extra_slots - 1, shape.depth,
                       kind=DraftTree)

    def _weighs_arms(self, ctx: DraftContext) -> bool:
        """``auto`` weighs a sampled chain against a tree under sampling only: under greedy decoding a tree holds
        the drafter's top chain, and the sizer already values it."""
        return self.sizer is not None and ctx.do_sample

    def shape(self, room: int, do_sample: bool = False) -> TreeShape:
        """The request for one pass, at most ``room`` tokens deep. Under sampling a tree of fixed shape (``static``)
        draws its children: top-ranked ones are one-hot drafts, which a sampling verifier accepts only as often as it
        would draw them (Spec-Bench at T=0.7, ``self:int8``: 0.22 of the nodes against 0.47 drawn; BENCHMARKS.md
        section 30). A tree shaped by its drafts' values (``dynamic``, ``auto``) keeps top-ranked children: choosing
        nodes by the value of what was drawn would bias the law."""
        sample = do_sample and self.config.tree_mode.grows_paths
        return TreeShape(self.config, room, self.sizer, sample=sample)

    def update(self, drafts: Drafts, accepted: list[int], draft_seconds: float, verify_seconds: float,
               drafter_forwards: int, path: torch.Tensor | list[list[int]] | None = None) -> None:
        """Calibrate the sizer: which of the tree's nodes the verifier accepted (``path``), against their values;
        under sampling, what the pass's arm delivered (tokens against the clock, or the cost model when seeded)."""
        if self.sizer is None or drafts.tokens.shape[1] == 0:
            return
        if self._arm is not None:
            n = drafts.tokens.shape[1]
            seconds = draft_seconds + verify_seconds if self.sizer.timed else \
                self.sizer.cost(n + 1) + drafter_forwards * self.sizer.draft_step
            self.sizer.arms.observe(self._arm, n if self._arm == "chain" else 0, accepted, seconds)
        if isinstance(drafts, DraftTree) and drafts.values is not None and path is not None:
            self.sizer.update(drafts, path, draft_seconds, drafter_forwards)
        else:
            self.sizer.learn_draft_step(draft_seconds, drafter_forwards)

    def to_dict(self) -> dict:
        """The configuration asked for (``summary.json``'s ``tree``; capping it to the call changes no tree drawn),
        with the sizer's state for ``auto``."""
        data = self.requested.to_dict()
        if self.sizer is not None:
            data.update(calibration=round(self.sizer.calibration, 4), draft_step_s=self.sizer.draft_step,
                        verify_cost=self.sizer.cost.to_dict(), edge_calibration=self.sizer.edges.to_dict())
            if any(self.sizer.arms.passes.values()):
                data.update(chain_or_tree=self.sizer.arms.to_dict())
        return data
