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

import inspect
import threading
import time
import types
import warnings
from typing import Any

import torch

from specdec.runners.cache import ManagedCache
from specdec.runners.capture import PhaseGraphs, graphs_option


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

    def __init__(self, model: torch.nn.Module, options: dict[str, Any] | None = None, phase: str = "verify") -> None:
        self.model = model
        self.phase = phase  # the captured phase's name: "verify" (the verifier), "step" (a model drafter's pass)
        self.cuda = model.device.type == "cuda"
        options = dict(options or {})
        #: ``backend="graphs"``: raw CUDA graphs of the eager forward (:mod:`specdec.runners.capture`), no dynamo;
        #: on a CPU the same padded passes run eagerly over the same static buffers
        self.raw_graphs = graphs_option(options)
        self.capture_seconds: list[float] = []  # raw graphs: warm-up and capture of each graph, in order
        self._takes_cache_position = "cache_position" in _forward_parameters(model)
        #: with raw graphs, ``fuse``: capture inductor's fused kernels (``torch.compile(dynamic=False)`` without its
        #: own CUDA graphs, as SGLang's optional compile inside its raw capture) instead of the eager ones; the first
        #: pass of each shape compiles (tens of seconds on a GPU); ``fuse_backend``: that compile's backend
        self.fuse = bool(options.get("fuse")) if self.raw_graphs else False
        if self.raw_graphs:
            options = {"backend": "graphs", **({"fuse": True, "fuse_backend": options.get("fuse_backend", "inductor")}
                                               if self.fuse else {})}
        elif options.get("backend", "inductor") == "inductor":
            options.setdefault("mode", "reduce-overhead" if self.cuda else None)
        # CUDA graphs need each pass padded to one of the call's widths; inductor's graphs take any width (its
        # shapes go dynamic after the first change), and on a CPU a padded token costs as much as a real one
        self.pads = options.get("mode") in ("reduce-overhead", "max-autotune") \
            or options.get("backend") in ("cudagraphs", "graphs")
        if self.pads:
            # padded passes have fixed shapes: a symbolic width would compile a second graph, and the cudagraphs
            # backend keys its recordings on int inputs only, replaying a width-2 graph at width 3
            options.setdefault("dynamic", False)
        self.options = options
        self.compiled: Any = torch.compile(model, dynamic=False, backend=options["fuse_backend"]) if self.fuse else \
            None if self.raw_graphs else torch.compile(model, **options)
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
        key = (num_layers, batch, length, self.model.dtype)
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
            cache.pointer = torch.zeros((), dtype=torch.long, device=self.model.device)
            if self.raw_graphs:  # the cache's graphs: they write into its buffers, so they live and go with it
                cache.graphs = PhaseGraphs(self.phase, capture=self.cuda)
            elif self.pads:  # CUDA graphs replay fixed addresses: tell dynamo these never move (as StaticLayer does)
                for layer in cache.layers:
                    if layer.is_initialized:  # a recurrent layer may hold no keys
                        torch._dynamo.mark_static_address(layer.keys)
                        torch._dynamo.mark_static_address(layer.values)
                torch._dynamo.mark_static_address(cache.pointer)
        cache.make_static(cache.pointer)

    def give_back(self, cache: ManagedCache) -> None:
        """Return a cache to the pool (one kept per shape)."""
        key = getattr(cache, "pool_key", None)
        if key is None or not cache.layers or not cache.nbytes:
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
        if self.raw_graphs:
            return self._replay(hidden, inputs)
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

    def _replay(self, hidden: bool, inputs: dict[str, Any]) -> Any:
        """One static pass through the cache's raw graph of this shape (captured at its first pass)."""
        name, cache = next((n, v) for n, v in inputs.items() if isinstance(v, ManagedCache))
        ids, mask, positions = inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"]
        args: list[Any] = [ids, mask, positions]
        if self._takes_cache_position:  # older transformers derive it from the cache's host length: a graph would freeze it
            args.append(cache.pointer + torch.arange(ids.shape[1], device=ids.device))
        masks = mask.values() if isinstance(mask, dict) else [mask]
        key = (tuple(ids.shape), tuple(tuple(m.shape) for m in masks), hidden)
        model, graphs = (self.compiled if self.fuse else self.model), cache.graphs
        made = graphs.graphs

        def verify(ids: torch.Tensor, mask: Any, positions: torch.Tensor, *position: torch.Tensor) -> Any:
            extra = {"cache_position": position[0]} if position else {}
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                        output_hidden_states=hidden, **{name: cache}, **extra)
            return out.logits, (tuple(out.hidden_states) if hidden else ())

        buffers = [cache.pointer, *(t for layer in cache.layers for t in _written(layer))]
        try:
            logits, states = graphs.run(key, verify, args, buffers)
        except COMPILE_ERRORS as err:  # fuse: the compile failed (at a key's first pass): eager kernels from now on
            if not self.fuse:
                raise
            self.fuse, graphs.failed = False, None
            warnings.warn(f"torch.compile failed for the {self.phase} pass ({type(err).__name__}: {err}); its graphs "
                          "capture the eager kernels", stacklevel=3)
            return self._replay(hidden, inputs)
        self.passes += 1
        if graphs.graphs > made:
            self.graphs += 1
            self.capture_seconds.append(graphs.capture_seconds[-1])
            self.compile_seconds += graphs.capture_seconds[-1]
        if graphs.failed and self.failed is None:
            self.failed = graphs.failed
        return types.SimpleNamespace(logits=logits, hidden_states=states or None)


def _written(layer: Any) -> list[torch.Tensor]:
    """The long-lived tensors a static pass writes in ``layer`` (keys and values; a recurrent layer's states)."""
    held = [layer.keys, layer.values] if layer.is_initialized else []
    return held + (layer.static_buffers() if hasattr(layer, "static_buffers") else [])


def _forward_parameters(model: torch.nn.Module) -> set[str]:
    """The keyword names ``model.forward`` takes (its inner model's too: a causal LM passes most on)."""
    names: set[str] = set()
    for module in (model, getattr(model, "model", None)):
        if module is not None:
            try:
                names |= set(inspect.signature(module.forward).parameters)
            except (TypeError, ValueError):
                pass
    return names
