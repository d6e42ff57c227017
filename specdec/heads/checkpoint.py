"""Loading and saving draft heads in the public EAGLE / EAGLE-3 layouts (config.json + model.safetensors or
pytorch_model.bin), so heads trained elsewhere load here and heads trained here serve in vLLM / SGLang."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from specdec.heads.config import HeadConfig
from specdec.heads.modules import EagleHead

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
#: keys some exporters add that carry nothing the head needs
_IGNORED = ("rotary_emb.inv_freq",)


class HeadLoadError(ValueError):
    """A head directory that cannot serve this verifier; the message says which file, key or shape."""


def _read_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        path = directory / name
        if path.is_file():
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                state = load_file(str(path), device="cpu")
            else:
                state = torch.load(path, map_location="cpu", weights_only=True)
            # some exporters prefix every key with "model."
            return {k.removeprefix("model."): v for k, v in state.items() if not k.endswith(_IGNORED)}
    raise HeadLoadError(f"head directory {str(directory)!r} has no {' or '.join(WEIGHT_FILES)}")


def _kind(state: dict[str, torch.Tensor], directory: Path) -> str:
    if any(k.startswith("midlayer.") for k in state):
        return "eagle3"
    if any(k.startswith("layers.0.") for k in state):
        return "eagle"
    raise HeadLoadError(f"{directory}: weights have neither EAGLE-3 'midlayer.*' nor EAGLE 'layers.0.*' keys "
                        f"(found e.g. {sorted(state)[:4]})")


def verifier_shape(verifier: Any) -> tuple[int, int, int]:
    """``(hidden size, decoder layers, vocabulary)`` of a transformers causal LM."""
    c = verifier.config.get_text_config() if hasattr(verifier.config, "get_text_config") else verifier.config
    vocab = verifier.get_input_embeddings().weight.shape[0]
    return c.hidden_size, c.num_hidden_layers, vocab


def check_against(config: HeadConfig, state: dict[str, torch.Tensor] | None, verifier: Any, where: str) -> None:
    """Refuse a head that does not fit ``verifier``, naming what differs."""
    hidden, layers, vocab = verifier_shape(verifier)
    problems = []
    if config.target_hidden_size != hidden:
        problems.append(f"it reads hidden states of size {config.target_hidden_size}, the verifier's are {hidden}")
    if config.vocab_size != vocab:
        problems.append(f"its vocabulary has {config.vocab_size} tokens, the verifier's {vocab}")
    bad = [i for i in config.aux_layers if not 0 <= i <= layers]
    if bad:
        problems.append(f"it reads hidden states {bad}, the verifier has only {layers} layers")
    if state is not None:
        fc = state.get("fc.weight")
        if fc is not None and fc.shape[1] != config.fc_in_features:
            problems.append(f"fc.weight is {list(fc.shape)}, but a {config.kind} head over this verifier needs "
                            f"{[config.hidden_size, config.fc_in_features]}")
    if problems:
        raise HeadLoadError(f"the draft head at {where} does not match the verifier: " + "; ".join(problems))


def load_head(directory: str | Path, verifier: Any) -> EagleHead:
    """Load an EAGLE-1/2 or EAGLE-3 head for ``verifier`` (its kind, biases and draft vocabulary are read from
    the weights, since configs are not reliable about them), in the verifier's dtype and on its device."""
    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise HeadLoadError(f"draft head directory {str(directory)!r} does not exist")
    if not (directory / "config.json").is_file():
        raise HeadLoadError(f"draft head directory {str(directory)!r} has no config.json")
    state = _read_state_dict(directory)
    kind = _kind(state, directory)
    try:
        data = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise HeadLoadError(f"{directory / 'config.json'} is not valid JSON ({e})") from None
    _, layers, _ = verifier_shape(verifier)
    if kind == "eagle3" and "lm_head.weight" in state:
        data["draft_vocab_size"] = state["lm_head.weight"].shape[0]  # the weights decide, not the config
    if "fc.weight" in state and kind == "eagle3" and "target_hidden_size" not in data:
        aux = (data.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or [0, 0, 0]
        data["target_hidden_size"] = state["fc.weight"].shape[1] // len(aux)
    if kind == "eagle":
        data["num_hidden_layers"] = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("layers."))
    try:
        config = HeadConfig.from_json(data, kind, layers)
    except (ValueError, TypeError) as e:
        raise HeadLoadError(f"{directory / 'config.json'}: {e}") from None
    check_against(config, state, verifier, str(directory))
    head = EagleHead(config, fc_bias="fc.bias" in state, attn_bias=any(k.endswith("q_proj.bias") for k in state))
    if "embed_tokens.weight" in state:
        head.embed_tokens = torch.nn.Embedding(*state["embed_tokens.weight"].shape)
    expected = head.state_dict()
    expected = {k: v for k, v in expected.items() if not k.startswith("rotary_emb.")}
    optional = {"d2t", "t2d"} if config.draft_vocab_size == config.vocab_size else set()
    missing = sorted(set(expected) - set(state) - optional)
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise HeadLoadError(f"{directory}: weights do not fit a {kind} head: "
                            + (f"missing {missing[:6]}" if missing else "")
                            + ("; " if missing and unexpected else "") + (f"unexpected {unexpected[:6]}" if unexpected else ""))
    for key, value in state.items():
        if value.shape != expected[key].shape:
            raise HeadLoadError(f"{directory}: {key} is {list(value.shape)}, the config asks for {list(expected[key].shape)}")
    head.load_state_dict({k: v.to(expected[k].dtype) if k in ("d2t", "t2d") else v for k, v in state.items()},
                         strict=False)
    embed, lm_head = verifier.get_input_embeddings(), verifier.get_output_embeddings()
    head = head.to(dtype=next(verifier.parameters()).dtype, device=embed.weight.device).eval()
    head.attach(embed, lm_head)
    return head


def save_head(head: EagleHead, directory: str | Path, *, dtype: torch.dtype = torch.bfloat16,
              card: str | None = None, extra_config: dict[str, Any] | None = None) -> Path:
    """Write ``config.json`` and ``model.safetensors`` in the public layout (weights in ``dtype``; ``d2t``
    and ``t2d`` exact), plus ``README.md`` when a model card is given."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {}
    for key, value in head.state_dict().items():
        if key.startswith("rotary_emb."):
            continue
        state[key] = value.detach().to("cpu").contiguous() if key in ("d2t", "t2d") else \
            value.detach().to(device="cpu", dtype=dtype).contiguous()
    config = head.config.to_json()
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    config.update(extra_config or {})
    tmp = directory / "model.safetensors.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    tmp.replace(directory / "model.safetensors")
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    if card is not None:
        (directory / "README.md").write_text(card, encoding="utf-8")
    return directory
