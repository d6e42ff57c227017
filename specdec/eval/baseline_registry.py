"""The registry of ``specdec eval`` baselines (torch-free): :class:`Baseline`, :func:`register_baseline`.

A baseline is a method of ``specdec eval`` that is not specdec (``hf``, ``hf-compiled``, ``hf-assisted[D]``, ...):
one :class:`Baseline` declares everything the evaluation needs to know about it, from how it generates to how the
report and plots show it. It holds no baselines of its own: :mod:`specdec.eval.baselines` declares the built-in
ones and is the module to import, so every baseline name is known wherever methods are read.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from specdec.draft_registry import what  # one wording of bad values in registration errors

#: the kind of specdec's own methods: never a baseline name
SPECDEC = "specdec"

#: name -> declaration, in the order methods are planned and listed
_BASELINES: "dict[str, Baseline]" = {}
#: names of the built-in baselines, which cannot be registered again or unregistered
_BUILTIN: set[str] = set()
#: what a name may hold: it is typed in ``--baselines a,b`` and written ``name[drafter]``, so no ',', '[', ']' or
#: spaces, and no leading '-' (argparse would take it for an option)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


@dataclass(frozen=True)
class BaselineSetup:
    """What a baseline's ``generate_kwargs`` may draw on, once per method (built by ``build_runners``)."""

    model: Any  # the verifier: the model every method generates with
    tokenizer: Any
    draft: str | None  # the method's drafter name (baselines with ``needs_draft``), else None
    assistant: Any  # that drafter's causal LM, for ``model.generate(assistant_model=...)`` (None: it is not one)
    prompt_lookup_num_tokens: int  # the run's ``EvalConfig.prompt_lookup_num_tokens``
    assistant_tokenizer: Any = None  # that drafter's own tokenizer, where its vocabulary is not the verifier's


def model_generate(model: Any, input_ids: Any, **kwargs: Any) -> Any:
    """The default :attr:`Baseline.generate`: plain ``model.generate(input_ids, **kwargs)``."""
    return model.generate(input_ids, **kwargs)


#: ``generate(model, input_ids, **kwargs)`` -> the output ids, prompt included, as ``model.generate`` returns them;
#: ``kwargs`` hold the batch's ``attention_mask``, a timing ``streamer``, the run's generation arguments and the
#: method's own (:attr:`Baseline.generate_kwargs`)
Generate = Callable[..., Any]
#: ``prepare(runner, batches, gen_kwargs, seed)`` -> the fields it adds to each of the method's records, or None
Prepare = Callable[[Any, Sequence[tuple[Any, Any]], Mapping[str, Any], "int | None"], "Mapping[str, Any] | None"]


@dataclass(frozen=True)
class Baseline:
    """One baseline of ``specdec eval``: everything the planner, the runner, the report and the plots need to know.

    Args:
        name: the method name (``--baselines NAME``, ``kind`` in records and ``summary.json``); with
            ``needs_draft`` its methods are named ``NAME[DRAFTER]``.
        generate: ``generate(model, input_ids, **kwargs)`` generates for one (left-padded) batch and returns the
            output ids as ``model.generate`` does (:data:`Generate`); default: ``model.generate``. It runs timed:
            pass the ``streamer`` on to keep the time to first token.
        generate_kwargs: ``generate_kwargs(setup)`` returns the method's own ``generate`` arguments, built once per
            method from a :class:`BaselineSetup` (its drafter's assistant model, the run's settings); the runner's
            ``extra``.
        prepare: ``prepare(runner, batches, gen_kwargs, seed)`` readies the method before anything is timed, in
            place of its warm-up (``hf-compiled`` compiles here): ``batches`` are the ``(input_ids, attention_mask)``
            it will run on; it may set ``runner.extra``; it returns the fields added to each of its records. Graphs
            ``torch.compile`` builds inside the method's timed calls are then counted (``compiled_graphs``).
        needs_draft: runs once per drafter of the run that is a causal LM (transformers' ``assistant_model``), or that
            ``takes_draft`` accepts; the others are skipped with a warning.
        drafts: it drafts and verifies: acceptance figures from transformers' candidate generator (first row), a
            JSON-schema logits processor wrapped for out-of-order scoring. False: a plain method, compared with
            ``hf`` token for token, without acceptance figures.
        batchable: runs batches of more than one prompt (``--batch-size``); False: left out of batched runs with a
            warning (transformers' assisted generation and prompt lookup take one row).
        label: its short name in the progress bar's running speedups (default: ``name``).
        reference_line: matplotlib line keywords (``color``, ``linestyle``, ``label``, ...) of the horizontal line
            at its speedup in the speedup-against-k plot; a baseline with ``needs_draft`` is drawn in its drafter's
            colour unless ``color`` is given. None: not drawn there (its bars are in the per-group plot either way).
        summarize: ``summarize(rows)`` returns more ``summary.json`` figures of its entry from its measured records.
        note: ``note(entry)`` returns a paragraph for the report about its ``summary.json`` entry (``""``: none).
        settings: the :class:`~specdec.eval.EvalConfig` fields its ``generate_kwargs`` reads that other methods
            ignore (``"prompt_lookup_num_tokens"``): recorded in ``eval_config.json`` only when it runs.
        reference: the reference of every run (one baseline only, ``hf``): it always runs, speedups are first
            against it, and ``identical`` counts greedy outputs equal to its own (it has no such count itself).
            :func:`reference_baseline` returns it.
        speedup_key: the ``summary.json`` key under which every method's speedup against it is written too, beside
            ``speedup_vs`` (``hf``: ``"speedup"``; ``hf-compiled``: ``"speedup_vs_hf_compiled"``); null there when
            it did not run. None: in ``speedup_vs`` only.
    """

    name: str
    generate: Generate = model_generate
    generate_kwargs: Callable[[BaselineSetup], Mapping[str, Any]] | None = None
    prepare: Prepare | None = None
    needs_draft: bool = False
    takes_draft: Callable[[str], bool] | None = None  # which drafters a needs_draft baseline runs with (None: causal LMs)
    drafts: bool = False
    batchable: bool = True
    label: str | None = None
    reference_line: Mapping[str, Any] | None = None
    summarize: Callable[[Sequence[Mapping[str, Any]]], Mapping[str, Any]] | None = None
    note: Callable[[Mapping[str, Any]], str] | None = None
    settings: tuple[str, ...] = ()
    reference: bool = False
    speedup_key: str | None = None


def register_baseline(baseline: Baseline, *, builtin: bool = False) -> Baseline:
    """Add a baseline: ``specdec eval --baselines NAME`` (and ``EvalConfig(baselines=[NAME])``) then plan, run,
    record, report and plot it. Returns ``baseline``.

    Raises :class:`ValueError` for a name already registered (:func:`unregister_baseline` it first; a built-in
    baseline cannot be replaced) or one that cannot be typed in ``--baselines``, and :class:`TypeError` for a
    field that should be a function and is not (or a declaration that is not a :class:`Baseline`).
    """
    if not isinstance(baseline, Baseline):
        raise TypeError(f"register_baseline takes a Baseline(name, generate=..., ...), got {what(baseline)}")
    name = baseline.name
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name == SPECDEC:
        raise ValueError(f"a baseline name must be non-empty, typeable in --baselines NAME (ASCII letters, digits, "
                         f"'_', '.', '+', '-'; not starting with '-') and not {SPECDEC!r}, got {name!r}")
    for field in ("generate", "generate_kwargs", "prepare", "summarize", "note"):
        value = getattr(baseline, field)
        if (value is not None or field == "generate") and not callable(value):
            raise TypeError(f"baseline {name!r}: {field} must be a function, got {what(value)}")
    if baseline.reference_line is not None and not isinstance(baseline.reference_line, Mapping):
        raise TypeError(f"baseline {name!r}: reference_line must be a dict of matplotlib line keywords or None, "
                        f"got {what(baseline.reference_line)}")
    if not isinstance(baseline.settings, tuple) or not all(isinstance(s, str) for s in baseline.settings):
        raise TypeError(f"baseline {name!r}: settings must be a tuple of EvalConfig field names, "
                        f"got {what(baseline.settings)}")
    if name in _BASELINES:
        why = "a built-in baseline" if name in _BUILTIN else f"already registered; unregister_baseline({name!r}) first"
        raise ValueError(f"baseline {name!r} is {why}")
    if baseline.reference and any(b.reference for b in _BASELINES.values()):
        raise ValueError(f"baseline {name!r}: the run has one reference, {reference_baseline().name!r}")
    if baseline.speedup_key is not None:
        if not isinstance(baseline.speedup_key, str) or not baseline.speedup_key.isidentifier():
            raise TypeError(f"baseline {name!r}: speedup_key must be a summary.json key (an identifier) or None, "
                            f"got {what(baseline.speedup_key)}")
        taken = [b.name for b in _BASELINES.values() if b.speedup_key == baseline.speedup_key]
        if taken:
            raise ValueError(f"baseline {name!r}: speedup_key {baseline.speedup_key!r} is baseline {taken[0]!r}'s")
    if builtin:
        _BUILTIN.add(name)
    _BASELINES[name] = baseline
    return baseline


def unregister_baseline(name: str) -> Baseline:
    """Remove the baseline ``name`` registered with :func:`register_baseline`; returns its declaration.

    Raises :class:`KeyError` when no baseline has that name, :class:`ValueError` for a built-in one.
    """
    if name in _BUILTIN:
        raise ValueError(f"{name!r} is a built-in baseline and cannot be unregistered")
    if name not in _BASELINES:
        raise KeyError(f"no baseline {name!r} is registered; the baselines are {', '.join(_BASELINES)}")
    return _BASELINES.pop(name)


@contextlib.contextmanager
def registered_baseline(baseline: Baseline) -> Iterator[Baseline]:
    """``with registered_baseline(Baseline(...)):`` the baseline is registered inside the block only."""
    register_baseline(baseline)
    try:
        yield baseline
    finally:
        unregister_baseline(baseline.name)


def get_baseline(name: str) -> Baseline | None:
    """The declaration of baseline ``name`` (a method's ``kind``); None for specdec and names not registered."""
    return _BASELINES.get(name)


def baselines() -> list[Baseline]:
    """Every registered baseline, in the order methods are planned (built-ins first)."""
    return list(_BASELINES.values())


def reference_baseline() -> Baseline:
    """The baseline declared ``reference`` (``hf``): speedups and output identity are measured against it."""
    for baseline in _BASELINES.values():
        if baseline.reference:
            return baseline
    raise LookupError("no baseline is declared the reference (Baseline(..., reference=True))")


def speedup_keys() -> dict[str, str]:
    """``summary.json`` key -> baseline name, for the baselines that declare a ``speedup_key``, in planning order."""
    return {b.speedup_key: b.name for b in _BASELINES.values() if b.speedup_key is not None}


def baseline_names() -> tuple[str, ...]:
    """The registered baseline names, in planning order (what ``--baselines`` accepts)."""
    return tuple(_BASELINES)

