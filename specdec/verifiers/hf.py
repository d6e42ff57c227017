"""Run a Hugging Face causal LM over a managed cache: prefill, multi-token forwards, per-row rollback.

Used for the verifier and, through :class:`specdec.drafters.ModelDrafter`, for model drafters.

Ragged batches (DESIGN.md section 4): all rows share one write pointer into the preallocated
cache, and a boolean slot map says which slots of each row hold real tokens. Left padding, the
rejected drafts of a row that accepted fewer tokens than another, and the filler of a ragged
input block are all just invalid slots: the 2-D attention mask hides them, and each row's
position ids count only its valid slots. Rolling a row back marks its tail invalid; the pointer
only moves back to the longest row. Per-row pointers (scatter writes, no holes) measured 3-7% faster
per batched verify pass (benchmarks/cache_layouts.py: the holes lengthen the attention span until a
compaction), but they need a hand-built 4-D mask that bypasses transformers' own (sdpa/eager only,
sliding windows by hand); here transformers' padding mask does the work, for every attention backend.
"""

from __future__ import annotations

import warnings

import torch
from transformers import PreTrainedModel

from specdec.verifiers.cache import CacheOverflowError, ManagedCache


def _compile_errors() -> tuple[type[BaseException], ...]:
    """What a failed ``torch.compile`` raises (no compiler, unsupported op), as opposed to a model error."""
    errors: list[type[BaseException]] = []
    try:
        from torch._dynamo.exc import TorchDynamoException

        errors.append(TorchDynamoException)
    except ImportError:
        pass
    try:
        from torch._inductor.exc import InductorError

        errors.append(InductorError)
    except ImportError:
        pass
    return tuple(errors)


_COMPILE_ERRORS = _compile_errors()


class UnsupportedModelError(TypeError):
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
    layer_types = getattr(config, "layer_types", None) or []
    odd = sorted({t for t in layer_types if t not in _KV_LAYER_TYPES})
    if odd:
        raise UnsupportedModelError(
            f"the {role} ({config.model_type}) has layers of type {odd} whose state is not a key/value history; "
            "only attention caches can be rolled back by specdec"
        )
    if getattr(config, "model_type", "") in {"mamba", "mamba2", "rwkv", "falcon_mamba"}:
        raise UnsupportedModelError(f"the {role} ({config.model_type}) does not use a transformers KV cache")


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
    """Holds a model, its managed cache and the valid-slot map of the current batch."""

    def __init__(self, model: PreTrainedModel, role: str = "verifier") -> None:
        check_supported(model, role)
        self.model = model
        self.role = role
        self.cache: ManagedCache | None = None
        self.valid: torch.Tensor | None = None  # [batch, max_len] bool: slot holds a real token of that row
        self.counts: torch.Tensor | None = None  # [batch] real tokens per row (= next position id)
        self._compiled: torch.nn.Module | None = None
        self._kv_dtype: torch.dtype | None = None  # dtype of the keys/values this model writes (seen once)
        self._single_row = False  # this call started with one row
        self._keep_logits = model._supports_logits_to_keep() if hasattr(model, "_supports_logits_to_keep") else False
        config = model.config
        self._sliding = bool(getattr(config, "sliding_window", None)) and getattr(config, "use_sliding_window", True) is not False

    def compile(self) -> None:
        """Run forwards through ``torch.compile`` (inductor, dynamic shapes).

        Worth it for drafters: on a CPU most of a small model's decode step is per-op overhead
        (norms, rotary, attention glue, Python) that inductor fuses away. Not for the verifier,
        whose output must match ``model.generate`` bit for bit. The first forwards compile (tens of
        seconds; cached on disk by inductor for later processes); if compilation fails, forwards
        fall back to eager with a warning.
        """
        self._compiled = torch.compile(self.model, dynamic=True)

    def prime(self) -> None:
        """Compile now, with dummy forwards of both input shape classes a compiled step meets (one
        token, and several), so that no later call pays the compilation."""
        if self._compiled is None:
            return
        extra = {"logits_to_keep": 1} if self._keep_logits else {}  # as the drafter calls it
        # Twice, with other prompt and cache sizes: dynamo specialises on the first state it sees
        # and generalises (dynamic shapes) on the second; later calls reuse the graphs.
        for prompt, slots in ((3, 8), (5, 13)):
            tokens = torch.ones(1, prompt, dtype=torch.long, device=self.model.device)
            self.prefill(tokens, None, slots)  # eager: learns the dtype of our keys/values
            for n in (1, 2):  # fresh (contiguous) tensors, like the drafter's: dynamo guards on strides
                self.forward(torch.ones(1, n, dtype=torch.long, device=self.model.device), **extra)
            self.release()

    def _run(self, **inputs) -> torch.Tensor:
        # Compiled: decode steps of single-row calls only (one or a few tokens over an initialised
        # cache). Prefills and batches run eagerly: each would be more graphs to compile (dynamo
        # guards on batch size, mask kind and cache state) for little gain.
        if self._compiled is not None and self._single_row and self._kv_dtype is not None and self.cache.layers[0].is_initialized:
            try:
                return self._compiled(**inputs).logits
            except _COMPILE_ERRORS as err:
                warnings.warn(f"torch.compile failed for the {self.role} ({type(err).__name__}: {err}); running it eagerly",
                              stacklevel=3)
                self._compiled = None
        logits = self.model(**inputs).logits
        if self._kv_dtype is None and self.cache.layers and self.cache.layers[0].is_initialized:
            self._kv_dtype = self.cache.layers[0].keys.dtype
        return logits

    @property
    def num_layers(self) -> int:
        config = self.model.config
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        return int(text.num_hidden_layers)

    @property
    def length(self) -> int:
        """The shared write pointer: slots used so far in every row."""
        return 0 if self.cache is None else self.cache.length

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, max_len: int) -> torch.Tensor:
        """Allocate a cache for ``max_len`` slots, run the (left-padded) prompt, return last logits ``[batch, vocab]``."""
        batch = input_ids.shape[0]
        self._single_row = batch == 1
        self.cache = ManagedCache(self.num_layers, max_len)
        self.valid = torch.zeros(batch, max_len, dtype=torch.bool, device=input_ids.device)
        self.counts = torch.zeros(batch, dtype=torch.long, device=input_ids.device)
        mask = None if attention_mask is None else attention_mask.bool()
        extra = {"logits_to_keep": 1} if self._keep_logits else {}
        return self.forward(input_ids, mask, **extra)[:, -1]

    def adopt_prompt(self, source: "CausalLMRunner", max_len: int) -> None:
        """Start from ``source``'s cached prompt instead of running a prefill.

        For drafters derived from the verifier (quantized copies, its first layers): the verifier's
        keys and values of the prompt stand in for the drafter's own. Drafts may differ slightly;
        output cannot, since the verifier decides. Saves the drafter's prefill, which for a quantized
        copy can cost more than the verifier's own.
        """
        if not shares_kv_layout(source.model.config, self.model.config):
            raise ValueError(f"the {self.role}'s key/value layout differs from the verifier's: cannot adopt its cache")
        self.cache = ManagedCache(self.num_layers, max_len)
        self._single_row = source.valid.shape[0] == 1
        with torch.inference_mode():  # the buffers are inference tensors, like those a forward allocates
            for mine, theirs in zip(self.cache.layers, source.cache.layers):
                mine.adopt(theirs, self._kv_dtype)  # our own dtype once known: no conversion mid-forward
        width = source.cache.length
        self.valid = torch.zeros(source.valid.shape[0], max_len, dtype=torch.bool, device=source.valid.device)
        self.valid[:, :width] = source.valid[:, :width]
        self.counts = source.counts.clone()

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, valid: torch.Tensor | None = None, **extra) -> torch.Tensor:
        """Append ``tokens [batch, n]`` (``valid`` marks real ones; default all) and return logits ``[batch, n, vocab]``."""
        start, n = self.length, tokens.shape[1]
        if (self._sliding or start + n > self.cache.max_cache_len) and self._has_holes():
            # Squeeze out holes left by ragged rows: when they use up the slots, and always for
            # sliding-window models, whose window is counted in slots rather than tokens.
            self.compact()
            start = self.length
        if start + n > self.cache.max_cache_len:
            raise CacheOverflowError(
                f"KV cache overflow: {n} more tokens after {start} in a cache preallocated for "
                f"{self.cache.max_cache_len} tokens"
            )
        if valid is None:
            valid = torch.ones_like(tokens, dtype=torch.bool)
        self.valid[:, start : start + n] = valid
        # Position of a real token = real tokens before it in its row; fillers get 0 (masked anyway).
        positions = (self.counts.unsqueeze(1) + valid.long().cumsum(dim=1) - 1).clamp_min(0)
        self.counts = self.counts + valid.sum(dim=1)
        seen = self.valid[:, : start + n]
        mask = None if bool(seen.all()) else seen.long()
        return self._run(
            input_ids=tokens,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            **extra,
        )

    def keep(self, counts: torch.Tensor | list[int]) -> None:
        """Keep the first ``counts[r]`` real tokens of each row; later slots become holes, the pointer moves back."""
        counts = torch.as_tensor(counts, dtype=torch.long, device=self.valid.device)
        if bool((counts > self.counts).any()):
            raise ValueError(f"cannot keep {counts.tolist()} tokens: rows hold only {self.counts.tolist()}")
        real_before = self.valid.long().cumsum(dim=1)
        self.valid &= real_before <= counts.unsqueeze(1)
        self.counts = counts
        self._trim()

    def _trim(self) -> None:
        """Move the shared pointer back to just after the last valid slot of any row."""
        used = self.valid.any(dim=0).nonzero()
        end = int(used.max()) + 1 if used.numel() else 0
        self.cache.rollback(min(end, self.cache.length))
        self.valid[:, end:] = False

    def rollback(self, length: int) -> None:
        """Keep only the first ``length`` slots of every row (all rows aligned)."""
        self.cache.rollback(length)
        self.valid[:, length:] = False
        self.counts = self.valid.sum(dim=1)

    def _has_holes(self) -> bool:
        """Whether some row has an invalid slot after its first real token (left padding is no hole)."""
        used = self.valid[:, : self.length]
        return bool((used.cummax(dim=1).values & ~used).any())

    @torch.inference_mode()
    def compact(self) -> None:
        """Re-lay every row as left padding + its real tokens (one copy of the cache)."""
        n = int(self.counts.max())
        # stable sort puts each row's invalid slots first and its valid slots after, in order
        order = torch.argsort(self.valid[:, : self.length].to(torch.int8), dim=1, stable=True)[:, -n:]
        for layer in self.cache.layers:
            layer.gather_slots(order)
        self.valid.zero_()
        self.valid[:, :n] = torch.arange(n, device=self.valid.device).unsqueeze(0) >= (n - self.counts).unsqueeze(1)

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Drop the batch rows not listed in ``rows`` (finished sequences stop costing compute)."""
        rows = rows.to(self.valid.device)
        with torch.inference_mode():  # the buffers stay inference tensors, like those a forward allocates
            for layer in self.cache.layers:
                layer.batch_select_indices(rows)
        self.valid, self.counts = self.valid[rows], self.counts[rows]
        self._trim()

    def release(self) -> None:
        """Drop the cache (frees its buffers)."""
        self.cache = self.valid = self.counts = None
