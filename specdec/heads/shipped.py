"""Draft heads that ship inside the package, found by the verifier they were trained for (``draft="eagle"``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specdec.heads.checkpoint import HeadLoadError, read_config

SHIPPED_DIR = Path(__file__).with_name("weights")
#: the verifier config fields a shipped head records under ``specdec_verifier`` and must match
FINGERPRINT = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "intermediate_size", "vocab_size")


def fingerprint(verifier_config: Any) -> dict[str, Any]:
    """The fields of a verifier config that identify which shipped head fits it."""
    c = verifier_config.get_text_config() if hasattr(verifier_config, "get_text_config") else verifier_config
    return {k: getattr(c, k, None) for k in FINGERPRINT}


def shipped_heads() -> list[Path]:
    """Directories of the heads shipped with specdec."""
    return sorted(p.parent for p in SHIPPED_DIR.glob("*/config.json"))


def shipped_head(verifier: Any) -> Path:
    """The shipped head trained for ``verifier``, or a :class:`HeadLoadError` saying how to get one."""
    want = fingerprint(verifier.config)
    for directory in shipped_heads():
        recorded = read_config(directory / "config.json").get("specdec_verifier") or {}  # a broken file: HeadLoadError
        if isinstance(recorded, dict) and all(recorded.get(k) == v for k, v in want.items()):
            return directory
    names = ", ".join(p.name for p in shipped_heads()) or "none"
    raise HeadLoadError(
        f"no draft head ships for this verifier ({want['model_type']}, hidden {want['hidden_size']}, "
        f"{want['num_hidden_layers']} layers; shipped: {names}). Train one with "
        "`specdec train-head --model MODEL --data PROMPTS --out DIR`, then use draft='eagle:DIR'."
    )
