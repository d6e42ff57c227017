"""A user's command-line choices checked before anything loads, and the one-line form of an error message.

Shared by ``specdec`` (cli.py), ``specdec eval`` and ``specdec train-head`` / ``head-report``: each imports these
from here, below all of them, rather than from one another.
"""

from __future__ import annotations

from typing import Any, Sequence

from specdec.errors import SpecdecError


def one_line(error: BaseException) -> str:
    """An error's message on one line (the CLI's errors are single ``error:`` lines; what they catch is
    :class:`specdec.errors.SpecdecError`, the base of every error a user can fix)."""
    return " ".join(str(error).split("\n"))


def check_model_and_draft(model: str, drafts: str | Sequence[str]) -> None:
    """A --model that is not local, or a --draft name that cannot be built, fails before the model loads: one-line
    ``error:`` exits (``specdec generate``, ``demo`` and ``eval`` alike). A kind that checks names against the
    verifier (``layer-skip:N``'s layer count) reads ``model``'s config, not its weights."""
    from specdec.models import DEFAULT_ALIASES, ModelNotFoundError, resolve_model_source

    if model not in DEFAULT_ALIASES:  # the embedded default is checked (with an install hint) when it loads
        try:
            resolve_model_source(model)
        except ModelNotFoundError as e:
            raise SystemExit(f"error: --model: {e}") from None
    from specdec.draft_spec import DraftSpecError, parse_draft

    config: Any = ...  # the verifier's config (...: not read yet), read once and only for a kind that asks
    for draft in [drafts] if isinstance(drafts, str) else drafts:
        try:
            spec = parse_draft(draft)
        except DraftSpecError as e:
            raise SystemExit(f"error: --draft: {one_line(e)}") from None
        kind = spec.declared
        try:
            if kind.check is not None:
                kind.check(spec)
            if kind.check_verifier is not None:
                config = _verifier_config(model) if config is ... else config
                if config is not None:
                    kind.check_verifier(spec, config)
        except DraftSpecError as e:  # the message starts with the drafter's name
            raise SystemExit(f"error: --draft {one_line(e)}") from None



def _verifier_config(model: str) -> Any | None:
    """``model``'s transformers config, read without its weights (a GGUF file's metadata included); None when it
    cannot be read, and the drafter is then checked when the model has loaded."""
    from specdec.models import ModelNotFoundError, resolve_model_source

    try:
        path, kwargs = resolve_model_source(model)
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(path, **kwargs)
    except (ModelNotFoundError, OSError, ValueError, KeyError, ImportError):  # what an unreadable config raises
        return None


class DeviceError(SpecdecError, ValueError):
    """A ``--device`` this machine does not have (or that is not a device)."""


def check_device(device: str) -> str:
    """``device`` (a ``--device`` value) when this machine has it; else :class:`DeviceError` with a one-line message.

    Every command that takes ``--device`` checks it with this before loading anything, so ``--device cuda`` without
    CUDA is one line, not an assertion deep in torch."""
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise DeviceError(f"{device!r} is not a device (e.g. cpu, cuda, cuda:1)") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch is built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
            raise DeviceError(f"{device!r}: CUDA is not available ({why}); use --device cpu")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise DeviceError(f"{device!r}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                              f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    elif parsed.type != "cpu":
        backend = getattr(torch.backends, parsed.type, None) or getattr(torch, parsed.type, None)
        available = getattr(backend, "is_available", None)
        if callable(available) and not available():
            raise DeviceError(f"{device!r}: {parsed.type} is not available on this machine; use --device cpu")
    return device
