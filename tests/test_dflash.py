"""DFlash drafters (``dflash:DIR``) in z-lab's layout: a tiny random checkpoint (its config's ``dflash_config`` with
block size and target layer ids; its own layers, ``fc`` and ``hidden_norm``) drafts the block a reference forward
written here from the paper computes (the named layers' features projected into keys and values beside the block's,
the block ``[newest token, masks]`` attending to all without a causal mask, the verifier's LM head), across passes
too; greedy output is ``generate``'s for chains and trees, batch 1 and ragged batch 4; one drafter forward a pass;
the sampling law holds and fails with a wrong ``q``."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as tf
from law import ALPHA, chi2, exact_joint, flat_q, tally
from safetensors.torch import save_file
from tiny_models import left_padded, make_model

import specdec
from specdec.drafters.base import Commit, DraftContext, Rows
from specdec.drafters.dflash import DFlashDrafter
from specdec.heads.dflash import DFlashLoadError, DFlashModel, DFlashSettings

MASK, BLOCK, LAYERS = 95, 6, [0, 1]


def _write_dflash(path, hidden: int = 64, vocab: int = 96, seed: int = 0, heads: int = 4, kv_heads: int = 2,
                  mask: int = MASK):
    """A random DFlash drafter in z-lab's layout at ``path``."""
    torch.manual_seed(seed)
    config = tf.Qwen3Config(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
                            num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                            vocab_size=vocab)
    model = DFlashModel(config, DFlashSettings(LAYERS, BLOCK, mask))
    for p in model.parameters():  # larger than the default init, so that drafts depend on the context
        torch.nn.init.normal_(p, std=0.3) if p.dim() > 1 else None
    path.mkdir(parents=True, exist_ok=True)
    raw = config.to_dict() | {"architectures": ["DFlashDraftModel"],
                              "dflash_config": {"target_layer_ids": LAYERS, "block_size": BLOCK, "mask_token_id": mask}}
    (path / "config.json").write_text(json.dumps(raw))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path / "model.safetensors"))
    return str(path)


@pytest.fixture(scope="module")
def dflash_dir(tmp_path_factory):
    return _write_dflash(tmp_path_factory.mktemp("dflash"))


def _reference_block(drafter: DFlashDrafter, verifier, context: torch.Tensor) -> torch.Tensor:
    """The paper's forward, without a cache, for one row: the greedy drafts after ``context [T]``."""
    m = drafter.dflash
    with torch.no_grad():
        states = verifier(context[None, :-1], output_hidden_states=True).hidden_states
        ctx = m.hidden_norm(m.fc(torch.cat([states[i + 1] for i in LAYERS], dim=-1)))  # features of all but the newest
        ids = torch.tensor([[int(context[-1])] + [MASK] * (BLOCK - 1)])
        x = verifier.get_input_embeddings().weight[ids]
        t = ctx.shape[1]
        cos, sin = m.rotary_emb(x, torch.arange(t + BLOCK)[None])
        for layer in m.layers:
            a = layer.self_attn
            h = layer.input_layernorm(x)
            q = a.q_norm(a.q_proj(h).view(1, BLOCK, a.heads, a.head_dim))
            both = torch.cat([ctx, h], dim=1)
            k = a.k_norm(a.k_proj(both).view(1, t + BLOCK, a.kv_heads, a.head_dim))
            v = a.v_proj(both).view(1, t + BLOCK, a.kv_heads, a.head_dim)
            rot = lambda z, c, s: z * c[:, :, None] + tf.models.qwen3.modeling_qwen3.rotate_half(z) * s[:, :, None]  # noqa: E731
            q, k = rot(q, cos[:, t:], sin[:, t:]), rot(k, cos, sin)
            k, v = (z.repeat_interleave(a.heads // a.kv_heads, dim=2) for z in (k, v))
            w = torch.softmax(torch.einsum("bqhd,bkhd->bhqk", q, k) / a.head_dim ** 0.5, dim=-1)  # no mask at all
            x = x + a.o_proj(torch.einsum("bhqk,bkhd->bqhd", w, v).reshape(1, BLOCK, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return verifier.get_output_embeddings()(m.norm(x)[:, 1:]).argmax(-1)[0]


def test_the_block_is_the_reference_forward_pass_after_pass(dflash_dir):
    verifier = make_model("qwen3")
    drafter = DFlashDrafter.from_pretrained(dflash_dir, verifier).for_call()
    prompt = torch.randint(4, 90, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = verifier(prompt, output_hidden_states=True)
    hidden = torch.cat([out.hidden_states[i + 1] for i in LAYERS], dim=-1)
    drafter.start(prompt, None, 64, hidden=hidden)
    ctx = DraftContext(None, False, vocab_size=96)
    context = torch.cat([prompt[0], out.logits[0, -1:].argmax(-1)])
    for passes, accepted in enumerate((2, 0, 3), 1):
        drafts = drafter.propose(Rows(context[None], [len(context)]), BLOCK - 1, ctx).tokens[0]
        assert torch.equal(drafts, _reference_block(drafter, verifier, context))
        assert drafter.forwards == passes  # the features and the block: one forward
        block = torch.cat([context[-1:], drafts])  # the verifier scores [newest, drafts]: commit some of them
        with torch.no_grad():
            states = verifier(torch.cat([context[:-1], block])[None], output_hidden_states=True).hidden_states
        feats = torch.cat([states[i + 1] for i in LAYERS], dim=-1)[:, len(context) - 1:]
        context = torch.cat([context, drafts[:accepted], torch.tensor([7])])
        drafter.commit(Commit(Rows(context[None], [len(context)]), torch.tensor([accepted]),
                              torch.tensor([accepted + 1]), hidden=feats))


@pytest.mark.parametrize("tree", [None, "static", "dynamic"])
def test_greedy_is_generate_at_batch_one_and_ragged_four(dflash_dir, tree):
    verifier = make_model("qwen3")
    spec = specdec.SpeculativeModel(verifier, f"dflash:{dflash_dir}", num_draft_tokens=4, tree=tree)
    assert isinstance(spec.drafter, DFlashDrafter)
    ids, mask = left_padded([5, 12, 8, 3], seed=4)
    kwargs = dict(max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(spec.generate(ids[1:2, -12:], **kwargs), verifier.generate(ids[1:2, -12:], **kwargs))
    assert torch.equal(spec.generate(ids, attention_mask=mask, **kwargs),
                       verifier.generate(ids, attention_mask=mask, **kwargs))


@pytest.mark.parametrize("k", [2, 5, 9])
def test_one_drafter_forward_a_pass_and_chains_of_up_to_block_minus_one(dflash_dir, k):
    verifier = make_model("qwen3")
    spec = specdec.SpeculativeModel(verifier, f"dflash:{dflash_dir}", num_draft_tokens=k, adaptive=k == 5)
    ids, _ = left_padded([10], seed=2)
    kwargs = dict(max_new_tokens=24, do_sample=False, eos_token_id=None)
    assert torch.equal(spec.generate(ids, **kwargs), verifier.generate(ids, **kwargs))
    stats = spec.last_stats
    assert stats.drafter_forwards == stats.drafted_passes
    assert len(stats.proposed_per_position) <= BLOCK - 1


def test_a_drafter_for_another_verifier_or_layout_is_refused(dflash_dir, tmp_path):
    with pytest.raises(DFlashLoadError, match="hidden size 64"):
        specdec.SpeculativeModel(_wide_verifier(), f"dflash:{dflash_dir}")
    (tmp_path / "config.json").write_text(json.dumps(tf.Qwen3Config(hidden_size=64).to_dict()))
    with pytest.raises(DFlashLoadError, match="target_layer_ids"):
        specdec.SpeculativeModel(make_model("qwen3"), f"dflash:{tmp_path}")


def _wide_verifier():
    config = tf.Qwen3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=96)
    return tf.AutoModelForCausalLM.from_config(config).eval()


def _sampled_law(directory: str, monkeypatch=None, rows: int = 2400) -> float:
    from test_sampling import _tiny_vocab_model

    verifier = _tiny_vocab_model(4)
    spec = specdec.SpeculativeModel(verifier, f"dflash:{directory}", num_draft_tokens=2)
    prompt, steps = torch.tensor([[3, 1, 4, 3, 1]]), 3
    sampling = dict(temperature=0.9, top_k=6)
    out = spec.generate(prompt.expand(rows, -1), max_new_tokens=steps, do_sample=True,
                        generator=torch.Generator().manual_seed(11), **sampling)
    assert spec.last_stats.accepted > 0
    return chi2(tally(out[:, prompt.shape[1]:].tolist()), exact_joint(verifier, prompt, steps, **sampling), rows)


@pytest.fixture(scope="module")
def tiny_vocab_dflash(tmp_path_factory):
    return _write_dflash(tmp_path_factory.mktemp("dflash8"), hidden=32, vocab=8, seed=1, mask=7)


def test_sampled_blocks_keep_the_verifier_law(tiny_vocab_dflash):
    assert _sampled_law(tiny_vocab_dflash) > ALPHA


def test_blocks_judged_by_a_q_they_were_not_drawn_from_fail_the_same_law_test(tiny_vocab_dflash, monkeypatch):
    """The negative control: drafts judged by a flat ``q`` over the same support."""
    monkeypatch.setattr(DFlashDrafter, "propose", flat_q(DFlashDrafter.propose))
    assert _sampled_law(tiny_vocab_dflash) < ALPHA


# --------------------------------------------------------------------------------------------
# transformers' layout (muse_glimmer_assistant) and its own generator, hf-dflash
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def transformers_dir(tmp_path_factory):
    """A random DFlash drafter saved by transformers (its ``encoder.fc`` / ``encoder.output_norm_enc`` names)."""
    if not hasattr(tf, "MuseGlimmerAssistantConfig"):
        pytest.skip("this transformers has no DFlash model of its own (muse_glimmer_assistant)")
    config = tf.MuseGlimmerAssistantConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, block_size=BLOCK, mask_token_id=MASK, target_layer_ids=LAYERS, vocab_size=96,
        layer_types=["full_attention"], bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(3)
    model = tf.MuseGlimmerAssistantModel(config).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3) if p.dim() > 1 else None
    path = tmp_path_factory.mktemp("dflash-hf")
    model.save_pretrained(path)
    return str(path), model


def test_transformers_layout_loads_and_drafts_what_transformers_computes(transformers_dir):
    path, reference = transformers_dir
    verifier = make_model("qwen3")
    drafter = DFlashDrafter.from_pretrained(path, verifier)
    features = torch.randn(1, 7, 128, generator=torch.Generator().manual_seed(0))
    block = verifier.get_input_embeddings().weight[torch.tensor([[5] + [MASK] * (BLOCK - 1)])]
    cache = drafter.dflash.new_cache(1, 32)
    with torch.no_grad():
        mine = drafter.dflash.draft(cache, features, torch.tensor([7]), block)
        theirs = reference(noise_embeds=block, context_hidden_states=features,
                           position_ids=torch.arange(7 + BLOCK)[None]).last_hidden_state
    assert torch.allclose(mine, theirs, atol=1e-5)


def test_eval_runs_hf_dflash_beside_specdec_on_the_same_checkpoint(transformers_dir, dflash_dir, tmp_path):
    from tiny_models import char_tokenizer

    from specdec.eval import EvalConfig, run_eval

    path, _ = transformers_dir
    config = EvalConfig(out_dir=tmp_path / "out", draft=[f"dflash:{path}", f"dflash:{dflash_dir}"], num_draft_tokens=4,
                        baselines=["hf-dflash"], max_new_tokens=10, progress=False, plots=False, chat=False)
    with pytest.warns(UserWarning, match=f"hf-dflash cannot run with drafter 'dflash:{dflash_dir}'"):
        summary = run_eval(make_model("qwen3"), char_tokenizer(), ["the cat sat on the mat", "a dog ran"],
                           config).to_dict()
    methods = {m["name"]: m for m in summary["methods"]}  # transformers loads no z-lab layout: left out, with a warning
    assert methods[f"hf-dflash[dflash:{path}]"]["identical"] == 2
    assert methods[f"specdec[dflash:{path},k=4]"]["identical"] == 2
    assert methods[f"specdec[dflash:{dflash_dir},k=4]"]["identical"] == 2
    assert f"hf-dflash[dflash:{dflash_dir}]" not in methods
