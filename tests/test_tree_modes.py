"""Tree modes from one table (issue 46): a new mode is one declaration, and every list of modes (``parse_tree``,
``TreeConfig``, ``specdec --tree``, ``specdec eval --tree``, eval method names) reads :data:`TREE_MODES`."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import torch

import specdec
import specdec.trees
from specdec.cli import build_parser
from specdec.eval.__main__ import add_eval_arguments
from specdec.eval.methods import SPECDEC, MethodSpec
from specdec.trees import TREE_MODES, PathTree, TopKTree, TreeConfig, TreeMode, parse_tree
from specdec.trees.modes import describe_modes, register_mode, tree_choices, unregister_mode
from specdec.trees.plan import TreePlan
from tiny_models import make_model, perturbed_copy

ROOT = Path(specdec.__file__).resolve().parent
WIDE = TopKTree("wide", help="two levels of six", defaults={"top_k": 6, "depth": 2, "total_tokens": 24})


@pytest.fixture
def wide():
    """The toy mode, registered for one test and removed after it."""
    register_mode(WIDE)
    yield WIDE
    unregister_mode(WIDE.name)


def _tree_action(parser: argparse.ArgumentParser) -> argparse.Action:
    return next(a for a in parser._actions if "--tree" in a.option_strings)


def _cli_tree_action() -> argparse.Action:
    sub = next(a for a in build_parser("generate")._actions if isinstance(a, argparse._SubParsersAction))
    return _tree_action(sub.choices["generate"])


def test_the_builtin_modes_are_the_table():
    assert tuple(TREE_MODES) == ("static", "dynamic", "auto")
    assert tree_choices() == ("none", *TREE_MODES) == specdec.trees.MODES
    assert isinstance(TREE_MODES["static"], PathTree) and TREE_MODES["static"].grows_paths
    assert [m.sized_per_pass for m in TREE_MODES.values()] == [False, False, True]
    assert [m.caps_to_vocab for m in TREE_MODES.values()] == [False, False, True]
    assert parse_tree("auto").tree_mode is TREE_MODES["auto"]


def test_cli_and_eval_choices_come_from_the_table(wide):
    eval_tree = _tree_action(add_eval_arguments(argparse.ArgumentParser()))
    cli_tree = _cli_tree_action()
    assert tuple(eval_tree.choices) == tuple(cli_tree.choices) == ("none", *TREE_MODES)
    assert "wide" in eval_tree.choices and "wide (two levels of six)" in cli_tree.help
    assert describe_modes() in cli_tree.help
    assert MethodSpec.parse("specdec[self:int8,k=4,tree=wide]").tree == "wide"


def test_no_module_copies_the_list_of_modes():
    # two built-in names side by side in quotes (a tuple, choices=..., a '|'.join) is a copy of the table
    copy = re.compile(r"""["'](static|dynamic|auto)["']\s*,\s*["'](static|dynamic|auto)["']""")
    found = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if copy.search(p.read_text())]
    assert found == []


def test_a_new_mode_is_one_declaration(wide):
    config = parse_tree("wide")
    assert (config.mode, config.top_k, config.depth, config.total_tokens) == ("wide", 6, 2, 24)
    assert config.to_dict() == {"mode": "wide", "top_k": 6, "depth": 2, "total_tokens": 24}
    assert (config.max_nodes, config.max_fed, config.max_depth) == (24, 6, 2)
    assert config.for_call(1) == TreeConfig(mode="wide", top_k=6, depth=1, total_tokens=6)
    assert parse_tree({"mode": "wide", "top_k": 2}).top_k == 2
    with pytest.raises(ValueError, match="top_k=6 is more than the vocabulary of 4"):
        config.fit_vocab(4)
    with pytest.raises(ValueError, match="tree must be one of none.static.dynamic.auto.wide"):
        parse_tree("bushy")
    unregister_mode("wide")
    with pytest.raises(ValueError, match="tree must be one of none.static.dynamic.auto,"):
        parse_tree("wide")
    assert "wide" not in _cli_tree_action().choices
    with pytest.raises(ValueError, match="one of static, dynamic, auto"):
        MethodSpec(SPECDEC, "self:int8", 4, tree="wide")


def test_a_new_mode_generates_greedy_identical(wide):
    model = make_model("llama")
    ids = torch.tensor([[1, 5, 6, 7, 8, 9]])
    spec = specdec.SpeculativeModel(model, perturbed_copy(model, 0.05), tree="wide")
    kwargs = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(spec.generate(ids, **kwargs), model.generate(ids, **kwargs))
    assert spec.last_stats.tree["mode"] == "wide"


def test_a_mode_declares_its_caps_and_its_sizer():
    paths = PathTree("capped", defaults={"choices": ((0,), (1,), (2,), (2, 0), (0, 0))}, caps_to_vocab=True)
    sized = TopKTree("sized", sized_per_pass=True)
    for mode in (paths, sized):
        register_mode(mode)
    try:
        assert parse_tree("capped").fit_vocab(2).choices == ((0,), (1,), (0, 0))  # rank 2 and its child go
        with pytest.raises(ValueError, match="static path rank 2 is out of range"):
            parse_tree([[0], [2]]).fit_vocab(2)
        with pytest.raises(ValueError, match="tree='sized' needs a TreeSizer"):
            TreePlan(parse_tree("sized"))
        TreePlan(parse_tree("dynamic"))  # sized per pass or not: read from the declaration
    finally:
        unregister_mode("capped")
        unregister_mode("sized")


@pytest.mark.parametrize("mode, error", [
    (TopKTree("static"), "built-in tree mode"), (TopKTree("none"), "not 'none'"), (TopKTree("--x"), "lowercase"),
    (TopKTree("w", defaults={"width": 3}), "unknown defaults"),
])
def test_bad_declarations_are_refused(mode, error):
    with pytest.raises(ValueError, match=error):
        register_mode(mode)
    assert tuple(TREE_MODES) == ("static", "dynamic", "auto")


def test_a_mode_is_a_shape_and_builtins_stay():
    with pytest.raises(TypeError, match="PathTree or TopKTree"):
        register_mode(TreeMode("plain"))
    with pytest.raises(ValueError, match="cannot be removed"):
        unregister_mode("auto")
    assert tuple(TREE_MODES) == ("static", "dynamic", "auto")
