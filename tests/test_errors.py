"""One base class for the errors a user can fix (issue 46): every user-facing error is a ``SpecdecError`` and keeps its
builtin base, internal errors are not, and the command lines print any ``SpecdecError`` as one ``error:`` line."""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path

import pytest

import specdec
import specdec.cli
import specdec.models
from specdec.cli import main
from specdec.errors import ResumeError, SpecdecError

ROOT = Path(specdec.__file__).resolve().parent

#: (module, class, the builtin base it keeps): the errors a user's input or environment causes
USER_FACING = [
    ("specdec.protocol", "ProposalError", ValueError),  # a custom drafter's proposal (the user's code)
    ("specdec.training.prompts", "TrainHeadError", ValueError),
    ("specdec.training.prompts", "TrainDataError", ValueError),
    ("specdec.training.pipeline", "ResumeError", ValueError),
    ("specdec.training.pipeline", "OutLockedError", ValueError),
    ("specdec.training.report_cli", "ReportDataError", ValueError),
    ("specdec.drafters.model", "VocabularyMismatchError", ValueError),
    ("specdec.drafters.shared_vocab", "SharedVocabularyError", ValueError),
    ("specdec.training.pard_cli", "TrainPardError", ValueError),
    ("specdec.heads.dflash", "DFlashLoadError", ValueError),
    ("specdec.drafters.pard", "PardConfigError", ValueError),
    ("specdec.draft_registry", "DraftSpecError", ValueError),
    ("specdec.draft_registry", "DrafterTypeError", TypeError),
    ("specdec.sizing.check", "PlanError", MemoryError),
    ("specdec.heads.checkpoint", "HeadLoadError", ValueError),
    ("specdec.heads.export", "HeadExportError", ValueError),
    ("specdec.constraints.adapt", "UnsupportedProcessorError", TypeError),
    ("specdec.user_input", "DeviceError", ValueError),
    ("specdec.prompts.files", "PromptFileError", ValueError),
    ("specdec.prompts.sets", "DatasetError", ValueError),
    ("specdec.eval.records", "ResumeError", ValueError),
    ("specdec.eval.records", "OutputDirError", ValueError),
    ("specdec.eval.json_schema", "SchemaError", ValueError),
    ("specdec.quant.schemes", "UnknownSchemeError", ValueError),
    ("specdec.quant.schemes", "UnsupportedSchemeError", ValueError),
    ("specdec.quant.schemes", "OffloadedModelError", ValueError),
    ("specdec.models", "ModelNotFoundError", FileNotFoundError),
    ("specdec.models", "MissingDependencyError", FileNotFoundError),
    ("specdec.models", "TorchTooOldError", ImportError),
    ("specdec.runners.hf", "UnsupportedModelError", TypeError),
    ("specdec.drafters.mtp", "MtpUnavailableError", TypeError),  # an UnsupportedModelError: draft="mtp" on a model without MTP
    ("specdec.drafters.suffix_cache", "SuffixCacheError", ValueError),
    ("specdec.drafters.auto", "AutoDraftError", ValueError),
]
#: errors that mean specdec itself is wrong (a broken invariant): a traceback, not a one-line message
INTERNAL = [
    ("specdec.runners.cache", "CacheOverflowError"),  # the engine sizes every cache before a call writes to it
    ("specdec.runners.capture", "CaptureError"),  # a phase that broke a graph's rules: a bug of ours, tested on CPU
]


def _class(module: str, name: str) -> type:
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("module, name, builtin", USER_FACING, ids=[f"{m}.{n}" for m, n, _ in USER_FACING])
def test_a_user_facing_error_is_a_specdec_error_and_keeps_its_builtin_base(module, name, builtin):
    cls = _class(module, name)
    assert issubclass(cls, SpecdecError) and issubclass(cls, builtin)


@pytest.mark.parametrize("module, name", INTERNAL)
def test_an_internal_error_is_not_a_specdec_error(module, name):
    assert not issubclass(_class(module, name), SpecdecError)


def test_every_error_class_is_sorted_into_user_facing_or_internal():
    """A new ``...Error`` class must say which it is (add it to one of the lists above)."""
    found = set()
    for path in ROOT.rglob("*.py"):
        module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error") and node.bases:
                found.add((module, node.name))
    listed = {(m, n) for m, n, _ in USER_FACING} | set(INTERNAL) | {("specdec.errors", "ResumeError"), ("specdec.errors", "SpecdecError")}
    assert found - listed == set()


def test_one_resume_error_for_eval_and_train_head():
    from specdec.eval import ResumeError as from_eval
    from specdec.training import ResumeError as from_training

    assert from_eval is from_training is ResumeError
    assert issubclass(ResumeError, ValueError)


def test_the_base_is_exported_and_its_module_imports_nothing():
    assert specdec.SpecdecError is SpecdecError and "SpecdecError" in specdec.__all__
    tree = ast.parse((ROOT / "errors.py").read_text(encoding="utf-8"))
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [getattr(n, "module", None) for n in imports] == ["__future__"]


# --- the command lines ----------------------------------------------------------------------------------------------


def _one_line(message: object, *needles: str) -> str:
    assert isinstance(message, str) and message.startswith("error: ") and "\n" not in message, message
    for needle in needles:
        assert needle in message, message
    return message


def test_a_specdec_error_raised_from_a_command_is_one_line(monkeypatch):
    from specdec.sizing import PlanError

    def fails(args):
        raise PlanError("not enough memory on cpu: batch 1 x 4096 tokens\nlower --max-new-tokens")

    monkeypatch.setattr(specdec.cli, "cmd_generate", fails)
    with pytest.raises(SystemExit) as err:
        main(["generate", "--prompt", "hi"])
    _one_line(err.value.code, "not enough memory on cpu", "lower --max-new-tokens")


def test_other_errors_keep_their_traceback(monkeypatch):
    def fails(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(specdec.cli, "cmd_generate", fails)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["generate", "--prompt", "hi"])


def test_a_torch_too_old_for_transformers_is_one_line(monkeypatch):
    def too_old(*_, **__):
        raise specdec.models.TorchTooOldError("transformers 5.20 does not run with torch 2.3\npip install 'torch>=2.4'")

    monkeypatch.setattr(specdec.models, "load_model", too_old)
    with pytest.raises(SystemExit) as err:
        main(["generate", "--prompt", "hi", "--max-new-tokens", "2"])
    _one_line(err.value.code, "does not run with torch 2.3", "pip install")


def test_train_head_prints_a_resume_error_in_one_line(tmp_path, capsys, monkeypatch):
    """``specdec train-head`` into an ``--out`` of other settings: eval's ResumeError class, one line."""
    import specdec.training.pipeline as pipeline
    from tiny_models import char_tokenizer, make_model

    make_model("llama").save_pretrained(tmp_path / "llama")
    char_tokenizer().save_pretrained(tmp_path / "llama")
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"question {i}?", "group": "g"}) + "\n" for i in range(4)))

    def differs(*_, **__):
        raise ResumeError("--out was made with --epochs 2; use --overwrite to start afresh")

    monkeypatch.setattr(pipeline, "check_settings", differs)
    monkeypatch.setattr(specdec.models, "load_model", lambda *_, **__: pytest.fail("nothing may load"))
    capsys.readouterr()  # saving the model's progress bars
    code = main(["train-head", "--model", str(tmp_path / "llama"), "--data", str(data), "--out", str(tmp_path / "out"),
                 "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines() == ["specdec train-head: error: --out was made with --epochs 2; use --overwrite "
                                        "to start afresh"]
