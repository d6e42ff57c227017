"""Compiled verify passes (``compile_verifier``; docs/design.md, "Compiled verify passes").

An eager verify pass of a small model is bound by per-op overhead on a CPU and by kernel launches on a GPU;
``torch.compile`` removes most of it (on CUDA with ``mode="reduce-overhead"``, i.e. CUDA graphs), but only for
fixed shapes. So a compiled pass is laid out the way transformers' static cache lays out a decode step:

- the cache is the whole preallocated buffer (``[batch, kv_heads, length, head_dim]``, length rounded up by
  :func:`specdec.slots.static_slots`), written at a tensor pointer and read in full under a full-width additive mask
  (one per layer type for sliding-window models, the window cut by position: :mod:`specdec.runners.masks`);
- the pass is padded to one of a few widths (:func:`specdec.slots.pass_widths`) with masked filler;
- rows that finish stay in the buffers as masked dummies, so the batch never changes inside a call.

:class:`StaticVerifier` owns the compiled model and a pool of caches: a CUDA graph records the addresses of
the buffers it reads, so the caches are reused between calls (one per batch size and length in use), as
transformers reuses its static cache.
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any

import torch

from specdec.runners.cache import ManagedCache


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


COMPILE_ERRORS = _compile_errors()


def _frames() -> int:
    """Frames dynamo has compiled in this process so far (a new one: a pass compiled)."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["total"])


class StaticVerifier:
    """A verifier's compiled forward for static passes, and its cache pool; shared by every call (thread-safe).

    ``options``: ``torch.compile``'s keyword arguments; with inductor, ``mode`` defaults to ``"reduce-overhead"``
    (CUDA graphs) on CUDA and to inductor's default elsewhere. Without CUDA graphs, shapes are dynamic after the first
    change (dynamo's default), so a CPU process compiles a couple of graphs in all; with them (padded passes) shapes
    are static (``dynamic=False``) and a chain call compiles and records one graph per (batch, k, length).
    """

    def __init__(self, model: torch.nn.Module, options: dict[str, Any] | None = None) -> None:
        self.model = model
        self.cuda = model.device.type == "cuda"
        options = dict(options or {})
        if options.get("backend", "inductor") == "inductor":
            options.setdefault("mode", "reduce-overhead" if self.cuda else None)
        # CUDA graphs need each pass padded to one of the call's widths; inductor's graphs take any width (its
        # shapes go dynamic after the first change), and on a CPU a padded token costs as much as a real one
        self.pads = options.get("mode") in ("reduce-overhead", "max-autotune") or options.get("backend") == "cudagraphs"
        if self.pads:
            # padded passes have fixed shapes: a symbolic width would compile a second graph, and the cudagraphs
            # backend keys its recordings on int inputs only, replaying a width-2 graph at width 3
            options.setdefault("dynamic", False)
        self.options = options
        self.compiled: Any = torch.compile(model, **options)
        self.compile_seconds = 0.0  # wall time of passes that compiled (priming or the first calls)
        self.passes = 0  # static passes run through the compiled model
        self.graphs = 0  # passes that compiled a graph (dynamo) or recorded one (a CUDA graph of a new shape)
        self.failed: str | None = None  # why compiling failed (the passes then run eagerly, still static)
        self._shapes: set[tuple] = set()  # shapes already run: with CUDA graphs a new one records a graph
        self._free: dict[tuple, list[ManagedCache]] = {}
        self._lock = threading.Lock()

    # -- caches ------------------------------------------------------------------------------------------
    def borrow(self, num_layers: int, batch: int, length: int) -> ManagedCache:
        """A cache of ``length`` slots for ``batch`` rows: a pooled one when free (its buffers and pointer keep
        their addresses, which CUDA graphs replay), else a new one (allocated by the prefill)."""
        key = (batch, length, self.model.dtype)
        with self._lock:
            pool = self._free.get(key)
            cache = pool.pop() if pool else None
        if cache is None:
            cache = ManagedCache(num_layers, length)
            cache.pool_key = key
            cache.pointer = None
            for layer in cache.layers:
                layer.zero_init = True
        for layer in cache.layers:  # eager again until the prefill has run
            layer.write_at, layer.length = None, 0
        return cache

    def activate(self, cache: ManagedCache) -> None:
        """After the (eager) prefill: route the cache's writes through its pointer for static passes."""
        if cache.pointer is None:
            cache.pointer = torch.zeros((), dtype=torch.long, device=cache.layers[0].keys.device)
            if self.pads:  # CUDA graphs replay fixed addresses: tell dynamo these never move (as StaticLayer does)
                for layer in cache.layers:
                    torch._dynamo.mark_static_address(layer.keys)
                    torch._dynamo.mark_static_address(layer.values)
                torch._dynamo.mark_static_address(cache.pointer)
        cache.make_static(cache.pointer)

    def give_back(self, cache: ManagedCache) -> None:
        """Return a cache to the pool (one kept per shape)."""
        key = getattr(cache, "pool_key", None)
        if key is None or not cache.layers or not cache.layers[0].is_initialized:
            return
        with self._lock:
            pool = self._free.setdefault(key, [])
            if not pool:
                pool.append(cache)

    def clear(self) -> None:
        """Drop the pooled caches (frees their memory)."""
        with self._lock:
            self._free.clear()

    def width(self, n: int, widths: tuple[int, ...]) -> int:
        """The width a pass of ``n`` tokens runs at: the next of ``widths`` when graphs need fixed shapes."""
        return next((w for w in widths if w >= n), n) if self.pads else n

    # -- passes ------------------------------------------------------------------------------------------
    def __call__(self, hidden: bool, **inputs: Any) -> Any:
        """One static pass through the compiled model (eager if compiling failed)."""
        if self.failed is None:
            mask = inputs["attention_mask"]  # one mask, or one per layer type (sliding windows), all as wide
            slots = next(iter(mask.values())) if isinstance(mask, dict) else mask
            shape = (inputs["input_ids"].shape, slots.shape[-1], hidden)
            new = self.pads and shape not in self._shapes  # CUDA graphs: records a graph
            frames, start = _frames(), time.perf_counter()
            try:
                if self.pads and self.cuda:  # the previous pass's outputs were copied out: their graph memory may be reused
                    torch.compiler.cudagraph_mark_step_begin()
                out = self.compiled(**inputs, output_hidden_states=hidden)
                self.passes += 1
            except COMPILE_ERRORS as err:
                self.failed = f"{type(err).__name__}: {err}"
                warnings.warn(f"torch.compile failed for the verifier ({self.failed}); verify passes run eagerly",
                              stacklevel=3)
            else:
                if new or _frames() > frames:  # dynamo compiled (inductor takes other widths without compiling)
                    self._shapes.add(shape)
                    self.graphs += 1
                    self.compile_seconds += time.perf_counter() - start
                return out
        return self.model(**inputs, output_hidden_states=hidden)
