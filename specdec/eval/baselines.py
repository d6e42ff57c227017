"""The built-in baselines of ``specdec eval``, one declaration each, and the registry's API (the module to import).

- ``hf``: plain ``model.generate``, the reference for speedups and output identity;
- ``hf-compiled``: ``model.generate(cache_implementation="static")`` with its decode step compiled by
  ``torch.compile`` (transformers' recipe), compiled before timing;
- ``hf-assisted[D]``: ``model.generate(assistant_model=<D's model>)`` with transformers' defaults;
- ``hf-assisted-heuristic[D]``: the same with transformers' ``num_assistant_tokens_schedule="heuristic"``
  (its adaptive draft length);
- ``hf-uag[D]``: the same with ``tokenizer=`` and ``assistant_tokenizer=``, for a drafter whose vocabulary differs
  (transformers' universal assisted generation; batch 1);
- ``hf-dflash[dflash:DIR]``: ``model.generate(assistant_model=<DIR>, speculation_type="dflash")``, transformers'
  DFlash generator (batch 1), for drafters in transformers' layout (it loads no other);
- ``hf-prompt-lookup``: ``model.generate(prompt_lookup_num_tokens=N)``;
- ``hf-mtp``: ``model.generate(use_mtp=True)``, transformers drafting with the model's own MTP layers (batch 1;
  models with MTP weights only: specdec's counterpart is ``specdec[mtp]``).

A new baseline is one ``register_baseline(Baseline(...))`` call (:mod:`specdec.eval.baseline_registry`). Torch-free
at import: what needs torch is imported when a method runs.
"""

from __future__ import annotations

import contextlib
import copy
import time
from typing import Any, Iterator, Mapping, Sequence

from specdec.eval.baseline_registry import (
    Baseline,
    BaselineSetup,
    baseline_names,
    baselines,
    get_baseline,
    model_generate,
    reference_baseline,
    register_baseline,
    registered_baseline,
    speedup_keys,
    unregister_baseline,
)

__all__ = [
    "Baseline", "BaselineSetup", "baseline_names", "baselines", "get_baseline", "model_generate", "reference_baseline",
    "register_baseline", "registered_baseline", "speedup_keys", "unregister_baseline",
]

HF, HF_COMPILED, HF_ASSISTED, HF_PROMPT_LOOKUP = "hf", "hf-compiled", "hf-assisted", "hf-prompt-lookup"
HF_ASSISTED_HEURISTIC = "hf-assisted-heuristic"
HF_MTP = "hf-mtp"
HF_UAG = "hf-uag"
HF_DFLASH = "hf-dflash"
#: the assistant generation settings of ``hf-assisted-heuristic``: transformers' own heuristic schedule
#: (k + 2 after a fully accepted draft, k - 1 otherwise) from its former default start of 5 tokens
HEURISTIC_ASSISTANT = {"num_assistant_tokens_schedule": "heuristic", "num_assistant_tokens": 5}
#: new tokens of each of ``hf-compiled``'s compile calls (enough decode steps to compile the step)
COMPILE_TOKENS = 8
#: device types on which ``generate`` compiles a static-cache decode step without being asked
_AUTO_COMPILE_DEVICES = ("cuda", "xpu", "neuron", "tpu")


# --------------------------------------------------------------------------------------------
# assisted generation
# --------------------------------------------------------------------------------------------


def _assistant(setup: BaselineSetup) -> dict[str, Any]:
    """The drafter's causal LM as transformers' ``assistant_model`` (the very module specdec drafts with); with both
    tokenizers where its vocabulary differs (transformers then drafts across vocabularies, as ``hf-uag`` does)."""
    if setup.assistant is None:
        raise ValueError(f"drafter {setup.draft!r} is not a causal LM: HF assisted generation cannot use it")
    if setup.assistant_tokenizer is None:
        return {"assistant_model": setup.assistant}
    # a copy of the same weights: under sampling transformers prunes the assistant's LM head in place
    # (UniversalSpeculativeDecodingGenerator, assistant_prune_lm_head=True), which would break specdec's drafter
    return {"assistant_model": copy.deepcopy(setup.assistant), "tokenizer": setup.tokenizer,
            "assistant_tokenizer": setup.assistant_tokenizer}


def _transformers_dflash(draft: str) -> bool:
    """Whether ``draft`` is ``dflash:DIR`` with a drafter in transformers' own layout (the only one it loads)."""
    import json
    from pathlib import Path

    kind, _, directory = draft.partition(":")
    config = Path(directory) / "config.json"
    return kind == "dflash" and config.is_file() and \
        json.loads(config.read_text()).get("model_type") == "muse_glimmer_assistant"


def _dflash_assistant(setup: BaselineSetup) -> dict[str, Any]:
    """``hf-dflash``: the drafter's directory loaded by transformers as the assistant of ``speculation_type="dflash"``."""
    from transformers import AutoModel

    p = next(setup.model.parameters())
    assistant = AutoModel.from_pretrained(setup.draft.partition(":")[2], dtype=p.dtype).to(p.device).eval()
    return {"assistant_model": assistant, "speculation_type": "dflash"}


def _universal_assistant(setup: BaselineSetup) -> dict[str, Any]:
    """``hf-uag``: transformers' assisted generation across vocabularies (``assistant_tokenizer=``; greedy: string
    matching, ``AssistedCandidateGeneratorDifferentTokenizers``; sampling: ``UniversalSpeculativeDecodingGenerator``)."""
    if setup.assistant is not None and setup.assistant_tokenizer is None:
        raise ValueError(f"hf-uag drafts across vocabularies: drafter {setup.draft!r} shares the verifier's "
                         "(use hf-assisted), or give its tokenizer (--draft-tokenizer)")
    return _assistant(setup)


@contextlib.contextmanager
def assistant_config(assistant: Any, settings: Mapping[str, Any]) -> Iterator[None]:
    """transformers reads the draft schedule from the assistant's own generation config (and the heuristic schedule
    writes its state back there): set it for one call only, so methods sharing the assistant module do not leak
    settings into each other."""
    config = getattr(assistant, "generation_config", None)
    if config is None:
        yield
        return
    saved = {k: getattr(config, k, None) for k in settings}
    for k, v in settings.items():
        setattr(config, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(config, k, v)


def _generate_heuristic(model: Any, input_ids: Any, **kwargs: Any) -> Any:
    """``hf-assisted-heuristic``: assisted generation under transformers' heuristic draft schedule."""
    with assistant_config(kwargs.get("assistant_model"), HEURISTIC_ASSISTANT):
        return model.generate(input_ids, **kwargs)


def _mtp_kwargs(setup: BaselineSetup) -> dict[str, Any]:
    """``hf-mtp``'s arguments; a model without MTP layers is refused here, in one line, before anything runs."""
    from specdec.drafters.mtp import MtpUnavailableError, mtp_layer_count
    from specdec.drafters.qwen_mtp import is_qwen_mtp

    kind = getattr(setup.model.config, "model_type", type(setup.model).__name__)
    if is_qwen_mtp(setup.model.config):
        raise MtpUnavailableError(f"{HF_MTP}: transformers' use_mtp cannot read the {kind!r} model's mtp.* layers "
                                  "(it drops them on load): leave hf-mtp out of --baselines")
    if mtp_layer_count(setup.model.config) < 1:
        raise MtpUnavailableError(f"{HF_MTP}: model type {kind!r} has no MTP layers (its config sets no "
                                  "num_mtp_layers): leave hf-mtp out of --baselines")
    return {"use_mtp": True}


def _generate_mtp(model: Any, input_ids: Any, **kwargs: Any) -> Any:
    """``hf-mtp``: transformers' own MTP drafting, finding the weights where specdec's ``mtp`` drafter does (at
    ``model.layers.{N + i}`` for the model's own depth ``N``, besides the released checkpoints' layer numbers)."""
    from specdec.drafters.mtp import checkpoint_mtp_patterns

    with checkpoint_mtp_patterns(model):
        return model.generate(input_ids, **kwargs)


# --------------------------------------------------------------------------------------------
# hf-compiled: compiled before timing, its compile cost reported apart
# --------------------------------------------------------------------------------------------


def static_cache_kwargs(model: Any, max_cache_len: int) -> dict[str, Any]:
    """``hf-compiled``'s ``generate`` arguments: a static KV cache of ``max_cache_len``, whose decode step transformers
    compiles.

    transformers' own mechanism is used: with ``cache_implementation="static"`` and a ``compile_config``,
    ``generate`` runs the prefill eagerly and each decode step through ``model.get_compiled_call`` (a
    ``torch.compile`` of the model's ``__call__``, kept on the model as ``_compiled_call``); the model's
    ``forward`` is never replaced. It does so by itself on CUDA/XPU; elsewhere (CPU) ``CompileConfig``'s
    private ``_compile_all_devices`` switch turns it on. Every call gets the same ``max_cache_len`` (the
    longest prompt of the run + ``max_new_tokens``), so every decode step has the same shapes whatever
    the prompt length: one graph per batch size, compiled by :func:`compile_decode_step` before any timed call.
    On CUDA transformers' default compile mode (``reduce-overhead``, CUDA graphs) is used; elsewhere
    ``mode="default"``, the faster of the two without CUDA graphs.
    """
    from transformers import CompileConfig

    config = CompileConfig()  # transformers' defaults: inductor, mode="reduce-overhead", not fullgraph
    if model.device.type != "cuda":
        # "reduce-overhead" means CUDA graphs; without them it is slower than eager on a CPU. Measured on
        # SmolLM2, 128 tokens, static cache: eager 5.4 s, reduce-overhead 6.3 s, default mode 5.3 s.
        config.mode = "default"
    if model.device.type not in _AUTO_COMPILE_DEVICES:
        config._compile_all_devices = True  # generate compiles on accelerators only unless told so
    return {"cache_implementation": "static", "max_cache_len": max_cache_len, "compile_config": config}


def compile_decode_step(runner: Any, batches: Sequence[tuple[Any, Any]], gen_kwargs: Mapping[str, Any],
                        seed: int | None) -> float:
    """Compile ``runner``'s decode step (its ``extra``: :func:`static_cache_kwargs`) for each batch shape in
    ``batches``, untimed; returns the compile seconds.

    Each shape is generated twice: compile time is the first call's wall time less the second's (the
    same call, already compiled).
    """
    new = min(COMPILE_TOKENS, int(gen_kwargs["max_new_tokens"]))
    if new < 2:  # the only new token comes from the (eager) prefill: there is no decode step to compile
        return 0.0
    # min_new_tokens: an early EOS must not end the call before the decode step has run (and compiled)
    kwargs = {**gen_kwargs, "max_new_tokens": new, "min_new_tokens": new}
    total = 0.0
    for ids, mask in {ids.shape[0]: (ids, mask) for ids, mask in batches}.values():
        times = []
        for _ in range(2):
            start = time.perf_counter()
            runner(ids, kwargs, seed, mask)
            times.append(time.perf_counter() - start)
        total += max(0.0, times[0] - times[1])
    if getattr(runner.model, "_compiled_call", None) is None:
        raise RuntimeError(f"{HF_COMPILED}: transformers' generate did not compile the decode step of "
                           f"{type(runner.model).__name__} (its auto-compile criteria were not met)")
    return total


def _compile_before_timing(runner: Any, batches: Sequence[tuple[Any, Any]], gen_kwargs: Mapping[str, Any],
                           seed: int | None) -> dict[str, Any]:
    """One static cache length for the whole run (the widest batch + ``max_new_tokens``), so every decode step has
    the same shapes and nothing recompiles; the decode step compiled for each batch size, untimed."""
    max_cache_len = max(ids.shape[1] for ids, _ in batches) + int(gen_kwargs["max_new_tokens"])
    runner.extra = static_cache_kwargs(runner.model, max_cache_len)
    return {"compile_seconds": compile_decode_step(runner, batches, gen_kwargs, seed), "max_cache_len": max_cache_len}


def _compile_figures(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``hf-compiled``'s compile cost: the untimed compile (largest over the runs that recorded ``rows``) and the
    graphs compiled inside timed calls (each batch counted once)."""
    seconds = [r["compile_seconds"] for r in rows if r.get("compile_seconds") is not None]
    calls = {(r.get("rank"), r.get("batch_index", r["prompt_index"]), r.get("max_cache_len")):
             r.get("compiled_graphs") or 0 for r in rows}
    return {"compile_seconds": round(float(max(seconds)), 4) if seconds else None,
            "compiled_graphs": sum(calls.values()),
            "max_cache_len": max((r.get("max_cache_len") or 0 for r in rows), default=None)}


def _compile_note(entry: Mapping[str, Any]) -> str:
    """The report's paragraph on ``hf-compiled``'s compile cost (excluded from its tokens/s)."""
    seconds = entry.get("compile_seconds")
    note = (f"`{entry['name']}` (static cache, decode step through `torch.compile`) compiled for "
            f"{'-' if seconds is None else format(seconds, '.1f')} s before its first timed call; that time is not "
            "in its tok/s.")
    if entry.get("compiled_graphs"):
        note += f" It compiled {entry['compiled_graphs']} more graph(s) inside timed calls: those are in its tok/s."
    return note


# --------------------------------------------------------------------------------------------
# the declarations, in planning order
# --------------------------------------------------------------------------------------------

register_baseline(Baseline(HF, model_generate, reference=True, speedup_key="speedup"), builtin=True)
register_baseline(Baseline(
    HF_COMPILED, model_generate, prepare=_compile_before_timing, label="compiled",
    reference_line={"color": "gray", "linestyle": "-."},  # the bar a performance-minded user would set
    summarize=_compile_figures, note=_compile_note, speedup_key="speedup_vs_hf_compiled",
), builtin=True)
register_baseline(Baseline(
    HF_ASSISTED, model_generate, generate_kwargs=_assistant, needs_draft=True, drafts=True, batchable=False,
    label="assisted", reference_line={"linestyle": ":"},
), builtin=True)
register_baseline(Baseline(
    HF_ASSISTED_HEURISTIC, _generate_heuristic, generate_kwargs=_assistant, needs_draft=True, drafts=True,
    batchable=False, label="heuristic",
), builtin=True)
register_baseline(Baseline(  # transformers takes one row with assistant_tokenizer=
    HF_UAG, model_generate, generate_kwargs=_universal_assistant, needs_draft=True, drafts=True, batchable=False,
    label="uag",
), builtin=True)
register_baseline(Baseline(  # transformers' DFlashTokenCandidateGenerator takes one row
    HF_DFLASH, model_generate, generate_kwargs=_dflash_assistant, needs_draft=True, drafts=True, batchable=False,
    takes_draft=_transformers_dflash, label="hf-dflash",
), builtin=True)
register_baseline(Baseline(
    HF_PROMPT_LOOKUP, model_generate,
    generate_kwargs=lambda setup: {"prompt_lookup_num_tokens": setup.prompt_lookup_num_tokens},
    drafts=True, batchable=False, label="lookup", settings=("prompt_lookup_num_tokens",),
), builtin=True)
register_baseline(Baseline(  # transformers refuses use_mtp past batch 1 ("assisted generate is only supported ...")
    HF_MTP, _generate_mtp, generate_kwargs=_mtp_kwargs, drafts=True, batchable=False, label="hf-mtp",
), builtin=True)
