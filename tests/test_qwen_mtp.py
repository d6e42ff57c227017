"""draft="mtp" on Qwen3.5 / Qwen3-Next checkpoints: their own ``mtp.*`` layers, read by specdec from the checkpoint
(transformers drops them on load), on tiny checkpoints saved with exactly the released key names."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers as tf
from safetensors.torch import load_file, save_file
from test_mtp_drafter import _recorded_drafts
from tiny_models import left_padded

import specdec
from specdec.drafters.mtp import MtpUnavailableError
from specdec.drafters.qwen_mtp import QwenMtp

VOCAB, HIDDEN = 96, 32
_COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
               head_dim=8, linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
               linear_num_key_heads=2, linear_num_value_heads=4, initializer_range=0.3, bos_token_id=1, eos_token_id=2,
               pad_token_id=0)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16)
CONFIGS = {
    "qwen3_5_text": (tf.Qwen3_5TextConfig, {}),
    "qwen3_5_moe_text": (tf.Qwen3_5MoeTextConfig, _MOE),
    "qwen3_next": (tf.Qwen3NextConfig, dict(_MOE, decoder_sparse_step=1)),
}


def _config(arch: str, layers: int, mtp: int | None) -> tf.PretrainedConfig:
    cls, extra = CONFIGS[arch]
    types = ["linear_attention", "full_attention", "full_attention", "full_attention"][:layers]
    return cls(num_hidden_layers=layers, layer_types=types, **({"mtp_num_hidden_layers": mtp} if mtp else {}),
               **_COMMON, **extra)


def write_checkpoint(directory: Path, arch: str, mtp: int = 1, seed: int = 0, with_mtp: bool = True) -> None:
    """A tiny ``arch`` model with ``mtp`` MTP layers saved to ``directory``: ``mtp.layers.{i}.*`` are the full-attention
    decoder layers of a deeper model of the same kind (the model's own layout), the rest of ``mtp.*`` random."""
    torch.manual_seed(seed)
    tf.AutoModelForCausalLM.from_config(_config(arch, 2, mtp)).save_pretrained(directory)
    if not with_mtp:
        return
    deeper = directory.parent / f"{directory.name}-deeper"
    tf.AutoModelForCausalLM.from_config(_config(arch, 2 + mtp, None)).save_pretrained(deeper)
    state, blocks = load_file(str(directory / "model.safetensors")), load_file(str(deeper / "model.safetensors"))
    g = torch.Generator().manual_seed(seed + 1)
    written = {key.replace(f"model.layers.{2 + i}.", f"mtp.layers.{i}."): value for key, value in blocks.items()
               for i in range(mtp) if key.startswith(f"model.layers.{2 + i}.")}
    written["mtp.fc.weight"] = 0.3 * torch.randn(HIDDEN, 2 * HIDDEN, generator=g)
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):  # (1 + w) norms: w near 0
        written[f"mtp.{name}.weight"] = 0.3 * torch.randn(HIDDEN, generator=g)
    save_file({**state, **written}, str(directory / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("qwen-mtp")
    made = {}
    for arch in CONFIGS:
        write_checkpoint(root / arch, arch)
        made[arch] = root / arch
    return made


def _load(directory: Path) -> torch.nn.Module:
    return tf.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


def _reference_drafts(model: torch.nn.Module, directory: Path, ids: torch.Tensor, k: int) -> list[int]:
    """Drafts 1..k of one MTP layer, from the formula alone, with no cache: position ``p`` reads
    ``fc(cat[norm_e(embed(x_p)), norm_h(h_{p-1})])`` (``h`` the model's final normed states), the block runs causally
    over positions 1.., ``mtp.norm`` ends it; a draft's own position reads the previous output as its ``h``."""
    tensors = {key[4:]: value for key, value in load_file(str(directory / "model.safetensors")).items()
               if key.startswith("mtp.")}
    text = model.config
    norm = lambda name: _norm(type(model.model.norm), tensors[f"{name}.weight"], text.rms_norm_eps)  # noqa: E731
    norm_e, norm_h, norm_out = norm("pre_fc_norm_embedding"), norm("pre_fc_norm_hidden"), norm("norm")
    layer_config = _config(next(a for a in CONFIGS if CONFIGS[a][0] is type(text)), 1, None)
    layer_config.layer_types = ["full_attention"]
    block = type(model.model.layers[1])(layer_config, 0).eval()
    block.load_state_dict(_fused({k[len("layers.0."):]: v for k, v in tensors.items() if k.startswith("layers.0.")}))
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        first = out.logits[0, -1].argmax()
        tokens = torch.cat([ids[0], first.view(1)])  # x_0 .. x_T: the verifier's first token is x_T
        h = out.hidden_states[-1][0]  # h_0 .. h_{T-1}
        drafts = []
        for _ in range(k):
            x = model.get_input_embeddings()(tokens[1:]).unsqueeze(0)
            inputs = torch.nn.functional.linear(torch.cat([norm_e(x), norm_h(h.unsqueeze(0))], dim=-1), tensors["fc.weight"])
            positions = torch.arange(1, tokens.shape[0]).unsqueeze(0)
            rope = model.model.rotary_emb(inputs, position_ids=positions)
            result = block(inputs, position_embeddings=rope, attention_mask=None, position_ids=positions)
            g = norm_out(result[0] if isinstance(result, tuple) else result)[0]
            draft = model.lm_head(g[-1]).argmax()
            drafts.append(int(draft))
            tokens, h = torch.cat([tokens, draft.view(1)]), torch.cat([h, g[-1:]])
    return drafts


def _fused(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoint per-expert weights as the module's stacked ``experts.gate_up_proj`` / ``experts.down_proj``."""
    experts = sorted({int(k.split(".")[2]) for k in state if k.startswith("mlp.experts.")})
    if not experts:
        return state
    out = {k: v for k, v in state.items() if not k.startswith("mlp.experts.")}
    at = lambda e, name: state[f"mlp.experts.{e}.{name}.weight"]  # noqa: E731
    out["mlp.experts.gate_up_proj"] = torch.stack([torch.cat([at(e, "gate_proj"), at(e, "up_proj")]) for e in experts])
    out["mlp.experts.down_proj"] = torch.stack([at(e, "down_proj") for e in experts])
    return out


def _norm(cls: type, weight: torch.Tensor, eps: float) -> torch.nn.Module:
    module = cls(weight.shape[0], eps=eps)
    module.weight.data.copy_(weight)
    return module


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_drafts_are_the_formula_and_greedy_is_generate(checkpoints, arch, monkeypatch):
    model = _load(checkpoints[arch])
    spec = specdec.SpeculativeModel(model, "mtp", num_draft_tokens=3)
    assert isinstance(spec.drafter.mtp, QwenMtp) and spec.drafter.num_mtp_layers == 1
    seen = _recorded_drafts(monkeypatch)
    ids = torch.randint(3, VOCAB, (1, 9), generator=torch.Generator().manual_seed(4))
    kwargs = dict(max_new_tokens=16, do_sample=False, eos_token_id=None)
    assert torch.equal(spec.generate(ids, **kwargs), model.generate(ids, **kwargs))
    # the first pass: one trained layer, then two recursive steps on its own output
    assert seen[0][0] == _reference_drafts(model, checkpoints[arch], ids, 3)


@pytest.mark.parametrize("arch", ["qwen3_5_text", "qwen3_next"])
def test_ragged_batch_and_trees_are_generate(checkpoints, arch):
    model = _load(checkpoints[arch])
    ids, mask = left_padded([5, 9, 3, 7], seed=6)  # tiny_models.VOCAB is ours too
    kwargs = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    expected = model.generate(ids, **kwargs)
    for options in ({"num_draft_tokens": 2}, {"num_draft_tokens": 3, "tree": "static"}):
        assert torch.equal(specdec.SpeculativeModel(model, "mtp", **options).generate(ids, **kwargs), expected), options


def test_a_checkpoint_without_mtp_tensors_is_refused_in_one_line(tmp_path):
    write_checkpoint(tmp_path / "plain", "qwen3_5_text", with_mtp=False)
    with pytest.raises(MtpUnavailableError, match="no mtp.\\* tensors") as err:
        specdec.SpeculativeModel(_load(tmp_path / "plain"), "mtp")
    assert "\n" not in str(err.value) and "'qwen3_5_text'" in str(err.value)
    torch.manual_seed(0)  # not loaded from a checkpoint at all
    with pytest.raises(MtpUnavailableError, match="not loaded from a checkpoint"):
        specdec.SpeculativeModel(tf.AutoModelForCausalLM.from_config(_config("qwen3_5_text", 2, 1)), "mtp")


def test_the_cli_accepts_a_qwen_config_that_declares_mtp_layers():
    from specdec.draft_registry import DraftSpecError
    from specdec.draft_spec import parse_draft

    spec = parse_draft("mtp")
    spec.declared.check_verifier(spec, _config("qwen3_5_text", 2, 1))
    with pytest.raises(DraftSpecError, match="mtp_num_hidden_layers"):
        spec.declared.check_verifier(spec, _config("qwen3_5_text", 2, None))
