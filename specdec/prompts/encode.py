"""Prompt text to token ids: the chat template every command and the evaluation apply alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # torch is imported when a prompt is encoded, not when the CLI reads a prompt file
    import torch


def encode_prompt(tokenizer: Any, prompt: str, chat: bool = True) -> "torch.Tensor":
    """Token ids ``[1, n]`` for one prompt, through the chat template (one user turn, then the
    assistant's generation prompt) when ``chat`` and the tokenizer has one; raw text otherwise."""
    if not prompt or not prompt.strip():
        raise ValueError("empty prompt: give the model some text to continue")
    if chat and getattr(tokenizer, "chat_template", None):
        return _input_ids(tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        ))
    return _input_ids(tokenizer(prompt, return_tensors="pt"))


def _input_ids(encoding: Any) -> "torch.Tensor":
    """``input_ids`` of what a tokenizer returned: a ``BatchEncoding`` / dict, or an object with the attribute."""
    return encoding["input_ids"] if isinstance(encoding, Mapping) else encoding.input_ids


def encode_batch(
    tokenizer: Any, prompts: Sequence[str], chat: bool = True, device: Any = "cpu"
) -> tuple["torch.Tensor", "torch.Tensor"]:
    """The prompts' ids left padded into one batch ``[B, width]`` (as ``model.generate`` expects) and
    their attention mask, on ``device``. Each row is :func:`encode_prompt` of its prompt."""
    import torch

    rows = [encode_prompt(tokenizer, p, chat)[0] for p in prompts]
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    ids = torch.full((len(rows), width), pad, dtype=torch.long, device="cpu")  # filled on the host, then moved
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, width - len(row):], mask[b, width - len(row):] = row, 1
    return ids.to(device), mask.to(device)
