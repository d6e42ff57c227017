"""draft="mtp": a model's own MTP layers as its drafter, on tiny checkpoints saved and reloaded with from_pretrained.

The checkpoints hold MTP weights the way released ones do (``model.layers.{N + i}.{enorm, hnorm, eh_proj,
shared_head.norm, <decoder layer>}``, experts unfused); the verifier itself ignores them when it loads, and both
specdec and transformers' ``generate(use_mtp=True)`` read them from the checkpoint files.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers as tf
from safetensors.torch import load_file, save_file
from transformers.generation import candidate_generator

import specdec
from specdec.drafters.mtp import MtpDrafter, MtpUnavailableError
from specdec.runners.hf import UnsupportedModelError
from law import ALPHA, chi2, exact_joint, tally
from tiny_models import left_padded, make_model

LAYERS = 2  # the verifier's decoder layers: the MTP layers are model.layers.2, model.layers.3


def _config(arch: str, mtp: int, vocab: int, layers: int = LAYERS) -> tf.PretrainedConfig:
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=layers,
                  num_attention_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                  first_k_dense_replace=1, num_mtp_layers=mtp, initializer_range=0.3, bos_token_id=1,
                  eos_token_id=2 if vocab > 8 else None, pad_token_id=0)
    if arch == "glm4_moe":
        return tf.Glm4MoeConfig(num_key_value_heads=2, head_dim=8, **common)
    return tf.DeepseekV3Config(num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
                               qk_nope_head_dim=8, v_head_dim=8, **common)


def write_mtp_checkpoint(directory: Path, arch: str = "deepseek_v3", mtp: int = 1, vocab: int = 96, seed: int = 0,
                         sharpness: float = 1.0) -> dict[str, torch.Tensor]:
    """Save a tiny random ``arch`` model with ``mtp`` MTP layers to ``directory``; returns the MTP tensors written.

    The decoder blocks come from a deeper model's ``save_pretrained`` (so they are in the checkpoint's own layout);
    the MTP extras are random, ``shared_head.norm`` scaled by ``sharpness`` (sharper draft distributions)."""
    torch.manual_seed(seed)
    tf.AutoModelForCausalLM.from_config(_config(arch, mtp, vocab), dtype=torch.float32).save_pretrained(directory)
    deeper = directory.parent / f"{directory.name}-deeper"
    tf.AutoModelForCausalLM.from_config(_config(arch, mtp, vocab, LAYERS + mtp), dtype=torch.float32).save_pretrained(deeper)
    state, blocks = load_file(str(directory / "model.safetensors")), load_file(str(deeper / "model.safetensors"))
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    rand = lambda *shape: torch.randn(*shape, generator=g, device="cpu")  # noqa: E731
    written = {}
    for i in range(mtp):
        prefix = f"model.layers.{LAYERS + i}."
        written.update({key: value for key, value in blocks.items() if key.startswith(prefix)})
        written[prefix + "enorm.weight"] = 1 + 0.3 * rand(32)
        written[prefix + "hnorm.weight"] = 1 + 0.3 * rand(32)
        written[prefix + "eh_proj.weight"] = 0.3 * rand(32, 64)
        written[prefix + "shared_head.norm.weight"] = sharpness * (1 + 0.3 * rand(32))
    save_file({**state, **written}, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return written


def _load(directory: Path) -> torch.nn.Module:
    return tf.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


def _transformers_finds_mtp(model: torch.nn.Module) -> None:
    """Let transformers' own MtpModel find these MTP weights: it matches the released checkpoints' layer numbers
    only (``model.layers.61`` for DeepSeek-V3), so a 2-layer checkpoint needs its numbers added (specdec adds them
    itself); on this instance only."""
    count = model.config.num_mtp_layers
    model._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{LAYERS + i}\..*" for i in range(count)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("mtp")
    made = {}
    for arch, mtp in (("deepseek_v3", 1), ("deepseek_v3", 2), ("glm4_moe", 1)):
        directory = root / f"{arch}-{mtp}"
        made[arch, mtp] = (directory, write_mtp_checkpoint(directory, arch, mtp))
    return made


def _recorded_drafts(monkeypatch) -> list[list[int]]:
    """Record row 0's drafts of every MtpDrafter proposal."""
    seen: list[list[int]] = []
    propose = MtpDrafter.propose

    def recording(self, rows, k, ctx):
        chain = propose(self, rows, k, ctx)
        seen.append(chain.tokens.tolist())
        return chain

    monkeypatch.setattr(MtpDrafter, "propose", recording)
    return seen


@pytest.mark.parametrize("arch, mtp", [("deepseek_v3", 1), ("deepseek_v3", 2), ("glm4_moe", 1)])
def test_weights_come_back_from_the_checkpoint(checkpoints, arch, mtp):
    directory, written = checkpoints[arch, mtp]
    drafter = specdec.SpeculativeModel(_load(directory), "mtp").drafter
    assert isinstance(drafter, MtpDrafter) and drafter.num_mtp_layers == mtp
    for i, layer in enumerate(drafter.mtp.layers):
        prefix = f"model.layers.{LAYERS + i}."
        assert torch.equal(layer.eh_proj.weight, written[prefix + "eh_proj.weight"])
        assert torch.equal(layer.enorm.weight, written[prefix + "enorm.weight"])
        assert torch.equal(layer.post_norm.weight, written[prefix + "shared_head.norm.weight"])
        assert torch.equal(layer.mtp_block.input_layernorm.weight, written[prefix + "input_layernorm.weight"])
        assert torch.equal(layer.mtp_block.self_attn.o_proj.weight, written[prefix + "self_attn.o_proj.weight"])


@pytest.mark.parametrize("arch, mtp", [("deepseek_v3", 1), ("deepseek_v3", 2), ("glm4_moe", 1)])
def test_greedy_is_generate_and_use_mtp_and_drafts_are_transformers_own(checkpoints, arch, mtp, monkeypatch):
    """One checkpoint, one run: specdec's output == generate == generate(use_mtp=True) for k in 1, 2, 4 (4: recursive
    past the trained depth), and with k = the trained depth every pass drafts what transformers' MTP drafts."""
    model = _load(checkpoints[arch, mtp][0])
    prompt = torch.randint(3, 96, (1, 9), generator=torch.Generator(device="cpu").manual_seed(3), device="cpu")
    plain = model.generate(prompt, max_new_tokens=24, do_sample=False)
    _transformers_finds_mtp(model)
    theirs: list[list[int]] = []
    get_candidates = candidate_generator.MTPCandidateGenerator.get_candidates

    def recording(self, input_ids, *args, **kwargs):
        ids, logits = get_candidates(self, input_ids, *args, **kwargs)
        if logits is not None:
            theirs.append(ids[0, input_ids.shape[1]:].tolist())
        return ids, logits

    monkeypatch.setattr(candidate_generator.MTPCandidateGenerator, "get_candidates", recording)
    assert torch.equal(model.generate(prompt, max_new_tokens=24, do_sample=False, use_mtp=True), plain)
    ours = _recorded_drafts(monkeypatch)
    for k in (1, 2, 4):
        ours.clear()
        spec = specdec.SpeculativeModel(model, "mtp", num_draft_tokens=k)
        assert torch.equal(spec.generate(prompt, max_new_tokens=24, do_sample=False), plain), f"k={k}"
        assert len(spec.last_stats.proposed_per_position) == k  # acceptance reported per draft position
        if k == mtp:  # the same drafts, pass for pass (specdec asks fewer near the end: compare what it asked)
            assert len(ours) == len(theirs) > 5
            assert all(t[: len(o[0])] == o[0] for o, t in zip(ours, theirs))


def test_ragged_batch_is_batched_generate_and_each_row_drafts_as_alone(checkpoints, monkeypatch):
    """Batch 4, left padded, rows of 9/3/6/1 tokens (transformers refuses use_mtp past batch 1): specdec's output is
    batched generate's, and each row's drafts are those it gets alone (the MTP caches never mix rows)."""
    model = _load(checkpoints["deepseek_v3", 2][0])
    ids, mask = left_padded([9, 3, 6, 1], seed=1)
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=0)
    _transformers_finds_mtp(model)
    with pytest.raises(ValueError, match="batch_size = 1"):
        model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, use_mtp=True, pad_token_id=0)
    seen = _recorded_drafts(monkeypatch)
    for k in (3,):  # one recursive step past the two trained layers
        seen.clear()
        spec = specdec.SpeculativeModel(model, "mtp", num_draft_tokens=k)
        assert torch.equal(spec.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False), plain), f"k={k}"
        batched = [[chain[b] for chain in seen if b < len(chain)] for b in range(4)]
        for b in range(4):
            seen.clear()
            alone = ids[b : b + 1, int((mask[b] == 0).sum()):]
            spec.generate(alone, max_new_tokens=20, do_sample=False)
            assert [chain[0] for chain in seen][: len(batched[b])] == batched[b][: len(seen)], f"row {b}, k={k}"


def test_rows_retire_midway(checkpoints):
    """A row that stops at its EOS leaves the batch; the others go on exactly."""
    model = _load(checkpoints["deepseek_v3", 1][0])
    ids, mask = left_padded([5, 7, 2], seed=4)
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
    eos = int(plain[1, ids.shape[1] + 4])  # row 1's fifth token ends it
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0, eos_token_id=eos)
    spec = specdec.SpeculativeModel(model, "mtp", num_draft_tokens=3)
    out = spec.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, eos_token_id=eos)
    assert torch.equal(out, plain)


class _LyingMtp(MtpDrafter):
    """Negative control: reports uniform draft probabilities instead of the ones it sampled from."""

    def propose(self, rows, k, ctx):
        chain = super().propose(rows, k, ctx)
        if chain.probs is not None:
            chain.probs = torch.full_like(chain.probs, 1.0 / chain.probs.shape[-1])
        return chain


def _exact_joint(model, prompt: torch.Tensor, steps: int, **sampling) -> dict:
    """law.exact_joint with every prefix of a depth in one forward (8**3 prefixes at the last step)."""
    from specdec.arguments import prepare_generation

    processors = prepare_generation(model, prompt, do_sample=True, max_new_tokens=steps, **sampling).processors
    prefixes, mass = torch.zeros(1, 0, dtype=torch.long, device="cpu"), torch.ones(1, device="cpu")
    for _ in range(steps):
        ids = torch.cat([prompt.expand(len(prefixes), -1), prefixes], dim=1)
        with torch.no_grad():
            dist = torch.softmax(processors(ids, model(ids).logits[:, -1].float()), dim=-1)
        vocab = dist.shape[-1]
        prefixes = torch.cat([prefixes.repeat_interleave(vocab, dim=0),
                              torch.arange(vocab, device="cpu").repeat(len(prefixes))[:, None]], dim=1)
        mass = (mass[:, None] * dist).reshape(-1)
    return {tuple(p): m for p, m in zip(prefixes.tolist(), mass.tolist()) if m > 0}


def test_sampling_follows_the_verifier_and_a_lying_q_is_caught(tmp_path):
    directory = tmp_path / "vocab8"
    write_mtp_checkpoint(directory, "deepseek_v3", mtp=1, vocab=8, seed=5, sharpness=4.0)
    verifier = _load(directory)
    prompt = torch.tensor([[3, 1, 4]], device="cpu")
    sampling = dict(temperature=0.8, top_k=0, top_p=1.0)
    exact = _exact_joint(verifier, prompt, 4, **sampling)
    reference = exact_joint(verifier, prompt, 2, **sampling)  # the batched enumeration is the shared one's
    assert reference == pytest.approx(_exact_joint(verifier, prompt, 2, **sampling), abs=1e-6)

    def counts(drafter) -> tuple[dict, specdec.SpeculativeModel]:
        # 4 new tokens: the prefill's, then passes of up to 2 drafts, the second one recursive (the one layer again)
        spec = specdec.SpeculativeModel(verifier, drafter, num_draft_tokens=2)
        gen = torch.Generator(device="cpu").manual_seed(42)
        out = torch.cat([spec.generate(prompt.expand(1000, -1), max_new_tokens=4, do_sample=True, generator=gen,
                                       **sampling)[:, 3:] for _ in range(2)])
        return tally(out.tolist()), spec

    honest, spec = counts(MtpDrafter.from_model(verifier))
    assert all(n > 0 for n in spec.last_stats.accepted_per_position[:2])  # recursive drafts accepted too
    assert chi2(honest, exact, 2000) > ALPHA
    liar, _ = counts(_LyingMtp.from_model(verifier))
    assert chi2(liar, exact, 2000) < ALPHA, "the test must catch a drafter that misreports q"


def _one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


def test_models_without_mtp_layers_are_refused_in_one_line(tmp_path):
    with pytest.raises(UnsupportedModelError) as err:  # no MTP in the config
        specdec.SpeculativeModel(make_model("llama"), "mtp")
    assert "'llama'" in _one_line(err) and "num_mtp_layers" in str(err.value)
    plain = tmp_path / "no-mtp-weights"  # MTP in the config (DeepSeek's default: 1), none in the checkpoint
    torch.manual_seed(0)
    tf.AutoModelForCausalLM.from_config(_config("deepseek_v3", 1, 96), dtype=torch.float32).save_pretrained(plain)
    with pytest.raises(MtpUnavailableError) as err:
        specdec.SpeculativeModel(_load(plain), "mtp")
    assert "'deepseek_v3'" in _one_line(err) and "no usable weights" in str(err.value)
    from_config = tf.AutoModelForCausalLM.from_config(_config("deepseek_v3", 1, 96), dtype=torch.float32)
    with pytest.raises(MtpUnavailableError) as err:  # not loaded from a checkpoint: nowhere to read weights from
        specdec.SpeculativeModel(from_config, "mtp")
    assert "checkpoint" in _one_line(err)


def test_the_cli_refuses_a_config_without_mtp_before_loading_weights():
    from specdec.draft_spec import parse_draft
    from specdec.draft_registry import DraftSpecError

    spec = parse_draft("mtp")
    assert spec.kind == "mtp"
    with pytest.raises(DraftSpecError, match="'llama' has no MTP layers"):
        spec.declared.check_verifier(spec, make_model("llama").config)
    spec.declared.check_verifier(spec, _config("deepseek_v3", 1, 96))  # declared: accepted here


def test_hf_mtp_baseline_runs_transformers_mtp_and_refuses_models_without(checkpoints):
    from specdec.eval.baselines import BaselineSetup, get_baseline

    baseline = get_baseline("hf-mtp")
    assert baseline.drafts and not baseline.batchable  # transformers: batch 1 only; eval leaves it out of batches
    model = _load(checkpoints["deepseek_v3", 1][0])
    kwargs = baseline.generate_kwargs(BaselineSetup(model, None, None, None, 4))
    prompt = torch.randint(3, 96, (1, 7), generator=torch.Generator(device="cpu").manual_seed(8), device="cpu")
    plain = model.generate(prompt, max_new_tokens=12, do_sample=False)
    patterns = model._keys_to_ignore_on_load_unexpected
    assert torch.equal(baseline.generate(model, prompt, max_new_tokens=12, do_sample=False, **kwargs), plain)
    assert model._keys_to_ignore_on_load_unexpected == patterns  # the layer patterns were added for the call only
    with pytest.raises(MtpUnavailableError) as err:
        baseline.generate_kwargs(BaselineSetup(make_model("llama"), None, None, None, 4))
    assert "'llama'" in _one_line(err)


@pytest.mark.parametrize("mtp", [1, 2])
def test_a_tree_holds_the_chain_as_its_top_ranked_path(checkpoints, mtp):
    """A static tree's all-first-ranks path is the greedy chain, past the trained depth too (where nodes see their
    ancestors in the last layer's cache and not their siblings); and trees are exact end to end, ragged."""
    from specdec.drafters.base import DraftContext, Rows
    from specdec.trees.build import TreeShape
    from specdec.trees.config import TreeConfig

    model = _load(checkpoints["deepseek_v3", mtp][0])
    prompt = torch.randint(3, 96, (2, 7), generator=torch.Generator(device="cpu").manual_seed(9), device="cpu")
    with torch.no_grad():
        out = model(prompt, output_hidden_states=True)
    rows = Rows(torch.cat([prompt, out.logits[:, -1].argmax(-1, keepdim=True)], dim=1), [8, 8])
    ctx = DraftContext(None, False, vocab_size=96)
    drafter = MtpDrafter.from_model(model)
    chain_drafter, tree_drafter = drafter.for_call(), drafter.for_call()
    for d in (chain_drafter, tree_drafter):
        d.start(prompt, None, 64, hidden=out.hidden_states[-1])
    logits: list[torch.Tensor] = []  # the chain's draft logits, depth by depth
    project = drafter.mtp._project_to_logits
    drafter.mtp._project_to_logits = lambda h: logits.append(project(h)) or logits[-1]
    chain = chain_drafter.propose(rows, 4, ctx).tokens.tolist()
    del drafter.mtp._project_to_logits
    # siblings fed at every depth (their children are in the tree too): a node must not see them
    config = TreeConfig(mode="static", choices=((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0), (1, 0, 0),
                                                (0, 0, 1), (0, 0, 0, 0), (0, 0, 1, 0)))
    tree = tree_drafter.propose_tree(rows, TreeShape(config, room=8), ctx)
    for b in range(2):
        parent, mass = -1, 1.0
        for depth, token in enumerate(chain[b]):  # follow the chain down the tree: same nodes, same probabilities
            parent = next(i for i, (t, p) in enumerate(zip(tree.tokens[b].tolist(), tree.parents[b].tolist()))
                          if t == token and p == parent)
            mass *= torch.softmax(logits[depth][b].float(), dim=-1)[token].item()
            assert tree.values[b, parent].item() == pytest.approx(mass, rel=1e-4), f"row {b}, depth {depth + 1}"
    ids, mask = left_padded([9, 3, 6, 1], seed=1)
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
    for mode in ("static", "dynamic"):
        spec = specdec.SpeculativeModel(model, "mtp", num_draft_tokens=4, tree=mode)
        assert torch.equal(spec.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False), plain), mode


def test_drafts_after_a_rollback_equal_those_of_a_drafter_that_never_drafted(checkpoints):
    """Drafter A proposes (k=4: frontier and recursive slots), then the commit rolls them back; drafter B skips that
    proposal (as inside a composite drafter: its states wait). At the next proposal both draft the same, row by row
    of a ragged batch that committed different counts."""
    from specdec.drafters.base import Commit, DraftContext, Rows

    model = _load(checkpoints["deepseek_v3", 2][0])
    ids, mask = left_padded([6, 3, 5], seed=2)
    with torch.no_grad():
        out = model(ids, attention_mask=mask, output_hidden_states=True)
    first = out.logits[:, -1].argmax(-1, keepdim=True)
    ctx = DraftContext(None, False, vocab_size=96)
    drafter = MtpDrafter.from_model(model)
    a, b = drafter.for_call(), drafter.for_call()
    for d in (a, b):
        d.start(ids, mask, 64, hidden=out.hidden_states[-1])
    rows = Rows(torch.cat([ids, first], dim=1), [7, 7, 7], pads=[0, 3, 1])
    a.propose(rows, 4, ctx)
    # the pass verified the newest token and 4 drafts; rows commit 3, 1 and 2 tokens (whatever the verifier said)
    g = torch.Generator(device="cpu").manual_seed(0)
    added = [3, 1, 2]
    committed = torch.cat([rows.tokens, torch.randint(3, 96, (3, 3), generator=g, device="cpu")], dim=1)
    hidden = torch.randn(3, 5, 32, generator=g, device="cpu")
    after = Rows(committed, [7 + n for n in added], pads=[0, 3, 1])
    for d in (a, b):
        d.commit(Commit(after, torch.tensor([n - 1 for n in added], device="cpu"),
                        torch.tensor(added, device="cpu"), hidden=hidden))
    assert torch.equal(a.propose(after, 4, ctx).tokens, b.propose(after, 4, ctx).tokens)
