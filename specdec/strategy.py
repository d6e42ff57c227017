"""How a :class:`~specdec.SpeculativeModel`'s calls draft: one :class:`CallPlan` per call, with its cache sizes.

:class:`Strategy` owns what the HF-facing façade does not: the draft plan of each call (chains of a fixed or
adaptive ``k``, or trees), what adaptive ``k`` and ``tree="auto"`` learn between calls, the measurements ``auto``
sizes trees with (the verifier's cost curve, one drafter pass), the lock that makes those measured once, and the
memory check of each call's caches. Shared by every thread calling one model.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from specdec.arguments import prepare_generation
from specdec.rules import check_rule
from specdec.chains import AdaptiveDraftLength, ChainPlan, FixedDraftLength
from specdec.costs import VerifyCost
from specdec.drafters import Drafter
from specdec.drafters.auto import CALIBRATION_TOKENS, AutoDrafter, Calibration
from specdec.engine import speculative_generate
from specdec.protocol import DraftPlan
from specdec.runners.hf import CausalLMRunner, lm_head_rows
from specdec.sizing import check_fits
from specdec.sizing.configs import max_positions
from specdec.slots import CallSlots
from specdec.trees.auto import TreeSizer, measure_verify_cost
from specdec.trees.config import TreeConfig, parse_tree
from specdec.trees.plan import TreePlan


@dataclass(frozen=True)
class CallPlan:
    """One call's plan (what the engine asks for each pass) and its cache sizes, counted once."""

    plan: DraftPlan
    slots: CallSlots


class Strategy:
    """The draft plans of one model's calls and what they learn between calls.

    ``tree``: as ``SpeculativeModel``'s (parsed and checked against the verifier and drafter here);
    ``adaptive``: chains of a per-pass ``k`` (refused with a tree); ``tree_cost`` / ``tree_draft_step``: ``auto``'s
    verifier cost curve and drafter pass in seconds, measured on first use when ``None``; ``memory_budget``: what
    every call's caches must fit in (``specdec.sizing.check_fits``); ``verify``: the rule sampled drafts are verified
    by (:func:`specdec.rules.check_rule`)."""

    def __init__(self, model: PreTrainedModel, verifier: CausalLMRunner, drafter: Drafter, *, adaptive: bool = False,
                 tree: Any = None, tree_cost: VerifyCost | None = None, tree_draft_step: float | None = None,
                 memory_budget: int | str | None = None, max_k: int = 1, verify: str = "token") -> None:
        self.model, self.verifier, self.drafter, self.memory_budget = model, verifier, drafter, memory_budget
        self.max_k = max_k  # the model's k: draft="auto" measures its candidates at it
        self.tree: TreeConfig | None = parse_tree(tree)
        self.verify = check_rule(verify, self.tree is not None)
        if isinstance(drafter, AutoDrafter):  # it chooses on first use, measuring the candidates with this loop
            drafter.attach(self.calibrate, max_k, trees=self.tree is not None)
        if self.tree is not None and adaptive:
            raise ValueError("adaptive draft lengths are for chains; with a tree use tree='auto' to size it per pass")
        if self.tree is not None and not drafter.supports_tree:
            raise ValueError(f"tree={tree!r}: {type(drafter).__name__} cannot draft trees (heads, model drafters, "
                             "drafters of another tokenizer, prompt lookup and composite can)")
        if self.tree is not None:
            # a tree's children are top-ranked tokens: ranks / top_k past the vocabulary fail now, not in topk mid-call
            self.tree = self.tree.fit_vocab(lm_head_rows(model))
            verifier.check_tree_masks()  # a model that would ignore the tree mask is refused now, not mid-call
            drafter.check_tree_masks()
        if tree_draft_step is not None and not tree_draft_step >= 0:
            raise ValueError(f"tree_draft_step must be seconds >= 0, got {tree_draft_step!r}")
        # the clock-free cost model of seeded adaptive calls (the timed policy's prior until it has measured)
        self.draft_cost_ratio = drafter.cost_ratio(model) if adaptive else None
        self.policy = AdaptiveDraftLength(max_k=max_k, draft_cost_ratio=self.draft_cost_ratio) if adaptive else None
        self.tree_cost, self.draft_step = tree_cost, tree_draft_step
        self._sizer: TreeSizer | None = None  # auto, unseeded calls: what it learnt carries over between calls
        self._lock = threading.Lock()  # auto's measurements are made once even when first calls race

    def for_call(self, k: int, generator: torch.Generator | None, batch: int, prompt: int, max_length: int) -> CallPlan:
        """The plan and cache sizes of one call of this shape; raises ``specdec.sizing.PlanError`` before any
        compute if its caches cannot fit."""
        plan = self._plan(k, generator, max_length - prompt)
        slots = plan.call_slots(batch, prompt, max_length, static=self.verifier.static is not None)
        self.check_memory(batch, prompt, slots, plan.max_drafts)
        return CallPlan(plan, slots)

    def measure_tree_cost(self) -> VerifyCost | None:
        """The verifier cost curve of trees sized per pass (``auto``), measured now unless given or measured already
        (and the drafter pass seeded calls size with); ``None`` for other trees and chains. Thread-safe: measured once."""
        if self.tree is None or not self.tree.tree_mode.sized_per_pass:
            return None
        if self.tree_cost is None or self.draft_step is None:  # double-checked: locked only until both exist
            with self._lock:
                if self.tree_cost is None:
                    self.tree_cost = measure_verify_cost(self.verifier)
                if self.draft_step is None:
                    self.draft_step = self._measure_draft_step()
        return self.tree_cost

    def check_memory(self, batch: int, prompt: int, slots: CallSlots, max_drafts: int) -> None:
        """Raise ``specdec.sizing.PlanError`` if the managed caches of a call cannot fit."""
        draft_model = self.drafter.model
        check_fits(self.model.config, None if draft_model is None else draft_model.config, batch_size=batch,
                   max_len=slots.verifier, dtype=self.model.dtype, memory_budget_bytes=self.memory_budget,
                   drafter_dtype=None if draft_model is None else draft_model.dtype, device=self.model.device,
                   prefill_tokens=prompt, draft_len=max_drafts)

    def _plan(self, k: int, generator: torch.Generator | None, new_tokens: int) -> DraftPlan:
        """Trees (capped to the call's ``new_tokens``) or chains of ``k`` (fixed, or adaptive up to ``k``)."""
        if self.tree is None:
            return ChainPlan(self._draft_length(k, generator), self.verify)
        if not self.tree.tree_mode.sized_per_pass:
            return TreePlan(self.tree, new_tokens=new_tokens, num_draft_tokens=k, rule=self.verify)
        cost = self.measure_tree_cost()
        limit = self.tree.total_tokens
        if generator is not None:  # reproducible: the measured draft step, nothing carried over from other calls
            sizer = TreeSizer(cost, draft_step=self.draft_step, max_tokens=limit)
        else:
            with self._lock:  # one shared sizer, even for concurrent first calls
                if self._sizer is None or self._sizer.cost is not cost:
                    self._sizer = TreeSizer(cost, max_tokens=limit)
                sizer = self._sizer
        return TreePlan(self.tree, sizer, new_tokens=new_tokens, num_draft_tokens=k, rule=self.verify)

    def _draft_length(self, k: int, generator: torch.Generator | None) -> FixedDraftLength | AdaptiveDraftLength:
        """``k`` itself, or an adaptive policy drafting at most ``k``."""
        if self.policy is None:
            return FixedDraftLength(k)
        if generator is not None:  # reproducible: no wall-clock state, nothing carried over from other calls
            return AdaptiveDraftLength(max_k=k, timed=False, draft_cost_ratio=self.draft_cost_ratio)
        self.policy.max_k = k  # the timing and acceptance estimates carry over; only the bound is this call's
        return self.policy

    def calibrate(self, drafter: Drafter, prompts: list[torch.Tensor], new_tokens: int = CALIBRATION_TOKENS) -> Calibration:
        """``draft="auto"``'s measurement of one candidate: greedy chains of this model's ``k`` over ``prompts``
        (batch 1, ``new_tokens`` each, no early stop), after one short untimed call (allocations, kernel choice)."""
        measured, positions = Calibration(), max_positions(self.model.config) or 1 << 30
        new_tokens = max(1, min(new_tokens, positions // 4))
        for i, ids in enumerate([prompts[0][:, :8], *prompts]):
            ids = ids[:, -max(1, positions // 2):]  # a small model's positions still hold prompt, drafts and output
            setup = prepare_generation(self.model, ids, max_new_tokens=4 if i == 0 else new_tokens, do_sample=False,
                                       eos_token_id=None, pad_token_id=None)
            stats = speculative_generate(self.verifier, drafter, setup, ChainPlan.fixed(self.max_k)).stats
            if i:
                measured.merge(Calibration.of_call(stats))
        return measured

    def _measure_draft_step(self) -> float:
        """Seconds of one drafter pass, on a short greedy chain over random tokens: the draft cost seeded ``auto``
        calls size trees with (fixed per object, so seeded samples reproduce)."""
        device = next(self.model.parameters()).device
        config = self.model.config.get_text_config()
        positions = getattr(config, "max_position_embeddings", None) or 64  # a short call fits any model
        prompt, new = max(1, min(32, positions // 4)), max(1, min(12, positions // 4))
        ids = torch.randint(0, lm_head_rows(self.model), (1, prompt), device=device,
                            generator=torch.Generator(device=device).manual_seed(0))
        setup = prepare_generation(self.model, ids, max_new_tokens=new, do_sample=False, eos_token_id=None,
                                   pad_token_id=None)
        plan = ChainPlan.fixed(max(1, min(4, positions // 4)))
        stats = speculative_generate(self.verifier, self.drafter, setup, plan).stats
        return stats.draft_seconds / stats.drafter_forwards if stats.drafter_forwards else 0.0
