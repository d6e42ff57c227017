"""The CUDA path: greedy identity with ``model.generate`` on a GPU, in fp32 and bf16, batch 1 and 3.

Skipped where no CUDA device is present (CI here is CPU only). Run it on a lent GPU machine:
``python -m pytest -q tests/test_cuda.py``. Every drafter family is covered: a separate model, a
quantized self-copy (int8 where bitsandbytes is installed, else int4: the test ids name which), prompt
lookup, composite (lookup + self-copy) and layer-skip; chains and trees
(static, dynamic; ``auto`` measures the GPU's own cost curve), and the shipped EAGLE-3 head.

fp32 must match token for token. In bf16 a pass over k+1 tokens rounds differently from
``generate``'s one-token steps, so a row may first differ only where ``generate``'s top two logits
are within bf16 rounding of each other (checked from its logits). The test logic was exercised here
by running this file with ``cuda`` replaced by ``cpu``: every fp32 case identical; bf16 identical
except at such ties (the real model, batch 1, drifts at one within 48 tokens).
"""

import pytest
import torch

import specdec
from specdec.runners import recurrent_layout
from tiny_models import VOCAB, make_model, perturbed_copy

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = [torch.float32, torch.bfloat16]


def _self_scheme() -> str:
    """The quantized self-copy the CUDA tests draft with: int8 (bitsandbytes) where it is installed, else int4
    (torch only), so a GPU machine without bitsandbytes still tests the self-copy and composite paths."""
    from specdec.quant.core import available_schemes

    return "int8" if torch.cuda.is_available() and "int8" in available_schemes("cuda") else "int4"


SELF = f"self:{_self_scheme()}"
COMPOSITE = f"composite:{_self_scheme()}"
DRAFTERS = ["model", SELF, "prompt-lookup", COMPOSITE, "layer-skip:1"]


def _left_padded(lengths: list[int], device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros((len(lengths), width), dtype=torch.long, device="cpu")
    mask = torch.zeros_like(ids)
    for r, n in enumerate(lengths):
        # repeat a short motif so prompt lookup finds matches too
        motif = torch.randint(3, VOCAB, (4,), generator=gen, device="cpu")
        ids[r, width - n:], mask[r, width - n:] = motif.repeat(n // 4 + 1)[:n], 1
    return ids.to(device), mask.to(device)


def _draft(kind: str, model: torch.nn.Module) -> object:
    return perturbed_copy(model, 0.05) if kind == "model" else kind


def _assert_equal_up_to_bf16_ties(out: torch.Tensor, ref, prompt: int, tolerance: float = 2 ** -6) -> None:
    """Rows equal ``generate``'s, or first differ where its top two logits are within bf16 rounding
    (``tolerance``, relative; compiled fp32 passes are held to float rounding).

    In bf16 a padded batch's multi-token verify pass and ``generate``'s one-token steps round
    differently (kernels tile a batch differently), so an exact near-tie may break either way;
    anything else is a bug.
    """
    for r in range(out.shape[0]):
        mine, theirs = out[r, prompt:], ref.sequences[r, prompt:]
        if torch.equal(mine, theirs):
            continue
        step = int((mine != theirs).nonzero()[0])
        top2 = ref.logits[step][r].float().topk(2).values
        gap, scale = float(top2[0] - top2[1]), float(top2[0].abs()) + 1.0
        assert gap <= tolerance * scale, f"row {r} differs at step {step} where generate's margin is {gap:.4f}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("draft", DRAFTERS)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("lengths", [[11], [3, 17, 9]], ids=["b1", "b3"])
@pytest.mark.parametrize("tree", [None, "static", "dynamic"], ids=["chain", "static", "dynamic"])
def test_tiny_models_greedy_identity_on_cuda(arch, draft, dtype, lengths, tree):
    model = make_model(arch).to("cuda", dtype)
    ids, mask = _left_padded(lengths, "cuda")
    kwargs = dict(max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    spec = specdec.SpeculativeModel(model, _draft(draft, model), num_draft_tokens=4, tree=tree)
    out = spec.generate(ids, attention_mask=mask, **kwargs)
    assert out.device.type == "cuda"
    ref = model.generate(ids, attention_mask=mask, return_dict_in_generate=True, output_logits=True, **kwargs)
    if dtype == torch.float32:
        assert torch.equal(out, ref.sequences)
    else:
        _assert_equal_up_to_bf16_ties(out, ref, ids.shape[1])
    assert spec.last_stats.verifier_forwards > 0


def test_compile_true_is_captured_fused_graphs_on_cuda():
    """On CUDA ``compile_verifier=True`` / ``compile_drafter=True`` mean raw graphs (of inductor's fused kernels for
    the verifier, of the head's greedy chain for the drafter): fp32 output is generate's."""
    model = make_model("llama").to("cuda")
    spec = specdec.SpeculativeModel(model, _random_eagle3(model), num_draft_tokens=4, compile_verifier=True,
                                    compile_drafter=True)
    kwargs = dict(max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    for lengths in ([11], [3, 17, 9]):
        ids, mask = _left_padded(lengths, "cuda")
        ref = model.generate(ids, attention_mask=mask, return_dict_in_generate=True, output_logits=True, **kwargs)
        _assert_equal_up_to_bf16_ties(spec.generate(ids, attention_mask=mask, **kwargs), ref, ids.shape[1])
    static = spec.verifier.static
    assert static.raw_graphs and static.fuse and static.failed is None and static.graphs >= 2
    assert spec.drafter.static_draft and spec.drafter._graph_caches  # the head's chain captured, not torch.compile


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("draft, tree", [(SELF, None), ("prompt-lookup", None), (COMPOSITE, None),
                                         ("layer-skip:10", None), ("eagle", None), ("eagle", "auto"),
                                         (SELF, "dynamic")])
@pytest.mark.parametrize("batch", [1, 3])
def test_embedded_model_greedy_identity_on_cuda(smollm2, draft, tree, dtype, batch):
    from specdec.eval.side_by_side import BUILTIN_PROMPTS

    model, tokenizer = smollm2
    model = model.to("cuda", dtype)
    try:
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": p["prompt"]}], tokenize=False,
                                               add_generation_prompt=True) for p in BUILTIN_PROMPTS[:batch]]
        tokenizer.padding_side = "left"
        enc = tokenizer(texts, return_tensors="pt", padding=True).to("cuda")
        kwargs = dict(max_new_tokens=48, do_sample=False, pad_token_id=tokenizer.eos_token_id)
        spec = specdec.SpeculativeModel(model, draft, num_draft_tokens=4, tokenizer=tokenizer, tree=tree)
        out = spec.generate(enc.input_ids, attention_mask=enc.attention_mask, **kwargs)
        ref = model.generate(enc.input_ids, attention_mask=enc.attention_mask, return_dict_in_generate=True,
                             output_logits=True, **kwargs)
        if dtype == torch.float32:
            assert torch.equal(out, ref.sequences)
        else:
            _assert_equal_up_to_bf16_ties(out, ref, enc.input_ids.shape[1])
    finally:
        model.to("cpu", torch.float32)  # the session fixture is shared with the CPU tests


#: compiled passes: inductor fuses ops and keeps their intermediates in fp32, so in bf16 its logits differ from eager
#: generate's by several roundings (on CPU the tiny Llama's first divergence was at a 1.7% margin; the same passes
#: run uncompiled, static layout included, match at 2**-6); fp32 is held to float rounding
COMPILED_TIES = {torch.bfloat16: 2 ** -5, torch.float32: 1e-5}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("draft", ["model", "prompt-lookup"])
def test_compiled_verifier_greedy_identity_on_cuda(dtype, draft):
    """compile_verifier (CUDA graphs): chains and trees, batch 1 and a ragged 3, one model (graphs shared)."""
    model = make_model("llama").to("cuda", dtype)
    spec = specdec.SpeculativeModel(model, _draft(draft, model), num_draft_tokens=4, compile_verifier=True)
    tree = specdec.SpeculativeModel(model, _draft(draft, model), num_draft_tokens=4, tree="dynamic",
                                    compile_verifier=True)
    assert spec.verifier.static.pads and spec.verifier.static.options["mode"] == "reduce-overhead"
    kwargs = dict(max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    for lengths in ([11], [3, 17, 9]):
        ids, mask = _left_padded(lengths, "cuda")
        ref = model.generate(ids, attention_mask=mask, return_dict_in_generate=True, output_logits=True, **kwargs)
        for s in (spec, tree):
            out = s.generate(ids, attention_mask=mask, **kwargs)
            _assert_equal_up_to_bf16_ties(out, ref, ids.shape[1], COMPILED_TIES[dtype])
    assert spec.verifier.static.failed is None


def _graphs_of(spec) -> list:
    """Every PhaseGraphs of the verifier's pooled caches."""
    return [c.graphs for caches in spec.verifier.static._free.values() for c in caches if hasattr(c, "graphs")]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("draft", ["eagle", "model", "prompt-lookup"])
def test_captured_phases_greedy_identity_on_cuda(dtype, draft):
    """compile_verifier="graphs" (and compile_drafter="graphs" for the head and a model drafter): raw CUDA graphs of
    the eager kernels, so fp32 output is generate's and bf16 differs only at near-ties, as eager specdec's does."""
    model = make_model("llama").to("cuda", dtype)
    drafter = _random_eagle3(model) if draft == "eagle" else _draft(draft, model)
    options = {"compile_drafter": "graphs"} if draft in ("eagle", "model") else {}
    spec = specdec.SpeculativeModel(model, drafter, num_draft_tokens=4, compile_verifier="graphs", **options)
    kwargs = dict(max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    for lengths in ([11], [3, 17, 9]):
        ids, mask = _left_padded(lengths, "cuda")
        ref = model.generate(ids, attention_mask=mask, return_dict_in_generate=True, output_logits=True, **kwargs)
        out = spec.generate(ids, attention_mask=mask, **kwargs)
        _assert_equal_up_to_bf16_ties(out, ref, ids.shape[1])
    static = spec.verifier.static
    assert static.raw_graphs and static.failed is None and static.graphs >= 2
    graphs = _graphs_of(spec)
    assert graphs and all(g.captured == g.graphs and g.recaptures == 0 for g in graphs)  # real graphs, replayed


@pytest.mark.slow
@pytest.mark.parametrize("draft, tree", [("prompt-lookup", None), ("eagle", "auto")])
def test_embedded_model_compiled_verifier_on_cuda(smollm2, draft, tree):
    from specdec.eval.side_by_side import BUILTIN_PROMPTS

    model, tokenizer = smollm2
    model = model.to("cuda", torch.bfloat16)
    try:
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": p["prompt"]}], tokenize=False,
                                               add_generation_prompt=True) for p in BUILTIN_PROMPTS[:3]]
        tokenizer.padding_side = "left"
        kwargs = dict(max_new_tokens=48, do_sample=False, pad_token_id=tokenizer.eos_token_id)
        spec = specdec.SpeculativeModel(model, draft, num_draft_tokens=4, tokenizer=tokenizer, tree=tree,
                                        compile_verifier=True)
        for batch in (texts[:1], texts):
            enc = tokenizer(batch, return_tensors="pt", padding=True).to("cuda")
            out = spec.generate(enc.input_ids, attention_mask=enc.attention_mask, **kwargs)
            ref = model.generate(enc.input_ids, attention_mask=enc.attention_mask, return_dict_in_generate=True,
                                 output_logits=True, **kwargs)
            _assert_equal_up_to_bf16_ties(out, ref, enc.input_ids.shape[1], COMPILED_TIES[torch.bfloat16])
        assert spec.verifier.static.failed is None
    finally:
        model.to("cpu", torch.float32)  # the session fixture is shared with the CPU tests


def _random_eagle3(model: torch.nn.Module) -> object:
    from specdec.drafters.eagle import EagleDrafter
    from test_eagle import _random_head

    return EagleDrafter(_random_head(model, "eagle3").to("cuda"), model)


@pytest.mark.parametrize("draft", ["eagle", SELF, "prompt-lookup", COMPOSITE, "eagle-region", "eagle-graphs",
                                   "model-graphs"])
@pytest.mark.parametrize("lengths", [[11], [3, 17, 9]], ids=["b1", "b3"])
def test_a_chain_pass_syncs_once_on_cuda(draft, lengths):
    """``torch.cuda.set_sync_debug_mode("warn")`` warns at every call that waits for the GPU: in steady state a chain
    pass makes one (the read of the accepted counts and tokens), as ``HostTrace`` counts on a CPU
    (tests/test_host_syncs.py). ``eagle-region``: the head's fixed-shape draft region, eager (no compile);
    ``*-graphs``: every phase replayed from raw CUDA graphs (verify pass, head chain or model-drafter steps)."""
    model = make_model("llama").to("cuda")
    drafter = _random_eagle3(model) if draft.startswith("eagle") else _draft(draft.removesuffix("-graphs"), model)
    if draft == "eagle-region":
        drafter.static_draft = True
    graphs = {"compile_verifier": "graphs", "compile_drafter": "graphs"} if draft.endswith("-graphs") else {}
    spec = specdec.SpeculativeModel(model, drafter, num_draft_tokens=4, **graphs)
    ids, mask = _left_padded(lengths, "cuda")
    kwargs = dict(attention_mask=mask, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    spec.generate(ids, **kwargs)  # warm: allocations, lazy initialisation
    per_pass, messages, out = _sync_warnings_per_pass(spec, ids, kwargs)
    assert len(per_pass) >= 4 and max(per_pass[:-2]) <= 1, (per_pass, messages)  # the steady passes
    assert torch.equal(out, model.generate(ids, **kwargs))


def _sync_warnings_per_pass(spec, ids, kwargs) -> tuple[list[int], list[str], torch.Tensor]:
    """One call under ``set_sync_debug_mode("warn")``: the warnings of each pass (from one ``propose`` to the next,
    the last pass to the call's end), the first messages, and the output."""
    import warnings

    from specdec.chains import ChainPlan

    starts, propose = [], ChainPlan.propose

    def marked(self, *args, **kw):
        starts.append(len(caught))
        return propose(self, *args, **kw)

    ChainPlan.propose = marked
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                out = spec.generate(ids, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
    finally:
        ChainPlan.propose = propose
    per_pass = [b - a for a, b in zip(starts, starts[1:] + [len(caught)])]
    return per_pass, [str(w.message)[:120] for w in caught][:8], out


def test_an_upload_from_host_lists_never_syncs_on_cuda():
    """``specdec.transfer.upload`` (a host list, pinned, copied without blocking): what a dispatch-level count of
    "tensors built from host lists" sees on every pass with a retiring row, and not a sync: under
    ``set_sync_debug_mode("error")`` a blocking call would raise (issue 59 item 3)."""
    from specdec.transfer import upload

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for values in ([1, 2, 3], [[0, 1], [2, 3]], [7]):
            t = upload(values, torch.long, "cuda")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert t.device.type == "cuda" and t.tolist() == [7]


@pytest.mark.parametrize("draft", [SELF, COMPOSITE, "prompt-lookup", "eagle"])
def test_a_retiring_ragged_batch_syncs_once_every_pass_on_cuda(draft):
    """Prompts of 3, 17 and 9 tokens, one row stopping early at an EOS: every pass, those after which a row leaves
    included, waits for the GPU once (``set_sync_debug_mode("warn")``), as HostTrace counts on a CPU."""
    model = make_model("llama").to("cuda")
    drafter = _random_eagle3(model) if draft == "eagle" else _draft(draft, model)
    spec = specdec.SpeculativeModel(model, drafter, num_draft_tokens=4)
    ids, mask = _left_padded([3, 17, 9], "cuda")
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False, pad_token_id=0, eos_token_id=None)
    rows = ref[:, ids.shape[1]:].tolist()
    eos = next((t for r, row in enumerate(rows) for i, t in enumerate(row[4:12], start=4)
                if t not in row[:i] and all(t not in other for o, other in enumerate(rows) if o != r)), None)
    if eos is None:
        pytest.skip("no token ends one row alone early")
    kwargs = dict(attention_mask=mask, max_new_tokens=40, do_sample=False, eos_token_id=eos, pad_token_id=0)
    spec.generate(ids, **kwargs)  # warm
    per_pass, messages, out = _sync_warnings_per_pass(spec, ids, kwargs)
    assert len(per_pass) >= 3 and max(per_pass) <= 1, (per_pass, messages)
    assert torch.equal(out, model.generate(ids, **kwargs))



@pytest.mark.skipif(not recurrent_layout.HYBRIDS_SUPPORTED,
                    reason=f"hybrids need transformers >= {recurrent_layout.HYBRID_TRANSFORMERS}")
@pytest.mark.parametrize("dtype", [torch.float32], ids=str)  # fp32: identity, not ties (the subset's time box)
@pytest.mark.parametrize("arch", ["qwen3_next", "nemotron_h", "mamba"])
def test_hybrid_captured_verifier_greedy_identity_on_cuda(dtype, arch):
    """Hybrid and recurrent models on CUDA (issue 60): the per-position scans eagerly (a chain and a static tree), and
    compile_verifier="graphs", whose raw graphs must write the live states in place and each state per position
    into the fixed buffers (a rebinding would leave the next replay reading a stale state)."""
    from test_hybrid_models import RECURRENT
    from tiny_hybrids import make_hybrid

    model = make_hybrid(arch, config=RECURRENT[arch]() if arch in RECURRENT else None).to("cuda", dtype)
    kwargs = dict(max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    runs = [{}, {"tree": "static"}, {"compile_verifier": "graphs"}]
    for options in runs:
        spec = specdec.SpeculativeModel(model, perturbed_copy(model, 0.05), num_draft_tokens=3, **options)
        for lengths in ([11], [3, 17, 9]):
            ids, mask = _left_padded(lengths, "cuda")
            ref = model.generate(ids, attention_mask=mask, return_dict_in_generate=True, output_logits=True, **kwargs)
            _assert_equal_up_to_bf16_ties(spec.generate(ids, attention_mask=mask, **kwargs), ref, ids.shape[1])
    static = spec.verifier.static
    assert static.raw_graphs and static.failed is None and static.graphs >= 1
    graphs = _graphs_of(spec)
    assert graphs and all(g.captured == g.graphs and g.recaptures == 0 for g in graphs)
