"""Drafters: things that propose tokens for the verifier to check."""

from __future__ import annotations

from typing import Any

import torch

from specdec.draft_spec import COMPOSITE_DEFAULT_SCHEME, DraftSpec, DraftSpecError, DrafterKind, forms, parse_draft
from specdec.draft_spec import register_drafter, register_kind
from specdec.draft_registry import DrafterTypeError, what
from specdec.drafters.base import Commit, DraftChain, DraftContext, Drafter, Proposal, Rows
from specdec.drafters.model import ModelDrafter, VocabularyMismatchError, check_vocab_compat, from_module
from specdec.drafters.composite import CompositeDrafter
from specdec.drafters.layer_skip import LayerSkipDrafter
from specdec.drafters.oracle import OracleDrafter
from specdec.drafters.prompt_lookup import PromptLookupDrafter
from specdec.drafters.simulated import AcceptanceProfile, SimulatedDrafter
from specdec.drafters.suffix import SuffixCache, SuffixCacheError, SuffixCompositeDrafter, SuffixDrafter

__all__ = [
    "AcceptanceProfile",
    "COMPOSITE_DEFAULT_SCHEME",
    "Commit",
    "CompositeDrafter",
    "DraftContext",
    "DraftSpec",
    "DraftSpecError",
    "Drafter",
    "DrafterKind",
    "LayerSkipDrafter",
    "ModelDrafter",
    "OracleDrafter",
    "PromptLookupDrafter",
    "DraftChain",
    "Proposal",
    "Rows",
    "SimulatedDrafter",
    "SuffixCache",
    "SuffixCacheError",
    "SuffixCompositeDrafter",
    "SuffixDrafter",
    "VocabularyMismatchError",
    "check_vocab_compat",
    "parse_draft",
    "register_drafter",
    "register_kind",
    "resolve_drafter",
]


def resolve_drafter(
    draft: Any,
    verifier: torch.nn.Module,
    *,
    verifier_tokenizer: Any = None,
    draft_tokenizer: Any = None,
) -> Drafter:
    """Build a drafter from a user-facing spec: the one place drafter names become drafters.

    ``draft`` may be a :class:`Drafter`, a transformers causal LM, or a name of any kind in the registry
    (:mod:`specdec.draft_spec`; :func:`~specdec.draft_spec.forms` lists them) or a local model path. A name builds
    through the kind that parses it (its ``build``; what that returns is resolved again, so a builder may return a
    causal LM, and what it returns is checked: :class:`DrafterTypeError`).
    """
    if isinstance(draft, Drafter):
        return draft
    if isinstance(draft, torch.nn.Module):
        return from_module(draft, verifier, verifier_tokenizer, draft_tokenizer)
    if not isinstance(draft, str):
        raise TypeError(f"cannot use {type(draft).__name__} as a drafter: pass an instance of a subclass of "
                        f"specdec.drafters.Drafter, a causal LM, or a drafter name: {forms()}")
    spec = parse_draft(draft)
    built = spec.declared.build(spec, verifier, verifier_tokenizer, draft_tokenizer)
    if not isinstance(built, str):
        _check_built(spec.declared.name, built)
    return resolve_drafter(built, verifier, verifier_tokenizer=verifier_tokenizer, draft_tokenizer=draft_tokenizer)


def _check_built(prefix: str, built: Any) -> None:
    """Raise :class:`DrafterTypeError` unless a kind's builder returned a drafter or a causal LM."""
    if isinstance(built, Drafter):
        return
    if isinstance(built, torch.nn.Module) and hasattr(built, "config") \
            and callable(getattr(built, "get_output_embeddings", None)) and built.get_output_embeddings() is not None:
        return
    raise DrafterTypeError(f"the builder registered for drafter prefix {prefix!r} returned {what(built)}: it must "
                           "return a specdec.drafters.Drafter, a causal LM (a model with a config and an LM head, "
                           "e.g. AutoModelForCausalLM), or another drafter's name")
