"""The methods an evaluation compares, and the drafters they share.

- the baselines, declared in :mod:`specdec.eval.baselines` (``hf``, the reference for speedups and output
  identity; ``hf-compiled``; ``hf-assisted[D]``; ``hf-assisted-heuristic[D]``; ``hf-prompt-lookup``; and any
  added with :func:`~specdec.eval.baselines.register_baseline`);
- ``specdec[D,k=K]``: :class:`specdec.SpeculativeModel` with drafter ``D`` drafting ``K`` tokens per pass;
  ``specdec[D,k=K,tree=T]`` verifies a tree of drafts per pass (``T``: a tree mode, e.g. static, dynamic or auto);
  ``specdec[...,compiled]`` runs its verify passes through ``torch.compile`` (``compile_verifier``).

Drafter names are resolved by :func:`specdec.drafters.resolve_drafter`, the one resolver;
:func:`resolve_draft` adds what HF assisted generation needs from the same drafter.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from specdec.draft_spec import parse_draft
from specdec.eval.baselines import (  # noqa: F401  (HEURISTIC_ASSISTANT: re-exported for older code)
    HEURISTIC_ASSISTANT,
    HF,
    HF_ASSISTED,
    HF_ASSISTED_HEURISTIC,
    HF_COMPILED,
    HF_PROMPT_LOOKUP,
    Baseline,
    baseline_names,
    get_baseline,
)
from specdec.eval.baselines import baselines as registered_baselines
from specdec.eval.baseline_registry import SPECDEC
from specdec.rules import RULES, applies, rules_for
from specdec.trees.modes import TREE_MODES

if TYPE_CHECKING:
    import torch

    from specdec.drafters import Drafter

# the built-in baselines as the registry declares them (snapshots for older code: the registry,
# baseline_names() and get_baseline(), is the live list, with the baselines registered since)
BASELINE_KINDS = baseline_names()
#: methods that do not draft: no acceptance statistics, but (greedy) compared with ``hf`` token for token
PLAIN_KINDS = tuple(b.name for b in registered_baselines() if not b.drafts)
ASSISTED_KINDS = tuple(b.name for b in registered_baselines() if b.needs_draft)
DEFAULT_BASELINES = (HF, HF_ASSISTED)
DEFAULT_DRAFT = "self:int8"
DEFAULT_PROMPT_LOOKUP_TOKENS = 10  # the value transformers' docs use
#: the states a cross-call cache is measured in (``MethodSpec.cache``)
CACHE_STATES = ("cold", "warm")
#: the rules sampled drafts can be verified by (``MethodSpec.verify``; :mod:`specdec.rules`)
VERIFY_RULES = tuple(RULES)


@dataclass(frozen=True)
class MethodSpec:
    """One generation method: ``kind`` plus the drafter and draft length where they apply."""

    kind: str
    draft: str | None = None
    k: int | None = None
    adaptive: bool = False  # specdec only: choose the draft length per step, up to k
    tree: str | None = None  # specdec only: a tree mode's name (TREE_MODES; None: chains)
    compiled: bool = False  # specdec only: verify passes through torch.compile (compile_verifier)
    cache: str | None = None  # specdec with a cross-call cache (suffix): "cold" (kept empty) or "warm" (learns in order)
    verify: str = "token"  # specdec only: how sampled drafts are verified (specdec.rules: block for chains, traversal trees)

    def __post_init__(self) -> None:
        if self.kind != SPECDEC and self.baseline is None:
            raise ValueError(f"unknown method {self.kind!r}; choose from {', '.join((*baseline_names(), SPECDEC))}")
        if (self.kind == SPECDEC or self.baseline.needs_draft) and not self.draft:
            raise ValueError(f"method {self.kind} needs a drafter")
        if self.kind == SPECDEC and (not isinstance(self.k, int) or self.k < 1):
            raise ValueError(f"specdec needs a draft length k >= 1, got {self.k!r}")
        if self.tree is not None and (self.kind != SPECDEC or self.tree not in TREE_MODES):
            raise ValueError(f"tree={self.tree!r}: trees are for specdec methods, one of {', '.join(TREE_MODES)}")
        if self.cache is not None and (self.kind != SPECDEC or self.cache not in CACHE_STATES):
            raise ValueError(f"cache={self.cache!r}: for specdec methods whose drafter learns across calls, one of "
                             f"{', '.join(CACHE_STATES)}")
        if self.verify != "token" and (self.kind != SPECDEC or not applies(self.verify, self.tree is not None)):
            which = "tree" if self.tree is not None else "chain"
            raise ValueError(f"verify={self.verify!r} does not verify specdec {which}s: a {which} method's rules are "
                             f"{', '.join(r for r in VERIFY_RULES if applies(r, self.tree is not None))}")
        if self.compiled and self.kind != SPECDEC:
            raise ValueError(f"compiled verify passes are for specdec methods, not {self.kind} (hf-compiled is HF's)")

    @property
    def name(self) -> str:
        """Stable name used in records and ``summary.json``: ``hf``, ``hf-assisted[self:int8]``, ``specdec[self:int8,k=4]``."""
        if self.kind == SPECDEC:
            tree = f",tree={self.tree}" if self.tree else ""
            compiled = ",compiled" if self.compiled else ""
            cache = f",{self.cache}" if self.cache else ""
            rule = "" if self.verify == "token" else f",verify={self.verify}"
            return (f"{SPECDEC}[{self.draft},k={self.k}{',adaptive' if self.adaptive else ''}{tree}{compiled}{rule}"
                    f"{cache}]")
        if self.baseline.needs_draft:
            return f"{self.kind}[{self.draft}]"
        return self.kind

    @property
    def baseline(self) -> Baseline | None:
        """The baseline's declaration (:mod:`specdec.eval.baselines`); None for specdec methods."""
        return None if self.kind == SPECDEC else get_baseline(self.kind)

    @property
    def speculative(self) -> bool:
        """Whether the method drafts and verifies (and so has acceptance statistics)."""
        return self.kind == SPECDEC or self.baseline.drafts

    @classmethod
    def parse(cls, name: str) -> "MethodSpec":
        """Inverse of :attr:`name`."""
        # the kinds named KIND[DRAFTER], longest first so that no name is read as a shorter one
        drafted = sorted((*(b.name for b in registered_baselines() if b.needs_draft), SPECDEC), key=len, reverse=True)
        m = re.fullmatch(rf"({'|'.join(map(re.escape, drafted))})\[(.+?)(?:,k=(\d+))?(,adaptive)?(?:,tree=(\w+))?"
                         r"(,compiled)?(?:,verify=(\w+))?(?:,(cold|warm))?\]", name.strip())
        if m:
            return cls(m.group(1), m.group(2), int(m.group(3)) if m.group(3) else None, bool(m.group(4)), m.group(5),
                       bool(m.group(6)), m.group(8), m.group(7) or "token")
        return cls(name.strip())


# --------------------------------------------------------------------------------------------
# drafters, for both sides
# --------------------------------------------------------------------------------------------


@dataclass
class ResolvedDraft:
    """A drafter for both sides: the :class:`~specdec.drafters.Drafter` specdec runs, and the causal LM
    ``model.generate(assistant_model=...)`` uses (``None`` when the drafter is not one)."""

    name: str
    draft: "Drafter"
    assistant: "torch.nn.Module | None" = None


def has_hf_assistant(spec: str) -> bool:
    """Whether drafter ``spec`` is a causal LM that HF assisted generation can use (as its kind declares)."""
    return parse_draft(spec).declared.hf_assistant


def resolve_draft(spec: str, model: Any, tokenizer: Any = None, draft_tokenizer: Any = None) -> ResolvedDraft:
    """Build drafter ``spec`` for verifier ``model`` once, for specdec and HF assisted generation alike.

    :func:`specdec.drafters.resolve_drafter` builds it (``self:SCHEME``, a local model, a drafter
    registered with :func:`specdec.drafters.register_drafter`, ...); where the drafter is a causal LM
    HF can assist with, its module is the assistant, so both sides run the very same weights (for
    ``self:SCHEME`` one quantized copy, which specdec lets adopt the verifier's cached prompt).
    """
    from specdec.drafters import resolve_drafter

    drafter = resolve_drafter(spec, model, verifier_tokenizer=tokenizer, draft_tokenizer=draft_tokenizer)
    return ResolvedDraft(spec, drafter, drafter.model if has_hf_assistant(spec) else None)


# --------------------------------------------------------------------------------------------
# planning a run
# --------------------------------------------------------------------------------------------


def plan_methods(
    baselines: Iterable[str] = DEFAULT_BASELINES,
    drafts: Iterable[str] = (DEFAULT_DRAFT,),
    num_draft_tokens: Iterable[int] = (4,),
    adaptive: bool = False,
    trees: Iterable[str | None] = (None,),
    compiled: Iterable[bool] = (False,),
    verify: Iterable[str] = ("token",),
) -> list[MethodSpec]:
    """The methods of a run: ``hf`` (always: it is the reference), ``hf-compiled`` when asked for, the other
    baselines, then specdec per drafter, k, tree (``None`` or ``"none"``: chains), ``compiled`` (eager and/or
    compiled verify passes) and each ``verify`` rule that applies to it (:func:`specdec.rules.rules_for`; and, with
    ``adaptive``, each chain method again with adaptive draft length up to k).

    ``hf-assisted`` is planned for each drafter that is a causal LM; for the others a warning says
    why it is left out.
    """
    wanted, drafts, ks = list(baselines), list(drafts), list(num_draft_tokens)
    unknown = [b for b in wanted if b not in baseline_names()]
    if unknown:
        raise ValueError(f"unknown baseline(s) {unknown}; choose from {', '.join(baseline_names())}")
    methods = [MethodSpec(HF)]
    for baseline in (b for b in registered_baselines() if b.name in wanted):  # in the registry's order
        if not baseline.needs_draft:
            methods.append(MethodSpec(baseline.name))
            continue
        for d in drafts:
            if (baseline.takes_draft or has_hf_assistant)(d):
                methods.append(MethodSpec(baseline.name, d))
            else:
                why = f"cannot run with drafter {d!r}" if baseline.takes_draft else \
                    f"needs a causal LM as assistant; drafter {d!r} is not one"
                warnings.warn(f"{baseline.name} {why}, skipped", stacklevel=2)
    trees = [None if t in (None, "none") else t for t in trees]
    compiled = list(compiled)
    rules = list(verify)  # each method runs under each rule that verifies its drafts (chain or tree)
    methods += [MethodSpec(SPECDEC, d, k, tree=t, compiled=c, verify=r) for d in drafts for k in ks for t in trees
                for c in compiled for r in rules_for(rules, t is not None)]
    if adaptive:
        methods += [MethodSpec(SPECDEC, d, k, adaptive=True, compiled=c, verify=r) for d in drafts for k in ks
                    for c in compiled for r in rules_for(rules, False)]
    return list(dict.fromkeys(_cache_states(methods)))


def _cache_states(methods: list[MethodSpec]) -> list[MethodSpec]:
    """Each specdec method whose drafter learns across calls (``suffix``, ``composite:suffix``) twice: ``cold`` (its
    cache kept empty) and ``warm`` (its cache fed by the run's earlier calls, in order; never the same prompt's)."""
    from dataclasses import replace

    from specdec.draft_kinds import learns_across_calls

    out = []
    for m in methods:
        if m.kind == SPECDEC and m.cache is None and learns_across_calls(m.draft):
            out += [replace(m, cache=state) for state in CACHE_STATES]
        else:
            out.append(m)
    return out


def batchable(methods: Sequence[MethodSpec]) -> list[MethodSpec]:
    """Drop the methods that run batches of one only (transformers' assisted generation and prompt lookup)."""
    single = [m.name for m in methods if m.baseline is not None and not m.baseline.batchable]
    if single:
        warnings.warn(f"batch_size > 1: transformers' assisted generation and prompt lookup support one row only; "
                      f"skipping {', '.join(single)}", stacklevel=3)
    return [m for m in methods if m.name not in single]


def rotate(methods: Sequence[MethodSpec], i: int) -> list[MethodSpec]:
    """Methods in the order used for the i-th prompt: each method goes first equally often."""
    j = i % len(methods)
    return list(methods[j:]) + list(methods[:j])
