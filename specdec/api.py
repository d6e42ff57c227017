"""Public API: ``generate``, the :class:`SpeculativeModel` wrapper and ``patch``.

Everything here mirrors ``transformers``' ``model.generate``: same arguments, same return types
(a tensor of sequences, or a ``GenerateDecoderOnlyOutput`` when ``return_dict_in_generate``).
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Iterable

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation.utils import GenerateDecoderOnlyOutput

from specdec.arguments import prepare_generation
from specdec.costs import VerifyCost
from specdec.drafters import Drafter, resolve_drafter
from specdec.drafters.base import wants_graphs
from specdec.drafters.grammar import constrained_drafter
from specdec.engine import speculative_generate
from specdec.models import check_torch_for_transformers
from specdec.runners.hf import CausalLMRunner
from specdec.sizing.configs import max_positions
from specdec.sizing.memory import check_count
from specdec.stats import SpecStats
from specdec.strategy import Strategy

DEFAULT_NUM_DRAFT_TOKENS = 4

#: the verifier's attributes a SpeculativeModel exposes: what ``generate``'s callers and pipelines read
_FORWARDED = frozenset({
    "config", "generation_config", "device", "dtype", "can_generate", "name_or_path", "main_input_name",
    "framework", "get_input_embeddings", "get_output_embeddings", "_supports_cache_class", "_is_stateful",
    "prepare_inputs_for_generation", "eval", "training",
})


@dataclass
class SpeculativeOutput(GenerateDecoderOnlyOutput):
    """``GenerateDecoderOnlyOutput`` plus the call's :class:`SpecStats` as ``spec_stats``."""

    spec_stats: SpecStats | None = None


class SpeculativeModel:
    """Wrap a causal LM (the verifier) and a drafter; ``.generate`` is a drop-in for ``model.generate``.

    Args:
        model: the verifier, any supported transformers causal LM.
        draft: a :class:`~specdec.drafters.Drafter`, a causal LM sharing the vocabulary, a drafter name
            (``"self:int8"``, ``"prompt-lookup"``, ...: ``specdec generate --help`` lists them) or a local path.
            ``"auto"``: the candidate with the best tokens a second measured here, chosen at :meth:`prime` or the
            first call (:mod:`specdec.drafters.auto`; needs ``tokenizer``; ``last_stats.draft_choice`` says why).
        num_draft_tokens: tokens drafted per verifier pass (``k``).
        tokenizer / draft_tokenizer: optional, used to check the vocabularies match exactly and for
            ``stop_strings``.
        memory_budget: bytes (or a string like ``"8GiB"``) the caches of one call may use; default:
            what is free on the model's device. A call whose caches cannot fit fails before any compute.
        adaptive: choose the draft length per pass (up to the call's ``k``), ``k = 0`` included where drafting does
            not pay (:class:`~specdec.chains.AdaptiveDraftLength`). Without a ``generator`` the wall-clock
            estimates carry over between calls; a seeded call uses a fresh, clock-free policy, so it reproduces.
        compile_drafter: ``torch.compile`` the drafter's model (or head), the first calls compiling; output is
            unaffected. ``"graphs"`` (heads, model drafters): each greedy chain draft one raw CUDA graph per (batch,
            ``k``), captured at first use (:mod:`specdec.runners.capture`); on CUDA ``True`` means ``"graphs"``.
        tree: verify a tree of drafts per pass (:mod:`specdec.trees`): ``"static"``, a list of paths of top-k
            ranks, ``"dynamic"`` (EAGLE-2), a dict of :class:`~specdec.trees.TreeConfig` fields, or ``"auto"``
            (sized per pass from the verifier's measured cost and the drafter's calibrated confidence). Output is
            unchanged. Drafters: heads, model drafters (another tokenizer's too), prompt lookup, composite.
        tree_cost / tree_draft_step: for ``tree="auto"``, a :class:`~specdec.costs.VerifyCost` and one drafter
            pass in seconds to use instead of measuring them on first use (:meth:`measure_tree_cost`); pin both
            (``stats.tree["verify_cost"]``, ``stats.tree["draft_step_s"]``) to reproduce seeded calls elsewhere.
        compile_verifier: every verify pass after the prefill over a static cache (a chain padded to k+1, a tree to
            a few widths) through ``torch.compile``; on CUDA ``True`` is raw CUDA graphs of inductor's fused kernels
            (:data:`CUDA_COMPILE`); :meth:`prime_verifier` compiles up front. Greedy output stays
            ``model.generate``'s up to float near-ties. A dict is passed to ``torch.compile``.
            ``"graphs"``: no ``torch.compile``; each pass shape of the eager forward is captured as a raw CUDA
            graph at its first use (seconds, not minutes) and replayed after (:mod:`specdec.runners.capture`).
        verify: the rule for sampled drafts (:mod:`specdec.rules`): ``"token"``, ``"block"`` (chains) or ``"traversal"``
            (trees; under sampling a ``static`` one draws its children). Greedy: every rule alike. ``last_stats.verify``.

    Raises:
        ValueError: a tree whose static ranks or ``top_k`` lie past the verifier's vocabulary, or other
            options no call could use.
        UnsupportedModelError: a tree with a verifier or model drafter that cannot take a tree mask, or
            ``compile_verifier`` with a verifier that cannot (flash / flex attention, sliding windows).
    """

    def __init__(self, model: PreTrainedModel, draft: Any = "self:int8", num_draft_tokens: int = DEFAULT_NUM_DRAFT_TOKENS,
                 tokenizer: Any = None, draft_tokenizer: Any = None, memory_budget: int | str | None = None,
                 adaptive: bool = False, compile_drafter: bool | str = False, tree: Any = None,
                 tree_cost: VerifyCost | None = None, tree_draft_step: float | None = None,
                 compile_verifier: bool | str | dict[str, Any] = False, verify: str = "token") -> None:
        cuda = model.device.type == "cuda"
        static_options = _static_options(compile_verifier, compile_drafter, num_draft_tokens, cuda)
        self.model, self.tokenizer, self.num_draft_tokens = model, tokenizer, num_draft_tokens
        self.draft_name = draft if isinstance(draft, str) else type(draft).__name__  # what reports call the drafter
        self.verifier = CausalLMRunner(model, role="verifier")
        self.compile_verifier = compile_verifier is not False
        if self.compile_verifier:
            self.verifier.compile_static(static_options)
        self.drafter: Drafter = resolve_drafter(draft, model, verifier_tokenizer=tokenizer, draft_tokenizer=draft_tokenizer)
        if compile_drafter:
            _compile_drafter(self.drafter, compile_drafter, cuda)
        self.strategy = Strategy(model, self.verifier, self.drafter, adaptive=adaptive, tree=tree, tree_cost=tree_cost,
                                 tree_draft_step=tree_draft_step, memory_budget=memory_budget, max_k=num_draft_tokens,
                                 verify=verify)
        self.last_stats: SpecStats | None = None

    def __getattr__(self, name: str) -> Any:
        # Only what generate's callers and pipelines read from a model (and the strategy's public state); anything
        # else is an error, not a silent reach into the verifier.
        if name in _FORWARDED:
            return getattr(self.model, name)
        if name in ("tree", "tree_cost", "policy", "memory_budget", "verify"):
            return getattr(self.strategy, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r} (the verifier is .model)")

    def generate(self, inputs: torch.Tensor | None = None, generation_config: GenerationConfig | None = None,
                 logits_processor: LogitsProcessorList | None = None, stopping_criteria: StoppingCriteriaList | None = None,
                 prefix_allowed_tokens_fn: Any = None, streamer: Any = None, num_draft_tokens: int | None = None,
                 generator: torch.Generator | None = None, **kwargs: Any) -> torch.LongTensor | SpeculativeOutput:
        """Speculative ``generate``: same arguments and return type as ``model.generate``.

        Extra arguments: ``num_draft_tokens`` (override ``k`` for this call) and ``generator``
        (a ``torch.Generator`` for reproducible sampling). Statistics land in :attr:`last_stats`.
        """
        k = self._k(num_draft_tokens)
        tokenizer = kwargs.pop("tokenizer", self.tokenizer)
        setup = prepare_generation(self.model, inputs, generation_config, logits_processor, stopping_criteria,
                                   prefix_allowed_tokens_fn, tokenizer=tokenizer, **kwargs)
        ids, config = setup.input_ids, setup.config
        if ids.device != self.model.device:
            raise ValueError(f"input_ids are on {ids.device} but the model is on {self.model.device}")
        if ids.shape[0] > 1 and streamer is not None:
            raise NotImplementedError("specdec streams batch size 1 only (rows advance by different amounts per step)")
        scores = bool(config.return_dict_in_generate and config.output_scores)
        logits = bool(config.return_dict_in_generate and config.output_logits)
        if ids.shape[0] > 1 and (scores or logits):
            raise NotImplementedError("output_scores / output_logits are supported for batch size 1 only")
        call = self.strategy.for_call(k, generator, *ids.shape, setup.max_length)
        drafter = constrained_drafter(self.drafter, setup.processors, tokenizer)  # grammar-aware under a grammar
        result = speculative_generate(self.verifier, drafter, setup, call.plan, streamer=streamer, generator=generator,
                                      output_scores=scores, output_logits=logits, slots=call.slots)
        self.last_stats = result.stats
        if not config.return_dict_in_generate:
            return result.sequences
        return SpeculativeOutput(sequences=result.sequences, scores=result.scores, logits=result.logits,
                                 spec_stats=result.stats)

    def prime_verifier(self, max_new_tokens: int, prompt_lengths: Iterable[int] = (1,), batch_size: int = 1,
                       num_draft_tokens: int | None = None, progress: Any = None) -> float:
        """With ``compile_verifier``: compile now every verify-pass shape that calls with these prompt lengths,
        ``batch_size`` and ``max_new_tokens`` will meet, so no timed call compiles; returns the seconds spent
        (0 without ``compile_verifier``). ``progress(done, total)`` is told after each shape. Trees are primed for
        their widest configuration; ``auto`` measures its cost curve first.

        Raises:
            ValueError: ``max_new_tokens``, ``batch_size`` or a prompt length that is not a positive integer, no
                prompt lengths, or a prompt length plus ``max_new_tokens`` past the model's positions (checked with or
                without ``compile_verifier``, before anything compiles).
            specdec.sizing.PlanError: a primed shape whose caches would not fit, as ``generate`` would refuse that
                call; checked for every shape before any is primed.
        """
        lengths = _prompt_lengths(max_new_tokens, prompt_lengths, batch_size, max_positions(self.model.config))
        k = self._k(num_draft_tokens)
        if not self.compile_verifier:
            return 0.0
        calls = [self.strategy.for_call(k, None, batch_size, n, n + max_new_tokens) for n in lengths]  # all checked
        shapes = [(batch_size, call.slots.verifier) for call in calls]
        return self.verifier.prime_static(shapes, calls[0].slots.widths, self.drafter.hidden_layers, progress)

    def prime(self) -> None:
        """Pay now what the first call would: ``draft="auto"``'s choice of drafter (it measures the candidates),
        the drafter's compilation (``compile_drafter``) and ``tree="auto"``'s cost curve."""
        self.drafter.prime()
        self.measure_tree_cost()

    def measure_tree_cost(self) -> VerifyCost | None:
        """``tree="auto"``'s verifier cost curve, measured now if it was neither given (``tree_cost=``) nor measured
        yet; ``None`` for other trees and chains. Call it before timing calls (``specdec eval`` does), or the first
        ``auto`` call pays for the measurement. Thread-safe: concurrent first calls measure once and share the curve."""
        return self.strategy.measure_tree_cost()

    @property
    def compiled_graphs(self) -> int | None:
        """Verify-pass graphs compiled so far for this model (``compile_verifier``); ``None`` without it."""
        static = self.verifier.static
        return None if static is None else static.graphs

    def _k(self, num_draft_tokens: int | None) -> int:
        k = self.num_draft_tokens if num_draft_tokens is None else num_draft_tokens
        _check_k(k)
        return k


#: what ``compile_verifier=True`` means on CUDA: each verify-pass shape captured as a raw CUDA graph of inductor's fused
#: kernels (H200, benchmarks/results/gpu/2026-11-28-h200-v3: the oracle at k=4 4.1x hf-compiled on the 1B shape and
#: 5.6x on the 8B, where torch.compile's own CUDA graphs did not prime within 75 s); a dict still goes to torch.compile
CUDA_COMPILE = {"backend": "graphs", "fuse": True}


def _static_options(compile_verifier: Any, compile_drafter: Any, k: int, cuda: bool = False) -> dict[str, Any] | None:
    """The two ``compile_*`` arguments and ``k`` checked, and torch (one line, not a missing model class, where
    transformers disabled it); ``compile_verifier``'s options for ``compile_static``. ``True`` on CUDA means raw
    graphs of inductor's fused kernels (:data:`CUDA_COMPILE`)."""
    _check_k(k)
    check_torch_for_transformers()
    if not isinstance(compile_verifier, (bool, dict)) and compile_verifier != "graphs":
        raise ValueError(f"compile_verifier must be a bool, 'graphs' or a dict of torch.compile options, "
                         f"got {compile_verifier!r}")
    if compile_drafter not in (True, False, "graphs"):
        raise ValueError(f"compile_drafter must be a bool or 'graphs', got {compile_drafter!r}")
    if compile_verifier is True and cuda:
        return dict(CUDA_COMPILE)
    return {"backend": "graphs"} if compile_verifier == "graphs" else \
        compile_verifier if isinstance(compile_verifier, dict) else None


def _compile_drafter(drafter: Drafter, how: bool | str, cuda: bool = False) -> None:
    """``compile_drafter``: raw CUDA graphs (``"graphs"``, and ``True`` on CUDA for a drafter that captures them) or
    ``torch.compile``; a drafter without either says so."""
    if wants_graphs(drafter, how, cuda):
        drafter.compile_graphs()  # raises, naming the drafter, where there is nothing to capture
        return
    if not drafter.compilable:
        raise ValueError(f"compile_drafter: {type(drafter).__name__} has no model to compile")
    drafter.compile()


def _prompt_lengths(max_new_tokens: int, prompt_lengths: Iterable[int], batch_size: int,
                    positions: int | None) -> list[int]:
    """``prime_verifier``'s arguments checked (against the model's ``positions`` too); its prompt lengths, sorted."""
    check_count("max_new_tokens", max_new_tokens)
    check_count("batch_size", batch_size)
    if isinstance(prompt_lengths, (int, str)) or not isinstance(prompt_lengths, Iterable):
        raise ValueError(f"prompt_lengths must be a list of prompt lengths, got {prompt_lengths!r}")
    lengths = list(prompt_lengths)
    if not lengths:
        raise ValueError("prompt_lengths is empty: name the prompt lengths the calls will have")
    for n in lengths:
        check_count("each of prompt_lengths", n)
    if positions is not None and max(lengths) + max_new_tokens > positions:
        raise ValueError(f"prime_verifier: a prompt of {max(lengths)} tokens plus max_new_tokens={max_new_tokens} "
                         f"passes the model's {positions} positions (max_position_embeddings): no call can have "
                         "that length")
    return sorted(set(lengths))


def _check_k(k: int) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"num_draft_tokens must be a positive integer, got {k!r}")


def generate(model: PreTrainedModel, draft: Any = "self:int8", inputs: torch.Tensor | None = None, **kwargs: Any):
    """One-shot speculative generation: ``SpeculativeModel(model, draft).generate(inputs, **kwargs)``."""
    options = {key: kwargs.pop(key) for key in ("num_draft_tokens", "tokenizer", "draft_tokenizer", "tree") if key in kwargs}
    k = options.pop("num_draft_tokens", DEFAULT_NUM_DRAFT_TOKENS)
    wrapper = SpeculativeModel(model, draft, num_draft_tokens=k, **options)
    return wrapper.generate(inputs, tokenizer=options.get("tokenizer"), num_draft_tokens=k, **kwargs)


def patch(model: PreTrainedModel, draft: Any = "self:int8", **options: Any) -> SpeculativeModel:
    """Make ``model.generate`` speculative in place (pipelines included); undo with :func:`unpatch`.

    Returns the :class:`SpeculativeModel` doing the work (its ``last_stats`` has each call's statistics).
    """
    if hasattr(model, "_specdec_original_generate"):
        raise RuntimeError("this model is already patched by specdec; call specdec.unpatch(model) first")
    wrapper = SpeculativeModel(model, draft, **options)
    model._specdec_original_generate = model.generate
    model._specdec = wrapper

    def generate(self, *args: Any, **kwargs: Any):
        return wrapper.generate(*args, **kwargs)

    generate.__doc__ = SpeculativeModel.generate.__doc__
    model.generate = types.MethodType(generate, model)
    return wrapper


def unpatch(model: PreTrainedModel) -> None:
    """Restore the ``generate`` that :func:`patch` replaced."""
    if not hasattr(model, "_specdec_original_generate"):
        raise RuntimeError("this model is not patched by specdec")
    del model.generate  # the instance attribute; the class method shows through again
    del model._specdec_original_generate
    del model._specdec
