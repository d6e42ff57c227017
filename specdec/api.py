"""Public API: ``generate``, the :class:`SpeculativeModel` wrapper and ``patch``.

Everything here mirrors ``transformers``' ``model.generate``: same arguments, same return types
(a tensor of sequences, or a ``GenerateDecoderOnlyOutput`` when ``return_dict_in_generate``).
"""

from __future__ import annotations

import threading
import types
from dataclasses import dataclass
from typing import Any, Iterable

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation.utils import GenerateDecoderOnlyOutput

from specdec.arguments import prepare_generation
from specdec.draft_length import AdaptiveDraftLength, ChainPlan, FixedDraftLength
from specdec.drafters import CompositeDrafter, Drafter, ModelDrafter, resolve_drafter
from specdec.constraints.drafting import constrained_drafter
from specdec.engine import speculative_generate
from specdec.models import check_torch_for_transformers
from specdec.sizing import check_fits
from specdec.sizing.memory import check_count
from specdec.protocol import DraftPlan
from specdec.slots import static_slots
from specdec.stats import SpecStats
from specdec.trees.config import TreeConfig, parse_tree
from specdec.trees.plan import TreePlan
from specdec.trees.sizing import TreeSizer, VerifyCost, measure_verify_cost
from specdec.verifiers.hf import CausalLMRunner, lm_head_rows

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
        draft: a :class:`~specdec.drafters.Drafter`, a causal LM sharing the vocabulary,
            ``"self:SCHEME"`` for a quantized copy of ``model`` (e.g. ``"self:int8"``) or a local path.
        num_draft_tokens: tokens drafted per verifier pass (``k``).
        tokenizer / draft_tokenizer: optional, used to check the vocabularies match exactly and for
            ``stop_strings``.
        memory_budget: bytes (or a string like ``"8GiB"``) the caches of one call may use; default:
            what is free on the model's device. A call whose caches cannot fit fails before any compute.
        adaptive: choose the draft length per step (up to ``num_draft_tokens``, or up to a call's
            own ``num_draft_tokens``) from online acceptance and cost estimates
            (:class:`~specdec.draft_length.AdaptiveDraftLength`), ``k = 0`` (a plain decode step) included
            where drafting does not pay, probing again later (``last_stats.drafted_passes`` counts the
            passes that drafted). Without a ``generator`` the
            wall-clock estimates carry over between calls; a call given a seeded ``generator`` uses a
            fresh policy whose choices depend on accepted counts only (no clock), so it is reproducible.
        compile_drafter: run the drafter's model (or draft head) through ``torch.compile`` (inductor). On a CPU it
            cuts a small drafter's step by about a third, a head's by about a fifth; the first calls pay the compilation
            (about a minute per input shape, cached on disk for later processes). Output is
            unaffected: the verifier decides every token (see ``compile_verifier`` for the verifier's own passes).
        tree: verify a tree of drafts per pass instead of a chain (:mod:`specdec.trees`): ``"static"``, a
            list of paths of top-k ranks, ``"dynamic"`` (EAGLE-2), a dict of :class:`~specdec.trees.TreeConfig`
            fields, or ``"auto"`` (sized per pass from the verifier's measured cost against tokens per pass and
            the drafter's calibrated confidence). Output is unchanged: greedy stays token-identical and
            sampling exact. Drafters: heads, model drafters, prompt lookup, composite.
        tree_cost: for ``tree="auto"``, a :class:`~specdec.trees.sizing.VerifyCost` to use instead of measuring
            the verifier on first use (a few seconds: passes of 1..64 tokens; :meth:`measure_tree_cost` measures
            it now). Seeded ``auto`` calls are reproducible given this curve and ``tree_draft_step``: pin both to
            reproduce them elsewhere (``stats.tree["verify_cost"]`` and ``stats.tree["draft_step_s"]``).
        tree_draft_step: for seeded ``tree="auto"`` calls, the seconds of one drafter pass to size trees with,
            instead of measuring it once on a short call (unseeded calls learn it from the clock).
        compile_verifier: run every verify pass after the prefill through ``torch.compile`` over a static cache
            (``mode="reduce-overhead"``, CUDA graphs, on CUDA; inductor's default elsewhere): passes padded to a few
            fixed widths, the whole cache buffer under a mask, finished rows kept as masked dummies, so a call meets
            a handful of shapes. The first call of each shape compiles (:meth:`prime_verifier` does it up front); the cache
            buffers are pooled between calls (one per batch size and length in use, as transformers' static cache).
            Greedy output stays ``model.generate``'s up to float near-ties (compiled kernels round differently).
            A dict is passed to ``torch.compile`` (``{"mode": "max-autotune"}``, ``{"backend": "eager"}``).

    Raises:
        ValueError: a tree whose static ranks or ``top_k`` lie past the verifier's vocabulary, or other
            options no call could use.
        UnsupportedModelError: a tree with a verifier or model drafter that cannot take a tree mask, or
            ``compile_verifier`` with a verifier that cannot (flash / flex attention, sliding windows).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        draft: Any = "self:int8",
        num_draft_tokens: int = DEFAULT_NUM_DRAFT_TOKENS,
        tokenizer: Any = None,
        draft_tokenizer: Any = None,
        memory_budget: int | str | None = None,
        adaptive: bool = False,
        compile_drafter: bool = False,
        tree: Any = None,
        tree_cost: VerifyCost | None = None,
        tree_draft_step: float | None = None,
        compile_verifier: bool | dict[str, Any] = False,
    ) -> None:
        _check_k(num_draft_tokens)
        self.tree: TreeConfig | None = parse_tree(tree)
        if self.tree is not None and adaptive:
            raise ValueError("adaptive draft lengths are for chains; with a tree use tree='auto' to size it per pass")
        self.memory_budget = memory_budget
        self.model = model
        check_torch_for_transformers()  # one line, not a missing model class, where transformers disabled torch
        self.tokenizer = tokenizer
        self.verifier = CausalLMRunner(model, role="verifier")
        if not isinstance(compile_verifier, (bool, dict)):
            raise ValueError(f"compile_verifier must be a bool or a dict of torch.compile options, got {compile_verifier!r}")
        self.compile_verifier = compile_verifier is not False
        if self.compile_verifier:
            self.verifier.compile_static(compile_verifier if isinstance(compile_verifier, dict) else None)
        self.drafter: Drafter = resolve_drafter(
            draft, model, verifier_tokenizer=tokenizer, draft_tokenizer=draft_tokenizer
        )
        if compile_drafter:
            if not self.drafter.compilable:
                raise ValueError(f"compile_drafter: {type(self.drafter).__name__} has no model to compile")
            self.drafter.compile()
        self.num_draft_tokens = num_draft_tokens
        # the clock-free cost model of seeded adaptive calls (and the timed policy's prior until it has measured):
        # fixed by the two models, so computed once
        self._draft_cost_ratio = _draft_cost_ratio(self.drafter, model) if adaptive else None
        self.policy = AdaptiveDraftLength(max_k=num_draft_tokens, draft_cost_ratio=self._draft_cost_ratio) \
            if adaptive else None
        self.last_stats: SpecStats | None = None
        if self.tree is not None and not self.drafter.supports_tree:
            raise ValueError(f"tree={tree!r}: {type(self.drafter).__name__} cannot draft trees (heads, model drafters, "
                             "prompt lookup and composite can)")
        if self.tree is not None:
            # a tree's children are top-ranked tokens: ranks / top_k past the vocabulary fail now, not in topk mid-call
            self.tree = self.tree.fit_vocab(lm_head_rows(model))
            # a model that would ignore the tree mask is refused now, not mid-call: the verifier and the model drafter
            self.verifier.check_tree_masks()
            for runner in _tree_mask_runners(self.drafter):
                runner.check_tree_masks()
        self.tree_cost = tree_cost
        if tree_draft_step is not None and not tree_draft_step >= 0:
            raise ValueError(f"tree_draft_step must be seconds >= 0, got {tree_draft_step!r}")
        self._draft_step = tree_draft_step  # auto, seeded calls: one drafter pass in seconds (measured when None)
        self._sizer: TreeSizer | None = None  # auto, unseeded calls: what it learnt carries over between calls
        # auto's cost curve is measured once per object even when its first calls come from several threads
        self._tree_lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        # Only what generate's callers and pipelines read from a model; anything else is an error,
        # not a silent reach into the verifier.
        if name in _FORWARDED:
            return getattr(self.model, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r} (the verifier is .model)")

    def generate(
        self,
        inputs: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        logits_processor: LogitsProcessorList | None = None,
        stopping_criteria: StoppingCriteriaList | None = None,
        prefix_allowed_tokens_fn: Any = None,
        streamer: Any = None,
        num_draft_tokens: int | None = None,
        generator: torch.Generator | None = None,
        **kwargs: Any,
    ) -> torch.LongTensor | SpeculativeOutput:
        """Speculative ``generate``: same arguments and return type as ``model.generate``.

        Extra arguments: ``num_draft_tokens`` (override ``k`` for this call) and ``generator``
        (a ``torch.Generator`` for reproducible sampling). Statistics land in :attr:`last_stats`.
        """
        k = self.num_draft_tokens if num_draft_tokens is None else num_draft_tokens
        _check_k(k)
        kwargs.setdefault("tokenizer", self.tokenizer)
        tokenizer = kwargs.pop("tokenizer")
        setup = prepare_generation(
            self.model,
            inputs,
            generation_config,
            logits_processor,
            stopping_criteria,
            prefix_allowed_tokens_fn,
            tokenizer=tokenizer,
            **kwargs,
        )
        device = self.model.device
        if setup.input_ids.device != device:
            raise ValueError(f"input_ids are on {setup.input_ids.device} but the model is on {device}")
        batch = setup.input_ids.shape[0]
        if batch > 1 and streamer is not None:
            raise NotImplementedError("specdec streams batch size 1 only (rows advance by different amounts per step)")
        if batch > 1 and setup.config.return_dict_in_generate and (setup.config.output_scores or setup.config.output_logits):
            raise NotImplementedError("output_scores / output_logits are supported for batch size 1 only")
        plan = self._plan(k, generator, setup.max_length - setup.input_ids.shape[1])
        slots = plan.slots(*setup.input_ids.shape, setup.max_length)
        if self.compile_verifier:  # the verifier's static cache is longer: padded passes, rounded length
            slots = static_slots(slots, plan.widths)
        self._check_memory(setup.input_ids.shape, slots, plan.max_drafts)
        result = speculative_generate(
            self.verifier,
            constrained_drafter(self.drafter, setup.processors, tokenizer),  # grammar-aware when a grammar constrains
            setup,
            plan,
            streamer=streamer,
            generator=generator,
            output_scores=bool(setup.config.return_dict_in_generate and setup.config.output_scores),
            output_logits=bool(setup.config.return_dict_in_generate and setup.config.output_logits),
        )
        self.last_stats = result.stats
        if not setup.config.return_dict_in_generate:
            return result.sequences
        return SpeculativeOutput(
            sequences=result.sequences, scores=result.scores, logits=result.logits, spec_stats=result.stats
        )


    def prime_verifier(self, max_new_tokens: int, prompt_lengths: Iterable[int] = (1,), batch_size: int = 1,
                       num_draft_tokens: int | None = None, progress: Any = None) -> float:
        """With ``compile_verifier``: compile now every verify-pass shape that calls with these prompt lengths,
        ``batch_size`` and ``max_new_tokens`` will meet, so no timed call compiles; returns the seconds spent
        (0 without ``compile_verifier``). ``progress(done, total)`` is told after each shape. Trees are primed for
        their widest configuration; ``auto`` measures its cost curve first (it runs the verifier eagerly).

        Raises:
            ValueError: ``max_new_tokens``, ``batch_size`` or a prompt length that is not a positive integer, or no
                prompt lengths (checked with or without ``compile_verifier``).
            specdec.sizing.PlanError: a primed shape whose caches would not fit, as ``generate`` would refuse that
                call; checked for every shape before any is primed.
        """
        check_count("max_new_tokens", max_new_tokens)
        check_count("batch_size", batch_size)
        if isinstance(prompt_lengths, (int, str)) or not isinstance(prompt_lengths, Iterable):
            raise ValueError(f"prompt_lengths must be a list of prompt lengths, got {prompt_lengths!r}")
        lengths = list(prompt_lengths)
        if not lengths:
            raise ValueError("prompt_lengths is empty: name the prompt lengths the calls will have")
        for n in lengths:
            check_count("each of prompt_lengths", n)
        lengths = sorted(set(lengths))
        k = self.num_draft_tokens if num_draft_tokens is None else num_draft_tokens
        _check_k(k)
        if not self.compile_verifier:
            return 0.0
        plan = self._plan(k, None, max_new_tokens)
        shapes = [(batch_size, plan.slots(batch_size, n, n + max_new_tokens)) for n in lengths]
        for (batch, slots), n in zip(shapes, lengths):  # as generate checks each call: the static cache primed
            self._check_memory((batch, n), static_slots(slots, plan.widths), plan.max_drafts)
        return self.verifier.prime_static(shapes, plan.widths, self.drafter.hidden_layers, progress)

    def measure_tree_cost(self) -> VerifyCost | None:
        """``tree="auto"``'s verifier cost curve, measured now if it was neither given (``tree_cost=``) nor measured
        yet; ``None`` for other trees and chains. Call it before timing calls (``specdec eval`` does), or the first
        ``auto`` call pays for the measurement. Thread-safe: concurrent first calls measure once and share the curve."""
        if self.tree is None or self.tree.mode != "auto":
            return None
        if self.tree_cost is None or self._draft_step is None:  # double-checked: locked only until both exist
            with self._tree_lock:
                if self.tree_cost is None:
                    self.tree_cost = measure_verify_cost(self.verifier)
                if self._draft_step is None:
                    self._draft_step = self._measure_draft_step()
        return self.tree_cost

    def _measure_draft_step(self) -> float:
        """Seconds of one drafter pass, measured once per object on a short greedy chain over random tokens: the
        draft cost seeded ``auto`` calls size their trees with (fixed per object, so seeded samples reproduce;
        a weights ratio guessed 1.6 ms for the shipped head's ~7 ms step)."""
        device = next(self.model.parameters()).device
        config = self.model.config.get_text_config()
        positions = getattr(config, "max_position_embeddings", None) or 64  # a short call fits any model
        prompt, new = max(1, min(32, positions // 4)), max(1, min(12, positions // 4))
        ids = torch.randint(0, lm_head_rows(self.model), (1, prompt), device=device,
                            generator=torch.Generator(device=device).manual_seed(0))
        setup = prepare_generation(self.model, ids, max_new_tokens=new, do_sample=False, eos_token_id=None,
                                   pad_token_id=None)
        stats = speculative_generate(self.verifier, self.drafter, setup, ChainPlan.fixed(max(1, min(4, positions // 4)))).stats
        return stats.draft_seconds / stats.drafter_forwards if stats.drafter_forwards else 0.0

    def _plan(self, k: int, generator: torch.Generator | None, new_tokens: int) -> DraftPlan:
        """How this call drafts: trees (capped to its ``new_tokens``; ``auto`` measures the verifier's cost curve
        once, on first use) or chains of ``k`` (fixed, or adaptive up to ``k``)."""
        if self.tree is None:
            return ChainPlan(self._draft_length(k, generator))
        if self.tree.mode != "auto":
            return TreePlan(self.tree, new_tokens=new_tokens, num_draft_tokens=k)
        cost = self.measure_tree_cost()
        limit = self.tree.total_tokens
        if generator is not None:  # reproducible: the object's measured draft cost, nothing carried over from other calls
            sizer = TreeSizer(cost, draft_step=self._draft_step, max_tokens=limit)
            return TreePlan(self.tree, sizer, new_tokens=new_tokens, num_draft_tokens=k)
        with self._tree_lock:  # one shared sizer, even for concurrent first calls
            if self._sizer is None or self._sizer.cost is not cost:
                self._sizer = TreeSizer(cost, max_tokens=limit)
            sizer = self._sizer
        return TreePlan(self.tree, sizer, new_tokens=new_tokens, num_draft_tokens=k)

    def _draft_length(self, k: int, generator: torch.Generator | None) -> FixedDraftLength | AdaptiveDraftLength:
        """The draft-length policy of one call: ``k`` itself, or an adaptive policy drafting at most ``k``."""
        if self.policy is None:
            return FixedDraftLength(k)
        if generator is not None:  # reproducible: no wall-clock state, nothing carried over from other calls
            return AdaptiveDraftLength(max_k=k, timed=False, draft_cost_ratio=self._draft_cost_ratio)
        self.policy.max_k = k  # the timing and acceptance estimates carry over; only the bound is this call's
        return self.policy

    def _check_memory(self, shape: torch.Size, max_len: int, k: int) -> None:
        """Raise ``specdec.sizing.PlanError`` before any compute if the managed caches cannot fit."""
        draft_model = self.drafter.model
        check_fits(
            self.model.config,
            None if draft_model is None else draft_model.config,
            batch_size=shape[0],
            max_len=max_len,
            dtype=self.model.dtype,
            memory_budget_bytes=self.memory_budget,
            drafter_dtype=None if draft_model is None else draft_model.dtype,
            device=self.model.device,
            prefill_tokens=shape[1],
            draft_len=k,
        )


def _tree_mask_runners(drafter: Drafter) -> list[CausalLMRunner]:
    """The runners of the drafter's own models that a tree feeds a tree mask (model drafters, a composite's
    inner model drafter): they must take one as the verifier must."""
    if isinstance(drafter, CompositeDrafter):
        return _tree_mask_runners(drafter.model_drafter)
    if isinstance(drafter, ModelDrafter):
        return [drafter.runner]
    return []


def _draft_cost_ratio(drafter: Drafter, verifier: torch.nn.Module) -> float:
    """A clock-free guess of one draft token's cost in verifier passes: the drafter's bytes over the verifier's."""
    from specdec.quant.memory import model_bytes  # counts packed int4/int8 weights at their real size

    draft_model = drafter.model
    if draft_model is None:
        return 0.02  # no model (prompt lookup): drafting is nearly free
    return min(1.0, max(0.02, model_bytes(draft_model) / max(model_bytes(verifier), 1)))


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
