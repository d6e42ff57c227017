"""Tests for specdec.sizing: the published KV arithmetic, GQA/MQA/MLA/sliding/hybrid layers, weight
counts, memory parsing, the planner, the engine pre-check, the CLI hooks, and the reality check that
the predicted managed-cache bytes equal what ManagedCache allocates for tiny real models."""

from __future__ import annotations

import argparse
import json
import re

import pytest
import torch

from specdec import sizing
from specdec.sizing import GiB, PlanError, presets
from specdec.sizing.weights import _weight_model
from specdec.slots import cache_slots
from specdec.runners.cache import cache_argument

# --------------------------------------------------------------------------------------------
# published arithmetic
# --------------------------------------------------------------------------------------------


def test_llama2_7b_fp16_4096_tokens_is_the_published_figure():
    expected = 2 * 32 * 32 * 128 * 4096 * 2  # K and V x layers x KV heads x head_dim x tokens x fp16
    assert expected == 2_147_483_648
    assert sizing.kv_bytes_per_token("llama-2-7b", "float16") == 2 * 32 * 32 * 128 * 2
    assert sizing.kv_bytes_per_sequence("llama-2-7b", 4096, "float16") == expected
    assert sizing.kv_cache_bytes("llama-2-7b", 1, 4096, "fp16") == expected
    assert sizing.managed_cache_bytes("llama-2-7b", 1, 4096, torch.float16) == expected


def test_mistral_7b_counts_8_kv_heads_not_32():
    cache = sizing.kv_cache_bytes("mistral-7b", 4, 4096, "float16")
    assert cache == 2 * GiB  # 2 x 32 layers x 8 KV heads x 128 x 4096 tokens x 4 rows x 2 bytes
    naive = 4 * 4096 * sizing.naive_kv_bytes_per_token("mistral-7b", "float16")
    assert naive == 8 * GiB  # the "8 GB" of counting the 32 query heads
    assert naive == 4 * cache


def test_mqa_counts_one_kv_head():
    layers, hidden, heads = 24, 2048, 16
    mqa = {"model_type": "llama", "num_hidden_layers": layers, "hidden_size": hidden,
           "num_attention_heads": heads, "num_key_value_heads": 1, "vocab_size": 1000}
    assert sizing.kv_bytes_per_token(mqa, "bfloat16") == 2 * layers * 1 * (hidden // heads) * 2
    assert sizing.naive_kv_bytes_per_token(mqa, "bfloat16") == heads * sizing.kv_bytes_per_token(mqa, "bfloat16")
    # GPT-BigCode / StarCoder say it with multi_query, Falcon-7B with multi_query and the old decoder.
    bigcode = {"model_type": "gpt_bigcode", "n_layer": layers, "n_embd": hidden, "n_head": heads,
               "multi_query": True, "vocab_size": 1000}
    falcon7b = {"model_type": "falcon", "num_hidden_layers": layers, "hidden_size": hidden,
                "num_attention_heads": heads, "multi_query": True, "new_decoder_architecture": False,
                "vocab_size": 1000}
    for cfg in (bigcode, falcon7b):
        assert sizing.kv_bytes_per_token(cfg, "bfloat16") == 2 * layers * (hidden // heads) * 2


def test_kv_heads_fall_back_to_attention_heads_only_when_absent():
    mha = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "vocab_size": 10}
    assert sizing.kv_bytes_per_token(mha, "float32") == 2 * 2 * 4 * 16 * 4
    gpt2 = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257}
    assert sizing.kv_bytes_per_token(gpt2, "float16") == 2 * 12 * 768 * 2


def test_explicit_head_dim_is_used():
    # Gemma-2-9B: head_dim 256 while hidden/heads = 3584/16 = 224.
    cfg = sizing.load_config("gemma-2-9b")
    assert cfg.hidden_size // cfg.num_attention_heads == 224
    assert sizing.kv_bytes_per_token(cfg, "bfloat16") == 2 * 42 * 8 * 256 * 2
    # Llama-3.2-1B: head_dim 64 = 2048/32, the explicit value agrees.
    assert sizing.kv_bytes_per_token("llama-3.2-1b", "bfloat16") == 2 * 16 * 8 * 64 * 2


def test_sliding_layers_cap_at_the_window_but_the_managed_cache_does_not():
    per_token = 2 * 32 * 8 * 128 * 2
    assert sizing.kv_bytes_per_sequence("mistral-7b", 2048, "fp16") == 2048 * per_token
    assert sizing.kv_bytes_per_sequence("mistral-7b", 16384, "fp16") == 4096 * per_token
    assert sizing.kv_bytes_per_sequence("mistral-7b", 16384, "fp16", cap_sliding=False) == 16384 * per_token
    assert sizing.managed_cache_bytes("mistral-7b", 1, 16384, "fp16") == 16384 * per_token
    # Gemma-2-9B: 21 global layers keep everything, 21 local ones at most 4096 tokens.
    layer = 2 * 8 * 256 * 2
    assert sizing.kv_bytes_per_sequence("gemma-2-9b", 8192, "bf16") == 21 * layer * 8192 + 21 * layer * 4096
    # Gemma-3-1B: 5 of every 6 layers slide over 512 tokens.
    prof = sizing.kv_profile("gemma-3-1b", "bf16")
    assert prof.layers == {"sliding": 22, "full": 4}
    assert prof.windows == {"sliding": 512}
    layer = 2 * 1 * 256 * 2
    assert prof.per_sequence(32768) == 4 * layer * 32768 + 22 * layer * 512


def test_mla_stores_the_latent_and_rope_key():
    per_token = 61 * (512 + 64) * 2  # DeepSeek-V3, bf16: one latent + one rope key per layer, no x2 x heads
    assert sizing.kv_bytes_per_token("deepseek-v3", "bfloat16") == per_token
    assert sizing.kv_bytes_per_token_by_type("deepseek-v3", "bfloat16") == {"mla": per_token}
    assert sizing.kv_bytes_per_sequence("deepseek-v3", 4096, "bfloat16") == 4096 * per_token
    naive = sizing.naive_kv_bytes_per_token("deepseek-v3", "bfloat16")
    assert naive == 61 * 128 * (128 + 64 + 128) * 2
    assert naive > 70 * per_token


def test_hybrid_layers_without_kv_are_counted_as_such():
    cfg = {"model_type": "custom_hybrid", "num_hidden_layers": 8, "hidden_size": 256, "num_attention_heads": 8,
           "num_key_value_heads": 2, "vocab_size": 100,
           "layer_types": ["mamba", "linear_attention", "mamba", "full_attention"] * 2}
    prof = sizing.kv_profile(cfg, "float32")
    assert prof.layers == {"none": 6, "full": 2}
    assert prof.bytes_per_token == 2 * 2 * 2 * 32 * 4
    assert prof.bytes_per_token_by_type["none"] == 0
    assert sizing.managed_cache_bytes(cfg, 3, 100, "float32") == 3 * 100 * prof.bytes_per_token
    # transformers' own Qwen3-Next config: three linear-attention layers per full one.
    from transformers import AutoConfig

    qwen3_next = AutoConfig.for_model("qwen3_next", num_hidden_layers=8, hidden_size=256, num_attention_heads=8,
                                      num_key_value_heads=2, head_dim=64, vocab_size=100)
    kinds = [layer.kind for layer in sizing.kv_layout(qwen3_next)]
    assert kinds.count("full") == 2 and kinds.count("none") == 6
    assert sizing.kv_bytes_per_token(qwen3_next, "bf16") == 2 * 2 * 2 * 64 * 2


def test_unknown_layer_types_are_refused_clearly():
    cfg = {"model_type": "x", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "vocab_size": 10, "layer_types": ["full_attention", "teleport_attention"]}
    with pytest.raises(ValueError, match="teleport_attention"):
        sizing.kv_bytes_per_token(cfg)


def test_kv_bytes_scale_with_dtype():
    fp32 = sizing.kv_bytes_per_token("llama-3-8b", "float32")
    assert sizing.kv_bytes_per_token("llama-3-8b", torch.bfloat16) * 2 == fp32
    assert sizing.kv_bytes_per_token("llama-3-8b", "fp8") * 4 == fp32
    with pytest.raises(ValueError, match="unknown dtype"):
        sizing.kv_bytes_per_token("llama-3-8b", "float13")


# --------------------------------------------------------------------------------------------
# weights
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, published",
    [
        ("llama-2-7b", 6.74e9), ("llama-2-70b", 68.98e9), ("llama-3-8b", 8.03e9), ("llama-3-70b", 70.55e9),
        ("llama-3.2-1b", 1.24e9), ("mistral-7b", 7.24e9), ("mixtral-8x7b", 46.7e9), ("qwen2.5-0.5b", 0.49e9),
        ("qwen2.5-7b", 7.61e9), ("qwen2.5-72b", 72.7e9), ("gemma-2-9b", 9.24e9), ("phi-3-mini", 3.82e9),
        ("deepseek-v3", 671e9), ("smollm2-135m", 134.5e6),
    ],
)
def test_parameter_counts_match_published_sizes(name, published):
    assert sizing.param_count(name) == pytest.approx(published, rel=0.01)


def test_weight_bytes_by_dtype_and_quantization():
    params = sizing.param_count("llama-3-8b")
    assert sizing.weight_bytes("llama-3-8b", "float32") == 4 * params
    assert sizing.weight_bytes("llama-3-8b", "bfloat16") == 2 * params
    bf16 = sizing.weight_bytes("llama-3-8b", "bfloat16")
    int8 = sizing.weight_bytes("llama-3-8b", "bfloat16", "int8")
    int4 = sizing.weight_bytes("llama-3-8b", "bfloat16", "int4")
    int4_g128 = sizing.weight_bytes("llama-3-8b", "bfloat16", "int4:g128")
    nf4 = sizing.weight_bytes("llama-3-8b", "bfloat16", "nf4")
    assert int4_g128 < int4 < int8 < bf16
    assert int4_g128 < nf4 < int8
    # The embedding stays bf16: 128256 x 4096 x 2 bytes is a floor for every scheme.
    assert int4 > 128256 * 4096 * 2
    # int4 with group 32: 4 bits + a 4-byte scale/zero pair per 32 weights = 5 bits per quantized weight.
    linears, _ = _weight_model(sizing.load_config("llama-3-8b"))
    block = sum(l.in_features * l.out_features * l.count for l in linears)
    head = 128256 * 4096
    assert int4 == pytest.approx((params - block - head) * 2 + (block + head) * 5 / 8, rel=1e-6)
    # "+head" keeps the LM head in the model dtype.
    assert sizing.weight_bytes("llama-3-8b", "bfloat16", "int4+head") > int4
    assert sizing.weight_bytes("llama-3-8b", "float32", "bf16") == bf16


def test_quantized_self_copy_shares_the_embedding():
    own = sizing.weight_bytes("smollm2-135m", "float32", "int8")
    copy = sizing.copy_weight_bytes("smollm2-135m", "float32", "int8")
    assert copy < own  # the copy has no embedding table of its own
    assert copy > sizing.param_count("smollm2-135m") - 49152 * 576  # >= 1 byte per non-embedding weight
    assert sizing.copy_weight_bytes("smollm2-135m", "float32", None) == 0
    assert sizing.copy_weight_bytes("smollm2-135m", "float32", "fp32") == 0


def _backend_missing_here(exc: Exception) -> bool:
    """True only when a scheme cannot run on this machine for a reason outside specdec: its package is
    not installed, or it needs CUDA. Any other failure of ``quantize`` is a bug and must fail the test."""
    from specdec.quant import UnsupportedSchemeError

    if not isinstance(exc, UnsupportedSchemeError):
        return False
    return bool(re.search(r"the \w+ package is not installed|CUDA is not available|needs compute capability",
                          exc.reason))


def _quantize_or_skip(model, scheme: str):
    """``specdec.quant.quantize(model, scheme)``; skips (naming why) only when the backend is missing here."""
    from specdec.quant import quantize

    try:
        return quantize(model, scheme)
    except Exception as exc:
        if _backend_missing_here(exc):
            pytest.skip(f"{scheme}: {exc.reason}")
        raise


def _tiny_qwen2(tied: bool):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("qwen2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                                  tie_word_embeddings=tied, bos_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    return config, AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("scheme", ["int8", "int8+head", "bf16", "int4", "int4:g64", "int4:g32+head8", "int4+head16", "int8-dynamic"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_copy_weight_bytes_equal_what_specdec_quant_allocates(scheme, tied):
    from specdec.quant import model_bytes, parse_scheme

    config, model = _tiny_qwen2(tied)
    copy = _quantize_or_skip(model, scheme)
    assert copy is not model and copy.specdec_quant.scheme == parse_scheme(scheme).canonical()
    added = model_bytes(copy, exclude=model)
    assert added > 0  # every scheme here makes new tensors: 0 would mean nothing was quantized
    packing = None
    if scheme.startswith("int8-dynamic"):  # QNNPACK on CPUs without VNNI: its packed layout holds more
        from specdec.quant import int8_dynamic_packing

        packing = int8_dynamic_packing()
    assert sizing.copy_weight_bytes(config, "float32", scheme, int8_packing=packing) == added


def test_copy_weight_test_skips_only_for_a_missing_backend(monkeypatch):
    """A broken scheme fails the copy-weight test; only a missing package or CUDA skips it."""
    import specdec.quant.core as core
    from specdec.quant.backends import bnb_available

    _, model = _tiny_qwen2(True)
    name, probe, _, dtype = core.BACKENDS[("int4", "cpu")]

    def broken(*_args):
        raise ValueError("int4: in_features 64 is not a multiple of 16")  # a bug, not a missing backend

    monkeypatch.setitem(core.BACKENDS, ("int4", "cpu"), (name, probe, broken, dtype))
    with pytest.raises(ValueError, match="not a multiple"):
        _quantize_or_skip(model, "int4")
    monkeypatch.setitem(core.BACKENDS, ("int4", "cpu"), (name, lambda _d: "no int4 kernel for this build", broken, dtype))
    with pytest.raises(ValueError, match="no int4 kernel"):  # unsupported, but not for a reason we may skip
        _quantize_or_skip(model, "int4")
    missing = lambda _d: "the bitsandbytes package is not installed (pip install bitsandbytes)"  # noqa: E731
    monkeypatch.setitem(core.BACKENDS, ("int4", "cpu"), (name, missing, broken, dtype))
    with pytest.raises(pytest.skip.Exception, match="bitsandbytes package is not installed"):
        _quantize_or_skip(model, "int4")
    if bnb_available("cpu") is not None:  # the real probe's wording is what the skip recognises
        with pytest.raises(pytest.skip.Exception):
            _quantize_or_skip(model, "nf4")


@pytest.mark.parametrize("bad", ["int9", "magic", "bf16:g32", "int8-dynamic:g32",
                                 # accepted by the planner once, never by specdec.quant: no longer planned
                                 "fp8", "int3", "int2:g32", "nf4-dq", "fp4-dq", "int8:g32", "int4-g32", "int4:g48",
                                 "qint8", "half", "float64", "no", ""])
def test_bad_quantization_names(bad):
    from specdec.quant import UnknownSchemeError, parse_scheme

    with pytest.raises(ValueError):
        sizing.parse_quant(bad)
    with pytest.raises(UnknownSchemeError):  # the same refusal as specdec.quant's
        parse_scheme(bad)


# Every form the grammar allows for each registered name and alias ("none" is the planner's "no
# quantization", tested apart).
def _scheme_spellings() -> list[str]:
    from specdec.quant import SCHEMES, scheme_names

    out = []
    for name in scheme_names():
        base = SCHEMES.get(name)
        grouped = base is not None and base.default_group_size is not None
        for suffix in ("", "+head", "+head8", "+head16"):
            out.append(name + suffix)
            if grouped:
                out += [f"{name}:g64{suffix}", f"{name}:g128{suffix}"]
    return [s for s in out if not s.startswith("none")]


@pytest.mark.parametrize("spec", _scheme_spellings())
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_planner_and_specdec_quant_read_one_scheme_table(spec, device):
    """The planner accepts exactly what specdec.quant accepts, names it the same, and agrees with
    quantize() on the compute dtype per device (what the copy's KV cache is stored in)."""
    from specdec.quant import parse_scheme
    from specdec.quant.backends import BACKENDS
    from specdec.quant.core import _DTYPE_SCHEMES

    parsed = parse_scheme(spec)
    scheme = sizing.parse_quant(spec, device)
    assert scheme.name == parsed.canonical()
    assert scheme.group_size == (parsed.group_size or parsed.info.block_size)
    assert scheme.quantize_head == (not parsed.keep_head)
    quant_dtype = _DTYPE_SCHEMES.get(parsed.base) or BACKENDS[(parsed.base, device)][3]
    assert f"torch.{scheme.compute_dtype}" == str(quant_dtype)


def test_none_means_no_quantization_to_the_planner():
    from specdec.quant import parse_scheme

    assert sizing.parse_quant(None) is None and sizing.parse_quant("none") is None and sizing.parse_quant(" None ") is None
    assert parse_scheme("none").base == "fp32"  # specdec.quant: an fp32 copy (docs/sizing.md says why they differ)


def test_int8_computes_in_fp16_on_cuda_and_bf16_on_cpu():
    plan_cpu = sizing.plan("smollm2-135m", "self", draft_quant="int8", dtype="float32", context=256)
    plan_cuda = sizing.plan("smollm2-135m", "self", draft_quant="int8", dtype="float32", context=256, device="cuda")
    per_token = sizing.kv_bytes_per_token("smollm2-135m", "bf16")
    assert plan_cpu.drafter_kv_bytes_per_token == per_token == plan_cuda.drafter_kv_bytes_per_token  # both 2 bytes
    assert sizing.parse_quant("int8", "cuda").compute_dtype == "float16"
    assert sizing.parse_quant("int8", "cpu").compute_dtype == "bfloat16"
    assert sizing.parse_quant("int8-dynamic", "cpu").compute_dtype == "float32"  # torch.ao computes in fp32
    with pytest.raises(SystemExit):
        parser = argparse.ArgumentParser()
        sizing.add_plan_arguments(parser)
        parser.parse_args(["--model", "smollm2-135m", "--device", "gpu"])


# --------------------------------------------------------------------------------------------
# memory sizes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("80GiB", 80 * 2**30), ("24GB", 24 * 10**9), ("512MiB", 512 * 2**20), ("1.5GiB", 3 * 2**29),
        ("1073741824", 2**30), (" 2 gib ", 2 * 2**30), ("64Gi", 64 * 2**30), ("100B", 100), ("1TB", 10**12),
        (123, 123), (2.0 * 2**30, 2**30 * 2),
    ],
)
def test_parse_memory(text, expected):
    assert sizing.parse_memory(text) == expected


@pytest.mark.parametrize("bad", ["", "abc", "-5GB", "12XB", "GB", "5G", "1.2.3GB", "nan", True, -1, 1.5, None])
def test_parse_memory_rejects_bad_sizes(bad):
    with pytest.raises(ValueError):
        sizing.parse_memory(bad)


def test_available_memory_is_positive():
    assert sizing.available_memory() > 0


# --------------------------------------------------------------------------------------------
# configs and presets
# --------------------------------------------------------------------------------------------


def test_presets_are_well_formed_and_load():
    for name, raw in presets.PRESETS.items():
        assert re.fullmatch(r"[a-z0-9.\-]+", name), name
        for key in ("model_type", "num_hidden_layers", "hidden_size", "num_attention_heads",
                    "num_key_value_heads", "vocab_size", "intermediate_size", "max_position_embeddings",
                    "tie_word_embeddings"):
            assert key in raw, (name, key)
        cfg = sizing.load_config(name)
        assert cfg.num_hidden_layers == raw["num_hidden_layers"]
        assert sizing.kv_bytes_per_token(cfg) > 0
    for name in ("llama-2-7b", "mistral-7b", "llama-3-8b", "qwen2.5-7b", "deepseek-v3", "smollm2-135m"):
        assert name in presets.PRESETS


def test_smollm2_preset_numbers():
    raw = presets.get_preset("SmolLM2-135M")
    assert (raw["num_hidden_layers"], raw["hidden_size"], raw["num_attention_heads"], raw["num_key_value_heads"],
            raw["head_dim"], raw["vocab_size"], raw["intermediate_size"], raw["tie_word_embeddings"]) == \
        (30, 576, 9, 3, 64, 49152, 1536, True)


def test_unknown_model_lists_presets():
    with pytest.raises(ValueError) as err:
        sizing.load_config("llama-9-1t")
    assert "llama-3-8b" in str(err.value) and "smollm2-135m" in str(err.value)


def test_load_config_from_json_file_and_directory(tmp_path):
    data = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
            "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000,
            "max_position_embeddings": 2048}
    (tmp_path / "config.json").write_text(json.dumps(data))
    expected = 2 * 4 * 2 * 32 * 2
    assert sizing.kv_bytes_per_token(tmp_path / "config.json", "bf16") == expected
    assert sizing.kv_bytes_per_token(str(tmp_path), "bf16") == expected
    cfg = sizing.load_config(tmp_path)
    assert cfg.num_key_value_heads == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="config.json"):
        sizing.load_config(empty)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="JSON"):
        sizing.load_config(tmp_path / "bad.json")


def test_multimodal_config_uses_the_text_decoder():
    from transformers import AutoConfig

    text = dict(presets.get_preset("gemma-3-4b"))
    text.pop("model_type")
    cfg = AutoConfig.for_model("gemma3", text_config=text)
    assert sizing.kv_bytes_per_token(cfg, "bf16") == sizing.kv_bytes_per_token("gemma-3-4b", "bf16")


# --------------------------------------------------------------------------------------------
# reality: predicted bytes == bytes ManagedCache allocates for tiny real models
# --------------------------------------------------------------------------------------------

_TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, vocab_size=128,
             max_position_embeddings=256, bos_token_id=0, eos_token_id=1, pad_token_id=0)

TINY_CONFIGS = {
    "llama-gqa": ("llama", dict(_TINY, num_key_value_heads=2)),
    "mistral-sliding": ("mistral", dict(_TINY, num_key_value_heads=2, sliding_window=4)),
    "qwen2-mqa": ("qwen2", dict(_TINY, num_key_value_heads=1)),
    "qwen3-head-dim": ("qwen3", dict(_TINY, num_key_value_heads=2, head_dim=32)),
    "gemma2-alternating": ("gemma2", dict(_TINY, num_key_value_heads=2, head_dim=24, sliding_window=4)),
    "gemma3-pattern": ("gemma3_text", dict(_TINY, num_hidden_layers=3, num_key_value_heads=1, head_dim=32,
                                           sliding_window=4, sliding_window_pattern=3)),
    "phi3-sliding": ("phi3", dict(_TINY, num_key_value_heads=2, sliding_window=4)),
    "mixtral-moe": ("mixtral", dict(_TINY, num_key_value_heads=2, num_local_experts=3, num_experts_per_tok=2)),
    "deepseek-v3-mla": ("deepseek_v3", dict(_TINY, num_hidden_layers=3, num_key_value_heads=4, kv_lora_rank=16,
                                            q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12,
                                            n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                                            moe_intermediate_size=32, first_k_dense_replace=1, n_group=2,
                                            topk_group=1)),
    "gpt2": ("gpt2", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=256, bos_token_id=0,
                          eos_token_id=1)),
    "gpt-neox": ("gpt_neox", dict(_TINY, tie_word_embeddings=False)),
}


@pytest.fixture(scope="module")
def tiny_models():
    from transformers import AutoConfig, AutoModelForCausalLM

    built = {}
    for key, (model_type, kwargs) in TINY_CONFIGS.items():
        config = AutoConfig.for_model(model_type, **kwargs)
        torch.manual_seed(0)
        built[key] = (config, AutoModelForCausalLM.from_config(config).eval())
    return built


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("key", list(TINY_CONFIGS))
def test_managed_cache_bytes_equal_the_allocated_bytes(tiny_models, key, dtype):
    from specdec.runners.cache import ManagedCache

    config, model = tiny_models[key]
    model = model.to(dtype)
    batch, prompt, max_len = 3, 7, 20  # prompt longer than the tiny sliding windows
    cache = ManagedCache(config.num_hidden_layers, max_len)
    input_ids = torch.randint(2, config.vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(input_ids, use_cache=True, **{cache_argument(model): cache})
    assert cache.length == prompt
    assert cache.nbytes > 0
    assert sizing.managed_cache_bytes(config, batch, max_len, dtype) == cache.nbytes
    # and the planner's per-token figure is the same arithmetic
    assert sizing.kv_bytes_per_token(config, dtype) * batch * max_len == cache.nbytes


@pytest.mark.parametrize("key", list(TINY_CONFIGS))
def test_parameter_count_equals_the_built_model(tiny_models, key):
    config, model = tiny_models[key]
    assert sizing.param_count(config) == sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------------------------
# planner
# --------------------------------------------------------------------------------------------


def _total(verifier, drafter, batch, context, **kw):
    return sizing.plan(verifier, drafter, batch=batch, context=context, **kw).total_bytes


def test_plan_breakdown_adds_up():
    p = sizing.plan("llama-3-8b", "llama-3.2-1b", memory="80GiB", context=8192, batch=2)
    assert p.total_bytes == (p.verifier_weight_bytes + p.drafter_weight_bytes + p.verifier_cache_bytes
                             + p.drafter_cache_bytes + p.activation_bytes + p.runtime_reserve_bytes)
    # the engine's slots for 2 rows: the context plus a ragged batch's slack, for an unknown (1-token) prompt
    assert p.cache_len == cache_slots(2, 1, 8192, 8) == 8192 + 8191 // 4 + 2 * 9
    assert p.verifier_cache_bytes == sizing.managed_cache_bytes("llama-3-8b", 2, p.cache_len, "bfloat16")
    assert p.drafter_cache_bytes == sizing.managed_cache_bytes("llama-3.2-1b", 2, p.cache_len, "bfloat16")
    assert p.kv_bytes_per_token == 131072
    assert p.naive_kv_bytes_per_token == 4 * 131072
    assert p.kv_cache_bytes == 2 * 8192 * 131072
    assert p.memory_bytes == 80 * GiB and p.fits
    assert p.free_bytes == p.memory_bytes - p.total_bytes
    d = p.to_dict()
    json.dumps(d)
    assert d["kv_cache_bytes"] == p.kv_cache_bytes and d["max_batch"] == p.max_batch
    assert "131,072" in p.table() and "<table>" in p._repr_html_()


@pytest.mark.parametrize(
    "verifier, drafter, memory, context, kw",
    [
        ("llama-3-8b", "llama-3.2-1b", "24GiB", 8192, {}),
        ("llama-3-8b", "llama-3.2-1b", "80GiB", 8192, {}),
        ("qwen2.5-32b", "qwen2.5-0.5b", "80GiB", 32768, {}),
        ("mistral-7b", None, "40GB", 16384, {"kv_dtype": "fp8", "weight_quant": "int4"}),
        ("smollm2-135m", "self", "6GiB", 8192, {"dtype": "float32", "draft_quant": "int8"}),
    ],
)
def test_max_batch_and_max_context_are_tight(verifier, drafter, memory, context, kw):
    p = sizing.plan(verifier, drafter, memory=memory, context=context, **kw)
    budget = sizing.parse_memory(memory)
    assert p.max_batch >= 1
    assert _total(verifier, drafter, p.max_batch, context, **kw) <= budget
    assert _total(verifier, drafter, p.max_batch + 1, context, **kw) > budget
    # max context at batch 1 (the default): tight unless the model's own limit stops it first
    assert _total(verifier, drafter, 1, p.max_context, **kw) <= budget
    if p.max_context_limited_by == "memory":
        assert _total(verifier, drafter, 1, p.max_context + 1, **kw) > budget
    else:
        assert p.max_context == p.model_max_context
    # and the plan at max_batch reports that it fits
    at_max = sizing.plan(verifier, drafter, memory=memory, context=context, batch=p.max_batch, **kw)
    assert at_max.fits and at_max.max_batch == p.max_batch


def test_plan_that_does_not_fit_says_what_to_change():
    p = sizing.plan("llama-3-8b", "llama-3.2-1b", memory="24GiB", context=8192, batch=16)
    assert p.fits is False
    assert p.max_batch < 16
    assert f"lower the batch to {p.max_batch}" in p.advice
    assert "shorten the context" in p.advice


def test_plan_error_when_nothing_fits():
    with pytest.raises(PlanError) as err:
        sizing.plan("llama-3-70b", memory="24GiB", context=4096)
    assert isinstance(err.value, MemoryError)
    message = str(err.value)
    assert "nothing fits" in message and "--quant int4" in message
    assert err.value.plan is not None and err.value.plan.max_batch == 0
    # weights fit, but neither the batch nor the context can be met on its own
    with pytest.raises(PlanError, match="Lower both"):
        sizing.plan("llama-3.1-8b", memory="24GiB", context=131072, batch=100_000)


def test_plan_without_memory_has_no_limits_and_defaults():
    p = sizing.plan("llama-2-7b", dtype="float16")
    assert p.batch == 1 and p.context == 4096  # the model's max_position_embeddings
    assert p.kv_cache_bytes == 2_147_483_648
    assert p.max_batch is None and p.max_context is None and p.fits is None
    no_max = {"model_type": "home_made", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
              "vocab_size": 10}
    assert sizing.plan(no_max).context == sizing.DEFAULT_CONTEXT


def test_plan_sliding_window_uses_full_context_for_the_managed_cache():
    p = sizing.plan("mistral-7b", context=16384, dtype="float16", draft_len=0)
    assert p.kv_cache_bytes == 4096 * 131072  # a windowed cache
    assert p.verifier_cache_bytes == 16384 * 131072  # specdec's managed cache keeps it all (one row: no slack)
    assert any("sliding" in note for note in p.notes)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("prompt_len", [None, 100, 4000])
def test_planner_slots_are_the_engines(batch, prompt_len):
    """The planner sizes both caches with specdec.slots.cache_slots, the engine's own formula."""
    context, k = 4096, 5
    p = sizing.plan("llama-3-8b", "llama-3.2-1b", context=context, batch=batch, draft_len=k, prompt_len=prompt_len)
    expected = cache_slots(batch, min(prompt_len or 1, context), context, k)  # unknown prompt: the largest slack
    assert p.cache_len == expected
    if batch == 1:
        assert p.cache_len == context  # one row never needs more than prompt + new tokens
    assert p.verifier_cache_bytes == sizing.managed_cache_bytes("llama-3-8b", batch, expected, "bfloat16")
    assert p.drafter_cache_bytes == sizing.managed_cache_bytes("llama-3.2-1b", batch, expected, "bfloat16")
    assert sizing.cache_len(prompt_len or 1, context - (prompt_len or 1), k, batch_size=batch) == expected


def test_plan_and_check_fits_count_the_same():
    """check_fits and plan share one budget computation: same caches and activations for the same call."""
    p = sizing.plan("llama-3-8b", "llama-3.2-1b", context=2048, batch=3, prompt_len=512)
    fit = sizing.check_fits("llama-3-8b", "llama-3.2-1b", 3, p.cache_len, "bfloat16", "1TiB", prefill_tokens=512,
                            include_weights=True)
    assert (fit.verifier_cache_bytes, fit.drafter_cache_bytes, fit.activation_bytes, fit.weight_bytes) == (
        p.verifier_cache_bytes, p.drafter_cache_bytes, p.activation_bytes,
        p.verifier_weight_bytes + p.drafter_weight_bytes)
    assert fit.required_bytes == p.total_bytes - p.runtime_reserve_bytes


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_presets_size_the_same_without_transformers(name):
    """The planner reads presets as plain dicts (no transformers); transformers' configs of them size the same."""
    from specdec.sizing.configs import PresetConfig, resolve

    raw = resolve(name)
    assert isinstance(raw, PresetConfig)
    cfg = sizing.load_config(name)
    assert sizing.kv_layout(raw) == sizing.kv_layout(cfg)
    assert sizing.kv_profile(raw).to_dict() == sizing.kv_profile(cfg).to_dict()
    assert sizing.param_breakdown(raw) == sizing.param_breakdown(cfg)
    for quant in (None, "int8", "int4+head8", "nf4", "bf16"):
        assert sizing.weight_bytes(raw, "bfloat16", quant) == sizing.weight_bytes(cfg, "bfloat16", quant)
        assert sizing.copy_weight_bytes(raw, "float32", quant) == sizing.copy_weight_bytes(cfg, "float32", quant)
    assert sizing.activation_bytes(raw, 100, "bf16", 5) == sizing.activation_bytes(cfg, 100, "bf16", 5)
    assert sizing.plan(name, memory="4TiB").to_dict() == sizing.plan(cfg, memory="4TiB").to_dict()


# --------------------------------------------------------------------------------------------
# engine pre-check
# --------------------------------------------------------------------------------------------


def test_check_fits_passes_and_fails_early():
    assert sizing.cache_len(prompt_len=100, max_new_tokens=400, draft_len=8) == 500  # one row: max_length
    length = sizing.cache_len(prompt_len=100, max_new_tokens=400, draft_len=8, batch_size=4)
    assert length == cache_slots(4, 100, 500, 8) == 500 + 400 // 4 + 2 * 9
    ok = sizing.check_fits("smollm2-135m", "smollm2-135m", 4, length, torch.float32, 8 * GiB)
    assert ok.verifier_cache_bytes == sizing.managed_cache_bytes("smollm2-135m", 4, length, "float32")
    assert ok.required_bytes == ok.verifier_cache_bytes + ok.drafter_cache_bytes + ok.activation_bytes
    with pytest.raises(PlanError) as err:
        sizing.check_fits("llama-3-8b", "llama-3.2-1b", 64, 8192 + 9, "bfloat16", "24GiB")
    assert isinstance(err.value, MemoryError)
    assert "lower the batch to" in str(err.value)
    with pytest.raises(PlanError, match="bfloat16"):
        sizing.check_fits("llama-3-8b", None, 8, 16384, "float32", "16GiB")


def test_check_fits_uses_free_memory_by_default():
    result = sizing.check_fits("smollm2-135m", None, 1, 64, "float32")
    assert result.available_bytes > 0 and result.device == "cpu"


# --------------------------------------------------------------------------------------------
# CLI hooks
# --------------------------------------------------------------------------------------------


def _run(argv, capsys):
    parser = argparse.ArgumentParser(prog="specdec plan")
    sizing.add_plan_arguments(parser)
    code = sizing.run_plan(parser.parse_args(argv))
    out = capsys.readouterr().out
    return code, out


def test_run_plan_prints_table_and_json_last_line(capsys):
    code, out = _run(["--model", "llama-2-7b", "--context", "4096", "--dtype", "float16", "--json"], capsys)
    assert code == 0
    lines = out.strip().splitlines()
    data = json.loads(lines[-1])
    assert data["kv_bytes_per_token"] == 524288
    assert data["kv_cache_bytes"] == 2_147_483_648
    assert data["naive_kv_bytes_per_token"] == 524288  # Llama-2-7B has no GQA: same figure
    assert "verifier KV cache" in out


def test_run_plan_with_memory_reports_limits(capsys):
    code, out = _run(["--model", "mistral-7b", "--draft", "qwen2.5-0.5b", "--memory", "24GiB", "--context", "4096",
                      "--batch", "4", "--dtype", "float16", "--json"], capsys)
    assert code == 0
    data = json.loads(out.strip().splitlines()[-1])
    assert data["kv_cache_bytes"] == 2 * GiB
    assert data["naive_kv_cache_bytes"] == 8 * GiB
    assert data["max_batch"] >= 4 and data["max_context"] >= 4096
    p = sizing.plan("mistral-7b", "qwen2.5-0.5b", memory="24GiB", context=4096, batch=4, dtype="float16")
    assert (data["max_batch"], data["max_context"]) == (p.max_batch, p.max_context)


def test_run_plan_errors(capsys):
    code, out = _run(["--model", "no-such-model", "--json"], capsys)
    assert code == 2
    assert "smollm2-135m" in json.loads(out.strip().splitlines()[-1])["error"]
    code, out = _run(["--model", "llama-3-8b", "--memory", "24 bananas", "--json"], capsys)
    assert code == 2
    code, out = _run(["--model", "llama-3-70b", "--memory", "24GiB", "--json"], capsys)
    assert code == 2 and "nothing fits" in json.loads(out.strip().splitlines()[-1])["error"]
    code, out = _run(["--model", "llama-3-8b", "--memory", "24GiB", "--context", "8192", "--batch", "16",
                      "--json"], capsys)
    data = json.loads(out.strip().splitlines()[-1])
    assert code == 1 and data["fits"] is False and data["max_batch"] < 16


@pytest.mark.parametrize("argv", [["--help"], ["plan", "--help"],
                                  ["plan", "--model", "llama-3-8b", "--draft", "self", "--draft-quant", "int4+head8",
                                   "--memory", "24GiB", "--batch", "4", "--context", "2048", "--json"]])
def test_help_and_plan_import_neither_torch_nor_transformers(argv):
    """`specdec --help` and `specdec plan PRESET` must start fast: no torch, no transformers."""
    import subprocess
    import sys

    code = (
        "import sys, specdec.cli\n"
        "try:\n"
        f"    code = specdec.cli.main({argv!r})\n"
        "except SystemExit as exit:\n"
        "    code = exit.code\n"
        "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "print('HEAVY', heavy, 'CODE', code, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "HEAVY [] CODE 0" in done.stderr, done.stderr[-2000:]
    if "--json" in argv:
        assert json.loads(done.stdout.strip().splitlines()[-1])["drafter_shares_weights"] is True


def test_prompt_len_and_headroom_options():
    full = sizing.plan("llama-3-8b", "llama-3.2-1b", memory="80GiB", context=8192)
    short = sizing.plan("llama-3-8b", "llama-3.2-1b", memory="80GiB", context=8192, prompt_len=1024)
    assert short.prefill_tokens == 1024 and short.activation_bytes < full.activation_bytes
    assert short.max_batch > full.max_batch
    assert short.verifier_cache_bytes == full.verifier_cache_bytes  # the cache still holds the whole context
    assert sizing.plan("smollm2-135m", memory="10GiB", headroom="10%").runtime_reserve_bytes == GiB
    assert sizing.plan("smollm2-135m", memory="10GiB", headroom=0.5).runtime_reserve_bytes == 5 * GiB
    assert sizing.plan("smollm2-135m", headroom="2GiB").runtime_reserve_bytes == 2 * GiB
    with pytest.raises(ValueError, match="memory budget"):
        sizing.plan("smollm2-135m", headroom=0.5)


# --------------------------------------------------------------------------------------------
# layout: a torch-free core that check_fits needs, and the planner above it
# --------------------------------------------------------------------------------------------


def _sizing_imports() -> dict[str, set[str]]:
    """Every specdec.sizing module -> the specdec.sizing modules it imports anywhere (function bodies
    and ``if TYPE_CHECKING:`` blocks included)."""
    import ast
    from pathlib import Path

    root = Path(sizing.__file__).parent
    files = {("specdec.sizing." + ".".join(f.relative_to(root).with_suffix("").parts)).removesuffix(".__init__"): f
             for f in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text())
        assert len(path.read_text().splitlines()) <= 500, f"{path} is over 500 lines"
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                assert not node.level, f"{path}: relative import"
                found.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                             for a in node.names)
        graph[name] = {m for m in found if m in files and m != name}
    return graph


def test_core_never_imports_the_planner_and_no_module_imports_in_a_circle():
    graph = _sizing_imports()
    core = [m for m in graph if m != "specdec.sizing" and not m.startswith("specdec.sizing.planner")]
    assert "specdec.sizing.check" in core and "specdec.sizing.planner.result" in graph
    for module in core:
        assert not {m for m in graph[module] if m == "specdec.sizing" or m.startswith("specdec.sizing.planner")}, module

    def in_a_circle(start: str) -> bool:
        stack, seen = list(graph[start]), set()
        while stack:
            module = stack.pop()
            if module == start:
                return True
            if module not in seen:
                seen.add(module)
                stack.extend(graph[module])
        return False

    assert not [m for m in graph if in_a_circle(m)]


def test_importing_sizing_imports_neither_torch_nor_transformers():
    import subprocess
    import sys

    code = "import sys, specdec.sizing; print([m for m in ('torch', 'transformers') if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stderr[-2000:]
