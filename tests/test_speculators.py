"""Interop with vllm-project/speculators (the EAGLE-3 format vLLM serves as a speculators model).

speculators itself loads the heads specdec exports and its model's logits equal specdec's head on the same inputs
at every training-time step; specdec loads heads speculators saves, with the same logits, and drafts exactly with
them. speculators is installed by ``.ci/setup`` (``--no-deps``: it pins an older transformers), so these run in CI:
a missing speculators is a failure here, not a skip.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import specdec
from specdec.heads import EagleHead, HeadConfig, HeadLoadError, load_head, save_head
from specdec.heads.export import export_speculators
from specdec.training.train import ttt_outputs
from tiny_models import make_model

try:
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
except ImportError as e:  # pragma: no cover - a broken set-up, reported as such
    raise ImportError(f"speculators is not installed ({e}); run `bash .ci/setup` (it installs speculators==0.9.0 "
                      "--no-deps beside the interop extra)") from None

STEPS = 3
AUX = (0, 1, 2)  # the tiny verifier has 2 layers; speculators wants distinct ids (specdec's default clamps to 1, 1, 1)


def _verifier_dir(verifier, tmp: Path) -> str:
    """The verifier as a checkpoint directory, for what speculators reads from it: the config (to resolve the head's
    layer ids) and the embedding, final norm and LM head (the GGUF model cannot ``save_pretrained``, so only these)."""
    from safetensors.torch import save_file

    directory = tmp / "verifier"
    verifier.config.save_pretrained(directory)
    state = verifier.state_dict()
    keep = ["model.embed_tokens.weight", "model.norm.weight"]
    if not verifier.config.tie_word_embeddings:
        keep.append("lm_head.weight")
    save_file({k: state[k].detach().clone().contiguous() for k in keep}, str(directory / "model.safetensors"))
    return str(directory)


def _speculators_model(path: Path) -> Eagle3DraftModel:
    """A head loaded by speculators as its users load it, attention switched to eager (its default, flex attention,
    is meant for compiled GPU training)."""
    config = Eagle3SpeculatorConfig.from_pretrained(str(path))
    config.transformer_layer_config._attn_implementation = "eager"
    return Eagle3DraftModel.from_pretrained(str(path), config=config).eval()


def _speculators_logits(model: Eagle3DraftModel, ids: torch.Tensor, feats: torch.Tensor) -> list[torch.Tensor]:
    """speculators' draft logits ``[n, draft_vocab]`` per training-time step (its forward returns argmaxes only)."""
    seen = []
    handle = model.lm_head.register_forward_hook(lambda mod, inp, out: seen.append(out[0].detach()))
    try:
        with torch.no_grad():
            model(hidden_states=feats, input_ids=ids, document_ids=torch.zeros_like(ids),
                  position_ids=torch.arange(ids.shape[1]).unsqueeze(0), ttt_steps=STEPS)
    finally:
        handle.remove()
    return seen


def _specdec_logits(head: EagleHead, ids: torch.Tensor, feats: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        return [head.logits(out)[0] for out in ttt_outputs(head, head.embed(ids), feats.to(head.fc.weight.dtype), STEPS)]


def _assert_same_logits(ours: list[torch.Tensor], theirs: list[torch.Tensor], atol: float) -> None:
    """speculators feeds step ``s`` at row ``r`` what specdec feeds at slot ``r + s`` (its inputs shift left per
    step, specdec's head outputs shift right): compare the rows both compute."""
    assert len(ours) == len(theirs) == STEPS
    n = ours[0].shape[0]
    for s in range(STEPS):
        a, b = ours[s][s:], theirs[s][: n - s].to(ours[s].dtype)
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, atol=atol, rtol=1e-4, msg=lambda m: f"step {s}: {m}")
        assert torch.equal(a.argmax(-1), b.argmax(-1)) or (a - b).abs().max() < atol


def _random_head(verifier, draft_vocab: int, seed: int = 0) -> EagleHead:
    torch.manual_seed(seed)
    config = HeadConfig.for_verifier(verifier.config, draft_vocab_size=draft_vocab)
    config.aux_layers = AUX
    head = EagleHead(config)
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.3)
    keep = torch.randperm(config.vocab_size)[:draft_vocab].sort().values
    head.d2t.copy_(keep - torch.arange(draft_vocab))
    head.t2d.zero_()
    head.t2d[keep] = True
    return head


def _inputs(verifier, n: int = 12, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    c = verifier.config
    return (torch.randint(3, c.vocab_size, (1, n), generator=g),
            torch.randn(1, n, len(AUX) * c.hidden_size, generator=g))


@pytest.mark.parametrize("draft_vocab", [40, 96])
def test_speculators_loads_specdec_export(tmp_path, draft_vocab):
    verifier = make_model("llama")
    head = _random_head(verifier, draft_vocab)
    save_head(head, tmp_path / "head", dtype=torch.float32)
    export_speculators(tmp_path / "head", tmp_path / "spec", verifier,
                       verifier_name_or_path=_verifier_dir(verifier, tmp_path), speculative_tokens=4)
    config = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["norm_before_residual"] is False
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    theirs = _speculators_model(tmp_path / "spec")
    assert theirs.config.draft_vocab_size == draft_vocab
    assert list(theirs.config.eagle_aux_hidden_state_layer_ids) == list(head.config.aux_layers)
    assert not any(torch.isnan(p).any() for p in theirs.parameters() if p.requires_grad or p.dim())  # all loaded
    ours = load_head(tmp_path / "head", verifier)
    ids, feats = _inputs(verifier)
    _assert_same_logits(_specdec_logits(ours, ids, feats), _speculators_logits(theirs, ids, feats), atol=1e-4)
    # and the export loads back into specdec as the same head
    again = load_head(tmp_path / "spec", verifier)
    for a, b in zip(_specdec_logits(again, ids, feats), _specdec_logits(ours, ids, feats)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def _speculators_save(verifier, directory: Path, *, draft_vocab: int = 40, seed: int = 0, **flags) -> Path:
    """A head made and saved by speculators' own classes (random weights, the verifier's embedding)."""
    from speculators import SpeculatorsConfig, VerifierConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    c = verifier.config
    layer = LlamaConfig(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                        head_dim=c.hidden_size // c.num_attention_heads, vocab_size=c.vocab_size, num_hidden_layers=1,
                        rms_norm_eps=c.rms_norm_eps)
    layer._attn_implementation = "eager"
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=draft_vocab, target_hidden_size=c.hidden_size,
        eagle_aux_hidden_state_layer_ids=list(AUX), **flags,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=_verifier_dir(verifier, directory.parent),
                                    architectures=["LlamaForCausalLM"])))
    torch.manual_seed(seed)
    model = Eagle3DraftModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.3 if p.dim() > 1 else 1 + 0.1 * torch.randn_like(p))
        model.embed_tokens.weight.copy_(verifier.get_input_embeddings().weight)
        if draft_vocab < c.vocab_size:
            keep = torch.randperm(c.vocab_size)[:draft_vocab].sort().values
            model.d2t.copy_(keep - torch.arange(draft_vocab))
            model.t2d.zero_()
            model.t2d[keep] = True
    model.save_pretrained(str(directory))
    return directory


@pytest.mark.parametrize("draft_vocab", [40, 96])
def test_specdec_loads_speculators_checkpoint(tmp_path, draft_vocab):
    verifier = make_model("llama")
    path = _speculators_save(verifier, tmp_path / "spec", draft_vocab=draft_vocab)
    ours = load_head(path, verifier)
    assert ours.config.kind == "eagle3" and ours.config.draft_vocab_size == draft_vocab
    ids, feats = _inputs(verifier)
    _assert_same_logits(_specdec_logits(ours, ids, feats), _speculators_logits(_speculators_model(path), ids, feats),
                        atol=1e-4)


@pytest.mark.parametrize("tree", ["none", "dynamic"])
def test_speculators_head_drafts_exactly(tmp_path, tree):
    verifier = make_model("llama")
    path = _speculators_save(verifier, tmp_path / "spec", seed=3)
    prompts = torch.tensor([[5, 17, 33, 8, 41, 9], [0, 0, 12, 60, 7, 30]])
    mask = (prompts != 0).long()
    mask[1, :2] = 0
    want = verifier.generate(prompts, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=0)
    spec = specdec.SpeculativeModel(verifier, f"eagle:{path}", num_draft_tokens=4, tree=tree)
    got = spec.generate(prompts, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=0)
    assert torch.equal(got, want)


@pytest.mark.parametrize("flags, named", [
    ({"norm_before_fc": True}, "norm_before_fc"),
    ({"fc_norm": True}, "fc_norm"),
    ({"norm_output": True}, "norm_output"),
])
def test_unsupported_speculators_variants_refused(tmp_path, flags, named):
    verifier = make_model("llama")
    path = _speculators_save(verifier, tmp_path / "spec", **flags)
    with pytest.raises(HeadLoadError, match=named) as info:
        load_head(path, verifier)
    assert "config.json" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("edit, named", [
    (lambda c: c.update(speculators_model_type="dflash"), "speculators_model_type"),
    (lambda c: c["transformer_layer_config"].update(num_hidden_layers=2), "num_hidden_layers"),
    (lambda c: c["transformer_layer_config"].update(model_type="qwen3"), "qwen3"),
    (lambda c: c["transformer_layer_config"].update(mlp_bias=True), "mlp_bias"),
    (lambda c: c.update(transformer_layer_config=[1]), "transformer_layer_config"),
])
def test_bad_speculators_configs_refused(tmp_path, edit, named):
    verifier = make_model("llama")
    path = _speculators_save(verifier, tmp_path / "spec")
    config = json.loads((path / "config.json").read_text())
    edit(config)
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(HeadLoadError, match=named):
        load_head(path, verifier)


def test_export_refuses_repeated_layers(tmp_path):
    verifier = make_model("llama")
    head = _random_head(verifier, 40)
    head.config.aux_layers = (1, 1, 1)
    save_head(head, tmp_path / "head")
    with pytest.raises(ValueError, match="distinct"):
        export_speculators(tmp_path / "head", tmp_path / "out", verifier)
    assert not (tmp_path / "out").exists()


def test_export_refuses_eagle1_heads(tmp_path):
    verifier = make_model("llama")
    config = HeadConfig.for_verifier(verifier.config, kind="eagle")
    save_head(EagleHead(config), tmp_path / "head")
    with pytest.raises(ValueError, match="EAGLE-1/2"):
        export_speculators(tmp_path / "head", tmp_path / "out", verifier)
    assert not (tmp_path / "out").exists()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdec.cli", "export-head", *args], capture_output=True, text=True,
                          timeout=600)


def test_export_head_cli_errors_before_loading(tmp_path):
    r = _cli("--head", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "no config.json" in r.stderr and "loading" not in r.stderr
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "config.json").write_text("{}")
    r = _cli("--head", str(tmp_path / "h"), "--out", str(tmp_path / "h"))
    assert r.returncode == 2 and "overwrite" in r.stderr
    r = _cli("--head", str(tmp_path / "h"), "--out", str(tmp_path / "o"), "--speculative-tokens", "0")
    assert r.returncode == 2 and "--speculative-tokens" in r.stderr


@pytest.mark.slow
def test_shipped_head_through_speculators(tmp_path):
    """The user's path to vLLM: `specdec export-head` on the shipped head, loaded by speculators, gives the shipped
    head's logits on the embedded model's own features."""
    from specdec.models import load_model
    from specdec.training.features import verifier_features

    verifier, tokenizer = load_model("smollm2")
    r = _cli("--head", "eagle", "--out", str(tmp_path / "spec"), "--dtype", "float32", "--json",
             "--verifier-name", _verifier_dir(verifier, tmp_path))
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["format"] == "speculators" and "model.safetensors" in summary["files"]
    ours = load_head(summary["head"], verifier)
    ids = tokenizer("The quick brown fox jumps over the lazy dog because", return_tensors="pt").input_ids
    feats, _, _ = verifier_features(verifier, ids, None, ours.config.aux_layers)
    theirs = _speculators_model(tmp_path / "spec")
    _assert_same_logits(_specdec_logits(ours, ids, feats), _speculators_logits(theirs, ids, feats), atol=2e-3)


def test_export_keeps_rope_scaling(tmp_path):
    """A head whose config.json writes rope scaling the old way (``type``) exports it as speculators and vLLM read
    it (``rope_parameters.rope_type``), and loads back with the same logits."""
    verifier = make_model("llama")
    head = _random_head(verifier, 40)
    head.config.rope_scaling = {"type": "linear", "factor": 4.0}
    save_head(head, tmp_path / "head", dtype=torch.float32)
    export_speculators(tmp_path / "head", tmp_path / "spec", verifier,
                       verifier_name_or_path=_verifier_dir(verifier, tmp_path))
    rope = json.loads((tmp_path / "spec" / "config.json").read_text())["transformer_layer_config"]["rope_parameters"]
    assert rope["rope_type"] == "linear" and rope["factor"] == 4.0
    ids, feats = _inputs(verifier, n=24)
    ours, back = load_head(tmp_path / "head", verifier), load_head(tmp_path / "spec", verifier)
    for a, b in zip(_specdec_logits(back, ids, feats), _specdec_logits(ours, ids, feats)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    _assert_same_logits(_specdec_logits(ours, ids, feats),
                        _speculators_logits(_speculators_model(tmp_path / "spec"), ids, feats), atol=1e-4)
