"""``specdec train-head --kind dflash``: the training forward is the drafter's (every anchor's block equals the
paper's forward over that prefix), training lowers the block loss, and the command writes a drafter in z-lab's layout
that ``dflash:DIR`` loads, whose greedy output is ``generate``'s, with a card that gives acceptance by position."""

from __future__ import annotations

import json
import random

import pytest
import torch
from test_dflash import BLOCK, LAYERS, MASK, _reference_block, _write_dflash
from tiny_models import left_padded, make_model, train_inputs

import specdec
from specdec.drafters.dflash import DFlashDrafter
from specdec.training.dflash import DFlashRecipe, block_hidden, block_loss, evaluate, new_dflash, train_dflash
from specdec.training.features import FeatureSet, extract_features


def test_every_anchor_of_the_training_forward_is_the_papers_block(tmp_path):
    verifier = make_model("qwen3")
    drafter = DFlashDrafter.from_pretrained(_write_dflash(tmp_path / "d"), verifier)
    seq = torch.randint(4, 90, (23,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        states = verifier(seq[None], output_hidden_states=True).hidden_states
        features = torch.cat([states[i + 1] for i in LAYERS], dim=-1)[0]
        anchors = torch.tensor([3, 9, 15, 20])
        block = torch.full((len(anchors), BLOCK), MASK)
        block[:, 0] = seq[anchors]
        hidden = block_hidden(drafter.dflash, features, verifier.get_input_embeddings()(block), anchors)
        drafts = verifier.get_output_embeddings()(hidden[:, 1:]).argmax(-1)
    for row, a in enumerate(anchors.tolist()):
        assert torch.equal(drafts[row], _reference_block(drafter, verifier, seq[: a + 1])), a


def _features(tmp_path, verifier, count: int = 12, length: int = 40):
    rng = torch.Generator().manual_seed(3)
    samples = [{"id": f"s{i}", "prompt_ids": torch.randint(4, 90, (6,), generator=rng).tolist(),
                "response_ids": torch.randint(4, 90, (length,), generator=rng).tolist()} for i in range(count)]
    layers = tuple(i + 1 for i in (0, 1))
    return FeatureSet(extract_features(verifier, samples, tmp_path / "features", layers, progress=False))


def test_training_lowers_the_block_loss(tmp_path):
    verifier = make_model("llama")
    features = _features(tmp_path, verifier)
    recipe = DFlashRecipe(block_size=4, anchors=8, sequences=2)
    embed, head = verifier.get_input_embeddings(), verifier.get_output_embeddings()
    before = evaluate(new_dflash(verifier, recipe, MASK), features, list(range(12)), embed, head, recipe)
    model, summary = train_dflash(verifier, features, list(range(12)), list(range(12)), tmp_path / "out", recipe,
                                  epochs=8, lr=3e-3, warmup=2, grad_clip=1.0, seed=0, save_every=10,
                                  mask_token_id=MASK, log=lambda m: None)
    assert summary["steps"] == 48
    assert summary["validation"]["loss"] < 0.8 * before["loss"], (before, summary["validation"])
    assert len(summary["validation"]["accuracy_by_position"]) == 3
    # a resumed run goes on from the checkpoint and changes nothing once every step is done
    again, resumed = train_dflash(verifier, features, list(range(12)), list(range(12)), tmp_path / "out", recipe,
                                  epochs=8, lr=3e-3, warmup=2, grad_clip=1.0, seed=0, save_every=10,
                                  mask_token_id=MASK, log=lambda m: None)
    assert resumed["steps"] == 48 and all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                                              again.state_dict().values()))


def test_the_loss_counts_only_targets_inside_the_text():
    verifier = make_model("llama")
    recipe = DFlashRecipe(block_size=5)
    model = new_dflash(verifier, recipe, MASK)
    ids = torch.randint(4, 90, (10,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = verifier(ids[None], output_hidden_states=True)
    sample = {"input_ids": ids, "top": out.logits[0].argmax(-1), "prompt_length": 2,
              "hidden": torch.cat([out.hidden_states[i] for i in (1, 2)], dim=-1)[0]}
    _, counts, hits = block_loss(model, sample, [2, 7, 8], verifier.get_input_embeddings(),
                                 verifier.get_output_embeddings(), 4.0)
    # anchor 2: four targets (tokens 3..6); anchor 7: tokens 8, 9; anchor 8: token 9 only
    assert counts.tolist() == [3, 2, 1, 1] and bool((hits <= counts).all())


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One ``train-head --kind dflash`` run on a tiny Llama and a character tokenizer."""
    from specdec.cli import main

    root = train_inputs(tmp_path_factory.mktemp("train_dflash"))
    args = ["train-head", "--kind", "dflash", "--model", str(root / "m"), "--data", str(root / "data.jsonl"),
            "--out", str(root / "out"), "--self-prompts", "0", "--max-new-tokens", "12", "--epochs", "2",
            "--block-size", "4", "--eval-prompts", "1", "--gen-batch", "4", "--heldout", "0.25", "--json"]
    assert main(args) == 0
    return root, args


def test_train_head_kind_dflash_writes_a_drafter_dflash_dir_loads(trained, capsys):
    root, args = trained
    out = root / "out"
    record = json.loads((out / "training.json").read_text())
    assert record["kind"] == "dflash" and record["steps"] > 0 and record["recipe"]["block_size"] == 4
    config = json.loads((out / "config.json").read_text())["dflash_config"]
    assert config["block_size"] == 4 and config["target_layer_ids"]
    card = (out / "README.md").read_text()
    assert "accuracy by block position" in card and "dflash:DIR" in card
    verifier = make_model("llama")
    spec = specdec.SpeculativeModel(verifier, f"dflash:{out}", num_draft_tokens=3)
    ids, mask = left_padded([5, 9, 3], seed=4)
    kwargs = dict(attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
    assert torch.equal(spec.generate(ids, **kwargs), verifier.generate(ids, **kwargs))
    # the same command again resumes: nothing is trained twice
    from specdec.cli import main

    capsys.readouterr()
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == record["steps"]


def test_bad_block_size_is_refused_in_one_line(trained, capsys):
    from specdec.cli import main

    root, args = trained
    bad = [a if a != "4" else "1" for a in args]
    assert main(bad) == 2
    assert "--block-size must be at least 2" in capsys.readouterr().err


def test_anchors_lie_in_the_response():
    from specdec.training.dflash import _anchors

    sample = {"input_ids": torch.arange(20), "prompt_length": 7}
    got = _anchors(sample, 50, random.Random(0))
    assert got == list(range(7, 19))
