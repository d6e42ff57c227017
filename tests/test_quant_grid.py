"""Weight error and storage-grid detection (specdec.quant.weight_error, quant-report's grid flag).

The embedded SmolLM2 is a Q4_1 GGUF: its projections are 4-bit codes with a scale and a minimum
per group of 32, dequantized to fp32 by transformers. Here a tiny model's weights are snapped to
such a grid first (flag true), and a plain random model is the control (flag false).
"""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from specdec.quant import (
    GRID_BOUND_NOTE,
    GRID_TOLERANCE,
    UnknownSchemeError,
    dequantize_weight,
    quantize,
    weight_error,
)
from specdec.quant.backends import Int4WeightOnlyLinear, Int8WeightOnlyLinear

VOCAB = 128


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                      max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval()


def snap_to_q4_1(w: torch.Tensor, group: int = 32, seed: int = 0) -> torch.Tensor:
    """Weights as a Q4_1 GGUF stores them: codes 0..15 per group of ``group``, with an fp16 scale d
    and fp16 minimum m, dequantized in fp32 as ``q * d + m`` (what transformers' loader does)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    n, k = w.shape
    g = w.float().reshape(n, k // group, group)
    d = ((g.amax(-1, keepdim=True) - g.amin(-1, keepdim=True)) / 15).half().float()
    m = g.amin(-1, keepdim=True).half().float()
    q = torch.randint(0, 16, g.shape, generator=gen, device="cpu").float()
    q[..., 0], q[..., 1] = 0.0, 15.0  # llama.cpp's min/max quantizer always uses both end codes
    return (q * d + m).reshape(n, k)


def grid_snapped_llama() -> LlamaForCausalLM:
    """A tiny Llama whose projections (not the tied head) lie on an int4 g32 grid."""
    model = tiny_llama()
    head = model.get_output_embeddings()
    with torch.no_grad():
        for i, lin in enumerate(m for m in model.modules() if type(m) is nn.Linear and m is not head):
            lin.weight.copy_(snap_to_q4_1(lin.weight, seed=i))
    return model


@pytest.fixture(scope="module")
def snapped() -> LlamaForCausalLM:
    return grid_snapped_llama()


@pytest.fixture(scope="module")
def plain() -> LlamaForCausalLM:
    return tiny_llama()


def test_int4_g32_on_a_grid_snapped_model_is_grid_bound(snapped):
    err = weight_error(snapped, "int4")
    assert err.scheme == "int4:g32"
    assert err.weight_error <= 1e-6 and err.grid_bound
    assert err.layers == 2 * 7  # q, k, v, o, gate, up, down per layer; the head is apart
    assert err.note == GRID_BOUND_NOTE
    # the kernels keep scales and zero points in bf16: close to the grid, not on it
    assert 0 < err.stored_weight_error < 0.01
    # the tied head (random, not snapped) quantized like the body is far off the grid
    assert err.head_weight_error > 0.02
    assert weight_error(snapped, "int4+head").head_weight_error == 0.0


@pytest.mark.parametrize("scheme", ["int4:g64", "int4:g128", "int8", "int8-dynamic", "bf16", "fp32"])
def test_other_grids_on_the_snapped_model_are_not_grid_bound(snapped, scheme):
    err = weight_error(snapped, scheme)
    assert not err.grid_bound and err.note == ""
    if scheme.startswith("int4"):
        assert err.weight_error > 0.02  # groups of 64 cannot follow per-32 scales
    if scheme == "fp32":
        assert err.weight_error == 0.0  # the verifier itself: exact, but not a quantization grid


@pytest.mark.parametrize("scheme", ["int4", "int4+head8", "int4:g64", "int8", "bf16"])
def test_plain_random_model_is_not_grid_bound(plain, scheme):
    err = weight_error(plain, scheme)
    assert not err.grid_bound
    assert err.weight_error > 10 * GRID_TOLERANCE


def test_error_sizes_are_ordered_as_the_grids(plain):
    e = {s: weight_error(plain, s).weight_error for s in ("bf16", "int8", "int4:g32", "int4:g64")}
    assert e["bf16"] < e["int8"] < e["int4:g32"] < e["int4:g64"]


def test_head_modes(plain):
    int8_head = weight_error(plain, "int8").head_weight_error
    assert weight_error(plain, "int4+head").head_weight_error == 0.0
    assert weight_error(plain, "int4+head8").head_weight_error == pytest.approx(int8_head, rel=1e-9)
    assert 0 < weight_error(plain, "int4+head16").head_weight_error < int8_head
    assert weight_error(plain, "int4").head_weight_error > int8_head


def test_weight_error_leaves_the_model_alone(snapped):
    before = {k: v.clone() for k, v in snapped.state_dict().items()}
    weight_error(snapped, "int4:g64+head8")
    assert all(torch.equal(before[k], v) for k, v in snapped.state_dict().items())


def test_bad_arguments(plain):
    with pytest.raises(UnknownSchemeError):
        weight_error(plain, "int3")
    with pytest.raises(ValueError, match="tolerance"):
        weight_error(plain, "int4", tolerance=-1)
    with pytest.raises(ValueError, match="no nn.Linear"):
        weight_error(nn.Sequential(nn.ReLU()), "int8")


# the reported error must be that of the weights the drafter's kernels really use


def test_int8_dequantization_matches_the_int8_linear(plain):
    q = quantize(plain, "int8")
    lin = q.model.layers[0].mlp.down_proj
    assert isinstance(lin, Int8WeightOnlyLinear)
    w = plain.model.layers[0].mlp.down_proj.weight
    used = lin.weight_int8.float() * lin.scales.float()[:, None]
    assert torch.equal(dequantize_weight(w, "int8", stored=True), used)


def test_int4_dequantization_matches_the_int4_kernel(plain):
    q = quantize(plain, "int4")
    lin = q.model.layers[0].self_attn.q_proj
    assert isinstance(lin, Int4WeightOnlyLinear)
    w = plain.model.layers[0].self_attn.q_proj.weight
    x = torch.randn(5, 64, generator=torch.Generator(device="cpu").manual_seed(0), device="cpu").bfloat16()
    with torch.inference_mode():
        got = lin(x).float()
    want = x.float() @ dequantize_weight(w, "int4", stored=True).t()
    off = x.float() @ dequantize_weight(w, "int4:g64", stored=True).t()
    assert torch.allclose(got, want, atol=2e-2, rtol=1e-2)
    assert not torch.allclose(got, off, atol=2e-2, rtol=1e-2)  # the check can tell grids apart


def test_int8_dynamic_dequantization_matches_torch_ao(plain):
    q = quantize(plain, "int8-dynamic")
    lin = q.model.layers[1].self_attn.o_proj
    w = plain.model.layers[1].self_attn.o_proj.weight
    assert torch.equal(dequantize_weight(w, "int8-dynamic"), lin.weight().dequantize())


# quant-report shows it


class _ToyTokenizer:
    chat_template = None
    eos_token_id = None
    pad_token_id = 0

    def __call__(self, text, return_tensors="pt"):
        ids = torch.tensor([[b % VOCAB for b in text.encode()[:24]] or [1]], device="cpu")
        return argparse.Namespace(input_ids=ids)


def _report(model, monkeypatch, capsys) -> tuple[dict, list[str]]:
    import specdec.quant_report as report

    monkeypatch.setattr(report, "load_model", lambda path=None, device="cpu": (model, _ToyTokenizer()))
    args = report.add_quant_report_arguments(argparse.ArgumentParser()).parse_args(
        ["--schemes", "int4+head8,int8", "--positions", "4", "--ctx", "8", "--repeats", "1", "--json"])
    assert report.run_quant_report(args) == 0
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1]), out[:-1]


def test_quant_report_flags_the_grid_bound_scheme(snapped, monkeypatch, capsys):
    data, table = _report(snapped, monkeypatch, capsys)
    rows = {r["scheme"]: r for r in data["schemes"]}
    assert rows["int4+head8"]["grid_bound"] is True and rows["int4+head8"]["grid_note"] == GRID_BOUND_NOTE
    assert rows["int4+head8"]["weight_error"] <= 1e-6
    assert rows["int8"]["grid_bound"] is False and rows["int8"]["grid_note"] == ""
    assert rows["int8"]["weight_error"] > 1e-3
    assert data["grid_tolerance"] == GRID_TOLERANCE
    line = next(l for l in table if l.startswith("| int4+head8 |"))
    assert "GRID-BOUND" in line and "0.00%" in line
    assert "GRID-BOUND" not in next(l for l in table if l.startswith("| int8 |"))
    assert any(l.startswith("GRID-BOUND int4+head8:") and GRID_BOUND_NOTE in l for l in table)


def test_quant_report_flags_nothing_on_a_plain_model(plain, monkeypatch, capsys):
    data, table = _report(plain, monkeypatch, capsys)
    assert [r["grid_bound"] for r in data["schemes"]] == [False, False]
    assert all(r["weight_error"] > 1e-3 for r in data["schemes"])
    assert not any("GRID-BOUND" in l for l in table)


@pytest.mark.slow
def test_embedded_smollm2_lies_on_the_int4_g32_grid(smollm2):
    """The embedded Q4_1 GGUF: int4 with groups of 32 reproduces its projections, other grids do not."""
    model, _ = smollm2
    int4 = weight_error(model, "int4+head8")
    assert int4.layers == 210 and int4.weight_error <= 1e-6 and int4.grid_bound
    assert 0.005 < int4.head_weight_error < 0.02  # the head is Q8_0 in the file, int8 per channel here
    for scheme, low, high in [("int4:g64", 0.06, 0.10), ("int4:g128", 0.06, 0.11), ("int8", 0.005, 0.012)]:
        err = weight_error(model, scheme)
        assert low < err.weight_error < high and not err.grid_bound, (scheme, err)
