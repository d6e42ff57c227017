"""Issue 44, every bad input a one-line error: a custom drafter's bad proposal, ``prime_verifier``'s arguments and
memory, an empty EAGLE-3 layer list in a head config, and ``samples.jsonl`` lines that parse but hold bad contents."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import specdec
from specdec.drafters import Drafter
from specdec.drafters.base import DraftChain
from specdec.host_trace import HostTrace, sync_report
from specdec.protocol import ProposalError
from specdec.sizing import PlanError
from specdec.trees.tree import DraftTree
from tiny_models import VOCAB, left_padded, make_model, train_inputs


@pytest.fixture(scope="module")
def model():
    return make_model("llama")


# ---- 1. a custom drafter's proposal -----------------------------------------------------------------------------

class _Custom(Drafter):
    """Proposes ``k`` copies of token 5 per row (or what ``bad`` makes of them); trees: a chain-shaped tree."""

    supports_tree = True

    def __init__(self, bad: str | None = None) -> None:
        self.bad = bad

    def propose(self, rows, k, ctx):
        rows_n, n = len(rows), k
        if self.bad == "rows":
            rows_n = max(rows_n - 1, 0) if rows_n > 1 else 2
        if self.bad == "long":
            n = k + 1
        tokens = torch.full((rows_n, n), 5, dtype=torch.long, device=rows.device)
        if self.bad == "float":
            tokens = tokens.float()
        elif self.bad in ("past-vocab", "negative") and n:
            tokens[-1, -1] = 100_000 if self.bad == "past-vocab" else -5
        elif self.bad == "at-vocab" and n:
            tokens[0, 0] = ctx.vocab_size
        probs = None
        if self.bad == "probs" and n:
            probs = torch.full((rows_n, n, ctx.vocab_size - 1), 1.0 / (ctx.vocab_size - 1), device=rows.device)
        return DraftChain(tokens, probs)

    def propose_tree(self, rows, shape, ctx):
        depth = shape.depth + (1 if self.bad == "deep" else 0)
        tokens = torch.full((len(rows), depth), 5, dtype=torch.long, device=rows.device)
        if self.bad == "past-vocab":
            tokens[0, -1] = 100_000
        parents = [[i - 1 for i in range(depth)] for _ in range(len(rows))]
        return DraftTree.from_host(tokens, parents)


def _ids(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    return left_padded([6, 4, 5][:batch]) if batch > 1 else left_padded([6])


@pytest.mark.parametrize("bad, expected", [
    ("long", "proposed 5 drafts per row; this pass asked for at most 4"),
    ("rows", "rows of drafts for a batch of"),
    ("float", "torch.float32 tensor"),
    ("past-vocab", f"token id 100000 (row {{row}}); ids must be in [0, {VOCAB})"),
    ("negative", "token id -5"),
    ("at-vocab", f"token id {VOCAB} (row 0)"),
])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sample"])
def test_a_bad_chain_proposal_is_a_one_line_error_naming_the_drafter(model, bad, expected, batch, sample):
    spec = specdec.SpeculativeModel(model, _Custom(bad), num_draft_tokens=4)
    ids, mask = _ids(batch)
    gen = dict(do_sample=True, generator=torch.Generator().manual_seed(0)) if sample else dict(do_sample=False)
    with pytest.raises(ProposalError) as error:
        spec.generate(ids, attention_mask=mask, max_new_tokens=12, pad_token_id=0, eos_token_id=None, **gen)
    message = str(error.value)
    assert "\n" not in message and message.startswith("drafter _Custom ")
    assert expected.format(row=batch - 1) in message
    # the failed call left nothing behind: a good drafter on the same verifier runs exactly
    out = specdec.SpeculativeModel(model, _Custom(), num_draft_tokens=4).generate(
        ids, attention_mask=mask, max_new_tokens=12, pad_token_id=0, eos_token_id=None, do_sample=False)
    assert torch.equal(out, model.generate(ids, attention_mask=mask, max_new_tokens=12, pad_token_id=0,
                                           eos_token_id=None, do_sample=False))


def test_probs_of_another_vocabulary_are_refused(model):
    spec = specdec.SpeculativeModel(model, _Custom("probs"), num_draft_tokens=3)
    with pytest.raises(ProposalError, match=rf"drafter _Custom proposed probs as a torch.float32 tensor of shape "
                                            rf"\(1, 3, {VOCAB - 1}\); they must be a float tensor \[1, 3, {VOCAB}\]"):
        spec.generate(_ids(1)[0], max_new_tokens=8, do_sample=True, generator=torch.Generator().manual_seed(0),
                      eos_token_id=None, pad_token_id=0)


@pytest.mark.parametrize("bad, expected", [
    ("deep", "proposed drafts 6 deep; this pass asked for at most 5"),
    ("past-vocab", "token id 100000 (row 0)"),
])
def test_a_bad_tree_proposal_is_a_one_line_error_naming_the_drafter(model, bad, expected):
    spec = specdec.SpeculativeModel(model, _Custom(bad), num_draft_tokens=4, tree="dynamic")
    ids, mask = _ids(3)
    with pytest.raises(ProposalError, match="drafter _Custom ") as error:
        spec.generate(ids, attention_mask=mask, max_new_tokens=12, pad_token_id=0, eos_token_id=None, do_sample=False)
    assert expected in str(error.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("tree", [None, "dynamic"])
def test_ids_past_the_vocabulary_on_cuda_are_an_error_not_a_device_assert(tree):
    """On CUDA an embedding lookup past the vocabulary is a device-side assert that ends the process's CUDA context;
    the ids are clamped for the pass and refused after its read, so the process goes on."""
    model = make_model("llama").to("cuda")
    ids, mask = (t.to("cuda") for t in _ids(3))
    bad = specdec.SpeculativeModel(model, _Custom("past-vocab"), num_draft_tokens=4, tree=tree)
    with pytest.raises(ProposalError, match="token id 100000"):
        bad.generate(ids, attention_mask=mask, max_new_tokens=12, pad_token_id=0, eos_token_id=None, do_sample=False)
    torch.cuda.synchronize()  # no pending device-side assert
    out = specdec.SpeculativeModel(model, _Custom(), num_draft_tokens=4, tree=tree).generate(
        ids, attention_mask=mask, max_new_tokens=12, pad_token_id=0, eos_token_id=None, do_sample=False)
    assert out.shape == (3, ids.shape[1] + 12)


@pytest.mark.parametrize("tree", [None, "dynamic"])
def test_checking_a_custom_proposal_costs_no_device_read(model, tree):
    """The ids' range is read with the pass's one read: a custom drafter's pass still reads the device once."""
    spec = specdec.SpeculativeModel(model, _Custom(), num_draft_tokens=4, tree=tree)
    ids, mask = _ids(3)
    with HostTrace() as trace:
        trace.mark_engine()
        spec.generate(ids, attention_mask=mask, max_new_tokens=24, pad_token_id=0, eos_token_id=None, do_sample=False)
    steady = trace.steady()
    assert len(steady) >= 3, sync_report(trace)
    assert max(r.sync_count for r in steady) == 1, sync_report(trace)


# ---- 2. prime_verifier ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, expected", [
    (dict(max_new_tokens=0), "max_new_tokens must be positive, got 0"),
    (dict(max_new_tokens=8, prompt_lengths=[]), "prompt_lengths is empty"),
    (dict(max_new_tokens=8, prompt_lengths=[0]), "each of prompt_lengths must be positive, got 0"),
    (dict(max_new_tokens=8, prompt_lengths=[4, "8"]), "each of prompt_lengths must be an integer, got '8'"),
    (dict(max_new_tokens=8, prompt_lengths=16), "prompt_lengths must be a list of prompt lengths, got 16"),
    (dict(max_new_tokens=8, batch_size=0), "batch_size must be positive, got 0"),
    (dict(max_new_tokens=True), "max_new_tokens must be an integer, got True"),
])
@pytest.mark.parametrize("compiled", [False, True])
def test_prime_verifier_refuses_bad_arguments_in_one_line(model, args, expected, compiled):
    compile_verifier = {"backend": "eager"} if compiled else False
    spec = specdec.SpeculativeModel(model, "prompt-lookup", compile_verifier=compile_verifier)
    with pytest.raises(ValueError) as error:
        spec.prime_verifier(**args)
    assert expected in str(error.value) and "\n" not in str(error.value)


def test_prime_verifier_checks_memory_per_shape_before_priming_any(model, monkeypatch):
    """A 200,000-position prompt needs a cache far over a 4 MiB budget: refused as generate would refuse the call,
    before any shape (the small one included) is primed."""
    monkeypatch.setattr(model.config, "max_position_embeddings", 1 << 20)  # the positions allow it: memory refuses
    spec = specdec.SpeculativeModel(model, "prompt-lookup", compile_verifier={"backend": "eager"},
                                    memory_budget="4MiB")
    primed = []
    monkeypatch.setattr(spec.verifier, "prime_static", lambda shapes, *a, **k: primed.append(shapes) or 0.0)
    with pytest.raises(PlanError, match="not enough memory on cpu: batch 1 x"):
        spec.prime_verifier(8, [4, 200_000])
    assert primed == []
    with pytest.raises(PlanError):  # the same call, as generate sees it
        spec.generate(torch.ones(1, 200_000, dtype=torch.long), max_new_tokens=8)
    assert spec.prime_verifier(8, [4, 6]) == 0.0 and len(primed) == 1


@pytest.mark.parametrize("compiled", [False, True])
def test_prime_verifier_refuses_a_length_past_the_models_positions_at_once(model, compiled, monkeypatch):
    """Issue 59 item 2: a prompt longer than the model's positions is a one-line error before anything compiles."""
    compile_verifier = {"backend": "eager"} if compiled else False
    spec = specdec.SpeculativeModel(model, "prompt-lookup", compile_verifier=compile_verifier)
    # refused before the memory plan and before any shape is primed (nothing compiles: no time spent)
    monkeypatch.setattr(spec.strategy, "for_call", lambda *a, **k: pytest.fail("planned"))
    monkeypatch.setattr(spec.verifier, "prime_static", lambda *a, **k: pytest.fail("primed"))
    positions = model.config.max_position_embeddings
    with pytest.raises(ValueError, match=f"passes the model's {positions} positions") as error:
        spec.prime_verifier(8, [4, 10 ** 6])
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="plus max_new_tokens=9 passes"):  # the new tokens count too
        spec.prime_verifier(9, [positions - 8])


# ---- 3. a head config with an empty layer list ------------------------------------------------------------------

@pytest.mark.parametrize("where", ["eagle_config", "top"])
def test_an_empty_eagle3_layer_list_is_refused(where):
    from specdec.heads.config import HeadConfig

    data = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": VOCAB}
    if where == "eagle_config":
        data["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": []}
    else:
        data["eagle_aux_hidden_state_layer_ids"] = []
    with pytest.raises(ValueError, match="eagle_aux_hidden_state_layer_ids is empty"):
        HeadConfig.from_json(data, "eagle3", 4)
    # absent: the default layers, as before
    data.pop("eagle_config", None), data.pop("eagle_aux_hidden_state_layer_ids", None)
    assert HeadConfig.from_json(data, "eagle3", 8).aux_layers == (2, 4, 5)


def test_a_head_directory_with_an_empty_layer_list_is_refused_in_one_line(model, tmp_path):
    from specdec.heads.checkpoint import HeadLoadError, load_head, save_head
    from specdec.heads.config import HeadConfig
    from specdec.heads.modules import EagleHead

    head = EagleHead(HeadConfig.for_verifier(model.config, "eagle3"))
    save_head(head, tmp_path / "head")
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = []
    (tmp_path / "head" / "config.json").write_text(json.dumps(config))
    with pytest.raises(HeadLoadError, match="eagle_aux_hidden_state_layer_ids is empty") as error:
        load_head(tmp_path / "head", model)
    assert "\n" not in str(error.value)


# ---- 4. samples.jsonl lines that parse but hold bad contents ----------------------------------------------------

BAD_SAMPLES = {
    "past-vocab": lambda row: {**row, "response_ids": row["response_ids"][:-1] + [100_000]},
    "negative": lambda row: {**row, "prompt_ids": [-5] + row["prompt_ids"]},
    "no-prompt-ids": lambda row: {k: v for k, v in row.items() if k != "prompt_ids"},
    "string-ids": lambda row: {**row, "response_ids": [str(t) for t in row["response_ids"]]},
    "bool-ids": lambda row: {**row, "response_ids": [True] * len(row["response_ids"])},
    "list-id": lambda row: {**row, "id": [row["id"]]},
    "no-source": lambda row: {k: v for k, v in row.items() if k != "source"},
}


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    """A tiny verifier as a local model directory, a prompt file, and a data-only train-head run over them."""
    from specdec.cli import main

    root = train_inputs(tmp_path_factory.mktemp("bad_samples"), prompts=6)
    assert main(_train_args(root, root / "made", "data")) == 0
    return root


def _train_args(root: Path, out: Path, stop: str) -> list[str]:
    return ["train-head", "--model", str(root / "m"), "--data", str(root / "data.jsonl"), "--out", str(out),
            "--self-prompts", "0", "--max-new-tokens", "6", "--gen-batch", "4", "--stop-after", stop, "--json"]


@pytest.mark.parametrize("bad", list(BAD_SAMPLES))
def test_a_sample_line_with_bad_contents_is_dropped_and_made_again(tiny_data, tmp_path, bad, capsys):
    """The features stage after it (and every rerun) used to crash on it; the rerun now makes the row again and
    writes the file whole, the other rows untouched."""
    from specdec.cli import main

    out = tmp_path / "head"
    shutil.copytree(tiny_data / "made", out)
    path = out / "work" / "samples.jsonl"
    good = [json.loads(line) for line in path.read_text().splitlines()]
    broken = BAD_SAMPLES[bad](good[1])
    path.write_text("".join(json.dumps(r) + "\n" for r in [good[0], broken, *good[2:]]))
    capsys.readouterr()
    assert main(_train_args(tiny_data, out, "features")) == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(rows, key=lambda r: r["id"]) == sorted(good, key=lambda r: r["id"])  # greedy: made the same again
    assert rows[:len(good) - 1] == [good[0], *good[2:]]  # the others kept as they were, the remade row appended
    assert (out / "work" / "features").is_dir()


def test_a_sample_made_past_the_vocabulary_is_refused(tmp_path):
    """A row that reading would drop is never written (it would be made again, and dropped, on every run)."""
    from specdec.training.distill import _check_made, sample_row
    from specdec.training.prompts import TrainHeadError

    with pytest.raises(TrainHeadError, match=r"the row made for id 'p1' cannot go in .*samples.jsonl: its token ids "
                                             r"lie outside the verifier's vocabulary"):
        _check_made(tmp_path / "samples.jsonl", {"id": "p1", "group": "g", "source": "s", "license": "l",
                                                 "prompt_ids": [3, VOCAB], "response_ids": [4]}, sample_row(VOCAB))
