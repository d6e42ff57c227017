"""Loading and saving draft heads in the public EAGLE / EAGLE-3 layouts (config.json + model.safetensors or
pytorch_model.bin), so heads trained elsewhere load here and heads trained here serve in vLLM / SGLang."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from specdec.errors import SpecdecError
from specdec.heads import speculators
from specdec.heads.config import HeadConfig, aux_layer_ids
from specdec.heads.modules import EagleHead

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
#: keys some exporters add that carry nothing the head needs
_IGNORED = ("rotary_emb.inv_freq",)


class HeadLoadError(SpecdecError, ValueError):
    """A head directory that cannot serve this verifier; the message says which file, key or shape."""


def _one_line(text: str, limit: int = 160) -> str:
    """``text`` squeezed onto one line (library errors span several) and cut to ``limit`` characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _refuse(path: Path | str, problem: str) -> HeadLoadError:
    return HeadLoadError(_one_line(f"draft head {path}: {problem}", 1000))


_JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
               type(None): "null"}


def read_config(path: Path) -> dict[str, Any]:
    """A head's ``config.json`` as a dict, or a one-line :class:`HeadLoadError` naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise _refuse(path, "is not UTF-8 text, so not a JSON config") from None
    except OSError as e:
        raise _refuse(path, f"cannot be read ({e.strerror or e})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise _refuse(path, f"is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(data, dict):
        raise _refuse(path, f"holds {_JSON_TYPES.get(type(data), type(data).__name__)}, not a JSON object of settings")
    return data


def _weights_file(directory: Path) -> Path:
    for name in WEIGHT_FILES:
        if (directory / name).is_file():
            return directory / name
    raise HeadLoadError(f"head directory {str(directory)!r} has no {' or '.join(WEIGHT_FILES)}")


def _read_problem(error: Exception) -> str:
    """What went wrong reading a weight file, in a few words; never torch's advice to retry with
    ``weights_only=False``, which would run whatever code an untrusted pickle holds."""
    text = str(error)
    if "WeightsUnpickler error:" in text:  # torch wraps the real reason in a paragraph of advice
        text = text.split("WeightsUnpickler error:", 1)[1].strip().split("\n\n")[0]
        return f"not a plain pickle of tensors: {_one_line(text, 100)}"
    if isinstance(error, EOFError) or not text.strip():
        return "the file ends early"
    text = _one_line(text.split(". ")[0], 120)
    return "unreadable" if "weights_only" in text else text


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    safetensors = path.name.endswith(".safetensors")
    try:
        if safetensors:
            from safetensors.torch import load_file

            state = load_file(str(path), device="cpu")
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # whatever the reader trips on, the file is what is wrong: say so, with its name
        kind = "safetensors" if safetensors else "a PyTorch state dict"
        raise _refuse(path, f"cannot be read as {kind} ({_read_problem(e)}); is it truncated or damaged?") from None
    if not isinstance(state, dict):
        raise _refuse(path, f"holds a {type(state).__name__}, not a dictionary of tensors")
    for key, value in state.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise _refuse(path, f"entry {key!r} is a {type(value).__name__}, not a tensor")
    # some exporters prefix every key with "model."
    return {k.removeprefix("model."): v for k, v in state.items() if not k.endswith(_IGNORED)}


def _kind(state: dict[str, torch.Tensor], path: Path) -> str:
    if any(k.startswith("midlayer.") for k in state):
        return "eagle3"
    if any(k.startswith("layers.0.") for k in state):
        return "eagle"
    raise _refuse(path, f"weights have neither EAGLE-3 'midlayer.*' nor EAGLE 'layers.0.*' keys "
                        f"(found e.g. {sorted(state)[:4]})")


def verifier_shape(verifier: Any) -> tuple[int, int, int]:
    """``(hidden size, decoder layers, vocabulary)`` of a transformers causal LM."""
    c = verifier.config.get_text_config() if hasattr(verifier.config, "get_text_config") else verifier.config
    vocab = verifier.get_input_embeddings().weight.shape[0]
    return c.hidden_size, c.num_hidden_layers, vocab


def check_against(config: HeadConfig, state: dict[str, torch.Tensor] | None, verifier: Any, where: str) -> None:
    """Refuse a head whose config does not fit ``verifier``, naming what differs (``where``: its config.json).
    ``state`` tells whether the head brings its own ``embed_tokens``; its shapes are checked by :func:`load_head`."""
    hidden, layers, vocab = verifier_shape(verifier)
    embed_width = verifier.get_input_embeddings().weight.shape[1]
    problems = []
    if config.target_hidden_size != hidden:
        problems.append(f"it reads hidden states of size {config.target_hidden_size}, the verifier's are {hidden}")
    # the head's own width meets the verifier's twice: tokens are embedded with the verifier's table unless the
    # checkpoint brings embed_tokens, and an EAGLE-1/2 head's output goes through the verifier's lm_head
    reasons = []
    through_lm_head = config.kind == "eagle" and config.hidden_size != hidden
    if through_lm_head:
        reasons.append("an EAGLE head's output goes through the verifier's lm_head")
    if (state is None or "embed_tokens.weight" not in state) and config.hidden_size != embed_width:
        reasons.append("the head has no embed_tokens of its own and embeds with the verifier's")
    reference = hidden if through_lm_head else embed_width
    if reasons:
        problems.append(f"hidden_size {config.hidden_size} differs from the verifier's {reference} ({'; '.join(reasons)})")
    if config.vocab_size != vocab:
        problems.append(f"its vocabulary has {config.vocab_size} tokens, the verifier's {vocab}")
    bad = [i for i in config.aux_layers if not 0 <= i <= layers]
    if bad:
        problems.append(f"it reads hidden states {bad}, the verifier has only {layers} layers")
    if problems:
        raise HeadLoadError(_one_line(f"draft head {where} does not fit the verifier: " + "; ".join(problems), 1000))


def _derived_settings(data: dict[str, Any], state: dict[str, torch.Tensor], kind: str) -> dict[str, Any]:
    """``data`` with what the weights decide (configs are not reliable about it): the draft vocabulary, the
    verifier width the fc reads when the config does not say, the number of EAGLE layers. Odd shapes are left
    for the shape check, which names them."""
    data = dict(data)
    fc, lm_head = state.get("fc.weight"), state.get("lm_head.weight")
    if kind == "eagle3":
        if lm_head is not None and lm_head.dim() == 2:
            data["draft_vocab_size"] = lm_head.shape[0]
        if data.get("target_hidden_size") is None and fc is not None and fc.dim() == 2:
            count = len(aux_layer_ids(data) or (0, 0, 0))
            if count and fc.shape[1] % count == 0:
                data["target_hidden_size"] = fc.shape[1] // count
    else:
        indices = {int(k.split(".")[1]) for k in state if k.startswith("layers.") and k.split(".")[1].isdigit()}
        data["num_hidden_layers"] = 1 + max(indices)  # eagle: there is a layers.0
    return data


def _expected_shapes(config: HeadConfig, fc_bias: bool, attn_bias: bool, embed: bool, where: Path) -> dict[str, tuple]:
    """Every tensor a head of ``config`` holds and its shape, from a module built on the meta device (no memory,
    however large the config claims to be)."""
    try:
        with torch.device("meta"):
            skeleton = EagleHead(config, fc_bias=fc_bias, attn_bias=attn_bias)
            if embed:
                skeleton.embed_tokens = torch.nn.Embedding(config.vocab_size, config.hidden_size)
    except Exception as e:  # transformers validates rope settings its own ways; any of them is a config problem
        raise _refuse(where, f"its settings do not build a head ({type(e).__name__}: {_one_line(e, 200)})") from None
    return {k: tuple(v.shape) for k, v in skeleton.state_dict().items() if not k.startswith("rotary_emb.")}


def _check_shapes(state: dict[str, torch.Tensor], expected: dict[str, tuple], config: HeadConfig, path: Path) -> None:
    optional = {"d2t", "t2d"} if config.draft_vocab_size == config.vocab_size else set()
    missing = sorted(set(expected) - set(state) - optional)
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise _refuse(path, f"weights do not fit an {config.kind} head: "
                      + (f"missing {missing[:6]}" if missing else "")
                      + ("; " if missing and unexpected else "") + (f"unexpected {unexpected[:6]}" if unexpected else ""))
    for key, value in state.items():
        if tuple(value.shape) != expected[key]:
            raise _refuse(path, f"{key} is {list(value.shape)}, but the head its config.json describes needs "
                                f"{list(expected[key])}")


def _check_values(state: dict[str, torch.Tensor], config: HeadConfig, dtype: torch.dtype, path: Path) -> None:
    """Refuse weights that cannot draft: NaN / inf (or values the verifier's dtype cannot hold), and ``d2t``
    offsets that are not integers or send a draft id outside the verifier's vocabulary."""
    limit = torch.finfo(dtype).max if dtype.is_floating_point else None
    for key, value in state.items():
        if not value.is_floating_point() or value.numel() == 0:
            continue
        v = value if value.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64) else value.float()
        finite = torch.isfinite(v)
        if not bool(finite.all()):
            bad = int((~finite).sum())
            raise _refuse(path, f"{key} is not finite: {bad} of its {value.numel()} values {'is' if bad == 1 else 'are'} "
                                f"NaN or inf")
        if limit is not None and key not in ("d2t", "t2d"):
            largest = float(v.abs().max())
            if largest > limit:
                raise _refuse(path, f"{key} holds {largest:.3g}, more than {str(dtype).removeprefix('torch.')} (the "
                                    f"verifier's dtype, which the head runs in) can hold ({limit:.3g})")
    d2t = state.get("d2t")
    if config.kind != "eagle3" or d2t is None:
        return
    if d2t.dtype == torch.bool or (d2t.is_floating_point() and not torch.equal(d2t, d2t.round())):
        raise _refuse(path, f"d2t holds {str(d2t.dtype).removeprefix('torch.')} offsets that are not integers "
                            "(verifier id = draft id + d2t[draft id])")
    target = d2t.to(torch.long) + torch.arange(d2t.shape[0], dtype=torch.long, device=d2t.device)
    outside = ((target < 0) | (target >= config.vocab_size)).nonzero().flatten()
    if len(outside):
        i = int(outside[0])
        raise _refuse(path, f"d2t sends draft id {i} to verifier id {int(target[i])}, outside the verifier's vocabulary "
                            f"of {config.vocab_size} tokens ({len(outside)} of {d2t.shape[0]} entries do)")


def load_head(directory: str | Path, verifier: Any) -> EagleHead:
    """Load an EAGLE-1/2 or EAGLE-3 head for ``verifier`` (its kind, biases and draft vocabulary are read from
    the weights, since configs are not reliable about them), in the verifier's dtype and on its device. Public
    EAGLE / EAGLE-3 directories and speculators' ``eagle3`` layout (:mod:`specdec.heads.speculators`) both load.

    Everything is checked before the head is built: the config (a JSON object whose settings build a head), the
    config against the verifier (widths, vocabulary, layers), every tensor's shape against the config, and the
    values (finite, within the verifier's dtype, ``d2t`` inside the vocabulary). Any failure is a one-line
    :class:`HeadLoadError` naming the file and what differs.
    """
    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise HeadLoadError(f"draft head directory {str(directory)!r} does not exist")
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise HeadLoadError(f"draft head directory {str(directory)!r} has no config.json")
    data = read_config(config_path)  # the cheap file first: a broken config never waits for the weights
    layout = speculators.is_speculators(data)
    if layout:
        try:
            data = speculators.public_config(data)
        except ValueError as e:
            raise _refuse(config_path, f"(speculators layout) {e}") from None
    weights_path = _weights_file(directory)
    state = _read_state_dict(weights_path)
    if layout:
        state = speculators.public_state(state)
    kind = _kind(state, weights_path)
    _, layers, _ = verifier_shape(verifier)
    try:
        config = HeadConfig.from_json(_derived_settings(data, state, kind), kind, layers)
    except (ValueError, TypeError) as e:
        raise _refuse(config_path, str(e)) from None
    check_against(config, state, verifier, str(config_path))
    fc_bias, attn_bias = "fc.bias" in state, any(k.endswith("q_proj.bias") for k in state)
    embed = "embed_tokens.weight" in state
    _check_shapes(state, _expected_shapes(config, fc_bias, attn_bias, embed, config_path), config, weights_path)
    dtype = next(verifier.parameters()).dtype
    _check_values(state, config, dtype, weights_path)
    head = EagleHead(config, fc_bias=fc_bias, attn_bias=attn_bias)
    if embed:
        head.embed_tokens = torch.nn.Embedding(config.vocab_size, config.hidden_size)
    expected = head.state_dict()
    head.load_state_dict({k: v.to(expected[k].dtype) if k in ("d2t", "t2d") else v for k, v in state.items()},
                         strict=False)
    embed_table, lm_head = verifier.get_input_embeddings(), verifier.get_output_embeddings()
    head = head.to(dtype=dtype, device=embed_table.weight.device).eval()
    head.attach(embed_table, lm_head)
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
