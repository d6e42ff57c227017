"""EAGLE-1/2 and EAGLE-3 draft heads: public checkpoint layouts, exactness, caches, training, bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import LogitsProcessorList

import specdec
from specdec.drafters import DraftSpecError, parse_draft
from specdec.drafters.base import DraftContext, Rows
from specdec.drafters.eagle import EagleDrafter
from specdec.heads import EagleHead, HeadConfig, HeadLoadError, load_head, save_head
from specdec.training.train import TrainingKeyValues
from tiny_models import CONFIGS, make_model

H, I, HEADS, KV, V = 64, 128, 4, 2, 96  # the tiny llama of tiny_models


def _public_eagle3(directory: Path, *, draft_vocab: int = 40, layers=(1, 1, 1), seed: int = 0, hidden: int = H,
                   config_extra: dict | None = None) -> Path:
    """A random EAGLE-3 checkpoint with exactly the public keys and shapes (no specdec code involved)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g) * 0.3  # noqa: E731
    d = HEADS * (hidden // HEADS)
    keep = torch.randperm(V, generator=g)[:draft_vocab].sort().values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[keep] = True
    state = {
        "fc.weight": r(hidden, 3 * hidden),
        "midlayer.self_attn.q_proj.weight": r(d, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": r(KV * (hidden // HEADS), 2 * hidden),
        "midlayer.self_attn.v_proj.weight": r(KV * (hidden // HEADS), 2 * hidden),
        "midlayer.self_attn.o_proj.weight": r(hidden, d),
        "midlayer.mlp.gate_proj.weight": r(I, hidden), "midlayer.mlp.up_proj.weight": r(I, hidden),
        "midlayer.mlp.down_proj.weight": r(hidden, I),
        "midlayer.input_layernorm.weight": torch.ones(hidden), "midlayer.hidden_norm.weight": torch.ones(hidden),
        "midlayer.post_attention_layernorm.weight": torch.ones(hidden), "norm.weight": torch.ones(hidden),
        "lm_head.weight": r(draft_vocab, hidden), "d2t": keep - torch.arange(draft_vocab), "t2d": t2d,
    }
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": I, "num_attention_heads": HEADS, "num_key_value_heads": KV, "num_hidden_layers": 1,
              "vocab_size": V, "draft_vocab_size": draft_vocab, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "max_position_embeddings": 2048, "hidden_act": "silu", "tie_word_embeddings": False,
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(layers)}, **(config_extra or {})}
    directory.mkdir(parents=True, exist_ok=True)
    save_file(state, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _public_eagle1(directory: Path, *, fc_bias: bool, embed: bool = False, seed: int = 0, bin_file: bool = True) -> Path:
    """A random EAGLE-1/2 checkpoint: fc [H, 2H] (bias or not), layers.0 without input_layernorm, no norm, no lm_head."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g) * 0.3  # noqa: E731
    state = {"fc.weight": r(H, 2 * H),
             "layers.0.self_attn.q_proj.weight": r(H, H), "layers.0.self_attn.k_proj.weight": r(KV * H // HEADS, H),
             "layers.0.self_attn.v_proj.weight": r(KV * H // HEADS, H), "layers.0.self_attn.o_proj.weight": r(H, H),
             "layers.0.mlp.gate_proj.weight": r(I, H), "layers.0.mlp.up_proj.weight": r(I, H),
             "layers.0.mlp.down_proj.weight": r(H, I), "layers.0.post_attention_layernorm.weight": torch.ones(H)}
    if fc_bias:
        state["fc.bias"] = r(H)
    if embed:
        state["embed_tokens.weight"] = r(V, H)
    # configs lie about bias: this one always says False
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "intermediate_size": I,
              "num_attention_heads": HEADS, "num_key_value_heads": KV, "num_hidden_layers": 1, "vocab_size": V,
              "bias": False, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu"}
    directory.mkdir(parents=True, exist_ok=True)
    if bin_file:
        torch.save(state, directory / "pytorch_model.bin")
    else:
        save_file(state, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _batch(width: int = 9, rows: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, V, (rows, width), generator=g)
    mask = torch.ones_like(ids)
    for b in range(1, rows):  # ragged: left padding of different widths
        ids[b, : 2 * b], mask[b, : 2 * b] = 0, 0
    return ids[:rows], mask[:rows]


def _assert_identical(model, draft, batch: int, k: int = 4, new: int = 24) -> specdec.SpeculativeModel:
    ids, mask = _batch(rows=batch)
    spec = specdec.SpeculativeModel(model, draft, num_draft_tokens=k)
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0)
    out = spec.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0)
    assert torch.equal(out, ref)
    return spec


@pytest.mark.parametrize("batch", [1, 3])
def test_public_eagle3_checkpoint_loads_and_is_exact(tmp_path, batch):
    model = make_model("llama")
    directory = _public_eagle3(tmp_path / "e3")
    head = load_head(directory, model)
    assert head.config.kind == "eagle3" and head.config.draft_vocab_size == 40
    assert head.config.aux_layers == (1, 1, 1)
    drafter = EagleDrafter(head, model)
    assert drafter.hidden_layers == (1, 1, 1)
    spec = _assert_identical(model, f"eagle:{directory}", batch)
    assert spec.last_stats.drafter_forwards > 0


@pytest.mark.parametrize("fc_bias", [False, True])
@pytest.mark.parametrize("embed", [False, True])
@pytest.mark.parametrize("batch", [1, 3])
def test_public_eagle1_checkpoint_loads_and_is_exact(tmp_path, fc_bias, embed, batch):
    model = make_model("llama")
    directory = _public_eagle1(tmp_path / "e1", fc_bias=fc_bias, embed=embed, bin_file=not embed)
    head = load_head(directory, model)
    assert head.config.kind == "eagle" and (head.fc.bias is not None) == fc_bias
    assert not hasattr(head.layers[0], "input_layernorm")
    assert (head.embed_tokens is not None) == embed
    assert EagleDrafter(head, model).hidden_layers == (model.config.num_hidden_layers,)
    _assert_identical(model, f"eagle:{directory}", batch)


def test_eagle3_drafts_only_draft_vocabulary_ids(tmp_path):
    model = make_model("llama")
    directory = _public_eagle3(tmp_path / "e3", draft_vocab=10)
    drafter = EagleDrafter.from_pretrained(directory, model)
    allowed = set(torch.nonzero(drafter.head.t2d).flatten().tolist())
    ids, mask = _batch(rows=2)
    out = model(ids, attention_mask=mask, output_hidden_states=True)
    hidden = torch.cat([out.hidden_states[i] for i in drafter.hidden_layers], dim=-1)
    d = drafter.for_call()
    d.start(ids, mask, 64, hidden=hidden)
    rows = Rows(torch.cat([ids, out.logits[:, -1].argmax(-1, keepdim=True)], dim=1), torch.tensor([10, 10]))
    proposal = d.propose(rows, 5, DraftContext(LogitsProcessorList(), False, None, V))
    assert set(proposal.tokens.flatten().tolist()) <= allowed


def _random_head(model, kind: str, seed: int = 0, draft_vocab: int | None = 48) -> EagleHead:
    torch.manual_seed(seed)
    config = HeadConfig.for_verifier(model.config, kind, draft_vocab_size=draft_vocab if kind == "eagle3" else None)
    head = EagleHead(config)
    if kind == "eagle3":
        keep = torch.randperm(config.vocab_size)[: config.draft_vocab_size].sort().values
        head.d2t.copy_(keep - torch.arange(len(keep)))
        head.t2d.zero_()
        head.t2d[keep] = True
    head.attach(model.get_input_embeddings(), model.get_output_embeddings())
    return head.eval()


@pytest.mark.parametrize("kind", ["eagle3", "eagle"])
def test_a_head_built_in_fp32_drafts_for_a_bf16_verifier(kind):
    """A head built by hand keeps torch's fp32 default; over a bf16 verifier the drafter casts it as load_head does
    (the H200 check found the fc fed bf16 features with fp32 weights)."""
    model = make_model("llama").to(torch.bfloat16)
    head = _random_head(model, kind)
    assert head.fc.weight.dtype == torch.float32
    drafter = EagleDrafter(head, model)
    assert all(p.dtype == torch.bfloat16 for p in drafter.head.parameters() if p.is_floating_point())
    _assert_identical(model, drafter, batch=1, new=12)


@pytest.mark.parametrize("arch", sorted(CONFIGS))
@pytest.mark.parametrize("kind", ["eagle3", "eagle"])
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_identity_every_architecture(arch, kind, batch):
    model = make_model(arch)
    _assert_identical(model, EagleDrafter(_random_head(model, kind), model), batch)


class _CheckedDrafter(EagleDrafter):
    """Checks at every proposal that the first draft's logits equal a from-scratch recomputation: the verifier
    over each whole row, then the head over every (feature, next token) slot (the training forward)."""

    verifier = None
    checks = 0

    def propose(self, rows, k, ctx):
        if k <= 0:  # nothing fed: the pending features wait for the next proposal
            return super().propose(rows, k, ctx)
        head, model = self.head, type(self).verifier
        expected = []
        with torch.no_grad():
            for b in range(len(rows)):
                row = rows[b][rows.pads[b]:].unsqueeze(0)
                out = model(row, output_hidden_states=True)
                feats = torch.cat([out.hidden_states[i] for i in self.hidden_layers], dim=-1)[:, :-1]
                embeds = head.embed(row[:, 1:])
                n = embeds.shape[1]
                hidden = head(embeds, head.input_hidden(embeds, feats), torch.arange(n).unsqueeze(0),
                              TrainingKeyValues(n, row.device))
                expected.append(head.logits(hidden[:, -1]))
        proposal = super().propose(rows, k, ctx)
        with torch.no_grad():
            mine = head.logits(self._last_first_hidden)
        torch.testing.assert_close(mine, torch.cat(expected), rtol=1e-4, atol=1e-4)
        type(self).checks += 1
        return proposal

    def _feed_pending(self, rows):
        out = super()._feed_pending(rows)
        self._last_first_hidden = out[:, -1]
        return out


@pytest.mark.parametrize("kind", ["eagle3", "eagle"])
def test_head_cache_equals_recomputation_through_ragged_generation(kind):
    """The head's KV cache (prompt features, commits, rolled-back drafts, rows leaving) matches a full recompute."""
    model = make_model("llama")
    _CheckedDrafter.verifier, _CheckedDrafter.checks = model, 0
    drafter = _CheckedDrafter(_random_head(model, kind), model)
    ids, mask = _batch(rows=3)
    spec = specdec.SpeculativeModel(model, drafter, num_draft_tokens=3)
    eos = [int(x) for x in model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                                          pad_token_id=0)[0, -3:]]
    out = spec.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=0, eos_token_id=eos[:1])
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=0, eos_token_id=eos[:1])
    assert torch.equal(out, ref)
    assert _CheckedDrafter.checks >= 3


def test_save_load_round_trip(tmp_path):
    model = make_model("qwen3")
    head = _random_head(model, "eagle3")
    save_head(head, tmp_path / "h", dtype=torch.float32, card="# card\n")
    loaded = load_head(tmp_path / "h", model)
    saved = {k: v for k, v in head.state_dict().items() if not k.startswith("rotary")}
    for key, value in loaded.state_dict().items():
        if not key.startswith("rotary"):
            assert torch.equal(value, saved[key]), key
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 48
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(head.config.aux_layers)
    assert (tmp_path / "h" / "README.md").read_text() == "# card\n"


def test_drafter_names():
    assert parse_draft("eagle").kind == "eagle" and parse_draft("eagle").head is None
    assert parse_draft("eagle:/x/y").head == "/x/y"
    with pytest.raises(DraftSpecError, match="head directory"):
        parse_draft("eagle:")


def test_bad_heads_get_clear_errors(tmp_path):
    model = make_model("llama")
    with pytest.raises(HeadLoadError, match="does not exist"):
        specdec.SpeculativeModel(model, f"eagle:{tmp_path / 'nowhere'}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(HeadLoadError, match="no config.json"):
        load_head(tmp_path / "empty", model)
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text("{}")
    with pytest.raises(HeadLoadError, match="model.safetensors or pytorch_model.bin"):
        load_head(tmp_path / "noweights", model)
    wide = _public_eagle3(tmp_path / "wide", hidden=2 * H)  # trained for a model with another hidden size
    with pytest.raises(HeadLoadError, match="hidden states of size 128, the verifier's are 64"):
        load_head(wide, model)
    vocab = _public_eagle3(tmp_path / "vocab", config_extra={"vocab_size": 500})
    with pytest.raises(HeadLoadError, match="vocabulary has 500 tokens, the verifier's 96"):
        load_head(vocab, model)
    deep = _public_eagle3(tmp_path / "deep", layers=(2, 5, 9))
    with pytest.raises(HeadLoadError, match="only 2 layers"):
        load_head(deep, model)
    with pytest.raises(HeadLoadError, match="no draft head ships for this verifier.*train-head"):
        specdec.SpeculativeModel(model, "eagle")


class _LyingDrafter(EagleDrafter):
    """Negative control: reports uniform draft probabilities instead of the ones it sampled from."""

    def propose(self, rows, k, ctx):
        proposal = super().propose(rows, k, ctx)
        if proposal.probs is not None:
            proposal.probs = torch.full_like(proposal.probs, 1.0 / proposal.probs.shape[-1])
        return proposal


def _sample_counts(spec, prompt, steps, rows, sampling, seed=42):
    gen = torch.Generator().manual_seed(seed)
    counts: dict = {}
    for _ in range(2):
        out = spec.generate(prompt.expand(rows, -1), max_new_tokens=steps, do_sample=True, generator=gen, **sampling)
        for r in out[:, prompt.shape[1]:].tolist():
            counts[tuple(r)] = counts.get(tuple(r), 0) + 1
    return counts


@pytest.mark.parametrize("kind", ["eagle3", "eagle"])
def test_sampling_with_a_head_follows_the_verifier(kind):
    from test_sampling import ALPHA, _chi2, _exact_joint, _tiny_vocab_model

    verifier = _tiny_vocab_model(0)
    head = _random_head(verifier, kind, seed=1, draft_vocab=6)
    # a confident head (sharp logits) makes the negative control's lie large
    with torch.no_grad():
        (head.lm_head if kind == "eagle3" else head.fc).weight.mul_(4.0)
    prompt = torch.tensor([[3, 1, 4]])
    sampling = dict(temperature=0.8, top_k=0, top_p=1.0)
    exact = _exact_joint(verifier, prompt, 3, **sampling)
    spec = specdec.SpeculativeModel(verifier, EagleDrafter(head, verifier), num_draft_tokens=2)
    counts = _sample_counts(spec, prompt, 3, 1500, sampling)
    assert spec.last_stats.accepted > 0
    assert _chi2(counts, exact, sum(counts.values())) > ALPHA
    if kind != "eagle3":
        return  # one negative control shows the test's power; the EAGLE-3 head's sharp lm_head makes its lie large
    liar = specdec.SpeculativeModel(verifier, _LyingDrafter(head, verifier), num_draft_tokens=2)
    counts = _sample_counts(liar, prompt, 3, 1500, sampling)
    assert _chi2(counts, exact, sum(counts.values())) < ALPHA, "the test must catch a drafter that misreports q"


def _self_distilled(model, count: int, prompt_len: int = 6, new: int = 40, seed: int = 1) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(count):
        p = torch.randint(3, V, (1, prompt_len), generator=g)
        out = model.generate(p, max_new_tokens=new, do_sample=False, pad_token_id=0, eos_token_id=None)
        samples.append({"id": str(i), "prompt_ids": p[0].tolist(), "response_ids": out[0, prompt_len:].tolist()})
    return samples


def _dense_head_loss(head, batch, embed, target_head, steps, prompt_weight=0.0, lookup_weight=1.0):
    """head_loss as first written: draft and target logits at every slot, then masked (the reference); with
    ``prompt_weight``, prompt slots whose chain starts at a real slot weigh that much against a response slot; with
    ``lookup_weight``, response slots whose target ``batch["lookup"]`` drafts weigh that much."""
    from torch import nn
    from specdec.training.train import ttt_outputs

    ids, hidden, final, top = batch["input_ids"], batch["hidden"], batch["final"], batch["top"]
    n = ids.shape[1] - 1
    slot = torch.arange(n).view(1, -1)
    real, first = slot < (batch["lengths"] - 1).view(-1, 1), (batch["prompt_lengths"] - 1).view(-1, 1)
    eagle3 = head.config.kind == "eagle3"
    with torch.no_grad():
        embeds = embed(ids[:, 1:])
        ids_t = torch.arange(head.config.draft_vocab_size) + head.d2t if eagle3 else None
        target = nn.functional.linear(final[:, 1:], target_head.weight[ids_t]) if eagle3 else target_head(final[:, 1:])
        target_p = torch.softmax(target, dim=-1)
        in_vocab = head.t2d[top[:, 1:]] if eagle3 else torch.ones_like(top[:, 1:], dtype=torch.bool)
    total, stats = 0.0, {}
    for s, out in enumerate(ttt_outputs(head, embeds, hidden[:, :-1], steps if eagle3 else 1)):
        logits = head.logits(out)
        response = real & (slot - s >= first)
        mask = response & in_vocab
        count = mask.sum().clamp(min=1)
        looked_up = torch.zeros_like(mask)
        if "lookup" in batch:  # lookup[b, t] drafts position t, slot i's target is position i + 2
            looked_up[:, : n - 1] = batch["lookup"][:, 2:] == top[:, 1:n]
        weight = mask.float() * torch.where(looked_up, lookup_weight, 1.0)
        weight = weight + prompt_weight * (real & (slot >= s) & ~response & in_vocab).float()
        loss = ((-(target_p * torch.log_softmax(logits, dim=-1)).sum(-1)) * weight).sum() / weight.sum().clamp(min=1)
        if not eagle3:
            regression = nn.functional.smooth_l1_loss(out, final[:, 1:], reduction="none").mean(-1)
            loss = (regression * weight).sum() / weight.sum().clamp(min=1) + 0.1 * loss
        total = total + (0.8 ** s) * loss
        guess = logits.argmax(-1)
        guess = ids_t[guess] if eagle3 else guess
        stats.update({f"n_{s}": float(mask.sum()), f"all_{s}": float(response.sum()), f"loss_{s}": float(loss.detach()),
                      f"acc_{s}": float(((guess == top[:, 1:]) & mask).sum() / count)})
    return total, stats


@pytest.mark.parametrize("kind,prompt_weight,lookup_weight", [
    ("eagle3", 0.0, 1.0), ("eagle", 0.0, 1.0), ("eagle3", 0.5, 1.0), ("eagle", 0.5, 1.0), ("eagle3", 0.0, 0.25),
    ("eagle", 0.5, 0.0)])
def test_head_loss_scores_the_response_slots_as_the_dense_loss_does(kind, prompt_weight, lookup_weight):
    """head_loss projects only the slots it scores (response slots, not prompt or padding ones; prompt slots too
    with a prompt weight): loss, statistics and gradients equal the dense loss's, at every training-time step; the
    statistics stay over response slots whatever the weight."""
    from specdec.training.train import head_loss

    model = make_model("llama")
    head = _random_head(model, kind, draft_vocab=48)
    head.train()
    g = torch.Generator().manual_seed(5)
    lengths, prompts = torch.tensor([11, 7, 4]), torch.tensor([3, 5, 2])  # ragged rows, right padding
    width = int(lengths.max())
    feature = head.config.fc_in_features if kind == "eagle3" else H
    batch = {"input_ids": torch.randint(3, V, (3, width), generator=g), "top": torch.randint(0, V, (3, width), generator=g),
             "hidden": torch.randn(3, width, feature, generator=g), "final": torch.randn(3, width, H, generator=g),
             "lengths": lengths, "prompt_lengths": prompts}
    # a lookup that drafts some targets right (the verifier's greedy token after that slot) and others wrong
    batch["lookup"] = torch.full((3, width), -1, dtype=torch.long)
    batch["lookup"][:, 2:] = torch.where(torch.rand(3, width - 2, generator=g) < 0.5, batch["top"][:, 1:-1], 1)
    embed, target_head = model.get_input_embeddings(), model.get_output_embeddings()
    results = []
    for loss_fn in (head_loss, _dense_head_loss):
        head.zero_grad()
        loss, stats = loss_fn(head, batch, embed, target_head, 4, prompt_weight=prompt_weight, lookup_weight=lookup_weight)
        loss.backward()
        results.append((loss.detach(), stats, [p.grad.clone() for p in head.parameters() if p.grad is not None]))
    (loss, stats, grads), (dense_loss, dense_stats, dense_grads) = results
    responses_only, responses_stats = head_loss(head, batch, embed, target_head, 4)
    # the prompt slots count, and the lookup's right targets weigh less
    assert (abs(float(responses_only.detach()) - float(loss)) > 1e-4) == (bool(prompt_weight) or lookup_weight != 1.0)
    assert all(abs(stats[k] - responses_stats[k]) < 1e-6 for k in stats if not k.startswith("loss_"))
    torch.testing.assert_close(loss, dense_loss)
    assert stats.keys() == dense_stats.keys() and all(abs(stats[k] - dense_stats[k]) < 1e-5 for k in stats), (stats, dense_stats)
    assert stats["all_0"] == 8 + 2 + 2 and stats.get("all_1", 9) == 12 - 3  # later steps score fewer (a row's first s go)
    assert len(grads) == len(dense_grads) > 0
    for a, b in zip(grads, dense_grads):
        torch.testing.assert_close(a, b)


def test_training_lowers_the_loss_raises_acceptance_and_resumes(tmp_path, monkeypatch):
    import specdec.training.train as train_module
    from specdec.training.features import FeatureSet, extract_features
    from specdec.training.pipeline import heldout_acceptance
    from specdec.training.train import TrainConfig, init_head, train_head

    model = make_model("llama")
    samples = _self_distilled(model, 24)
    config = HeadConfig.for_verifier(model.config, "eagle3")
    features = FeatureSet(extract_features(model, samples, tmp_path / "features", config.aux_layers,
                                           shard_samples=10, progress=False))
    assert len(features) == 24 and len(list((tmp_path / "features").glob("*.safetensors"))) == 3
    train = TrainConfig(draft_vocab=64, epochs=40, batch_tokens=512, lr=3e-3, warmup=10, save_every=40)
    lines, trims = [], []
    monkeypatch.setattr(train_module, "release_free_memory", lambda: trims.append(1) or True)
    head, summary = train_head(model, features, list(range(24)), tmp_path, train, config, progress=False, log=lines.append)
    assert len(trims) == summary["steps"] // train_module.TRIM_EVERY > 0  # a CPU run hands free heap pages back
    first, last = summary["history_first"], summary["final"]
    progress = [m for m in lines if m.startswith("step ")]  # no bar: a line per checkpoint
    assert len(progress) == summary["steps"] // 40 + (summary["steps"] % 40 > 0) and progress[0].startswith(
        f"step 40 of {summary['steps']}: loss ") and "s a step" in progress[-1], lines
    assert last["loss_0"] < first["loss_0"] - 0.1 and last["acc_0"] > first["acc_0"]
    untrained = init_head(config, model, torch.nonzero(head.t2d).flatten())
    untrained.attach(model.get_input_embeddings(), model.get_output_embeddings())
    trained_rate, trained_len = heldout_acceptance(model, head, samples[:6], 4, 24)
    untrained_rate, _ = heldout_acceptance(model, untrained.eval(), samples[:6], 4, 24)
    assert trained_rate > untrained_rate + 0.05 and trained_len > 1.0
    # a rerun finds the last checkpoint and has nothing left to do
    again, resumed = train_head(model, features, list(range(24)), tmp_path, train, config, progress=False, log=lambda m: None)
    assert resumed["steps"] == summary["steps"] and resumed["resumed_from"] == summary["steps"]
    for (name, a), b in zip(head.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name


def test_train_head_cli_rejects_bad_inputs_before_loading(tmp_path, capsys):
    from specdec.cli import main

    assert main(["train-head", "--data", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "prompt": ""}\n')
    assert main(["train-head", "--data", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err
    good = tmp_path / "good.jsonl"
    good.write_text('{"id": 1, "prompt": "hi"}\n')
    (tmp_path / "file").write_text("x")
    assert main(["train-head", "--data", str(good), "--out", str(tmp_path / "file")]) == 2
    assert "is a file" in capsys.readouterr().err
    assert main(["train-head", "--data", str(good), "--out", str(tmp_path / "o"), "--model", "/no/such/model"]) == 2
    assert "neither" in capsys.readouterr().err
