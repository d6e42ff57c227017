"""PARD training's layout (specdec.training.pard): one forward over a sequence and its masked copies gives, for every
item, the logits that drafting would compute for it (the context up to ``x_{t-j}``, then ``j`` masks); COD keeps each
item's dependency; training lowers the loss and writes a checkpoint that ``pard:DIR`` drafts with, exactly."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_model

from specdec.training.pard import pard_example, pard_loss

MASK = 95


@pytest.mark.parametrize("masks", [[MASK], [MASK, 94, 93]])
def test_every_item_sees_what_drafting_shows_it(masks):
    model = make_model("llama", seed=2)
    ids = torch.randint(4, 90, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    ex = pard_example(ids, copies=4, masks=masks, keep=1.0)
    bias = torch.zeros(ex.allowed.shape).masked_fill(~ex.allowed, torch.finfo(torch.float32).min)
    with torch.no_grad():
        logits = model(input_ids=ex.input_ids[None], position_ids=ex.position_ids[None],
                       attention_mask=bias[None, None]).logits[0]
        for i, (j, t) in enumerate(zip(ex.copies.tolist(), ex.position_ids.tolist())):
            block = ids[: t - j + 1] + [masks[min(m, len(masks) - 1)] for m in range(j)]
            expected = model(torch.tensor([block])).logits[0, -1]
            assert torch.allclose(logits[i], expected, atol=1e-4), (j, t)
            assert ex.labels[i] == (ids[t + 1] if t + 1 < len(ids) else -100)


def test_drop_tokens_keep_each_items_dependency():
    ids = list(range(4, 104))
    ex = pard_example(ids, copies=8, masks=[MASK], keep=0.7, floor=0.2, generator=torch.Generator().manual_seed(3))
    items = set(zip(ex.copies.tolist(), ex.position_ids.tolist()))
    counts = torch.bincount(ex.copies).tolist()
    assert counts[0] == 100 and counts[1] == 70 and all(c >= 1 for c in counts)
    assert counts == sorted(counts, reverse=True)
    assert all((j - 1, t - 1) in items for j, t in items if j >= 1)
    assert ex.allowed.diagonal().all()


def test_the_loss_is_finite_and_falls_with_training():
    model = make_model("llama", seed=1).train()
    ids = torch.randint(4, 90, (24,), generator=torch.Generator().manual_seed(5)).tolist()
    ex = pard_example(ids, copies=4, masks=[MASK], keep=1.0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = pard_loss(model, ex)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0]


def test_train_pard_writes_a_drafter_that_drafts_exactly_and_resumes(tmp_path, capsys):
    import json

    from tiny_models import char_tokenizer, left_padded

    import specdec
    from specdec.cli import main
    from specdec.drafters.pard import PardDrafter

    base = tmp_path / "base"
    make_model("llama").save_pretrained(base)
    char_tokenizer().save_pretrained(base)
    data = tmp_path / "data.jsonl"
    gen = torch.Generator().manual_seed(0)
    data.write_text("".join(json.dumps({"prompt_ids": torch.randint(4, 90, (6,), generator=gen).tolist(),
                                        "response_ids": torch.randint(4, 90, (10,), generator=gen).tolist()}) + "\n"
                            for _ in range(6)))
    argv = ["train-pard", "--model", str(base), "--data", str(data), "--out", str(tmp_path / "out"), "--copies", "4",
            "--accumulate", "2", "--lr", "1e-3", "--save-every", "2", "--mask-token", str(MASK)]
    assert main([*argv, "--steps", "2"]) == 0
    assert main([*argv, "--steps", "4"]) == 0  # resumes from step 2
    out = capsys.readouterr().out
    assert "resuming at step 2" in out and "step 4/4" in out and "step 1/4" not in out.split("resuming")[1]
    model_dir = tmp_path / "out" / "model"
    assert json.loads((model_dir / "config.json").read_text())["pard_token"] == MASK
    assert "steps: 4" in (model_dir / "README.md").read_text()
    verifier = make_model("llama")
    spec = specdec.SpeculativeModel(verifier, f"pard:{model_dir}", num_draft_tokens=3)
    assert isinstance(spec.drafter, PardDrafter)
    ids, mask = left_padded([6, 9], seed=1)
    kwargs = dict(max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0, attention_mask=mask)
    assert torch.equal(spec.generate(ids, **kwargs), verifier.generate(ids, **kwargs))
