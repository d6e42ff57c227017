"""Drafters: things that propose tokens for the verifier to check."""

from __future__ import annotations

from typing import Any

import torch

from specdec.drafters.base import DraftContext, Drafter, Proposal
from specdec.drafters.model import ModelDrafter, VocabularyMismatchError, check_vocab_compat
from specdec.drafters.composite import CompositeDrafter
from specdec.drafters.layer_skip import LayerSkipDrafter
from specdec.drafters.prompt_lookup import PromptLookupDrafter

#: the self-copy behind a bare ``"composite"`` drafter
COMPOSITE_DEFAULT_SCHEME = "int8"

__all__ = [
    "CompositeDrafter",
    "LayerSkipDrafter",
    "DraftContext",
    "Drafter",
    "ModelDrafter",
    "PromptLookupDrafter",
    "Proposal",
    "VocabularyMismatchError",
    "check_vocab_compat",
    "resolve_drafter",
]


def _derived_from(draft: torch.nn.Module, verifier: torch.nn.Module) -> bool:
    """Whether ``draft`` is built from ``verifier`` (a specdec.quant copy shares its embedding table)."""
    try:
        mine, theirs = draft.get_input_embeddings().weight, verifier.get_input_embeddings().weight
    except AttributeError:
        return False
    return draft is verifier or mine.data_ptr() == theirs.data_ptr()


def resolve_drafter(
    draft: Any,
    verifier: torch.nn.Module,
    *,
    verifier_tokenizer: Any = None,
    draft_tokenizer: Any = None,
) -> Drafter:
    """Build a drafter from a user-facing spec.

    ``draft`` may be a :class:`Drafter`, a transformers causal LM, ``"self:SCHEME"`` (a quantized
    copy of the verifier, e.g. ``"self:int8"``), ``"prompt-lookup"`` (n-gram copying, no model),
    ``"composite"`` / ``"composite:SCHEME"`` (prompt lookup, else a quantized self-copy; default int8),
    ``"layer-skip:N"`` (the verifier's first N layers), or a local model directory.
    """
    if draft == "prompt-lookup":
        return PromptLookupDrafter()
    if isinstance(draft, str) and (draft == "composite" or draft.startswith("composite:")):
        scheme = draft.split(":", 1)[1] if ":" in draft else COMPOSITE_DEFAULT_SCHEME
        return CompositeDrafter(resolve_drafter(f"self:{scheme}", verifier))
    if isinstance(draft, str) and draft.startswith("layer-skip:"):
        try:
            layers = int(draft.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"layer-skip needs a layer count, e.g. 'layer-skip:8', got {draft!r}") from None
        return LayerSkipDrafter(verifier, layers)
    if isinstance(draft, str) and draft.startswith("self:"):
        from specdec.quant import quantize

        return ModelDrafter(quantize(verifier, draft.split(":", 1)[1]), reuse_verifier_prompt=True)
    if isinstance(draft, str):
        from specdec.models import load_model

        model, tok = load_model(draft)
        check_vocab_compat(verifier, model, verifier_tokenizer, tok)
        return ModelDrafter(model)
    if isinstance(draft, torch.nn.Module):
        check_vocab_compat(verifier, draft, verifier_tokenizer, draft_tokenizer)
        return ModelDrafter(draft, reuse_verifier_prompt=_derived_from(draft, verifier))
    if isinstance(draft, Drafter):
        return draft
    raise TypeError(
        f"cannot use {type(draft).__name__} as a drafter: pass a Drafter, a causal LM, 'self:SCHEME' or a model path"
    )
