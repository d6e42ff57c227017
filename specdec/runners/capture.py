"""Raw CUDA graphs of the engine's fixed-shape phases (the verify pass, the head's draft chain), one mechanism for all.

A phase is a function of tensors whose shapes are fixed per *key* (batch, width, ``k``, ...), that reads and writes
long-lived buffers in place (a KV cache) and returns tensors. :class:`PhaseGraphs` runs it the way SGLang's and
vLLM's CUDA-graph runners do (docs/design.md, "Captured phases"):

- the first call of a key copies its inputs into *static buffers* owned by the key, runs the function once eagerly
  (the warm-up: lazy initialisations, cuBLAS workspaces) and captures it as a ``torch.cuda.CUDAGraph`` on a side
  stream, in one memory pool shared by every phase of the device; later calls copy their inputs into the same
  buffers and replay;
- the outputs are the graph's own tensors, overwritten by the next replay: callers copy what they keep.

Everywhere else (a CPU; CUDA with capture off) the *stand-in* runs the same function eagerly over the same static
buffers and copies its outputs into buffers kept from the first call, so a caller that holds an output across a
pass sees it change on a CPU as on a GPU. On either path a key's input shapes must never change (a
:class:`CaptureError`), and where a long-lived buffer it is given (a cache) moved, the key is made again and counted
in :attr:`PhaseGraphs.recaptures` (the tests expect none), so a graph never writes into a buffer that is gone; the
static input buffers are the key's own, so they cannot move.

With :data:`PROVE` set (tests), every key's function runs through ``torch.compile(fullgraph=True, dynamic=False)``
with dynamo's eager backend, one compiled copy per key, so a graph break or a guard that fails on a later pass (a
recompile: ``fail_on_recompile``) is an error on a CPU, where a capture would have baked in a stale value.

A phase is captured only for work that is the same every replay: no host read, no upload from host data, no
random draw (greedy drafting and verification only).
"""

from __future__ import annotations

import gc
import threading
import time
import types
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

#: tests set this: each key's function is traced with ``torch.compile(fullgraph=True, dynamic=False)`` (eager backend)
PROVE = False
#: warm-up runs before a capture (SGLang runs 2, vLLM 1: one initialises every lazy state a forward has)
WARMUPS = 1

_CAPTURE_LOCK = threading.Lock()  # one capture at a time in the process (a capture may not overlap other work)
_POOLS: dict[int, Any] = {}  # device index -> the graph memory pool every phase of that device shares


class CaptureError(RuntimeError):
    """A phase broke a rule a graph relies on (a buffer moved, a key's shapes changed)."""


def capture_supported(device: torch.device) -> bool:
    """Whether raw CUDA graphs can be captured on ``device`` (a CUDA device; elsewhere phases run the stand-in)."""
    return torch.device(device).type == "cuda" and torch.cuda.is_available()


def _pool(device: torch.device) -> Any:
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    if index not in _POOLS:
        _POOLS[index] = torch.cuda.graph_pool_handle()
    return _POOLS[index]


@dataclass
class _Entry:
    """One key's static buffers, outputs and (on CUDA) graph."""

    inputs: list[torch.Tensor]
    spec: Any
    outputs: Any = None
    out_flat: list[torch.Tensor] = field(default_factory=list)
    graph: Any = None  # torch.cuda.CUDAGraph, or None: the stand-in
    run: Callable[..., Any] | None = None  # the stand-in's function (compiled with PROVE)
    pointers: tuple[int, ...] = ()  # data_ptr of every long-lived buffer at the first pass
    seconds: float = 0.0  # warm-up and capture


class PhaseGraphs:
    """The graphs of one phase over one set of long-lived buffers (one KV cache): one per key, made at first use.

    ``name``: the phase (``verify``, ``draft``, ``step``), for messages and reports. ``capture``: capture raw CUDA
    graphs (only on CUDA; else the stand-in runs). Keep one :class:`PhaseGraphs` per cache: a graph writes into
    the addresses it was captured with.
    """

    def __init__(self, name: str, capture: bool) -> None:
        self.name = name
        self.capture = capture
        self._entries: dict[Hashable, _Entry] = {}
        self.failed: str | None = None  # why a capture failed (the phase then runs the stand-in)
        self.recaptures = 0  # keys made again because a long-lived buffer had moved (tests expect none)

    @property
    def graphs(self) -> int:
        """Keys met so far (graphs captured on CUDA, stand-in entries elsewhere)."""
        return len(self._entries)

    @property
    def captured(self) -> int:
        """Keys replayed from a real CUDA graph (0 on a CPU, or where capturing failed)."""
        return sum(e.graph is not None for e in self._entries.values())

    @property
    def capture_seconds(self) -> list[float]:
        """Seconds of warm-up and capture of each key, in the order they were made."""
        return [e.seconds for e in self._entries.values()]

    def run(self, key: Hashable, fn: Callable[..., Any], args: Sequence[Any], buffers: Sequence[torch.Tensor] = ()) -> Any:
        """``fn(*args)`` for ``key``: captured (or stood in for) at the key's first call, replayed after.

        ``args``: tensors (or lists, tuples, dicts of them), copied into the key's static buffers; ``fn`` must
        depend on nothing else that changes between calls of one key (it is called, and captured, only at the
        key's first call). ``buffers``: the long-lived tensors ``fn`` reads or writes in place (cache buffers,
        a write pointer): they must keep their addresses. Returns ``fn``'s outputs, overwritten by the next call.
        """
        flat, spec = tree_flatten(list(args))
        entry = self._entries.get(key)
        if entry is not None and tuple(t.data_ptr() for t in buffers) != entry.pointers:
            # a long-lived buffer moved (a cache grew or lost rows): a graph would write into the old one
            self.recaptures += 1
            del self._entries[key]
            entry = None
        if entry is None:
            return self._first(key, fn, flat, spec, buffers)
        if spec != entry.spec or any(a.shape != b.shape or a.dtype != b.dtype for a, b in zip(flat, entry.inputs)):
            raise CaptureError(f"the {self.name} phase's inputs for key {key!r} changed shape or dtype since its first "
                               f"call: {[tuple(a.shape) for a in flat]} vs {[tuple(b.shape) for b in entry.inputs]}")
        for dst, src in zip(entry.inputs, flat):
            if dst is not src:
                dst.copy_(src, non_blocking=True)
        if entry.graph is not None:
            entry.graph.replay()
            return entry.outputs
        return self._stand_in(entry)

    def replay_ms(self, repeats: int = 20) -> dict[Hashable, float]:
        """Milliseconds per replay of each captured graph, alone (CUDA events, after a synchronize): what the GPU
        spends in the phase, against which a pass's time shows the host's share. Replays rewrite what the last
        call wrote (the same inputs). Empty on the stand-in."""
        timings: dict[Hashable, float] = {}
        for key, entry in self._entries.items():
            if entry.graph is None:
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            entry.graph.replay()
            start.record()
            for _ in range(repeats):
                entry.graph.replay()
            end.record()
            end.synchronize()
            timings[key] = start.elapsed_time(end) / repeats
        return timings

    def clear(self) -> None:
        """Drop every graph and buffer (their memory returns to the pool)."""
        self._entries.clear()

    # -- internals ----------------------------------------------------------------------------------------
    def _first(self, key: Hashable, fn: Callable[..., Any], flat: list[Any], spec: Any,
               buffers: Sequence[torch.Tensor]) -> Any:
        if not all(isinstance(a, torch.Tensor) for a in flat):
            raise TypeError(f"the {self.name} phase takes tensors only, got {[type(a).__name__ for a in flat]}")
        start = time.perf_counter()
        inputs = [a.detach().clone() for a in flat]
        entry = _Entry(inputs=inputs, spec=spec)
        entry.pointers = tuple(t.data_ptr() for t in buffers)
        call = lambda: fn(*tree_unflatten(entry.inputs, spec))  # noqa: E731
        device = inputs[0].device if inputs else (buffers[0].device if buffers else torch.device("cpu"))
        if self.capture and self.failed is None and capture_supported(device):
            try:
                self._capture(entry, call, device)
            except Exception as err:  # noqa: BLE001  (any capture failure falls back to the stand-in, with its reason)
                self.failed = f"{type(err).__name__}: {err}"
                warnings.warn(f"CUDA graph capture of the {self.name} phase failed ({self.failed}); it runs eagerly",
                              stacklevel=4)
                entry.graph = None
                torch.cuda.synchronize(device)
        if entry.graph is None:
            entry.run = _proven(fn) if PROVE else fn
            entry.outputs = entry.run(*tree_unflatten(entry.inputs, spec))
            entry.out_flat = [t for t in tree_flatten(entry.outputs)[0] if isinstance(t, torch.Tensor)]
        else:
            entry.graph.replay()  # the warm-up's result may be gone with its memory: the first result is a replay
        entry.seconds = time.perf_counter() - start
        self._entries[key] = entry
        return entry.outputs

    def _capture(self, entry: _Entry, call: Callable[[], Any], device: torch.device) -> None:
        """Warm up on a side stream and capture ``call`` into one graph of the device's shared pool."""
        with _CAPTURE_LOCK:
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for _ in range(WARMUPS):
                    call()
            torch.cuda.current_stream(device).wait_stream(stream)
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            frozen = gc.isenabled()
            gc.collect()
            gc.disable()  # a collection during capture could free a tensor the graph's pool still tracks
            try:
                with torch.cuda.graph(graph, pool=_pool(device), stream=stream, capture_error_mode="thread_local"):
                    outputs = call()
            finally:
                if frozen:
                    gc.enable()
            entry.graph, entry.outputs = graph, outputs
            entry.out_flat = [t for t in tree_flatten(outputs)[0] if isinstance(t, torch.Tensor)]

    def _stand_in(self, entry: _Entry) -> Any:
        """The eager run over the static buffers, its outputs copied into the first call's (as a replay overwrites)."""
        fresh = [t for t in tree_flatten(entry.run(*tree_unflatten(entry.inputs, entry.spec)))[0]
                 if isinstance(t, torch.Tensor)]
        if len(fresh) != len(entry.out_flat):
            raise CaptureError(f"the {self.name} phase returned {len(fresh)} tensors, {len(entry.out_flat)} at its first call")
        for dst, src in zip(entry.out_flat, fresh):
            if dst.shape != src.shape:
                raise CaptureError(f"the {self.name} phase's output changed shape: {tuple(src.shape)} vs {tuple(dst.shape)}")
            dst.copy_(src)
        return entry.outputs


def _proven(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` traced as one graph of fixed shapes (a fresh code object: its own dynamo cache), compiled at the first
    call; a later call that would compile again (a guard failed: a host value changed) raises."""
    code = fn.__code__.replace()
    own = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    compiled = torch.compile(own, fullgraph=True, dynamic=False, backend="eager")
    first = [True]

    def run(*args: Any) -> Any:
        if first[0]:
            first[0] = False
            return compiled(*args)
        with torch.compiler.set_stance("fail_on_recompile"):
            return compiled(*args)

    return run


def graphs_option(value: Any) -> bool:
    """Whether a ``compile_*`` argument asks for raw CUDA graphs (``"graphs"``, or a dict with ``backend="graphs"``)."""
    return value == "graphs" or (isinstance(value, dict) and value.get("backend") == "graphs")
