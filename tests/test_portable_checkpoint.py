"""Portable training checkpoints (``specdec.training.portable``): a run packed into a small bf16 checkpoint
without optimizer state resumes, on a machine that lost its ``runs/``, from the packed step with the packed
weights and a second warm-up; another head's checkpoint is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tiny_models import make_model, tiny_head_features


@pytest.fixture()
def setup(tmp_path):
    model = make_model("llama")
    features, config = tiny_head_features(model, tmp_path / "features")
    return model, features, config


def _train(setup, out: Path, *, stop_at: int | None = None, draft_vocab: int = 32, monkeypatch=None, log=None):
    """``train_head`` into ``out`` (4 epochs, a checkpoint every 2 steps); ``stop_at``: interrupted right after
    that step's checkpoint, as a session that ends."""
    import specdec.training.train as train_mod

    model, features, config = setup
    if stop_at is not None:
        real = train_mod.save_checkpoint

        def save_then_stop(accelerator, checkpoints, step, trainer):
            real(accelerator, checkpoints, step, trainer)
            if step == stop_at:
                raise KeyboardInterrupt

        monkeypatch.setattr(train_mod, "save_checkpoint", save_then_stop)
    train = train_mod.TrainConfig(draft_vocab=draft_vocab, epochs=4, batch_tokens=64, warmup=2, save_every=2, lr=1e-2)
    head_config = type(config)(**{**vars(config)})
    return train_mod.train_head(model, features, list(range(6)), out, train, head_config, progress=False,
                                log=log or (lambda m: None))


def test_pack_unpack_and_resume_from_the_packed_step(setup, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from specdec.training.portable import PORTABLE_KEY, pack_checkpoint, unpack_checkpoint
    from specdec.training.checkpoints import trainer_state

    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        _train(setup, run, stop_at=4, monkeypatch=monkeypatch)
    monkeypatch.undo()
    full = load_file(str(run / "checkpoints" / "step-4" / "model.safetensors"))
    trainer = pack_checkpoint(run, tmp_path / "pack")
    assert trainer["step"] == 4 and trainer[PORTABLE_KEY]["from"] == "step-4"
    packed = load_file(str(tmp_path / "pack" / "model.safetensors"))
    assert set(packed) == set(full) and not (tmp_path / "pack" / "optimizer.bin").exists()
    for k, v in full.items():  # floats rounded to bf16, the draft vocabulary's integer maps exact
        assert torch.equal(packed[k], v.to(torch.bfloat16) if v.is_floating_point() else v), k

    shutil.rmtree(run / "checkpoints")  # the machine lost runs/ (features are recomputed: here, kept)
    restored = unpack_checkpoint(tmp_path / "pack", run)
    assert restored == run / "checkpoints" / "step-4" and trainer_state(restored)[PORTABLE_KEY]
    assert unpack_checkpoint(tmp_path / "pack", run) is None  # already there: nothing to do

    import specdec.training.train as train_mod

    loaded, lrs = {}, []
    real_load = train_mod.load_portable

    def spy_load(head, path):
        real_load(head, path)
        loaded.update({k: v.detach().clone() for k, v in head.state_dict().items()})

    real_step = torch.optim.AdamW.step

    def spy_step(self, *a, **kw):
        lrs.append(self.param_groups[0]["lr"])
        return real_step(self, *a, **kw)

    monkeypatch.setattr(train_mod, "load_portable", spy_load)
    monkeypatch.setattr(torch.optim.AdamW, "step", spy_step)
    lines: list[str] = []
    head, summary = _train(setup, run, log=lines.append)
    assert summary["resumed_from"] == 4 and summary["steps"] == summary["total_steps"] > 4
    assert any("portable" in line for line in lines)
    for k, v in packed.items():  # resumed from exactly the packed weights
        assert torch.equal(loaded[k].to(v.dtype), v) if v.is_floating_point() else torch.equal(loaded[k], v), k
    # the schedule continues at step 4, warmed up again over 2 steps: half, then the full cosine value
    import math

    total = summary["total_steps"]
    cosine = [0.5 * (1 + math.cos(math.pi * s / total)) for s in (4, 5)]
    assert lrs[0] == pytest.approx(1e-2 * cosine[0] * 0.5) and lrs[1] == pytest.approx(1e-2 * cosine[1])
    assert len(lrs) == total - 4


def test_a_portable_checkpoint_of_another_head_is_refused(setup, tmp_path, monkeypatch):
    from specdec.training.portable import pack_checkpoint, unpack_checkpoint
    from specdec.training.prompts import TrainHeadError

    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        _train(setup, run, stop_at=2, monkeypatch=monkeypatch)
    monkeypatch.undo()
    pack_checkpoint(run, tmp_path / "pack")
    other = tmp_path / "other"
    unpack_checkpoint(tmp_path / "pack", other)
    with pytest.raises(TrainHeadError, match="another head"):
        _train(setup, other, draft_vocab=16)  # another draft-vocabulary size: other shapes


def test_pack_and_unpack_refuse_what_is_not_a_checkpoint(tmp_path, capsys):
    from specdec.training.portable import main

    (tmp_path / "run" / "checkpoints" / "step-2").mkdir(parents=True)  # an interrupted save: not whole
    assert main(["pack", str(tmp_path / "run"), str(tmp_path / "pack")]) == 2
    assert "no whole checkpoint" in capsys.readouterr().err and not (tmp_path / "pack").exists()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "model.safetensors").write_bytes(b"x")
    (tmp_path / "src" / "trainer.json").write_text(json.dumps({"step": 3}))  # whole-looking, not portable
    assert main(["unpack", str(tmp_path / "src"), str(tmp_path / "run")]) == 2
    assert "not a portable checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "run" / "checkpoints" / "step-3").exists()


def test_a_checkpoint_exports_as_a_head_that_drafts_as_the_trained_one(setup, tmp_path, monkeypatch):
    """A mid-run checkpoint, full or packed, becomes a head directory whose logits are the trained head's."""
    from specdec.heads.checkpoint import load_head
    from specdec.training.portable import export_head, pack_checkpoint
    from specdec.training.prompts import TrainHeadError

    model = setup[0]
    run = tmp_path / "run"
    head, _ = _train(setup, run)
    final = sorted((run / "checkpoints").glob("step-*"), key=lambda p: int(p.name.split("-")[1]))[-1]
    pack_checkpoint(run, tmp_path / "pack")
    trained = {k: v for k, v in head.state_dict().items() if not k.startswith("rotary_emb.")}
    for source in (final, tmp_path / "pack"):
        exported = load_head(export_head(source, model, tmp_path / f"head-{source.name}"), model).state_dict()
        for k, v in trained.items():  # every tensor where the trained head has it (bf16-rounded)
            want = v.to(torch.bfloat16) if v.is_floating_point() else v
            assert torch.equal(exported[k].to(want.dtype), want), k
    with pytest.raises(TrainHeadError, match="not a whole"):
        export_head(tmp_path, model, tmp_path / "nothing")
