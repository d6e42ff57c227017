"""The built-in drafter kinds, each declared once in the registry of :mod:`specdec.draft_spec`.

A kind says how its name parses, how it builds, how it describes itself, whether transformers'
assisted generation can use what it builds, and its form for help texts. Torch-free at import: the
builders and describers import what they need when they run.
"""

from __future__ import annotations

import os
from typing import Any

from specdec.draft_registry import COMPOSITE_DEFAULT_SCHEME, FALLBACK_KIND, DraftSpec, DraftSpecError, DrafterKind
from specdec.draft_registry import forms, parse_draft, register_kind

#: drafters that do not inherit the verifier's storage grid, suggested next to a grid-bound one
GRID_FREE_DRAFTERS = "eagle, self:int8 or prompt-lookup"
#: what a composite drafter does before its inner drafter, in its description
_LOOKUP_FIRST = "prompt lookup where the text repeats, else "
_SUFFIX_FIRST = "suffix decoding where this call or an earlier one repeats, else "


# --- self:SCHEME ----------------------------------------------------------------------------------------


def _scheme(text: str, arg: str | None) -> dict[str, Any]:
    if not arg:
        raise DraftSpecError(f"drafter {text!r} needs a quantization scheme after ':', e.g. {text.partition(':')[0]}:int8")
    return {"scheme": arg}


def _build_self(spec: DraftSpec, verifier: Any, verifier_tokenizer: Any, draft_tokenizer: Any) -> Any:
    from specdec.drafters.model import ModelDrafter
    from specdec.quant import quantize

    return ModelDrafter(quantize(verifier, spec.scheme), reuse_verifier_prompt=True)


def _describe_self(spec: DraftSpec, verifier: Any, before: str = "") -> dict[str, Any]:
    from specdec.quant import weight_error

    err = weight_error(verifier, spec.scheme)
    head = "" if err.head_weight_error is None else f", LM head {100 * err.head_weight_error:.2f}%"
    if err.grid_bound:
        note = ("its weights coincide with the verifier's storage grid (the verifier's weights already lie on "
                f"this scheme's grid), so acceptance is near-perfect and not representative of a bf16 model; "
                f"for a grid-free drafter try --draft {GRID_FREE_DRAFTERS}")
    else:
        note = "acceptance reflects how far quantization moves the verifier's weights (and the drafter's bf16 activations)"
    return {"weight_error": err.weight_error, "head_weight_error": err.head_weight_error, "grid_bound": err.grid_bound,
            "description": (f"{spec.text}: {before}a quantized copy of the verifier ({err.scheme}); relative weight "
                            f"error against the verifier {100 * err.weight_error:.2f}% over {err.layers} linear "
                            f"layers{head}"),
            "note": note}


def _check_scheme(spec: DraftSpec) -> None:
    from specdec.quant import UnknownSchemeError, parse_scheme

    try:
        parse_scheme(spec.scheme)
    except UnknownSchemeError as e:
        raise DraftSpecError(f"{spec.text}: {e}") from None


register_kind(DrafterKind("self", "self:SCHEME (e.g. self:int8)", _build_self, parse=_scheme, describe=_describe_self,
                          check=_check_scheme, hf_assistant=True), builtin=True)


# --- prompt-lookup --------------------------------------------------------------------------------------


def _build_prompt_lookup(spec: DraftSpec, verifier: Any, verifier_tokenizer: Any, draft_tokenizer: Any) -> Any:
    from specdec.drafters.prompt_lookup import PromptLookupDrafter

    return PromptLookupDrafter()


register_kind(DrafterKind(
    "prompt-lookup", "prompt-lookup", _build_prompt_lookup,
    parse=lambda text, arg: {} if arg is None else None,  # "prompt-lookup:X" is a path, as it always was
    describe=lambda spec, verifier: {
        "description": "prompt-lookup: copies n-grams from the prompt and the output so far (no model)",
        "note": "acceptance is high where the output repeats its context (code edits, summaries, quotes), low elsewhere"},
), builtin=True)


# --- suffix[:TOKENS] -----------------------------------------------------------------------------------


def _suffix(text: str, arg: str | None) -> dict[str, Any]:
    if arg is not None and not (arg.isascii() and arg.isdigit()):  # ASCII digits only, as layer-skip:N
        raise DraftSpecError(f"drafter {text!r}: suffix takes its cache budget in tokens after ':', e.g. suffix:100000")
    return {}


def _build_suffix(spec: DraftSpec, verifier: Any, verifier_tokenizer: Any, draft_tokenizer: Any) -> Any:
    from specdec.drafters.suffix import SuffixDrafter

    return SuffixDrafter() if spec.arg is None else SuffixDrafter(int(spec.arg))


register_kind(DrafterKind(
    "suffix", "suffix[:TOKENS]", _build_suffix, parse=_suffix,
    describe=lambda spec, verifier: {
        "description": (f"{spec.text}: suffix decoding: the most frequent continuations of the text's suffix, in this "
                        "call's prompt and output and in earlier calls' outputs (a cache this model keeps; no model)"),
        "note": "acceptance grows as calls repeat each other (agent loops, extraction with one schema, revisions)"},
), builtin=True)


def learns_across_calls(name: str) -> bool:
    """Whether drafter ``name`` keeps a cache across calls (``suffix``, ``composite:suffix``): ``specdec eval`` then
    measures it cold (empty cache) and warm (the cache the run's earlier calls left)."""
    spec = parse_draft(name)
    return spec.kind == "suffix" or (spec.kind == "composite" and spec.inner == "suffix")


# --- composite[:SCHEME], composite:eagle[:DIR] ----------------------------------------------------------
# composite:suffix[:SCHEME] too


def _composite(text: str, arg: str | None) -> dict[str, Any]:
    if arg is None:
        return {"scheme": COMPOSITE_DEFAULT_SCHEME}
    inner, _, head = arg.partition(":")
    if inner == "suffix":  # suffix decoding first, then a self-copy (int8 unless a scheme follows)
        return {"scheme": head.strip() or COMPOSITE_DEFAULT_SCHEME, "inner": "suffix"}
    if inner != "eagle":
        return _scheme(text, arg)
    if arg != "eagle" and not head.strip():
        raise DraftSpecError(f"drafter {text!r} needs a head directory after 'eagle:', e.g. composite:eagle:./my-head")
    return {"head": head.strip() or None, "inner": "eagle"}


def _build_composite(spec: DraftSpec, verifier: Any, verifier_tokenizer: Any, draft_tokenizer: Any) -> Any:
    from specdec.drafters.composite import CompositeDrafter

    inner = _build_eagle if spec.inner == "eagle" else _build_self
    if spec.inner == "suffix":
        from specdec.drafters.suffix import SuffixCompositeDrafter

        return SuffixCompositeDrafter(inner(spec, verifier, verifier_tokenizer, draft_tokenizer))
    return CompositeDrafter(inner(spec, verifier, verifier_tokenizer, draft_tokenizer))


register_kind(DrafterKind(
    "composite", "composite[:SCHEME], composite:eagle[:DIR], composite:suffix[:SCHEME]", _build_composite,
    parse=_composite,
    describe=lambda spec, verifier: (_describe_eagle if spec.inner == "eagle" else _describe_self)(
        spec, verifier, _SUFFIX_FIRST if spec.inner == "suffix" else _LOOKUP_FIRST),
    check=lambda spec: _check_head(spec) if spec.inner == "eagle" else _check_scheme(spec),
), builtin=True)


# --- layer-skip:N ---------------------------------------------------------------------------------------


def _layers(text: str, arg: str | None) -> dict[str, Any]:
    count = arg or ""
    # ASCII only: str.isdigit() also passes '²' (which int() refuses) and '٣' (which int() reads as 3)
    if not (count.isascii() and count.isdigit()) or int(count) < 1:
        raise DraftSpecError(f"drafter {text!r}: layer-skip needs a layer count >= 1, e.g. layer-skip:8")
    return {"layers": int(count)}


def _build_layer_skip(spec: DraftSpec, verifier: Any, verifier_tokenizer: Any, draft_tokenizer: Any) -> Any:
    from specdec.drafters.layer_skip import LayerSkipDrafter

    return LayerSkipDrafter(verifier, spec.layers)


def _check_layers_fit(spec: DraftSpec, config: Any) -> None:
    from specdec.drafters.layer_skip import check_layer_count

    total = getattr(config, "num_hidden_layers", None)
    if isinstance(total, int):  # a config without it: the drafter checks the model once it loads
        try:
            check_layer_count(spec.layers, total)
        except DraftSpecError as e:
            raise DraftSpecError(f"{spec.text}: {e}") from None


register_kind(DrafterKind(
    "layer-skip", "layer-skip:N", _build_layer_skip, parse=_layers, check_verifier=_check_layers_fit,
    describe=lambda spec, verifier: {
        "description": f"{spec.text}: the verifier's first {spec.layers} layers and its LM head (no extra weights)",
        "note": "acceptance falls as fewer layers are kept"},
), builtin=True)

# --- eagle[:DIR] ----------------------------------------------------------------------------------------


def _head(text: str, arg: str | None) -> dict[str, Any]:
    if arg is not None and not arg.strip():
        raise DraftSpecError(f"drafter {text!r} needs a head directory after ':', e.g. eagle:./my-head")
    return {"head": (arg or "").strip() or None}


def _build_eagle(spec: DraftSpec, verifier: Any, verifier_tokenizer: Any, draft_tokenizer: Any) -> Any:
    from specdec.drafters.eagle import EagleDrafter
    from specdec.heads.shipped import shipped_head

    return EagleDrafter.from_pretrained(spec.head or shipped_head(verifier), verifier)


def _describe_eagle(spec: DraftSpec, verifier: Any, before: str = "") -> dict[str, Any]:
    where = spec.head or "the head shipped for this model"
    return {"description": (f"{spec.text}: {before}a trained draft head (EAGLE style) from {where}, reading the "
                            "verifier's hidden states"),
            "note": "grid-free: acceptance comes from training on the verifier's own outputs, as it would for a bf16 model",
            "grid_bound": False}


def _check_head(spec: DraftSpec) -> None:
    if spec.head is not None and not os.path.isdir(spec.head):
        raise DraftSpecError(f"{spec.text}: draft head directory {spec.head!r} does not exist")


register_kind(DrafterKind("eagle", "eagle[:DIR]", _build_eagle, parse=_head, describe=_describe_eagle, check=_check_head),
              builtin=True)


# --- mtp: the verifier's own multi-token-prediction layers -----------------------------------------------


def _build_mtp(spec: DraftSpec, verifier: Any, verifier_tokenizer: Any, draft_tokenizer: Any) -> Any:
    from specdec.drafters.mtp import MtpDrafter

    return MtpDrafter.from_model(verifier)


def _check_mtp_config(spec: DraftSpec, config: Any) -> None:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if not (getattr(text, "num_mtp_layers", 0) or getattr(text, "mtp_num_hidden_layers", 0)):
        raise DraftSpecError(f"{spec.text}: model type {getattr(config, 'model_type', '?')!r} has no MTP layers (its "
                             "config sets no num_mtp_layers or mtp_num_hidden_layers); use another drafter, e.g. "
                             "prompt-lookup")


register_kind(DrafterKind(
    "mtp", "mtp", _build_mtp, parse=lambda text, arg: {} if arg is None else None, check_verifier=_check_mtp_config,
    describe=lambda spec, verifier: {
        "description": "mtp: the verifier's own multi-token-prediction layers (DeepSeek-V3, GLM-4.5, Qwen3.5 style), read "
                       "from its checkpoint, reading its hidden states; recursive past their trained depth",
        "note": "acceptance is what the model's MTP training gives: highest at the first draft, falling past the "
                "trained depth"},
), builtin=True)


# --- auto: the candidate with the best measured tokens a second here ------------------------------------------


def _build_auto(spec: DraftSpec, verifier: Any, verifier_tokenizer: Any, draft_tokenizer: Any) -> Any:
    from specdec.drafters import resolve_drafter
    from specdec.drafters.auto import AutoDrafter

    return AutoDrafter(verifier, verifier_tokenizer,
                       lambda name: resolve_drafter(name, verifier, verifier_tokenizer=verifier_tokenizer))


AUTO = "auto"  # the kind's name is its whole form

register_kind(DrafterKind(
    AUTO, AUTO, _build_auto, parse=lambda text, arg: {} if arg is None else None,
    describe=lambda spec, verifier: {
        "description": ("auto: of prompt lookup, suffix decoding, the self:* copies with a backend here, the shipped "
                        "head and their composites, the one with the best tokens a second measured on this machine"),
        "note": "the choice and the ranking it measured are in last_stats.draft_choice (--json: draft_choice)"},
), builtin=True)


# --- pard: a draft model that proposes k tokens in one forward ------------------------------------------------


def _pard(text: str, arg: str | None) -> dict[str, Any]:
    where, _, option = (arg or "").partition(",")
    if not where.strip():
        raise DraftSpecError(f"drafter {text!r} needs the PARD model's directory after ':', e.g. pard:./pard-135m")
    scheme = None
    if option:
        key, _, scheme = option.partition("=")
        if key.strip() != "quant" or not scheme.strip():
            raise DraftSpecError(f"drafter {text!r}: after the directory only ',quant=SCHEME' (e.g. ,quant=int8)")
    return {"head": where.strip(), "scheme": scheme.strip() if scheme else None}


def _build_pard(spec: DraftSpec, verifier: Any, verifier_tokenizer: Any, draft_tokenizer: Any) -> Any:
    from specdec.drafters.model import check_vocab_compat
    from specdec.drafters.pard import PardDrafter, pard_tokens
    from specdec.models import load_model

    model, tok = load_model(spec.head, dtype=verifier.dtype, device=verifier.device)
    pard_tokens(model.config)  # a plain model fails here, naming the key
    check_vocab_compat(verifier, model, verifier_tokenizer, draft_tokenizer or tok)
    if spec.scheme:
        from specdec.quant import quantize

        model = quantize(model, spec.scheme)
    return PardDrafter(model)


def _check_pard(spec: DraftSpec) -> None:
    from specdec.models import ModelNotFoundError, resolve_model_source

    try:
        resolve_model_source(spec.head)
    except ModelNotFoundError:
        raise DraftSpecError(f"{spec.text}: no PARD model at {spec.head!r}") from None
    if spec.scheme:
        _check_scheme(spec)


register_kind(DrafterKind(
    "pard", "pard:DIR[,quant=SCHEME]", _build_pard, parse=_pard, check=_check_pard,
    describe=lambda spec, verifier: {
        "description": f"{spec.text}: a PARD draft model (k tokens from one forward, mask tokens after the context)"
                       + (f", quantized {spec.scheme}" if spec.scheme else ""),
        "note": "acceptance falls with the draft position: each mask predicts further ahead without the drafts before it"},
), builtin=True)


# --- dflash: a block drafter reading the verifier's hidden states ---------------------------------------------


def _dflash(text: str, arg: str | None) -> dict[str, Any]:
    if not (arg or "").strip():
        raise DraftSpecError(f"drafter {text!r} needs the DFlash drafter's directory after ':', e.g. dflash:./dflash")
    return {"head": arg.strip()}


def _build_dflash(spec: DraftSpec, verifier: Any, verifier_tokenizer: Any, draft_tokenizer: Any) -> Any:
    from specdec.drafters.dflash import DFlashDrafter

    return DFlashDrafter.from_pretrained(spec.head, verifier)


def _check_dflash(spec: DraftSpec) -> None:
    if not os.path.isdir(spec.head):
        raise DraftSpecError(f"{spec.text}: DFlash drafter directory {spec.head!r} does not exist")


register_kind(DrafterKind(
    "dflash", "dflash:DIR", _build_dflash, parse=_dflash, check=_check_dflash,
    describe=lambda spec, verifier: {
        "description": f"{spec.text}: a DFlash block drafter (a block of drafts from one forward, reading the "
                       "verifier's hidden states, with its embedding and LM head)",
        "note": "acceptance falls with the position in the block: each mask is drafted without the drafts before it"},
), builtin=True)


# --- a local model directory / .gguf file (every other name) ---------------------------------------------


def _build_path(spec: DraftSpec, verifier: Any, verifier_tokenizer: Any, draft_tokenizer: Any) -> Any:
    from specdec.drafters.model import from_module
    from specdec.models import load_model

    model, tok = load_model(spec.text, dtype=verifier.dtype, device=verifier.device)
    return from_module(model, verifier, verifier_tokenizer, draft_tokenizer or tok)


def _check_path(spec: DraftSpec) -> None:
    from specdec.models import DEFAULT_ALIASES, ModelNotFoundError, resolve_model_source

    if spec.text in DEFAULT_ALIASES:
        return
    try:
        resolve_model_source(spec.text)
    except ModelNotFoundError:
        raise DraftSpecError(f"{spec.text!r} is not a drafter: use {forms()}") from None


register_kind(DrafterKind(
    FALLBACK_KIND, "a local model directory / .gguf file", _build_path, check=_check_path, hf_assistant=True,
    describe=lambda spec, verifier: {
        "description": f"{spec.text}: a separate draft model",
        "note": "acceptance depends on how closely that model's next-token choices match the verifier's"},
), builtin=True)
