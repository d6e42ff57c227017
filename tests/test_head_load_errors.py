"""Heads that cannot serve a verifier are refused at load with one clear line (issue 23).

Each test builds a tiny public-layout checkpoint (the helpers of ``test_eagle``), breaks one thing, and checks
that ``load_head`` (and ``draft="eagle:DIR"`` / the shipped-head path) raises a :class:`HeadLoadError` naming
the file and what differs, instead of loading and failing later inside ``generate``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest
import torch
from safetensors.torch import load_file, save_file

import specdec
from specdec.heads import EagleHead, HeadConfig, HeadLoadError, load_head, save_head
from specdec.heads import shipped
from test_eagle import HEADS, KV, V, _assert_identical, _public_eagle1, _public_eagle3
from tiny_models import make_model


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return make_model("llama")  # hidden 64, 2 layers, vocabulary 96


def _refused(directory: Path, model: torch.nn.Module, *fragments: str) -> str:
    """Load ``directory`` expecting a one-line :class:`HeadLoadError` that contains every fragment."""
    with pytest.raises(HeadLoadError) as info:
        load_head(directory, model)
    message = str(info.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def _edit_safetensors(directory: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    path = directory / "model.safetensors"
    state = load_file(str(path))
    edit(state)
    save_file(state, str(path))
    return directory


def _edit_bin(directory: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    path = directory / "pytorch_model.bin"
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)
    return directory


def _edit_config(directory: Path, edit: Callable[[dict], None]) -> Path:
    path = directory / "config.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return directory


# --- EAGLE-3 d2t -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sign", ["past the end", "below zero"])
def test_d2t_pointing_past_the_vocabulary_is_refused(tmp_path, model, sign):
    directory = _public_eagle3(tmp_path / "h", draft_vocab=40)

    def edit(state):
        i = 3
        state["d2t"][i] = V - i if sign == "past the end" else -i - 5  # target = i + d2t[i]: 96 or -5

    _edit_safetensors(directory, edit)
    _refused(directory, model, "model.safetensors", "d2t", "draft id 3", "96")
    with pytest.raises(HeadLoadError, match="d2t"):  # the drafter name path refuses it too, before generate
        specdec.SpeculativeModel(model, f"eagle:{directory}")


def test_d2t_with_fractional_offsets_is_refused(tmp_path, model):
    directory = _edit_safetensors(_public_eagle3(tmp_path / "h"),
                                  lambda s: s.__setitem__("d2t", s["d2t"].double() + 0.5))
    _refused(directory, model, "model.safetensors", "d2t", "integer")


# --- sizes against the verifier --------------------------------------------------------------------------------

def _consistent_head(model, kind: str, *, hidden: int, target: int, embed: bool) -> EagleHead:
    """A head whose tensors all agree with its own config (hidden ``hidden``, reading features of ``target``)."""
    config = HeadConfig(kind=kind, hidden_size=hidden, intermediate_size=2 * hidden, num_attention_heads=HEADS,
                        num_key_value_heads=KV, vocab_size=V, target_hidden_size=target,
                        aux_layers=(1, 1, 1) if kind == "eagle3" else (),
                        draft_vocab_size=V if kind == "eagle3" else None)
    torch.manual_seed(0)
    head = EagleHead(config)
    if embed:
        head.embed_tokens = torch.nn.Embedding(V, hidden)
    with torch.no_grad():
        for p in head.parameters():
            p.mul_(0.3)
    return head


@pytest.mark.parametrize("kind", ["eagle3", "eagle"])
def test_head_hidden_size_other_than_the_verifiers_is_refused(tmp_path, model, kind):
    # every tensor agrees with the config (fc reads features of the verifier's width 64), but the head's own
    # width 32 cannot take the verifier's 64-wide embeddings (nor, for EAGLE, feed the verifier's lm_head)
    head = _consistent_head(model, kind, hidden=32, target=64, embed=False)
    directory = save_head(head, tmp_path / "h", dtype=torch.float32)
    _refused(directory, model, "config.json", "hidden_size 32 differs from the verifier's 64")


def test_eagle3_head_with_its_own_embedding_may_be_narrower_than_the_verifier(tmp_path, model):
    """Positive control: an EAGLE-3 head that brings its own 32-wide embed_tokens fits a 64-wide verifier."""
    head = _consistent_head(model, "eagle3", hidden=32, target=64, embed=True)
    directory = save_head(head, tmp_path / "h", dtype=torch.float32)
    assert load_head(directory, model).config.hidden_size == 32
    _assert_identical(model, f"eagle:{directory}", 1, new=8)


def test_eagle1_narrow_head_is_refused_even_with_its_own_embedding(tmp_path, model):
    head = _consistent_head(model, "eagle", hidden=32, target=64, embed=True)
    directory = save_head(head, tmp_path / "h", dtype=torch.float32)
    _refused(directory, model, "config.json", "hidden_size 32 differs from the verifier's 64", "lm_head")


def test_target_hidden_size_other_than_the_verifiers_names_the_config(tmp_path, model):
    head = _consistent_head(model, "eagle3", hidden=64, target=32, embed=False)
    directory = save_head(head, tmp_path / "h", dtype=torch.float32)
    _refused(directory, model, "config.json", "hidden states of size 32, the verifier's are 64")


@pytest.mark.parametrize("shape", [(50, 64), (V, 32), (V + 4, 64)])
def test_eagle1_embed_tokens_of_the_wrong_shape_is_refused(tmp_path, model, shape):
    directory = _public_eagle1(tmp_path / "h", fc_bias=False, embed=True)
    _edit_bin(directory, lambda s: s.__setitem__("embed_tokens.weight", torch.randn(*shape)))
    _refused(directory, model, "pytorch_model.bin", f"embed_tokens.weight is {list(shape)}", f"[{V}, 64]")


def _grow(value: torch.Tensor) -> torch.Tensor:
    """The tensor with one more row (or, for a vector, one more entry)."""
    return torch.cat([value, value[:1]], dim=0)


EAGLE3_KEYS = ["d2t", "fc.weight", "lm_head.weight", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
               "midlayer.mlp.down_proj.weight", "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight",
               "midlayer.post_attention_layernorm.weight", "midlayer.self_attn.k_proj.weight",
               "midlayer.self_attn.o_proj.weight", "midlayer.self_attn.q_proj.weight",
               "midlayer.self_attn.v_proj.weight", "norm.weight", "t2d"]  # every key of _public_eagle3


@pytest.mark.parametrize("key", EAGLE3_KEYS)
def test_every_eagle3_tensor_shape_is_checked(tmp_path, model, key):
    directory = _edit_safetensors(_public_eagle3(tmp_path / "h"), lambda s: s.__setitem__(key, _grow(s[key])))
    if key == "lm_head.weight":  # its rows set the draft vocabulary, so d2t is the tensor that disagrees
        _refused(directory, model, "model.safetensors", "d2t is [40]", "[41]")
    else:
        found = list(_grow(load_file(str(_public_eagle3(tmp_path / "ref") / "model.safetensors"))[key]).shape)
        _refused(directory, model, "model.safetensors", f"{key} is {found}")


@pytest.mark.parametrize("key", ["fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight",
                                 "layers.0.self_attn.k_proj.weight", "layers.0.mlp.down_proj.weight",
                                 "layers.0.post_attention_layernorm.weight", "embed_tokens.weight"])
def test_every_eagle1_tensor_shape_is_checked(tmp_path, model, key):
    directory = _edit_bin(_public_eagle1(tmp_path / "h", fc_bias=True, embed=True),
                          lambda s: s.__setitem__(key, _grow(s[key])))
    _refused(directory, model, "pytorch_model.bin", f"{key} is [")


def test_a_tensor_of_the_wrong_rank_is_refused(tmp_path, model):
    directory = _edit_safetensors(_public_eagle3(tmp_path / "h"),
                                  lambda s: s.__setitem__("norm.weight", s["norm.weight"].unsqueeze(0)))
    _refused(directory, model, "model.safetensors", "norm.weight is [1, 64]", "[64]")


# --- non-finite weights ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("key", ["fc.weight", "midlayer.self_attn.q_proj.weight", "lm_head.weight", "norm.weight"])
def test_non_finite_weights_are_refused(tmp_path, model, key, value):
    directory = _edit_safetensors(_public_eagle3(tmp_path / "h"), lambda s: s[key].view(-1).__setitem__(0, value))
    _refused(directory, model, "model.safetensors", key, "not finite")


def test_non_finite_eagle1_weights_in_a_bin_file_are_refused(tmp_path, model):
    directory = _edit_bin(_public_eagle1(tmp_path / "h", fc_bias=True),
                          lambda s: s["fc.bias"].__setitem__(2, float("nan")))
    _refused(directory, model, "pytorch_model.bin", "fc.bias", "not finite")


def test_weights_that_overflow_the_verifiers_dtype_are_refused(tmp_path):
    verifier = make_model("llama").to(torch.float16)
    directory = _edit_safetensors(_public_eagle3(tmp_path / "h"), lambda s: s["fc.weight"].view(-1).__setitem__(5, 1e6))
    _refused(directory, verifier, "model.safetensors", "fc.weight", "float16")


# --- config.json -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["[1, 2]", '"a string"', "3", "null", "{not json", "", "\udcff"],
                         ids=["list", "string", "number", "null", "not-json", "empty", "not-utf8"])
def test_config_json_that_is_not_an_object_is_refused(tmp_path, model, text):
    directory = _public_eagle3(tmp_path / "h")
    (directory / "config.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    _refused(directory, model, "config.json")


def test_config_json_is_read_before_the_weights(tmp_path, model):
    directory = _public_eagle3(tmp_path / "h")
    (directory / "config.json").write_text("[]")
    (directory / "model.safetensors").write_bytes(b"\0" * 10)
    _refused(directory, model, "config.json", "object")


BAD_CONFIGS = {
    "missing keys": lambda d: [d.pop(k) for k in ("hidden_size", "intermediate_size")],
    "heads do not divide hidden": lambda d: d.update(num_attention_heads=5),
    "kv heads do not divide heads": lambda d: d.update(num_attention_heads=4, num_key_value_heads=3, head_dim=16),
    "odd head_dim": lambda d: d.update(num_attention_heads=4, head_dim=15),
    "zero heads": lambda d: d.update(num_attention_heads=0),
    "negative intermediate": lambda d: d.update(intermediate_size=-128),
    "string hidden": lambda d: d.update(hidden_size="64"),
    "float hidden": lambda d: d.update(hidden_size=64.5),
    "bool vocab": lambda d: d.update(vocab_size=True),
    "list eps": lambda d: d.update(rms_norm_eps=[1e-6]),
    "string rope_theta": lambda d: d.update(rope_theta="ten thousand"),
    "unknown activation": lambda d: d.update(hidden_act="wiggle"),
    "rope_scaling list": lambda d: d.update(rope_scaling=[1, 2]),
    "aux layers an int": lambda d: d.update(eagle_config={"eagle_aux_hidden_state_layer_ids": 1}),
    "aux layers strings": lambda d: d.update(eagle_config={"eagle_aux_hidden_state_layer_ids": ["a", "b", "c"]}),
    "eagle_config a list": lambda d: d.update(eagle_config=[1, 1, 1]),
    "rope_parameters a list": lambda d: d.update(rope_parameters=[10000.0]),
    "norm_before_residual a string": lambda d: d.update(norm_before_residual="yes"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_config_values_that_cannot_build_a_head_are_refused(tmp_path, model, case):
    directory = _edit_config(_public_eagle3(tmp_path / "h"), BAD_CONFIGS[case])
    _refused(directory, model, "config.json")


def test_heads_not_dividing_hidden_size_names_both(tmp_path, model):
    directory = _edit_config(_public_eagle3(tmp_path / "h"), BAD_CONFIGS["heads do not divide hidden"])
    _refused(directory, model, "config.json", "num_attention_heads 5", "hidden_size 64")


# --- weight files ----------------------------------------------------------------------------------------------

def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


WEIGHT_DAMAGE = {
    "truncated safetensors": ("model.safetensors", lambda p: _truncate(p)),
    "empty safetensors": ("model.safetensors", lambda p: p.write_bytes(b"")),
    "garbage safetensors": ("model.safetensors", lambda p: p.write_bytes(b"garbage" * 50)),
    "truncated bin": ("pytorch_model.bin", lambda p: _truncate(p)),
    "empty bin": ("pytorch_model.bin", lambda p: p.write_bytes(b"")),
    "garbage bin": ("pytorch_model.bin", lambda p: p.write_bytes(b"garbage" * 50)),
    "bin holding a list": ("pytorch_model.bin", lambda p: torch.save([torch.zeros(2)], p)),
    "bin holding non-tensors": ("pytorch_model.bin", lambda p: torch.save({"fc.weight": [1.0, 2.0]}, p)),
}


@pytest.mark.parametrize("case", sorted(WEIGHT_DAMAGE))
def test_unreadable_weight_files_are_refused(tmp_path, model, case):
    name, damage = WEIGHT_DAMAGE[case]
    directory = (_public_eagle1(tmp_path / "h", fc_bias=False) if name.endswith(".bin")
                 else _public_eagle3(tmp_path / "h"))
    damage(directory / name)
    message = _refused(directory, model, name)
    assert "weights_only" not in message  # never advise loading an untrusted pickle with code execution


def test_unexpected_layer_keys_are_refused(tmp_path, model):
    directory = _edit_bin(_public_eagle1(tmp_path / "h", fc_bias=False),
                          lambda s: s.__setitem__("layers.x.mlp.up_proj.weight", torch.zeros(2)))
    _refused(directory, model, "pytorch_model.bin", "layers.x.mlp.up_proj.weight")


# --- the drafter-name and shipped-head paths -------------------------------------------------------------------

@pytest.mark.parametrize("break_it", ["nan", "config list", "truncated", "embed rows"])
def test_eagle_drafter_names_report_head_load_errors_before_generating(tmp_path, model, break_it):
    if break_it == "embed rows":
        directory = _edit_bin(_public_eagle1(tmp_path / "h", fc_bias=False, embed=True),
                              lambda s: s.__setitem__("embed_tokens.weight", s["embed_tokens.weight"][:50]))
    else:
        directory = _public_eagle3(tmp_path / "h")
        if break_it == "nan":
            _edit_safetensors(directory, lambda s: s["fc.weight"].view(-1).__setitem__(0, float("nan")))
        elif break_it == "config list":
            (directory / "config.json").write_text("[]")
        else:
            _truncate(directory / "model.safetensors")
    with pytest.raises(HeadLoadError):
        specdec.SpeculativeModel(model, f"eagle:{directory}")


def test_shipped_heads_report_head_load_errors(tmp_path, model, monkeypatch):
    monkeypatch.setattr(shipped, "SHIPPED_DIR", tmp_path)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{truncated")
    with pytest.raises(HeadLoadError, match="broken.config.json"):
        specdec.SpeculativeModel(model, "eagle")
    (broken / "config.json").write_text("[]")
    with pytest.raises(HeadLoadError, match="broken.config.json"):
        specdec.SpeculativeModel(model, "eagle")
    (broken / "config.json").unlink()
    # a head recorded for this verifier, whose weights hold a NaN: found, then refused at load
    head = _public_eagle3(tmp_path / "tiny", config_extra={"specdec_verifier": shipped.fingerprint(model.config)})
    _edit_safetensors(head, lambda s: s["lm_head.weight"].view(-1).__setitem__(0, float("nan")))
    with pytest.raises(HeadLoadError, match="lm_head.weight.*not finite"):
        specdec.SpeculativeModel(model, "eagle")
