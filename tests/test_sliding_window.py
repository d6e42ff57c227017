"""Sliding-window (and chunked) attention on every path: chains, trees and compiled verify passes, batch 1 and
ragged, token-identical to ``model.generate`` with prompts and output far longer than the window (8), so the window
really cuts. The masks are built per layer type by :mod:`specdec.runners.masks`, windows counted in positions.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import masking_utils

import specdec
from specdec.runners import CausalLMRunner, UnsupportedModelError
from specdec.runners.masks import CHUNKED, FULL, SLIDING, MaskLayout, positions_of
from specdec.runners.session import CacheSession
from tiny_models import SLIDING_CONFIGS, WINDOW, left_padded, make_sliding_model, perturbed_copy

ARCHS = sorted(SLIDING_CONFIGS)
LENGTHS = {1: [21], 3: [21, 12, 17]}  # every prompt past the window; the output (20) passes it again
SEED = 4  # prompts on which even gemma's tiny models (that soon repeat one token) change output without the window
NEW = 20
COMPILED = {"backend": "eager"}  # dynamo traces what inductor would get, quickly (as tests/test_compile_verifier.py)
MODES = {"chain": {}, "static": {"tree": "static"}, "dynamic": {"tree": "dynamic"},
         "compiled": {"compile_verifier": COMPILED}, "compiled-tree": {"compile_verifier": COMPILED, "tree": "dynamic"}}
_MODELS: dict[tuple[str, str | None], torch.nn.Module] = {}


def _model(arch: str, attn: str | None = None) -> torch.nn.Module:
    if (arch, attn) not in _MODELS:
        _MODELS[arch, attn] = make_sliding_model(arch, attn=attn)
    return _MODELS[arch, attn]


def _generate(model, spec, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(specdec's output, generate's)`` for the ``batch`` prompts of :data:`LENGTHS`."""
    ids, mask = left_padded(LENGTHS[batch], seed=SEED)
    gen = dict(attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0, eos_token_id=None)
    return spec.generate(ids, **gen), model.generate(ids, **gen)


def _identical(arch: str, mode: str, batch: int, attn: str | None = None, pads: bool = False) -> specdec.SpeculativeModel:
    model = _model(arch, attn)
    spec = specdec.SpeculativeModel(model, perturbed_copy(model, 0.05), num_draft_tokens=3, **MODES[mode])
    if spec.verifier.static is not None:
        spec.verifier.static.pads = pads  # True: the CUDA-graph layout (passes padded to fixed widths)
    out, ref = _generate(model, spec, batch)
    assert torch.equal(out, ref)
    assert spec.last_stats.accepted > 0
    if "tree" in MODES[mode]:
        assert spec.last_stats.mean_tree_tokens > 3  # really a tree: more than the chain of 3 scored per pass
    if spec.verifier.static is not None:
        assert spec.verifier.static.failed is None and spec.verifier.static.passes > 0  # it really ran compiled
    return spec


# ---------------------------------------------------------------- the masks are transformers' own


@pytest.mark.parametrize("arch", ARCHS)
def test_masks_equal_transformers_own_for_a_padded_prompt(arch):
    """Without holes, positions and slots differ alike: each layer type's mask is the one transformers builds
    from the 2-D padding mask (the window's off-by-one included)."""
    model = _model(arch, "eager")
    config = model.config
    layout = MaskLayout.of(config)
    ids, pad = left_padded(LENGTHS[3], seed=SEED)
    valid = pad.bool()
    slots = torch.arange(ids.shape[1], device="cpu")
    allowed = valid[:, None, :] & (slots[None, :] <= slots[:, None])  # causal over valid slots
    positions = positions_of(valid)
    ours = layout.masks(allowed, positions, positions, lambda a: a)
    ours = ours if layout.keyed else {layout.types[0]: ours}
    build = {FULL: masking_utils.create_causal_mask, SLIDING: masking_utils.create_sliding_window_causal_mask,
             CHUNKED: masking_utils.create_chunked_causal_mask}
    embeds = torch.zeros(*ids.shape, config.hidden_size, device="cpu")
    real = valid[:, :, None]  # query rows of padding see nothing in either; compare the real ones
    for kind, mask in ours.items():
        theirs = build[kind](config=config, inputs_embeds=embeds, attention_mask=pad, cache=None,
                             position_ids=positions)
        theirs = theirs[:, 0] == 0 if theirs.dtype != torch.bool else theirs[:, 0]
        assert torch.equal(mask & real, theirs & real), kind
    assert layout.restricted and any(not torch.equal(m, allowed) for m in ours.values())  # the window cuts here


def test_layouts_follow_the_config():
    assert MaskLayout.of(_model("mistral").config) == MaskLayout((SLIDING,), False, WINDOW)  # every layer slides
    assert MaskLayout.of(_model("qwen2").config) == MaskLayout((FULL, SLIDING), True, WINDOW)  # mixed layer types
    assert MaskLayout.of(_model("gemma2").config) == MaskLayout((SLIDING, FULL), True, WINDOW)
    assert MaskLayout.of(_model("llama4_text").config) == MaskLayout((CHUNKED,), True, None, WINDOW)
    off = SLIDING_CONFIGS["qwen2"]()
    off.use_sliding_window = False
    assert not MaskLayout.of(off).restricted


# ---------------------------------------------------------------- identical to generate on every path


# The fast twin of test_greedy_identity_every_path (-m slow): each family's chains and trees, ragged and at batch 1
# (gpt_oss, the slowest, one tree), compiled passes on one family of each mask layout, padded (CUDA-graph) ones once.
FAST = [(arch, mode, batch) for arch in ARCHS if arch != "gpt_oss"
        for mode, batch in (("chain", 3), ("dynamic", 3), ("static", 1))]
FAST += [("gpt_oss", "dynamic", 3)] + [(arch, "compiled-tree", 3) for arch in ("mistral", "qwen2", "llama4_text")]


@pytest.mark.parametrize("arch, mode, batch", FAST)
def test_greedy_identity(arch, mode, batch):
    _identical(arch, mode, batch)


@pytest.mark.parametrize("arch, mode, batch", [("gemma3_text", "compiled-tree", 3), ("gemma2", "compiled", 1)])
def test_greedy_identity_compiled_padded_passes(arch, mode, batch):
    _identical(arch, mode, batch, pads=True)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("pads", [False, True])
def test_greedy_identity_every_path(arch, mode, batch, pads):
    if pads and "compiled" not in mode:
        pytest.skip("pads is a compiled pass's layout")
    _identical(arch, mode, batch, pads=pads)


@pytest.mark.parametrize("arch, attn", [("mistral", "eager"), ("qwen2", "eager"), ("gemma3_text", "eager")])
def test_greedy_identity_other_mask_kernel(arch, attn):  # each family's default kernel is in the tests above
    _identical(arch, "dynamic", 3, attn=attn)


# ---------------------------------------------------------------- the window matters, holes are not compacted


@pytest.mark.parametrize("arch", ["mistral", "qwen2", "gemma2", "gemma3_text", "llama4_text"])
def test_without_the_window_the_output_differs(arch):
    """Negative control: the same tree passes with the window (or chunk) widened past the whole sequence differ
    from generate (in every row of a ragged batch), so the tests above see the window."""
    model = _model(arch)
    spec = specdec.SpeculativeModel(model, perturbed_copy(model, 0.05), num_draft_tokens=3, tree="static")
    layout = spec.verifier.mask_layout
    spec.verifier.mask_layout = dataclasses.replace(layout, window=layout.window and 10**6, chunk=layout.chunk and 10**6)
    out, ref = _generate(model, spec, 3)
    assert (out != ref).any(dim=1).all()


def test_ragged_rows_keep_their_holes(monkeypatch):
    """The window counts positions, not slots: a ragged batch with room to spare is never compacted (the old
    path compacted before every pass, a device read each time)."""
    compactions = []
    monkeypatch.setattr(CacheSession, "compact", lambda self: compactions.append(1))
    _identical("gemma2", "chain", batch=3)
    assert compactions == []


def test_runner_takes_custom_masks_and_refuses_kernels_that_ignore_them():
    model = _model("gemma2")
    runner = CausalLMRunner(model)
    assert runner.custom_masks and runner.sliding
    runner.check_tree_masks()  # no refusal
    flash = make_sliding_model("gemma2")
    flash.config._attn_implementation = "flash_attention_2"
    runner = CausalLMRunner(flash)
    assert not runner.custom_masks
    with pytest.raises(UnsupportedModelError, match="ignores custom 4-D masks"):
        runner.check_tree_masks()
    with pytest.raises(UnsupportedModelError, match="ignores custom 4-D masks: a compiled verifier"):
        specdec.SpeculativeModel(flash, "prompt-lookup", compile_verifier=True)
