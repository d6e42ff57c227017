"""Model configs: load one from any accepted form, and read fields whatever their spelling.

The planner reads a preset as its plain dict, so ``specdec plan PRESET`` imports neither
transformers nor torch. A ``config.json`` (or a dict) from elsewhere goes through transformers'
``AutoConfig``, whose per-family defaults (sliding windows, layer types, KV heads) it relies on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Union

from specdec.sizing.presets import get_preset, preset_names

if TYPE_CHECKING:  # transformers is imported lazily: `specdec plan` should start fast
    from transformers import PretrainedConfig

ConfigLike = Union["PretrainedConfig", Mapping[str, Any], str, os.PathLike]


def load_config(spec: ConfigLike) -> "PretrainedConfig":
    """A transformers config from a config object, a dict, a ``config.json`` path (or a directory
    holding one), or a preset name (see :mod:`specdec.sizing.presets`). Never downloads anything.

    Raises:
        ValueError: when ``spec`` is neither an existing path nor a known preset (the message lists
            the presets), or the file is not a JSON object.
    """
    from transformers import PretrainedConfig

    if isinstance(spec, PretrainedConfig):
        return spec
    if isinstance(spec, Mapping):
        return _config_from_dict(dict(spec), None)
    if isinstance(spec, (str, os.PathLike)):
        path = _config_path(spec)
        if path is not None:
            return _config_from_dict(_read_json(path), str(spec))
        if isinstance(spec, str):
            return _config_from_dict(_preset(spec), spec.strip().lower())
        raise ValueError(f"no such config file or directory: {spec!s}")
    raise TypeError(f"cannot load a config from {type(spec).__name__}")


class PresetConfig(dict):
    """A preset's fields as a plain dict, already resolved: read as they are, without transformers."""


def resolve(config: ConfigLike) -> Any:
    """The decoder config behind any accepted form: a preset stays a plain dict (no transformers),
    a path or dict becomes a transformers config, a config object is used as it is."""
    if isinstance(config, PresetConfig):
        return config
    if isinstance(config, str) and _config_path(config) is None:
        data = PresetConfig(_preset(config))
        data["_name_or_path"] = config.strip().lower()  # the name load_config gives it
        return data
    if isinstance(config, (str, os.PathLike, Mapping)):
        config = load_config(config)
    return text_config(config)


def _config_path(spec: str | os.PathLike) -> Path | None:
    """The ``config.json`` that ``spec`` names (a file, or a directory holding one), None if no such path."""
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ValueError(f"{spec!s} is a directory without a config.json")
    return path if path.is_file() else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def _preset(name: str) -> dict[str, Any]:
    try:
        return get_preset(name)
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}: not a preset and no such config.json or directory. "
            f"Presets: {', '.join(preset_names())}"
        ) from None


def _config_from_dict(data: dict[str, Any], name: str | None) -> "PretrainedConfig":
    from transformers import AutoConfig, PretrainedConfig

    data = dict(data)
    model_type = data.pop("model_type", None)
    config = None
    if model_type:
        try:
            config = AutoConfig.for_model(model_type, **data)
        except Exception:  # unknown to this transformers version, or fails its validation
            config = None
    if config is None:
        # Keep the raw fields; set them after construction so that transformers' validators (e.g. of
        # layer_types) cannot stop the planner from reading them and refusing clearly itself.
        config = PretrainedConfig()
        for key, value in data.items():
            try:
                setattr(config, key, value)
            except Exception:
                object.__setattr__(config, key, value)
        if model_type:
            config.model_type = model_type  # instance attribute: PretrainedConfig's is ""
    if name:
        config.name_or_path = name
    return config


def text_config(config: Any) -> Any:
    """The decoder's config of a multimodal config (Gemma 3, Llava, ...), else the config itself."""
    if isinstance(config, Mapping):
        inner = config.get("text_config")
        return inner if isinstance(inner, Mapping) else config
    getter = getattr(config, "get_text_config", None)
    if callable(getter):
        try:
            return getter(decoder=True)
        except TypeError:
            return getter()
    return config


def get_field(config: Any, *names: str, default: Any = None) -> Any:
    """The first of ``names`` that ``config`` (object or dict) sets to something other than None."""
    for name in names:
        value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
        if value is not None:
            return value
    return default


def model_name(config: Any, fallback: str = "model") -> str:
    """The name a plan shows for ``config``: its path or preset name, else its model type."""
    name = get_field(config, "name_or_path", "_name_or_path")
    if name:
        return str(name)
    return str(get_field(text_config(config), "model_type", default=fallback) or fallback)


def max_positions(config: Any) -> int | None:
    """The model's maximum context (``max_position_embeddings`` or its other spellings), if set."""
    cfg = text_config(config)
    value = get_field(cfg, "max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
    return int(value) if value else None


def is_self_draft(verifier: Any, drafter: Any) -> bool:
    """Whether the drafter is a copy of the verifier (``"self"``, or the same spec/object)."""
    if drafter is None:
        return False
    if isinstance(drafter, str) and drafter.strip().lower() == "self":
        return True
    if drafter is verifier:
        return True
    if isinstance(drafter, (str, os.PathLike)) and isinstance(verifier, (str, os.PathLike)):
        return str(drafter).strip().lower() == str(verifier).strip().lower()
    return False
