"""The methods an evaluation compares, and the drafters they share.

- ``hf``: plain ``model.generate``, the reference for speedups and output identity;
- ``hf-compiled``: ``model.generate(cache_implementation="static")`` with its decode step compiled by
  ``torch.compile`` (transformers' recipe), compiled before timing;
- ``hf-assisted[D]``: ``model.generate(assistant_model=<D's model>)`` with transformers' defaults;
- ``hf-assisted-heuristic[D]``: the same with transformers' ``num_assistant_tokens_schedule="heuristic"``
  (its adaptive draft length);
- ``hf-prompt-lookup``: ``model.generate(prompt_lookup_num_tokens=N)``;
- ``specdec[D,k=K]``: :class:`specdec.SpeculativeModel` with drafter ``D`` drafting ``K`` tokens per pass;
  ``specdec[D,k=K,tree=T]`` verifies a tree of drafts per pass (``T``: static, dynamic or auto);
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

if TYPE_CHECKING:
    import torch

    from specdec.drafters import Drafter

HF, HF_ASSISTED, HF_PROMPT_LOOKUP, SPECDEC = "hf", "hf-assisted", "hf-prompt-lookup", "specdec"
HF_ASSISTED_HEURISTIC = "hf-assisted-heuristic"
HF_COMPILED = "hf-compiled"
BASELINE_KINDS = (HF, HF_COMPILED, HF_ASSISTED, HF_ASSISTED_HEURISTIC, HF_PROMPT_LOOKUP)
#: methods that do not draft: no acceptance statistics, but (greedy) compared with ``hf`` token for token
PLAIN_KINDS = (HF, HF_COMPILED)
ASSISTED_KINDS = (HF_ASSISTED, HF_ASSISTED_HEURISTIC)
#: the assistant generation settings of ``hf-assisted-heuristic``: transformers' own heuristic schedule
#: (k + 2 after a fully accepted draft, k - 1 otherwise) from its former default start of 5 tokens
HEURISTIC_ASSISTANT = {"num_assistant_tokens_schedule": "heuristic", "num_assistant_tokens": 5}
DEFAULT_BASELINES = (HF, HF_ASSISTED)
DEFAULT_DRAFT = "self:int8"
DEFAULT_PROMPT_LOOKUP_TOKENS = 10  # the value transformers' docs use
TREE_MODES = ("static", "dynamic", "auto")


@dataclass(frozen=True)
class MethodSpec:
    """One generation method: ``kind`` plus the drafter and draft length where they apply."""

    kind: str
    draft: str | None = None
    k: int | None = None
    adaptive: bool = False  # specdec only: choose the draft length per step, up to k
    tree: str | None = None  # specdec only: static | dynamic | auto (None: chains)
    compiled: bool = False  # specdec only: verify passes through torch.compile (compile_verifier)

    def __post_init__(self) -> None:
        if self.kind not in (*BASELINE_KINDS, SPECDEC):
            raise ValueError(f"unknown method {self.kind!r}; choose from {', '.join((*BASELINE_KINDS, SPECDEC))}")
        if self.kind in (*ASSISTED_KINDS, SPECDEC) and not self.draft:
            raise ValueError(f"method {self.kind} needs a drafter")
        if self.kind == SPECDEC and (not isinstance(self.k, int) or self.k < 1):
            raise ValueError(f"specdec needs a draft length k >= 1, got {self.k!r}")
        if self.tree is not None and (self.kind != SPECDEC or self.tree not in TREE_MODES):
            raise ValueError(f"tree={self.tree!r}: trees are for specdec methods, one of {', '.join(TREE_MODES)}")
        if self.compiled and self.kind != SPECDEC:
            raise ValueError(f"compiled verify passes are for specdec methods, not {self.kind} (hf-compiled is HF's)")

    @property
    def name(self) -> str:
        """Stable name used in records and ``summary.json``: ``hf``, ``hf-assisted[self:int8]``, ``specdec[self:int8,k=4]``."""
        if self.kind == SPECDEC:
            tree = f",tree={self.tree}" if self.tree else ""
            compiled = ",compiled" if self.compiled else ""
            return f"{SPECDEC}[{self.draft},k={self.k}{',adaptive' if self.adaptive else ''}{tree}{compiled}]"
        if self.kind in ASSISTED_KINDS:
            return f"{self.kind}[{self.draft}]"
        return self.kind

    @property
    def speculative(self) -> bool:
        """Whether the method drafts and verifies (and so has acceptance statistics)."""
        return self.kind not in PLAIN_KINDS

    @classmethod
    def parse(cls, name: str) -> "MethodSpec":
        """Inverse of :attr:`name`."""
        m = re.fullmatch(r"(hf-assisted-heuristic|hf-assisted|specdec)\[(.+?)(?:,k=(\d+))?(,adaptive)?(?:,tree=(\w+))?"
                         r"(,compiled)?\]", name.strip())
        if m:
            return cls(m.group(1), m.group(2), int(m.group(3)) if m.group(3) else None, bool(m.group(4)), m.group(5),
                       bool(m.group(6)))
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


def resolve_draft(spec: str, model: Any, tokenizer: Any = None) -> ResolvedDraft:
    """Build drafter ``spec`` for verifier ``model`` once, for specdec and HF assisted generation alike.

    :func:`specdec.drafters.resolve_drafter` builds it (``self:SCHEME``, a local model, a drafter
    registered with :func:`specdec.drafters.register_drafter`, ...); where the drafter is a causal LM
    HF can assist with, its module is the assistant, so both sides run the very same weights (for
    ``self:SCHEME`` one quantized copy, which specdec lets adopt the verifier's cached prompt).
    """
    from specdec.drafters import resolve_drafter

    drafter = resolve_drafter(spec, model, verifier_tokenizer=tokenizer)
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
) -> list[MethodSpec]:
    """The methods of a run: ``hf`` (always: it is the reference), ``hf-compiled`` when asked for, the other
    baselines, then specdec per drafter, k, tree (``None`` or ``"none"``: chains) and ``compiled`` (eager and/or
    compiled verify passes) (and, with ``adaptive``, each chain method again with adaptive draft length up to k).

    ``hf-assisted`` is planned for each drafter that is a causal LM; for the others a warning says
    why it is left out.
    """
    baselines, drafts, ks = list(baselines), list(drafts), list(num_draft_tokens)
    unknown = [b for b in baselines if b not in BASELINE_KINDS]
    if unknown:
        raise ValueError(f"unknown baseline(s) {unknown}; choose from {', '.join(BASELINE_KINDS)}")
    methods = [MethodSpec(HF)]
    if HF_COMPILED in baselines:
        methods.append(MethodSpec(HF_COMPILED))
    for kind in (k for k in ASSISTED_KINDS if k in baselines):
        for d in drafts:
            if has_hf_assistant(d):
                methods.append(MethodSpec(kind, d))
            else:
                warnings.warn(f"{kind} needs a causal LM as assistant; drafter {d!r} is not one, skipped",
                              stacklevel=2)
    if HF_PROMPT_LOOKUP in baselines:
        methods.append(MethodSpec(HF_PROMPT_LOOKUP))
    trees = [None if t in (None, "none") else t for t in trees]
    compiled = list(compiled)
    methods += [MethodSpec(SPECDEC, d, k, tree=t, compiled=c) for d in drafts for k in ks for t in trees for c in compiled]
    if adaptive:
        methods += [MethodSpec(SPECDEC, d, k, adaptive=True, compiled=c) for d in drafts for k in ks for c in compiled]
    return list(dict.fromkeys(methods))


def batchable(methods: Sequence[MethodSpec]) -> list[MethodSpec]:
    """Drop the methods transformers runs for batches of one only (assisted generation, prompt lookup)."""
    single = [m.name for m in methods if m.kind in (*ASSISTED_KINDS, HF_PROMPT_LOOKUP)]
    if single:
        warnings.warn(f"batch_size > 1: transformers' assisted generation and prompt lookup support one row only; "
                      f"skipping {', '.join(single)}", stacklevel=3)
    return [m for m in methods if m.name not in single]


def rotate(methods: Sequence[MethodSpec], i: int) -> list[MethodSpec]:
    """Methods in the order used for the i-th prompt: each method goes first equally often."""
    j = i % len(methods)
    return list(methods[j:]) + list(methods[:j])
