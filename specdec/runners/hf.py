"""Run a Hugging Face causal LM over a managed cache: prefill, multi-token forwards, per-row rollback.

Used for the verifier and, through :class:`specdec.drafters.ModelDrafter`, for model drafters.

The runner (:class:`CausalLMRunner`) is per model and shared; each ``generate`` call owns a
:class:`CacheSession` (the cache, its valid-slot map, per-row counts), so calls on different
threads never share state.

Ragged batches (docs/design.md, "Ragged batches"): all rows share one write pointer into the preallocated
cache, and a boolean slot map says which slots of each row hold real tokens. Left padding, the
rejected drafts of a row that accepted fewer tokens than another, and the filler of a ragged
input block are all just invalid slots: the attention mask hides them, and each row's
position ids count only its valid slots. Rolling a row back marks its tail invalid; the pointer
only moves back to the longest row. Per-row pointers (scatter writes, no holes) measured 3-7% faster
per batched verify pass (benchmarks/cache_layouts.py: the holes lengthen the attention span until a
compaction), but they need a hand-built 4-D mask that bypasses transformers' own (sdpa/eager only,
sliding windows by hand); here the slot map is the mask: for eager/sdpa attention a 4-D additive mask built on
the device (:attr:`CausalLMRunner.custom_masks`; a 2-D padding mask would be read back by transformers on every
1-token forward), one per layer type with sliding windows and chunks counted in positions
(:mod:`specdec.runners.masks`), else transformers builds it from the 2-D map, for every attention backend.
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any, Iterable

import torch
from transformers import PreTrainedModel
from transformers import __version__ as transformers_version

from specdec.errors import SpecdecError
from specdec.slots import STATIC_LENGTH_STEP, primed_widths, static_slots
from specdec.runners import recurrent_layout as recurrent
from specdec.runners.cache import cache_argument
from specdec.runners.masks import MaskLayout
from specdec.runners.session import CacheSession, StepOutput
from specdec.runners.static import COMPILE_ERRORS, StaticVerifier


def lm_head_rows(model: PreTrainedModel) -> int:
    """Rows of ``model``'s LM head, the width of its logits (quantized heads may have no ``.weight``)."""
    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor):
        return int(weight.shape[0])
    return int(getattr(head, "out_features", None) or model.config.vocab_size)


_SHARED_LOCK = threading.Lock()


class _PerModel(dict):
    """What a model carries for specdec (its compiled verifiers): never copied or pickled with the model
    (a copy of the model would carry graphs and caches of the original)."""

    def __deepcopy__(self, memo: dict) -> "_PerModel":
        return _PerModel()

    def __reduce__(self) -> tuple:
        return (_PerModel, ())


class UnsupportedModelError(SpecdecError, TypeError):
    """The model cannot be driven by specdec's managed cache."""


# Layer kinds whose state is a plain key/value history (rollback = forget the tail).
_KV_LAYER_TYPES = {"full_attention", "sliding_attention", "chunked_attention", None}


def check_supported(model: torch.nn.Module, role: str = "verifier") -> None:
    """Raise :class:`UnsupportedModelError` naming the problem if ``model`` is not a decoder-only KV-cache LM."""
    config = getattr(model, "config", None)
    if not isinstance(model, PreTrainedModel) or config is None:
        raise UnsupportedModelError(f"the {role} must be a transformers PreTrainedModel, got {type(model).__name__}")
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(
            f"the {role} ({config.model_type}) is an encoder-decoder model; specdec supports decoder-only causal LMs"
        )
    if not hasattr(model, "get_output_embeddings") or model.get_output_embeddings() is None:
        raise UnsupportedModelError(f"the {role} ({config.model_type}) has no language-modeling head")
    # recurrent / convolutional layers (hybrids) roll back through specdec.runners.recurrent; MLP-only blocks keep nothing
    held = set(recurrent.recurrent_layer_types(config))
    kinds = recurrent.cache_layer_types(config)
    layer_types = getattr(config, "layer_types", None) or []
    odd = sorted({t for i, t in enumerate(layer_types) if t not in _KV_LAYER_TYPES and i not in held
                  and (i >= len(kinds) or kinds[i] != "dummy")})
    if odd and not recurrent.HYBRIDS_SUPPORTED:
        raise UnsupportedModelError(
            f"the {role} ({config.model_type}) has layers of type {odd}: specdec runs hybrid and recurrent models with "
            f"transformers >= {recurrent.HYBRID_TRANSFORMERS} (installed: {transformers_version})"
        )
    if odd:
        raise UnsupportedModelError(
            f"the {role} ({config.model_type}) has layers of type {odd} whose state is neither a key/value history nor "
            "a recurrent state that specdec can roll back"
        )
    if getattr(config, "model_type", "") in {"rwkv"}:
        raise UnsupportedModelError(f"the {role} ({config.model_type}) does not use a transformers Cache")
    if held:
        try:
            recurrent.layout(model)
        except ValueError as err:
            raise UnsupportedModelError(f"the {role} ({config.model_type}) has recurrent layers, but {err}") from None


def _kv_layout(config) -> tuple:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_attention_heads", None)
    kv = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or (text.hidden_size // heads if heads else None)
    return text.model_type, kv, head_dim, getattr(text, "rope_theta", None)


def shares_kv_layout(verifier_config, drafter_config) -> bool:
    """Whether a drafter's layers can read the verifier's keys/values (same kind, heads and sizes, no more layers)."""
    v = verifier_config.get_text_config() if hasattr(verifier_config, "get_text_config") else verifier_config
    d = drafter_config.get_text_config() if hasattr(drafter_config, "get_text_config") else drafter_config
    return _kv_layout(v) == _kv_layout(d) and d.num_hidden_layers <= v.num_hidden_layers


class CausalLMRunner:
    """A model and what is learnt about it once (compiled graph, cache dtype); shared by every call.

    Per-call state lives in the :class:`CacheSession` that :meth:`prefill` / :meth:`adopt` return.
    """

    def __init__(self, model: PreTrainedModel, role: str = "verifier") -> None:
        check_supported(model, role)
        self.model = model
        self.role = role
        self._compiled: torch.nn.Module | None = None
        self.static: StaticVerifier | None = None  # compiled static verify passes (compile_static)
        self._kv_dtype: torch.dtype | None = None  # dtype of the keys/values this model writes (seen once)
        self.cache_arg = cache_argument(model)
        self.keep_logits = model._supports_logits_to_keep() if hasattr(model, "_supports_logits_to_keep") else False
        self.mask_layout = MaskLayout.of(model.config)  # masks per layer type, sliding windows and chunks
        self.recurrent = recurrent.layout(model)  # hybrids: recurrent layers and their mixers (None: attention only)
        self.sliding = self.mask_layout.restricted

    @property
    def custom_masks(self) -> bool:
        """Whether this model takes custom 4-D attention masks as is (eager or sdpa attention; windows are cut by
        :mod:`specdec.runners.masks`): then a session with padding or holes passes them built on the device (no host
        read a pass)."""
        impl = getattr(self.model.config, "_attn_implementation", None) or "eager"
        return impl in ("eager", "sdpa") and self.recurrent is None  # recurrent layers read the 2-D padding mask

    def compile(self) -> None:
        """Run forwards through ``torch.compile`` (inductor, dynamic shapes).

        Worth it for drafters: on a CPU most of a small model's decode step is per-op overhead
        (norms, rotary, attention glue, Python) that inductor fuses away. Not for the verifier,
        whose output must match ``model.generate`` bit for bit. The first forwards compile (tens of
        seconds; cached on disk by inductor for later processes); if compilation fails, forwards
        fall back to eager with a warning.
        """
        if self.recurrent is not None:  # the mixers' hooks record inputs for the rollback: a graph would skip them
            warnings.warn(f"the {self.role} ({self.model.config.model_type}) has recurrent layers, whose rollback "
                          "hooks a compiled graph would bypass; running it eagerly", stacklevel=2)
            return
        self._compiled = torch.compile(self.model, dynamic=True)

    def compile_static(self, options: dict[str, Any] | None = None) -> None:
        """Run every pass after the prefill as a static pass through ``torch.compile`` (the verifier's
        ``compile_verifier``; :mod:`specdec.runners.static`). ``options``: ``torch.compile`` keyword arguments
        (with inductor, ``mode`` defaults to ``"reduce-overhead"``, CUDA graphs, on CUDA).

        Raises :class:`UnsupportedModelError` for models whose attention ignores custom 4-D masks: a static pass's
        masks span the whole buffer (per layer type, with sliding windows cut by position)."""
        if self.recurrent is not None and self.role != "verifier":
            raise UnsupportedModelError(f"the {self.role}: " + recurrent.refusal(self.model, "compile"))
        self.check_tree_masks(purpose="a compiled verifier (compile_verifier) passes its own")
        # one per model and options, kept on the model as transformers keeps its compiled call: every wrapper of
        # the model (an eval's methods) shares its graphs and cache pool instead of compiling its own
        shared = self.model.__dict__.setdefault("_specdec_static_verifiers", _PerModel())
        # a moved model: new graphs; id: a shallow copy (layer-skip's truncated view) shares this dict, not the model
        key = (repr(sorted((options or {}).items())), str(self.model.device), self.model.dtype, id(self.model))
        with _SHARED_LOCK:
            if key not in shared:
                shared[key] = StaticVerifier(self.model, options, phase="verify" if self.role == "verifier" else "step")
            self.static = shared[key]

    def prime_static(self, shapes: Iterable[tuple[int, int]], widths: tuple[int, ...], hidden_layers: tuple[int, ...] = (),
                     progress: Any = None) -> float:
        """Compile (or record) now every static pass that calls of these ``(batch, slots)`` shapes (the verifier's
        slots of :class:`~specdec.slots.CallSlots`, as :meth:`prefill` takes them) and pass ``widths`` will run, with dummy passes; returns the seconds spent. ``progress(done, total)`` is told
        after each pass shape. Each width runs twice, at two write positions (the pointer is data, not a constant)."""
        if self.static is None:
            return 0.0
        start, device = time.perf_counter(), self.model.device
        shapes = sorted(set(shapes))  # calls whose caches round up to the same static length share every graph
        run = primed_widths(widths, self.static.pads)
        done, total = 0, len(shapes) * len(run)
        for batch, slots in shapes:
            session, _ = self.prefill(torch.ones(batch, 2, dtype=torch.long, device=device), None, slots, widths=widths)
            try:
                for width in run:
                    for _ in range(2):
                        session.forward(torch.ones(batch, width, dtype=torch.long, device=device),
                                        hidden_layers=hidden_layers)
                        session.keep(session.counts - width + 1)
                    done += 1
                    if progress is not None:
                        progress(done, total)
            finally:
                session.release()
        return time.perf_counter() - start

    def prime(self) -> None:
        """Compile now, with dummy forwards of both input shape classes a compiled step meets (one
        token, and several), so that no later call pays the compilation."""
        if self._compiled is None:
            return
        extra = {"logits_to_keep": 1} if self.keep_logits else {}  # as the drafter calls it
        # Twice, with other prompt and cache sizes: dynamo specialises on the first state it sees
        # and generalises (dynamic shapes) on the second; later calls reuse the graphs.
        for prompt, slots in ((3, 8), (5, 13)):
            tokens = torch.ones(1, prompt, dtype=torch.long, device=self.model.device)
            session, _ = self.prefill(tokens, None, slots)  # eager: learns the dtype of our keys/values
            for n in (1, 2):  # fresh (contiguous) tensors, like the drafter's: dynamo guards on strides
                session.forward(torch.ones(1, n, dtype=torch.long, device=self.model.device), **extra)
            session.release()

    @property
    def num_layers(self) -> int:
        config = self.model.config
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        return int(text.num_hidden_layers)

    def session(self, batch: int, max_len: int, device: torch.device, widths: tuple[int, ...] = ()) -> CacheSession:
        """An empty per-call cache of ``max_len`` slots for ``batch`` rows; with :meth:`compile_static` and pass
        ``widths``, a static one (``max_len`` as :class:`~specdec.slots.CallSlots` rounded it for compiled passes)."""
        if self.static is None or not widths:
            return CacheSession(self, batch, max_len, device)
        if max_len < static_slots(1, widths) or max_len % STATIC_LENGTH_STEP:
            raise ValueError(f"a static cache's length is a multiple of {STATIC_LENGTH_STEP} with room for a "
                             f"{max(widths)}-token pass (CallSlots.of), got {max_len}")
        return CacheSession(self, batch, max_len, device, static=self.static, widths=widths)

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, max_len: int,
                hidden_layers: tuple[int, ...] = (), widths: tuple[int, ...] = ()) -> tuple[CacheSession, StepOutput]:
        """Allocate a cache for ``max_len`` slots and run the (left-padded) prompt.

        ``widths``: the token counts of this call's later passes (:func:`specdec.slots.pass_widths`); they
        make the session static when the runner is compiled for it (:meth:`compile_static`).
        Returns the session and the last position's logits ``[batch, vocab]`` (with the hidden states
        of every prompt position when ``hidden_layers`` asks)."""
        session = self.session(input_ids.shape[0], max_len, input_ids.device, widths)
        mask = None if attention_mask is None else attention_mask.bool()
        extra = {"logits_to_keep": 1} if self.keep_logits else {}
        out = session.forward(input_ids, mask, hidden_layers=hidden_layers, **extra)
        return session, StepOutput(out.logits[:, -1], out.hidden)

    def adopt(self, source: CacheSession, max_len: int, widths: tuple[int, ...] = ()) -> CacheSession:
        """A session that starts from ``source``'s cached prompt instead of running a prefill.

        For drafters derived from the verifier (quantized copies, its first layers): the verifier's
        keys and values of the prompt stand in for the drafter's own. Drafts may differ slightly;
        output cannot, since the verifier decides. Saves the drafter's prefill, which for a quantized
        copy can cost more than the verifier's own.
        """
        if not shares_kv_layout(source.runner.model.config, self.model.config):
            raise ValueError(f"the {self.role}'s key/value layout differs from the verifier's: cannot adopt its cache")
        session = self.session(source.valid.shape[0], max_len, source.valid.device, widths)
        dtype = self._kv_dtype  # our own dtype once known: no conversion mid-forward
        if widths and self.static is not None and dtype is None:
            raise ValueError(f"the {self.role} cannot adopt a cache into static passes before its first forward "
                             "(its key/value dtype is not known yet): prefill instead")
        with torch.inference_mode():  # the buffers are inference tensors, like those a forward allocates
            for mine, theirs in zip(session.cache.layers, source.cache.layers):
                mine.adopt(theirs, dtype, rows=None if source.static is None else source.live)  # a static source: its live rows
        if session.static is not None:  # static passes from here, as after a prefill
            session.static.activate(session.cache)
        width = source.cache.length
        session.valid[:, :width] = source.valid[:, :width]
        session.counts, session.dense = source.counts.clone(), source.dense
        session.adopt_positions(source, width)
        return session

    def run(self, session: CacheSession, hidden_layers: tuple[int, ...], **inputs) -> StepOutput:
        """One forward of the model over ``session``'s cache."""
        # Compiled: decode steps of single-row calls only (one or a few tokens over an initialised
        # cache). Prefills and batches run eagerly: each would be more graphs to compile (dynamo
        # guards on batch size, mask kind and cache state) for little gain.
        if (self._compiled is not None and session.single_row and not hidden_layers and self._kv_dtype is not None
                and session.cache.layers[0].is_initialized):
            try:
                return StepOutput(self._compiled(**inputs).logits)
            except COMPILE_ERRORS as err:
                warnings.warn(f"torch.compile failed for the {self.role} ({type(err).__name__}: {err}); running it eagerly",
                              stacklevel=3)
                self._compiled = None
        mask = inputs.get("attention_mask")
        if self.recurrent is not None and self.recurrent.raw_mask and mask is not None:  # its mixers read the new
            # tokens' padding; no attention layer reads a tree's mask (its recurrence follows the tree by itself)
            inputs["attention_mask"] = mask[:, -inputs["input_ids"].shape[1] :] if mask.dim() == 2 else None
        out = self.model(**inputs, output_hidden_states=bool(hidden_layers))
        if self._kv_dtype is None and session.cache.layers and session.cache.layers[0].is_initialized:
            self._kv_dtype = session.cache.layers[0].keys.dtype
        hidden = torch.cat([out.hidden_states[i] for i in hidden_layers], dim=-1) if hidden_layers else None
        return StepOutput(out.logits, hidden)

    def run_static(self, session: CacheSession, hidden_layers: tuple[int, ...], **inputs) -> StepOutput:
        """One static pass (:meth:`CacheSession.forward` of a static session) through the compiled model."""
        if self.recurrent is not None and self.recurrent.raw_mask:  # no attention: its mixers take the tokens' padding
            inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])  # (none in a chain's static pass)
        out = self.static(bool(hidden_layers), **inputs)
        hidden = torch.cat([out.hidden_states[i] for i in hidden_layers], dim=-1) if hidden_layers else None
        return StepOutput(out.logits, hidden)

    def check_tree_masks(self, purpose: str = "tree drafts need") -> None:
        """Raise :class:`UnsupportedModelError` if this model cannot take a custom 4-D attention mask
        (``purpose`` says who needs one)."""
        if self.recurrent is not None and self.static is not None and purpose == "tree drafts need":
            raise UnsupportedModelError(f"the {self.role}: " + recurrent.refusal(self.model, "tree"))
        impl = getattr(self.model.config, "_attn_implementation", None) or "eager"
        if impl not in ("eager", "sdpa"):
            raise UnsupportedModelError(
                f"the {self.role} uses {impl!r} attention, which ignores custom 4-D masks: {purpose} one, so use "
                "attn_implementation='sdpa' or 'eager'"
            )
