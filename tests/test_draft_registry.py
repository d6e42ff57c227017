"""The one registry of drafter kinds (issue 26): a new kind is one module and one registration call, and
then parses, builds, describes itself and appears in every ``--draft`` help; the built-in kinds keep their
names, errors and help forms."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import pytest
import torch

import specdec
from specdec import draft_registry, draft_spec
from specdec.cli import drafter_summary, main
from specdec.user_input import check_model_and_draft
from specdec.draft_spec import DraftSpecError, DrafterKind, forms, parse_draft, register_drafter, register_kind
from specdec.drafters import Drafter, DraftChain, resolve_drafter
from specdec.eval.methods import has_hf_assistant, plan_methods
from tiny_models import make_model

#: what ``--draft`` help said before the registry; the built-in kinds still read exactly so
BUILTIN_FORMS = ("self:SCHEME (e.g. self:int8), prompt-lookup, suffix[:TOKENS], composite[:SCHEME], composite:eagle[:DIR], "
                 "composite:suffix[:SCHEME], layer-skip:N, eagle[:DIR], mtp, auto, pard:DIR[,quant=SCHEME], dflash:DIR, "
                 "or a local model directory / .gguf file")


@pytest.fixture(autouse=True)
def registry(monkeypatch):
    """The built-in kinds only (other test files register kinds of their own), and a test's are gone after it."""
    monkeypatch.setattr(draft_registry, "_KINDS",
                        {name: kind for name, kind in draft_registry._KINDS.items() if name in draft_registry._BUILTIN})


@pytest.fixture(scope="module")
def model():
    return make_model("llama")


def _help(capsys, argv: list[str]) -> str:
    """``specdec ARGV --help``, whitespace removed (argparse wraps lines, also at hyphens)."""
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return re.sub(r"\s+", "", capsys.readouterr().out)


# --- a new kind: the module ... ------------------------------------------------------------------------


class EchoDrafter(Drafter):
    """Drafts the same token every time."""

    def __init__(self, token: int) -> None:
        self.token = token

    def propose(self, rows, k, ctx):
        return DraftChain(torch.full((len(rows), k), self.token, dtype=torch.long))


def _echo_token(text: str, arg: str | None) -> dict:
    if arg is None or not arg.isdigit():
        raise DraftSpecError(f"drafter {text!r}: echo needs a token id, e.g. echo:7")
    return {}


# --- ... and its registration -------------------------------------------------------------------------


def _register_echo() -> DrafterKind:
    return register_kind(DrafterKind(
        "echo", "echo:TOKEN", lambda spec, verifier, tok, draft_tok: EchoDrafter(int(spec.arg)), parse=_echo_token,
        describe=lambda spec, verifier: {"description": f"{spec.text}: token {spec.arg}, every time", "note": "for tests"},
    ))


def test_a_registered_kind_appears_in_every_draft_help(capsys):
    _register_echo()
    assert forms() == BUILTIN_FORMS.replace(", or ", ", echo:TOKEN, or ")
    for argv in (["demo"], ["generate"], ["eval"]):
        assert "echo:TOKEN" in _help(capsys, argv), argv
    from specdec.eval.__main__ import main as eval_main

    with pytest.raises(SystemExit):
        eval_main(["--help"])
    assert "echo:TOKEN" in capsys.readouterr().out


def test_a_registered_kind_parses_builds_and_describes_itself(model, capsys):
    kind = _register_echo()
    spec = parse_draft("echo:7")
    assert (spec.kind, spec.arg, spec.declared) == ("echo", "7", kind)
    with pytest.raises(DraftSpecError, match="echo needs a token id"):
        parse_draft("echo:x")
    with pytest.raises(SystemExit, match="^error: --draft: drafter 'echo': echo needs a token id"):
        check_model_and_draft("smollm2", "echo")
    check_model_and_draft("smollm2", "echo:7")  # no check declared: nothing more to refuse

    drafter = resolve_drafter("echo:7", model)
    assert isinstance(drafter, EchoDrafter) and drafter.token == 7
    ids = torch.tensor([[5, 17, 33, 8, 41]])
    kwargs = dict(max_new_tokens=8, do_sample=False, eos_token_id=None)
    assert torch.equal(specdec.SpeculativeModel(model, "echo:7").generate(ids, **kwargs), model.generate(ids, **kwargs))

    assert drafter_summary("echo:7", model) == {"weight_error": None, "head_weight_error": None, "grid_bound": None,
                                                "description": "echo:7: token 7, every time", "note": "for tests"}
    assert not has_hf_assistant("echo:7")
    with pytest.warns(UserWarning, match="'echo:7' is not one"):
        methods = plan_methods(baselines=("hf", "hf-assisted"), drafts=("echo:7",))
    assert [m.name for m in methods] == ["hf", "specdec[echo:7,k=4]"]


def test_register_drafter_declares_a_kind_too(model, capsys):
    register_drafter("twin", lambda spec, verifier, tok: verifier, hf_assistant=True)
    spec = parse_draft("twin:anything")
    assert (spec.kind, spec.prefix, spec.hf_assistant) == ("registered", "twin", True)
    assert "twin[:ARGS]" in forms() and "twin[:ARGS]" in _help(capsys, ["demo"])
    assert drafter_summary("twin", model)["description"] == "twin: a registered drafter ('twin')"
    assert resolve_drafter("twin:x", model).model is model  # a causal LM is drafted with as a model drafter


@pytest.mark.parametrize("name", ["self", "prompt-lookup", "composite", "layer-skip", "eagle", "path"])
def test_built_in_kinds_cannot_be_registered(name):
    with pytest.raises(ValueError, match="built-in"):
        register_drafter(name, lambda *a: None)
    with pytest.raises(ValueError, match="built-in"):
        register_kind(DrafterKind(name, name, lambda *a: None))


def test_prefixes_with_a_colon_are_refused():
    with pytest.raises(ValueError, match="contain no ':'"):
        register_drafter("a:b", lambda *a: None)


# --- the built-in kinds, as they were -------------------------------------------------------------------


def test_help_lists_every_built_in_kind(capsys):
    assert forms() == BUILTIN_FORMS == draft_spec.FORMS
    compact = re.sub(r"\s+", "", BUILTIN_FORMS)
    for argv in (["demo"], ["generate"], ["eval"]):
        assert compact in _help(capsys, argv), argv


@pytest.mark.parametrize("text, fields, hf_assistant", [
    ("self:int8", dict(kind="self", scheme="int8"), True),
    (" self:int4:g128+head8 ", dict(kind="self", scheme="int4:g128+head8", text="self:int4:g128+head8"), True),
    ("prompt-lookup", dict(kind="prompt-lookup"), False),
    ("prompt-lookup:3", dict(kind="path"), True),  # prompt lookup takes no argument: a path, as before
    ("composite", dict(kind="composite", scheme="int8"), False),
    ("composite:int4:g128", dict(kind="composite", scheme="int4:g128"), False),
    ("composite:eaglex", dict(kind="composite", scheme="eaglex"), False),
    ("composite:eagle", dict(kind="composite", inner="eagle", head=None, scheme=None), False),
    ("composite:eagle:./h", dict(kind="composite", inner="eagle", head="./h"), False),
    ("layer-skip:3", dict(kind="layer-skip", layers=3), False),
    ("eagle", dict(kind="eagle", head=None), False),
    ("eagle:  /x/y ", dict(kind="eagle", head="/x/y"), False),
    ("/some/dir", dict(kind="path"), True),
    ("eaglex", dict(kind="path"), True),
    ("path:x", dict(kind="path"), True),
])
def test_built_in_names_parse_as_before(text, fields, hf_assistant):
    spec = parse_draft(text)
    assert {f: getattr(spec, f) for f in fields} == fields
    assert spec.hf_assistant is hf_assistant and has_hf_assistant(text) is hf_assistant


@pytest.mark.parametrize("text, message", [
    ("", "a drafter name must be a non-empty string, got ''; use " + BUILTIN_FORMS),
    ("self", "drafter 'self' needs a quantization scheme after ':', e.g. self:int8"),
    ("self:", "drafter 'self:' needs a quantization scheme after ':', e.g. self:int8"),
    ("composite:", "drafter 'composite:' needs a quantization scheme after ':', e.g. composite:int8"),
    ("composite:eagle:", "drafter 'composite:eagle:' needs a head directory after 'eagle:', e.g. composite:eagle:./my-head"),
    ("layer-skip", "drafter 'layer-skip': layer-skip needs a layer count >= 1, e.g. layer-skip:8"),
    ("layer-skip:0", "drafter 'layer-skip:0': layer-skip needs a layer count >= 1, e.g. layer-skip:8"),
    ("layer-skip:x", "drafter 'layer-skip:x': layer-skip needs a layer count >= 1, e.g. layer-skip:8"),
    ("eagle:", "drafter 'eagle:' needs a head directory after ':', e.g. eagle:./my-head"),
])
def test_built_in_errors_read_as_before(text, message):
    with pytest.raises(DraftSpecError) as err:
        parse_draft(text)
    assert str(err.value) == message


@pytest.mark.parametrize("text, message", [
    ("self:int3", "error: --draft self:int3: unknown quantization scheme 'int3'"),
    ("composite:int4:g3", "error: --draft composite:int4:g3: group size must be a power of two"),
    ("eagle:/no/such/head", "error: --draft eagle:/no/such/head: draft head directory '/no/such/head' does not exist"),
    ("composite:eagle:/no/such/head", "error: --draft composite:eagle:/no/such/head: draft head directory "
                                      "'/no/such/head' does not exist"),
    ("no-such-drafter", f"error: --draft 'no-such-drafter' is not a drafter: use {BUILTIN_FORMS}"),
    ("layer-skip:x", "error: --draft: drafter 'layer-skip:x': layer-skip needs a layer count"),
])
def test_the_cli_refuses_unbuildable_names_before_loading(text, message):
    with pytest.raises(SystemExit) as err:
        check_model_and_draft("smollm2", text)
    assert err.value.code.startswith(message)


def test_the_registry_is_torch_free_and_legacy_drafters_are_gone():
    code = ("import sys, specdec.draft_spec, specdec.draft_kinds, specdec.cli; "
            "assert 'torch' not in sys.modules, 'torch imported'; print(specdec.draft_spec.forms())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == BUILTIN_FORMS
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("specdec.drafters.legacy")
    assert not hasattr(specdec.drafters, "LegacyDrafter") and not hasattr(specdec.drafters, "is_legacy_drafter")
