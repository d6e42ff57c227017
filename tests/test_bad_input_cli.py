"""Every bad input a one-line error (issue 44): ``--draft`` names, ``--device``, head-report data and registered
drafters are refused with one ``error:`` line, before the model loads wherever that can be known.

Tiny local models throughout; the loader is replaced by one that fails the test where nothing may load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import specdec
import specdec.cli
import specdec.user_input
import specdec.models
import specdec.prompts
from specdec import draft_registry
from specdec.cli import DeviceError, check_device, check_model_and_draft, main
from specdec.draft_spec import DraftSpecError, DrafterKind, parse_draft, register_drafter, register_kind
from specdec.draft_registry import MAX_NAME_CHAIN, DrafterTypeError
from specdec.drafters import PromptLookupDrafter, resolve_drafter
from specdec.eval.__main__ import main as eval_main
from tiny_models import VOCAB, char_tokenizer, make_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny two-layer llama saved with a character tokenizer, and a one-prompt data set beside it."""
    root = tmp_path_factory.mktemp("bad-input")
    make_model("llama").save_pretrained(root / "llama")
    char_tokenizer().save_pretrained(root / "llama")
    (root / "prompts.jsonl").write_text(json.dumps({"prompt": "Name a fruit."}) + "\n")
    return root


@pytest.fixture
def no_load(monkeypatch):
    """Loading a model or reading prompts fails the test: the error must come first."""
    def refuse(*_, **__):
        raise AssertionError("nothing may load for a bad argument")

    monkeypatch.setattr(specdec.models, "load_model", refuse)
    monkeypatch.setattr(specdec.prompts, "load_prompts", refuse)


@pytest.fixture
def registry(monkeypatch):
    """A test's registered kinds are gone after it."""
    monkeypatch.setattr(draft_registry, "_KINDS", dict(draft_registry._KINDS))


def _one_line(message: object, *needles: str) -> str:
    assert isinstance(message, str) and message.startswith("error: ") and "\n" not in message, message
    for needle in needles:
        assert needle in message, message
    return message


def _generate(tiny_dir, draft: str) -> list[str]:
    return ["generate", "--model", str(tiny_dir / "llama"), "--draft", draft, "--prompt", "Name a fruit.",
            "--max-new-tokens", "3", "--no-chat-template"]


def _eval(tiny_dir, tmp_path, *extra: str, via_specdec: bool = False) -> list[str]:
    argv = ["--model", str(tiny_dir / "llama"), "--dataset", str(tiny_dir / "prompts.jsonl"), "--max-new-tokens", "3",
            "--baselines", "hf", "--out", str(tmp_path / "out"), "--no-progress", "--no-plots", "--no-warmup", *extra]
    return ["eval", *argv] if via_specdec else argv


# --- 1. layer-skip:N against the verifier's layer count ------------------------------------------------------------


@pytest.mark.parametrize("command", ["generate", "eval"])
def test_a_layer_count_past_the_verifier_fails_before_it_loads(tiny_dir, tmp_path, no_load, command):
    argv = _generate(tiny_dir, "layer-skip:999") if command == "generate" else \
        _eval(tiny_dir, tmp_path, "--draft", "layer-skip:999", via_specdec=True)
    with pytest.raises(SystemExit) as err:
        main(argv)
    _one_line(err.value.code, "--draft layer-skip:999:", "1 <= N < 2", "got 999")


@pytest.mark.parametrize("command", ["generate", "eval"])
def test_without_a_readable_config_the_count_is_checked_after_loading(tiny_dir, tmp_path, monkeypatch, command):
    monkeypatch.setattr(specdec.user_input, "_verifier_config", lambda model: None)  # the layer count cannot be known early
    argv = _generate(tiny_dir, "layer-skip:2") if command == "generate" else \
        _eval(tiny_dir, tmp_path, "--draft", "layer-skip:2", via_specdec=True)
    with pytest.raises(SystemExit) as err:
        main(argv)
    _one_line(err.value.code, "layer-skip needs 1 <= N < 2", "got 2")


def test_the_api_refuses_the_count_as_a_draft_spec_error():
    with pytest.raises(DraftSpecError, match="1 <= N < 2"):
        specdec.SpeculativeModel(make_model("llama"), "layer-skip:5")


@pytest.mark.slow
def test_the_embedded_gguf_models_layer_count_is_read_before_it_loads(no_load):
    with pytest.raises(SystemExit) as err:
        check_model_and_draft("smollm2", "layer-skip:30")
    _one_line(err.value.code, "--draft layer-skip:30:", "1 <= N < 30")
    check_model_and_draft("smollm2", "layer-skip:29")


def test_the_process_prints_one_line_and_no_traceback(tiny_dir):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "specdec.cli", *_generate(tiny_dir, "layer-skip:999")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: --draft layer-skip:999:")


# --- 2. digits are ASCII digits ---------------------------------------------------------------------------------


@pytest.mark.parametrize("count", ["²", "٣", "３", "1²", "⑤"])
def test_unicode_digits_are_not_a_layer_count(count):
    with pytest.raises(DraftSpecError, match="layer-skip needs a layer count >= 1"):
        parse_draft(f"layer-skip:{count}")
    with pytest.raises(SystemExit) as err:
        check_model_and_draft("smollm2", f"layer-skip:{count}")
    _one_line(err.value.code, f"--draft: drafter 'layer-skip:{count}'")


# --- 3. specdec eval checks every --draft before prompts and model ---------------------------------------------


@pytest.mark.parametrize("draft, needle", [
    ("eagle:", "needs a head directory"),
    ("composite:eagle:", "needs a head directory"),
    ("self:int8:junk", "unknown quantization scheme"),
    ("prompt-lookup:abc", "is not a drafter"),
    ("layer-skip:²", "layer-skip needs a layer count"),
    ("eagle:/no/such/head", "does not exist"),
])
@pytest.mark.parametrize("via_specdec", [True, False], ids=["specdec-eval", "python-m-specdec.eval"])
def test_eval_refuses_a_bad_draft_before_reading_prompts_or_loading(tiny_dir, tmp_path, no_load, draft, needle,
                                                                    via_specdec):
    argv = _eval(tiny_dir, tmp_path, "--draft", "prompt-lookup", draft, via_specdec=via_specdec)
    with pytest.raises(SystemExit) as err:
        (main if via_specdec else eval_main)(argv)
    _one_line(err.value.code, "--draft", draft, needle)


def test_eval_refuses_a_missing_model_before_reading_prompts(tmp_path, no_load):
    with pytest.raises(SystemExit) as err:
        eval_main(["--model", str(tmp_path / "missing"), "--out", str(tmp_path / "out")])
    _one_line(err.value.code, "--model", "never downloads")


# --- 4. head-report token ids ----------------------------------------------------------------------------------


@pytest.mark.parametrize("ids, needle", [
    ([-3], "response_ids holds -3"),
    ([True], "response_ids holds true"),
    ([4, 1.5], "response_ids holds 1.5"),
    (["7"], 'response_ids holds "7"'),
])
def test_head_report_refuses_ids_that_are_not_token_ids_before_loading(tmp_path, capsys, no_load, ids, needle):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"prompt": "fine"}) + "\n" + json.dumps({"prompt_ids": [5], "response_ids": ids}) + "\n")
    assert main(["head-report", "--data", str(data)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{data}:2:" in err and needle in err, err


def test_head_report_refuses_ids_past_the_vocabulary_naming_its_size(tiny_dir, tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    good = {"prompt_ids": [5, 6], "response_ids": [7, VOCAB - 1]}
    data.write_text(json.dumps(good) + "\n" + json.dumps({"prompt_ids": [5], "response_ids": [7, VOCAB]}) + "\n")
    head = tmp_path / "head"
    head.mkdir()  # never read: the data fails first
    argv = ["head-report", "--model", str(tiny_dir / "llama"), "--head", str(head), "--data", str(data),
            "--device", "cpu"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after transformers' loading progress
    assert err.startswith("specdec head-report: error: "), err
    assert f"{data}:2:" in err and f"holds {VOCAB}" in err and f"vocabulary of {VOCAB} ids" in err, err


# --- 5. --device ------------------------------------------------------------------------------------------------


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_head_report_device_cuda_without_cuda_is_one_line(tmp_path, capsys, no_load, no_cuda):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"prompt": "hello"}) + "\n")
    assert main(["head-report", "--data", str(data), "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--device 'cuda': CUDA is not available" in err, err


def test_eval_device_cuda_without_cuda_is_one_line(tiny_dir, tmp_path, no_load, no_cuda):
    with pytest.raises(SystemExit) as err:
        main(_eval(tiny_dir, tmp_path, "--draft", "prompt-lookup", "--device", "cuda:0", via_specdec=True))
    _one_line(err.value.code, "--device 'cuda:0': CUDA is not available", "--device cpu")


def test_check_device(monkeypatch):
    assert check_device("cpu") == "cpu"
    with pytest.raises(DeviceError, match="'gpu9' is not a device"):
        check_device("gpu9")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert check_device("cuda:0") == "cuda:0"
    with pytest.raises(DeviceError, match="has 1 CUDA device"):
        check_device("cuda:3")


# --- 6. register_drafter ----------------------------------------------------------------------------------------


def test_a_builder_that_is_not_callable_is_refused(registry):
    with pytest.raises(TypeError, match="must be callable"):
        register_drafter("mine", "not a function")
    with pytest.raises(TypeError, match="build must be a function"):
        register_kind(DrafterKind("mine", "mine", None))
    with pytest.raises(TypeError, match="parse must be a function"):
        register_kind(DrafterKind("mine", "mine", lambda *a: None, parse={}))
    assert "mine" not in draft_registry._KINDS


@pytest.mark.parametrize("prefix", ["my drafter", " mine", "mine\t", "", "a:b", "-mine", "dräft", "it's", "a/b"])
def test_a_prefix_that_cannot_be_typed_in_draft_is_refused(registry, prefix):
    with pytest.raises(ValueError, match="cannot be typed in --draft"):
        register_drafter(prefix, lambda spec, verifier, tok: verifier)
    with pytest.raises(ValueError, match="cannot be typed in --draft"):
        register_kind(DrafterKind(prefix, prefix, lambda *a: None))
    with pytest.raises(TypeError, match="must be a string"):
        register_drafter(3, lambda spec, verifier, tok: verifier)


def test_a_builder_that_names_itself_is_refused_with_the_loop(registry):
    model = make_model("llama")
    register_drafter("loop", lambda spec, verifier, tok: spec)
    with pytest.raises(DraftSpecError, match="lead back to themselves: loop:x -> loop:x"):
        resolve_drafter("loop:x", model)
    register_drafter("ping", lambda spec, verifier, tok: "pong")
    register_drafter("pong", lambda spec, verifier, tok: "ping")
    with pytest.raises(DraftSpecError, match="ping -> pong -> ping"):
        resolve_drafter("ping", model)
    register_drafter("grow", lambda spec, verifier, tok: spec + "1")  # never repeats: the depth limit stops it
    with pytest.raises(DraftSpecError, match=f"more than {MAX_NAME_CHAIN} names"):
        resolve_drafter("grow:1", model)
    register_drafter("alias", lambda spec, verifier, tok: "prompt-lookup")  # a name that leads somewhere still works
    assert isinstance(resolve_drafter("alias", model), PromptLookupDrafter)


@pytest.mark.parametrize("built, needle", [
    (lambda model: torch.nn.Linear(4, 4), "returned a torch.nn.modules.linear.Linear"),
    (lambda model: model.model, "returned a transformers.models.llama.modeling_llama.LlamaModel"),
    (lambda model: None, "returned NoneType None"),
    (lambda model: 7, "returned int 7"),
])
def test_a_builder_returning_no_drafter_or_causal_lm_is_a_type_error(registry, built, needle):
    model = make_model("llama")
    register_drafter("odd", lambda spec, verifier, tok: built(verifier))
    with pytest.raises(TypeError, match=needle) as err:
        resolve_drafter("odd", model)
    assert isinstance(err.value, DrafterTypeError) and isinstance(err.value, DraftSpecError)


@pytest.mark.parametrize("builder, needle", [
    (lambda spec, verifier, tok: spec, "lead back to themselves"),
    (lambda spec, verifier, tok: torch.nn.Linear(4, 4), "Linear"),
])
def test_registered_drafter_errors_are_one_line_in_the_cli(registry, tiny_dir, builder, needle):
    register_drafter("odd", builder)
    with pytest.raises(SystemExit) as err:
        main(_generate(tiny_dir, "odd"))
    _one_line(err.value.code, "--draft odd:", needle)


def test_quantization_scheme_and_device_take_ascii_digits_only():
    """``\\d`` matches any Unicode digit: ``int4:g١٢٨`` must not be read as group 128."""
    from specdec.quant.schemes import _DEVICE_RE, _SCHEME_RE

    assert _SCHEME_RE.match("int4:g128") and not _SCHEME_RE.match("int4:g١٢٨")
    assert _DEVICE_RE.match("cuda:1") and not _DEVICE_RE.match("cuda:١")


def test_train_head_device_cuda_without_cuda_is_one_line(tmp_path, capsys, no_cuda):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"question {i}?", "group": "g"}) + "\n" for i in range(4)))
    code = main(["train-head", "--data", str(data), "--out", str(tmp_path / "out"), "--device", "cuda"])
    err = capsys.readouterr().err
    assert code == 2 and "--device 'cuda': CUDA is not available" in err and "Traceback" not in err
