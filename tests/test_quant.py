"""specdec.quant: quantized copies, memory accounting, scheme errors, and the report.

Fast tests run on tiny random Llama models built from a config; tests marked ``slow`` load the
embedded SmolLM2-135M (about 15 s to load on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import importlib.util
import json

import pytest
import torch
from torch import nn
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from specdec.quant import (
    SCHEMES,
    UnknownSchemeError,
    UnsupportedSchemeError,
    available_schemes,
    model_bytes,
    parse_scheme,
    quantize,
    scheme_backend,
)
from specdec.quant.backends import Int4WeightOnlyLinear, Int8WeightOnlyLinear, int4_group_for
from specdec.quant_report import (
    add_quant_report_arguments,
    load_prompts,
    quant_report,
    run_quant_report,
)
from specdec.runners.cache import cache_argument

VOCAB = 128
HAS_CUDA = torch.cuda.is_available()
HAS_BNB = importlib.util.find_spec("bitsandbytes") is not None

CPU_SCHEMES = available_schemes("cpu")
# every scheme the package offers on CPU, plus the variants a user is pointed at
CPU_VARIANTS = sorted(
    set(CPU_SCHEMES)
    | {"none", "int4:g64", "int4:g128", "int8+head", "int4+head", "int4+head8", "int8-dynamic+head16", "bf16+head8"}
)
# bitsandbytes' CPU path is very slow on anything but a tiny model; it is tested below when installed
CPU_VARIANTS_FAST = [s for s in CPU_VARIANTS if parse_scheme(s).base not in ("nf4", "fp4")]


def tiny_llama(tied: bool = True, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return tiny_llama()


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))


def _prefill_and_step(m: nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, DynamicCache]:
    cache = DynamicCache(config=m.config)
    arg = cache_argument(m)
    with torch.inference_mode():
        a = m(input_ids=ids[:, :-1], attention_mask=torch.ones_like(ids[:, :-1]),
              use_cache=True, **{arg: cache}).logits
        pos = torch.full((ids.shape[0], 1), ids.shape[1] - 1)
        b = m(input_ids=ids[:, -1:], position_ids=pos, attention_mask=torch.ones_like(ids),
              use_cache=True, **{arg: cache}).logits
    return a, b, cache


def _snapshot(m: nn.Module) -> dict[str, tuple[int, torch.Tensor, torch.dtype, bool]]:
    return {
        k: (v.data_ptr(), v.detach().clone(), v.dtype, getattr(v, "requires_grad", False))
        for k, v in list(m.named_parameters()) + list(m.named_buffers())
    }


# --------------------------------------------------------------------------------------------
# every CPU scheme loads, runs with a DynamicCache, and leaves the source alone
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", CPU_VARIANTS_FAST)
def test_cpu_scheme_forward_with_cache(model, ids, scheme):
    q = quantize(model, scheme)
    a, b, cache = _prefill_and_step(q, ids)
    assert a.shape == (2, ids.shape[1] - 1, VOCAB) and b.shape == (2, 1, VOCAB)
    assert torch.isfinite(a.float()).all() and torch.isfinite(b.float()).all()
    assert cache.get_seq_length() == ids.shape[1]
    assert q.specdec_quant.scheme == parse_scheme(scheme).canonical()
    assert q.specdec_quant.backend == scheme_backend(scheme, "cpu")
    assert not q.training


@pytest.mark.parametrize("scheme", CPU_VARIANTS_FAST)
def test_copy_leaves_source_untouched(scheme, ids):
    m = tiny_llama()
    before = _snapshot(m)
    modules_before = [(n, type(x)) for n, x in m.named_modules()]
    with torch.inference_mode():
        ref = m(ids).logits.clone()
    q = quantize(m, scheme)
    _prefill_and_step(q, ids)  # running the copy must not touch the source either
    after = _snapshot(m)
    assert after.keys() == before.keys()
    for k, (ptr, val, dtype, rg) in before.items():
        assert after[k][0] == ptr, f"{k} was reallocated"
        assert after[k][2] == dtype and after[k][3] == rg, f"{k} dtype/requires_grad changed"
        assert torch.equal(after[k][1], val), f"{k} changed"
    assert [(n, type(x)) for n, x in m.named_modules()] == modules_before
    assert all(not x._forward_hooks and not x._forward_pre_hooks for x in m.modules())
    assert m.config.dtype in (torch.float32, "float32", None)
    with torch.inference_mode():
        assert torch.equal(m(ids).logits, ref)


def test_fp32_copy_shares_everything_and_matches(model, ids):
    q = quantize(model, "fp32")
    assert model_bytes(q, exclude=model) == 0
    assert model_bytes(q) == model_bytes(model)
    with torch.inference_mode():
        assert torch.equal(q(ids).logits, model(ids).logits)


@pytest.mark.parametrize("scheme", ["bf16", "int8", "int8-weight-only", "int4"])
def test_input_embedding_is_shared_not_copied(model, scheme):
    q = quantize(model, scheme)
    assert q.get_input_embeddings().weight is model.get_input_embeddings().weight
    # the tied head is quantized (or cast) in the copy, the source's tie is intact
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_keep_head_shares_the_tied_head(model):
    q = quantize(model, "int8+head")
    assert type(q.lm_head) is nn.Linear and q.lm_head.weight is model.lm_head.weight
    assert model_bytes(q, exclude=model) < model_bytes(quantize(model, "int8"), exclude=model)


def test_head_modes(model, ids):
    q = quantize(model, "int4+head8")
    assert isinstance(q.lm_head, Int8WeightOnlyLinear)
    assert isinstance(q.model.layers[0].mlp.down_proj, Int4WeightOnlyLinear)
    q16 = quantize(model, "int8-dynamic+head16")
    assert q16.lm_head.weight.dtype == torch.bfloat16
    with torch.inference_mode():
        assert q16(ids).logits.dtype == torch.bfloat16
        # an int8 head on an int4 body is closer to fp32 than an int4 head
        ref = model(ids).logits
        err = lambda s: (quantize(model, s)(ids).logits.float() - ref).norm().item()  # noqa: E731
        assert err("int4+head8") < err("int4")


def test_untied_model(ids):
    m = tiny_llama(tied=False)
    for scheme in ("bf16", "int8", "int4"):
        a, b, _ = _prefill_and_step(quantize(m, scheme), ids)
        assert torch.isfinite(b.float()).all()


def test_copy_is_close_to_source(model, ids):
    with torch.inference_mode():
        ref = model(ids).logits
        for scheme, tol in [("bf16", 0.05), ("int8-weight-only", 0.05), ("int8", 0.1), ("int4", 0.3)]:
            out = quantize(model, scheme)(ids).logits.float()
            rel = ((out - ref).norm() / ref.norm()).item()
            assert rel < tol, (scheme, rel)


def test_bf16_logits_dtype_and_keep_head_fp32(model, ids):
    with torch.inference_mode():
        assert quantize(model, "bf16")(ids).logits.dtype == torch.bfloat16
        assert quantize(model, "int4+head")(ids).logits.dtype == torch.float32
        assert quantize(model, "int8-dynamic")(ids).logits.dtype == torch.float32


def test_int8_smaller_than_fp32(model):
    fp32 = model_bytes(model)
    for scheme in ("int8", "int8-dynamic", "int8-weight-only", "int4"):
        q = quantize(model, scheme)
        assert model_bytes(q, exclude=model) < 0.4 * fp32, scheme
        assert model_bytes(q) < fp32, scheme


def test_int4_group_fallback():
    assert int4_group_for(576, 128) == 64
    assert int4_group_for(1536, 128) == 128
    assert int4_group_for(64, 32) == 32
    m = tiny_llama()
    q = quantize(m, "int4:g128")  # 64-wide layers fall back to g64; 128-wide down_proj keeps g128
    groups = {x.group_size for x in q.modules() if isinstance(x, Int4WeightOnlyLinear)}
    assert groups == {64, 128}


# --------------------------------------------------------------------------------------------
# memory accounting against real tensor sizes
# --------------------------------------------------------------------------------------------


def test_model_bytes_hand_computed():
    m = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2, bias=False), nn.LayerNorm(2))
    m.register_buffer("steps", torch.zeros(5, dtype=torch.int64))
    m[2].half()
    expected = (4 * 3 + 3) * 4 + 3 * 2 * 4 + (2 + 2) * 2 + 5 * 8
    assert model_bytes(m) == expected


def test_model_bytes_counts_shared_once():
    a = nn.Linear(8, 4, bias=False)
    b = nn.Linear(8, 4, bias=False)
    b.weight = a.weight  # tied
    m = nn.ModuleList([a, b])
    assert model_bytes(m) == 8 * 4 * 4
    big = torch.zeros(10, 8)
    c = nn.Module()
    c.register_buffer("x", big[:4])  # a view keeps its whole storage alive
    c.register_buffer("y", big[4:])
    assert model_bytes(c) == 10 * 8 * 4
    assert model_bytes(m, exclude=a) == 0


def test_model_bytes_quantized_linears():
    lin = nn.Linear(64, 32)
    n, k = 32, 64
    w8 = Int8WeightOnlyLinear(lin, torch.bfloat16, torch.device("cpu"))
    assert model_bytes(w8) == n * k + n * 2 + n * 2  # int8 codes, bf16 scales, bf16 bias
    w4 = Int4WeightOnlyLinear(lin, 32, torch.device("cpu"))
    packed = w4.weight_int4.numel() * w4.weight_int4.element_size()
    assert packed == n * k // 2  # two 4-bit codes per byte
    assert model_bytes(w4) == n * k // 2 + (k // 32) * n * 2 * 2 + n * 2
    holder = nn.Module()
    holder.lin = lin
    assert model_bytes(quantize(holder, "int8")) == n * k + n * 2 + n * 2  # int8 = weight-only on CPU
    q = quantize(holder, "int8-dynamic")
    # fbgemm keeps int8 codes plus a float32 scale and int32 zero point per channel; bias fp32
    assert model_bytes(q) == n * k + n * 4 + n * 4 + n * 4
    assert model_bytes(holder) == (n * k + n) * 4  # the source is untouched


@pytest.mark.skipif(not HAS_BNB, reason="bitsandbytes is not installed")
def test_model_bytes_bitsandbytes_4bit():
    holder = nn.Module()
    holder.lin = nn.Linear(128, 64, bias=False)
    q = quantize(holder, "nf4")
    # 4-bit codes plus one absmax per 64-block (+ the 16-entry code table); far below bf16
    codes = 64 * 128 // 2
    assert codes < model_bytes(q) < codes + 64 * 128 * 2 // 4


# --------------------------------------------------------------------------------------------
# scheme names and errors
# --------------------------------------------------------------------------------------------


def test_parse_scheme():
    assert parse_scheme("int4").group_size == 32
    assert parse_scheme("int4:g128").group_size == 128
    p = parse_scheme(" INT8+head ")
    assert p.base == "int8" and p.keep_head and p.canonical() == "int8+head"
    assert parse_scheme("int4:g64+head8").head == "int8"
    assert parse_scheme("int4+head16").canonical() == "int4:g32+head16"
    assert parse_scheme("none").base == "fp32"
    assert parse_scheme("bfloat16").base == "bf16"


@pytest.mark.parametrize("bad", ["int3", "q4_k_m", "", "int8:g32", "int4:g48", "int4+tail", "int4+head4"])
def test_unknown_scheme_lists_valid_ones(model, bad):
    with pytest.raises(UnknownSchemeError) as e:
        quantize(model, bad)
    assert isinstance(e.value, ValueError)
    msg = str(e.value)
    assert "int8" in msg or "group size" in msg or "takes no group" in msg


def test_unknown_scheme_message_names_alternatives(model):
    with pytest.raises(ValueError, match=r"Valid schemes: .*int4.*int8"):
        quantize(model, "int3")


def test_unsupported_device_names_scheme_device_and_alternatives(model):
    with pytest.raises(UnsupportedSchemeError) as e:
        quantize(model, "int8", device="mps")
    msg = str(e.value)
    assert "'int8'" in msg and "mps" in msg
    assert isinstance(e.value, ValueError)


@pytest.mark.skipif(HAS_CUDA, reason="checks the error raised when CUDA is absent")
def test_cuda_scheme_without_cuda_is_clear(model):
    with pytest.raises(UnsupportedSchemeError) as e:
        quantize(model, "int8", device="cuda")
    msg = str(e.value)
    assert "cuda" in msg and "CUDA is not available" in msg
    assert "Schemes that work on 'cuda'" in msg
    assert available_schemes("cuda") == []


def test_missing_package_is_clear(model, monkeypatch):
    import specdec.quant.backends as backends

    real = importlib.util.find_spec
    monkeypatch.setattr(backends.importlib.util, "find_spec",
                        lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    with pytest.raises(UnsupportedSchemeError) as e:
        quantize(model, "nf4", device="cpu")
    msg = str(e.value)
    assert "bitsandbytes" in msg and "'nf4'" in msg and "int8" in msg  # names working alternatives


def test_registry_describes_every_scheme():
    for name, info in SCHEMES.items():
        assert info.name == name and info.description and info.backends
        assert info.bits > 0 and set(info.compute_dtypes) == set(info.backends)  # storage and compute per device
    cpu = available_schemes("cpu")
    assert {"fp32", "bf16", "int8", "int8-dynamic", "int8-weight-only", "int4"} <= set(cpu)
    assert all(SCHEMES[s].backend("cpu") for s in cpu)


def test_backends_are_read_from_the_one_scheme_table():
    """quantize()'s backends take their names and compute dtypes from SCHEMES, which the planner reads too."""
    from specdec.quant.backends import BACKENDS
    from specdec.quant.core import _DTYPE_SCHEMES

    for name, info in SCHEMES.items():
        for device, backend in info.backends.items():
            if info.cast_dtype is not None:
                assert (name, device) not in BACKENDS and str(_DTYPE_SCHEMES[name]) == f"torch.{info.cast_dtype}"
                continue
            entry = BACKENDS[(name, device)]
            assert entry[0] == backend and str(entry[3]) == f"torch.{info.compute_dtypes[device]}"
    assert {k[0] for k in BACKENDS} | set(_DTYPE_SCHEMES) == set(SCHEMES)


def test_scheme_table_imports_without_torch():
    import subprocess
    import sys

    code = ("import sys; from specdec.quant import SCHEMES, parse_scheme; parse_scheme('int4:g64+head8'); "
            "SCHEMES['int8'].compute_dtype('cuda:1'); print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stderr[-2000:]


# --------------------------------------------------------------------------------------------
# bitsandbytes (CPU when installed) and CUDA-only schemes
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(not HAS_BNB, reason="bitsandbytes is not installed")
@pytest.mark.parametrize("scheme", ["nf4", "fp4"])
def test_bitsandbytes_4bit_on_cpu(ids, scheme):
    m = tiny_llama()
    before = _snapshot(m)
    a, b, _ = _prefill_and_step(quantize(m, scheme), ids)
    assert b.shape == (2, 1, VOCAB) and torch.isfinite(b.float()).all()
    assert all(torch.equal(before[k][1], v) for k, v in [(k, x[1]) for k, x in _snapshot(m).items()])


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("scheme", ["fp32", "bf16", "fp16", "int8", "int8-dynamic", "int8-weight-only", "int4", "nf4", "fp4"])
def test_cuda_schemes(ids, scheme):
    m = tiny_llama()
    if scheme not in available_schemes("cuda"):
        with pytest.raises(UnsupportedSchemeError):
            quantize(m, scheme, device="cuda")
        pytest.skip(f"{scheme} not available on this CUDA setup")
    q = quantize(m, scheme, device="cuda")
    a, b, _ = _prefill_and_step(q, ids.cuda())
    assert b.shape == (2, 1, VOCAB) and torch.isfinite(b.float()).all()
    assert next(m.parameters()).device.type == "cpu"


# --------------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------------


class _ToyTokenizer:
    """Enough of a tokenizer for the report: bytes of the text modulo the vocabulary."""

    chat_template = None
    eos_token_id = None
    pad_token_id = 0

    def __call__(self, text, return_tensors="pt"):
        ids = torch.tensor([[b % VOCAB for b in text.encode()[:24]] or [1]])
        return argparse.Namespace(input_ids=ids)


def test_load_prompts_formats(tmp_path):
    f = tmp_path / "p.jsonl"
    rows = [
        {"question_id": 1, "category": "a", "turns": ["A1", "A1 second turn"]},
        {"question_id": 2, "category": "a", "turns": ["A2"]},
        {"question_id": 3, "category": "b", "turns": ["B1"]},
        {"prompt": "P1"},
    ]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert load_prompts(str(f), limit=3) == ["A1", "B1", "P1"]  # round-robin over categories
    assert sorted(load_prompts(str(f))) == ["A1", "A2", "B1", "P1"]
    assert len(load_prompts(None)) >= 3


def test_quant_report_on_tiny_model(model):
    rep = quant_report(model, _ToyTokenizer(), ["fp32", "int8", "int3"], ["hello world", "abc"],
                       positions=6, ctx=16, repeats=1)
    assert [r["scheme"] for r in rep["schemes"]] == ["fp32", "int8"]
    assert rep["skipped"][0]["scheme"] == "int3"
    fp32 = rep["schemes"][0]
    assert fp32["agreement"] == 1.0 and fp32["positions"] == 6 and fp32["added_bytes"] == 0
    for r in rep["schemes"]:
        for key in ("scheme", "backend", "bytes", "ms_per_token", "ms_per_8_tokens", "agreement"):
            assert r[key] is not None
        assert r["ms_per_token"] > 0 and 0 <= r["agreement"] <= 1
    json.dumps(rep)


def test_cli_hooks_json_last_line(tmp_path, capsys, monkeypatch):
    import specdec.quant_report as report

    tiny = tiny_llama()
    monkeypatch.setattr(report, "load_model", lambda path=None, device="cpu": (tiny, _ToyTokenizer()))
    p = tmp_path / "q.jsonl"
    p.write_text(json.dumps({"prompt": "some prompt"}) + "\n")
    parser = add_quant_report_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--schemes", "int8,bf16", "--prompts", str(p), "--positions", "4",
                              "--ctx", "8", "--repeats", "1", "--json"])
    assert run_quant_report(args) == 0
    out = capsys.readouterr().out.strip().splitlines()
    data = json.loads(out[-1])
    assert [r["scheme"] for r in data["schemes"]] == ["int8", "bf16"]
    assert {"scheme", "backend", "bytes", "ms_per_token", "agreement"} <= set(data["schemes"][0])
    assert any(line.startswith("| int8 |") for line in out)
    # draft="auto"'s ranking, measured through the real loop: the same one `--draft auto` chooses from
    auto = data["auto"]
    assert auto["chosen"] == auto["ranking"][0]["draft"] and auto["k"] == 4
    assert any(line.startswith("draft='auto' on this machine, k=4") for line in out)
    assert any(line.startswith(f"chosen: {auto['chosen']}: ") for line in out)


# --------------------------------------------------------------------------------------------
# the real model (slow)
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    from specdec.quant_report import load_model

    try:
        return load_model()
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.mark.slow
def test_smollm2_quantized_copies(smollm2):
    """The embedded SmolLM2: the default drafter schemes agree with fp32, are small, share the
    embedding table, and leave the verifier's outputs unchanged."""
    from specdec.quant_report import _greedy_references, measure_agreement

    model, tok = smollm2
    refs = _greedy_references(model, tok, ["Explain what a hash table is."], 16)
    ids = torch.cat(refs[0], dim=1)
    with torch.inference_mode():
        ref_logits = model(ids).logits
    fp32 = model_bytes(model)
    for scheme, floor in [("int8", 0.8), ("int4+head8", 0.8), ("int8-dynamic", 0.6)]:
        q = quantize(model, scheme)
        agreement, n = measure_agreement(q, refs)
        assert n == 16 and agreement >= floor, (scheme, agreement)
        assert model_bytes(q, exclude=model) < 0.3 * fp32, scheme
        assert q.get_input_embeddings().weight is model.get_input_embeddings().weight
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, ref_logits)


def test_cli_with_a_local_model_directory(tmp_path, capsys):
    """--model PATH loads a local HF directory (model + tokenizer), no hub involved."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<eos>"] + [f"w{i}" for i in range(VOCAB - 2)]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="<eos>", pad_token="<eos>")
    tiny_llama().save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    args = add_quant_report_arguments(argparse.ArgumentParser()).parse_args(
        ["--model", str(tmp_path), "--schemes", "int8", "--positions", "4", "--ctx", "8",
         "--repeats", "1", "--json", "--no-auto"])
    assert run_quant_report(args) == 0
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert data["schemes"][0]["scheme"] == "int8" and data["positions"] == 4 and data["auto"] is None


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_a_quantized_self_copy_drafts_a_ragged_batch(scheme):
    """A ragged batch hands the packed-weight kernels strided rows, which they refused (``expect A to be contiguous``)."""
    import specdec
    from tiny_models import left_padded, make_model

    model = make_model("llama")
    ids, mask = left_padded([3, 8, 5], seed=2)
    kwargs = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=None)
    spec = specdec.SpeculativeModel(model, f"self:{scheme}", num_draft_tokens=3)
    assert torch.equal(spec.generate(ids, **kwargs), model.generate(ids, **kwargs))
