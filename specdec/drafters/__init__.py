"""Drafters: things that propose tokens for the verifier to check."""

from __future__ import annotations

from typing import Any

import torch

from specdec.draft_spec import COMPOSITE_DEFAULT_SCHEME, DraftSpec, DraftSpecError, parse_draft, register_drafter
from specdec.draft_spec import registered_builder
from specdec.drafters.base import Commit, DraftContext, Drafter, Proposal, Rows
from specdec.drafters.model import ModelDrafter, VocabularyMismatchError, check_vocab_compat
from specdec.drafters.composite import CompositeDrafter
from specdec.drafters.layer_skip import LayerSkipDrafter
from specdec.drafters.legacy import LegacyDrafter, is_legacy_drafter
from specdec.drafters.oracle import OracleDrafter
from specdec.drafters.prompt_lookup import PromptLookupDrafter

__all__ = [
    "COMPOSITE_DEFAULT_SCHEME",
    "Commit",
    "CompositeDrafter",
    "DraftContext",
    "DraftSpec",
    "DraftSpecError",
    "Drafter",
    "LayerSkipDrafter",
    "ModelDrafter",
    "OracleDrafter",
    "PromptLookupDrafter",
    "Proposal",
    "Rows",
    "VocabularyMismatchError",
    "check_vocab_compat",
    "parse_draft",
    "register_drafter",
    "resolve_drafter",
]


def _derived_from(draft: torch.nn.Module, verifier: torch.nn.Module) -> bool:
    """Whether ``draft`` is built from ``verifier`` (a specdec.quant copy shares its embedding table)."""
    try:
        mine, theirs = draft.get_input_embeddings().weight, verifier.get_input_embeddings().weight
    except AttributeError:
        return False
    return draft is verifier or mine.data_ptr() == theirs.data_ptr()


def _from_module(draft: torch.nn.Module, verifier: torch.nn.Module, verifier_tokenizer: Any, draft_tokenizer: Any) -> Drafter:
    check_vocab_compat(verifier, draft, verifier_tokenizer, draft_tokenizer)
    return ModelDrafter(draft, reuse_verifier_prompt=_derived_from(draft, verifier))


def resolve_drafter(
    draft: Any,
    verifier: torch.nn.Module,
    *,
    verifier_tokenizer: Any = None,
    draft_tokenizer: Any = None,
) -> Drafter:
    """Build a drafter from a user-facing spec: the one place drafter names become drafters.

    ``draft`` may be a :class:`Drafter`, a transformers causal LM, or a name (see
    :mod:`specdec.draft_spec`): ``"self:SCHEME"`` (a quantized copy of the verifier, e.g.
    ``"self:int8"``), ``"prompt-lookup"`` (n-gram copying, no model), ``"composite"`` /
    ``"composite:SCHEME"`` (prompt lookup, else a quantized self-copy; default int8), ``"composite:eagle[:DIR]"``
    (prompt lookup, else a draft head),
    ``"layer-skip:N"`` (the verifier's first N layers), ``"eagle"`` / ``"eagle:DIR"`` (a trained draft
    head: the shipped one for the embedded model, or a local EAGLE / EAGLE-3 directory), a registered
    prefix, or a local model path.
    """
    if isinstance(draft, Drafter):
        return draft
    if is_legacy_drafter(draft):
        return LegacyDrafter(draft)
    if isinstance(draft, torch.nn.Module):
        return _from_module(draft, verifier, verifier_tokenizer, draft_tokenizer)
    if not isinstance(draft, str):
        raise TypeError(
            f"cannot use {type(draft).__name__} as a drafter: pass a Drafter, a causal LM, 'self:SCHEME' or a model path"
        )
    spec = parse_draft(draft)
    if spec.kind == "registered":
        built = registered_builder(spec)(spec.text, verifier, verifier_tokenizer)
        return resolve_drafter(built, verifier, verifier_tokenizer=verifier_tokenizer, draft_tokenizer=draft_tokenizer)
    if spec.kind == "prompt-lookup":
        return PromptLookupDrafter()
    if spec.kind == "composite":
        inner = ("eagle" + (f":{spec.head}" if spec.head else "")) if spec.inner == "eagle" else f"self:{spec.scheme}"
        return CompositeDrafter(resolve_drafter(inner, verifier))
    if spec.kind == "layer-skip":
        return LayerSkipDrafter(verifier, spec.layers)
    if spec.kind == "eagle":
        from specdec.drafters.eagle import EagleDrafter
        from specdec.heads.shipped import shipped_head

        return EagleDrafter.from_pretrained(spec.head or shipped_head(verifier), verifier)
    if spec.kind == "self":
        from specdec.quant import quantize

        return ModelDrafter(quantize(verifier, spec.scheme), reuse_verifier_prompt=True)
    from specdec.models import load_model

    model, tok = load_model(spec.text, dtype=verifier.dtype, device=verifier.device)
    return _from_module(model, verifier, verifier_tokenizer, draft_tokenizer or tok)
