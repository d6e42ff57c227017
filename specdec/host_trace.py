"""Count, per verify pass, what a GPU would pay on the host: device syncs, ops dispatched, allocations.

On a CPU a device read costs nothing, so timing cannot show the loop's GPU overhead; counting can, exactly.
:class:`HostTrace` is a context manager that watches everything torch runs while it is open:

- **syncs**: every call that blocks the host until the device queue drains on CUDA: ``aten._local_scalar_dense``
  (``bool()``, ``int()``, ``float()``, ``.item()`` of a tensor), ``nonzero``, ``masked_select``, ``unique``,
  boolean-mask indexing, ``repeat_interleave`` without ``output_size``, and, patched in, ``Tensor.tolist``,
  ``.cpu()``, ``.numpy()``, a blocking ``.to(device)`` of a host tensor and ``torch.tensor`` / ``torch.as_tensor`` with a ``device``
  other than the literal ``"cpu"`` (the project's convention for host bookkeeping, enforced by
  ``tests/test_device_safety.py``): each is a blocking host-to-device copy on CUDA. A non-blocking
  upload (:func:`specdec.transfer.upload`) is counted apart, as an ``upload``;
- **ops**: aten ops that launch work (views and ``detach`` excluded), a proxy for CUDA kernel launches;
- **allocations**: outputs of those ops that are not in place.

Passes are delimited by the plan's ``propose`` (each engine iteration calls it once), so every count lands in the
pass it belongs to; what runs before the first pass (prefill, first token) is pass ``-1``. :meth:`HostTrace.region`
attributes ops to a named region (``draft``, ``verifier``; the rest is ``other``). Used by the sync tests and by
``benchmarks/overhead.py``; never active in normal runs.
"""

from __future__ import annotations

import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specdec.transfer import upload  # noqa: F401  (re-exported: the non-blocking upload this module counts apart)

_PACKAGE = str(Path(__file__).resolve().parent)
_SYNC_OPS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::_unique", "aten::_unique2",
             "aten::unique_dim", "aten::unique_consecutive", "aten::nonzero_static", "aten::equal"}
# Scalar reads as a dispatch mode meets them. Outside ``torch.inference_mode`` ``bool()``, ``int()``, ``float()`` and
# ``.item()`` reach it as ``_local_scalar_dense``; inside it (every specdec forward runs there) as ``item`` and
# ``is_nonzero``, whose own ``_local_scalar_dense`` runs below the mode: all count once, under one name.
_SCALAR_READS = {"aten::_local_scalar_dense", "aten::item", "aten::is_nonzero"}


@dataclass
class PassRecord:
    """What one pass (or the setup before the first, index -1) did on the host."""

    index: int
    batch: int = 0  # rows the plan was asked to draft for
    syncs: list[tuple[str, str]] = field(default_factory=list)  # (what, site)
    uploads: int = 0
    ops: Counter = field(default_factory=Counter)  # per region
    allocations: Counter = field(default_factory=Counter)
    trace: dict[str, list[tuple]] = field(default_factory=dict)  # per region, (op, shapes, dtypes) in order
    region_syncs: Counter = field(default_factory=Counter)  # syncs and uploads per region (a captured phase: none)

    @property
    def sync_count(self) -> int:
        return len(self.syncs)

    @property
    def op_count(self) -> int:
        return sum(self.ops.values())


class _Mode(TorchDispatchMode):
    def __init__(self, trace: "HostTrace") -> None:
        super().__init__()
        self.trace = trace

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.trace._op(func, args, kwargs)
        return out


class HostTrace:
    """Count syncs, ops and allocations per pass while open (see the module doc). ``with HostTrace() as t: ...``."""

    def __init__(self, sites: bool = True, signatures: tuple[str, ...] = ()) -> None:
        self.sites = sites  # record the specdec frame of each sync (a stack walk per sync)
        self.signatures = signatures  # regions whose ops are recorded with their shapes (graph-replay checks)
        self.records: list[PassRecord] = [PassRecord(-1)]
        self._regions: list[str] = []
        self._patches: list[tuple[Any, str, Any]] = []
        self._mode = _Mode(self)
        self._quiet = 0  # >0 inside a patched call that already counted itself

    # ---- what the engine's passes did -------------------------------------------------------------------
    @property
    def passes(self) -> list[PassRecord]:
        """The records of the passes (setup excluded)."""
        return self.records[1:]

    def steady(self) -> list[PassRecord]:
        """Passes in steady state: not the last one, and none after which rows left the batch (retiring a row
        reshapes the caches, a rare per-row cost)."""
        out = []
        for now, after in zip(self.passes, self.passes[1:]):
            if after.batch == now.batch:
                out.append(now)
        return out

    def every_pass(self) -> list[PassRecord]:
        """Every pass, those after which rows left and the last included: what a GPU pays per pass, retirements
        and all (the last pass's record also holds the call's wrap-up after the loop: ``drafter.finish``, the
        output's assembly, which read nothing back)."""
        return self.passes

    def sync_counts(self, records: list[PassRecord] | None = None) -> list[int]:
        """Syncs per pass over ``records`` (default: :meth:`every_pass`)."""
        return [r.sync_count for r in (self.every_pass() if records is None else records)]

    def sync_sites(self, records: list[PassRecord] | None = None) -> Counter:
        """``(what, site)`` -> how often, over ``records`` (default: the steady passes)."""
        return Counter(s for r in (self.steady() if records is None else records) for s in r.syncs)

    # ---- regions and pass markers -----------------------------------------------------------------------
    def region(self, name: str) -> "_Region":
        """``with trace.region("draft"): ...``: ops inside count for ``name`` (the innermost region wins)."""
        return _Region(self, name)

    def wrap(self, owner: Any, attr: str, region: str | None = None, marks_pass: bool = False) -> None:
        """Patch ``owner.attr`` (a class or an object) while the trace is open: its calls count in ``region``, and
        with ``marks_pass`` each call starts a new pass."""
        original = getattr(owner, attr)
        trace = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if marks_pass:
                rows = args[2] if len(args) > 2 else kwargs.get("rows")  # plan.propose(self, drafter, rows, ...)
                trace.records.append(PassRecord(len(trace.records) - 1, batch=len(rows) if rows is not None else 0))
            if region is None:
                return original(*args, **kwargs)
            with trace.region(region):
                return original(*args, **kwargs)

        self._patches.append((owner, attr, owner.__dict__.get(attr, _MISSING) if isinstance(owner, type) else
                              vars(owner).get(attr, _MISSING)))
        setattr(owner, attr, wrapper)

    def mark_engine(self) -> None:
        """Mark passes at every plan's ``propose`` (chains and trees)."""
        from specdec.chains import ChainPlan
        from specdec.trees.plan import TreePlan

        for plan in (ChainPlan, TreePlan):
            self.wrap(plan, "propose", marks_pass=True)

    # ---- counting ---------------------------------------------------------------------------------------
    @property
    def _now(self) -> PassRecord:
        return self.records[-1]

    @property
    def _region(self) -> str:
        """The innermost open region (``other`` outside any)."""
        return self._regions[-1] if self._regions else "other"

    def _sync(self, what: str) -> None:
        if self._quiet:
            return
        self._now.syncs.append((what, self._site() if self.sites else ""))
        self._now.region_syncs[self._region] += 1

    def _site(self) -> str:
        for frame in reversed(traceback.extract_stack()[:-3]):
            if frame.filename.startswith(_PACKAGE) and not frame.filename.endswith("host_trace.py"):
                return f"{Path(frame.filename).relative_to(_PACKAGE).as_posix()}:{frame.lineno} {frame.name}"
        return "outside specdec"

    def _op(self, func: Any, args: tuple, kwargs: dict) -> None:
        name = func._schema.name
        if name in _SCALAR_READS:
            self._sync("_local_scalar_dense")
            return  # a read, not a launch
        if name == "aten::copy_" and len(args) > 1 and getattr(args[1], "_host_mirror", False) \
                and not kwargs.get("non_blocking", args[2] if len(args) > 2 else False):
            self._sync("copy_(host)")  # host bookkeeping copied into a device tensor: a blocking upload
        if name in _SYNC_OPS or (name == "aten::repeat_interleave" and kwargs.get("output_size") is None
                                 and func._overloadname.startswith("Tensor")) \
                or (name in ("aten::index", "aten::index_put", "aten::index_put_") and _bool_index(args)):
            self._sync(name.removeprefix("aten::"))
        if func.is_view or name in ("aten::detach", "aten::lift_fresh"):
            return
        region = self._region
        self._now.ops[region] += 1
        if region in self.signatures:
            self._now.trace.setdefault(region, []).append((name, *_shapes(args)))
        if not func._schema.is_mutable:
            self._now.allocations[region] += 1

    # ---- the context --------------------------------------------------------------------------------
    def __enter__(self) -> "HostTrace":
        trace = self
        tensor_tolist, tensor_cpu, tensor_numpy, tensor_to = (torch.Tensor.tolist, torch.Tensor.cpu,
                                                              torch.Tensor.numpy, torch.Tensor.to)
        factory_tensor, factory_as_tensor = torch.tensor, torch.as_tensor

        def counted(name: str, fn: Callable) -> Callable:
            def inner(self_: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                if not getattr(self_, "_host_mirror", False):  # reading host bookkeeping reads no device
                    trace._sync(name)
                trace._quiet += 1
                try:
                    return fn(self_, *args, **kwargs)
                finally:
                    trace._quiet -= 1
            return inner

        def to(self_: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            target = kwargs.get("device", args[0] if args and isinstance(args[0], (str, torch.device)) else None)
            # a device tensor moved to its own device is a no-op; a host tensor moved anywhere but "cpu" is a copy
            moves = target is not None and not _literal_cpu(target) and \
                (getattr(self_, "_host_mirror", False) or self_.device != torch.device(target))
            if moves and kwargs.get("non_blocking", False):
                trace._now.uploads += 1
                trace._now.region_syncs[trace._region] += 1
            elif moves:
                trace._sync("Tensor.to(device)")
            return tensor_to(self_, *args, **kwargs)

        def factory(name: str, fn: Callable) -> Callable:
            def inner(*args: Any, **kwargs: Any) -> Any:
                if "device" in kwargs and not _literal_cpu(kwargs["device"]):
                    trace._sync(f"torch.{name}(device=...)")
                out = fn(*args, **kwargs)
                if _literal_cpu(kwargs.get("device")):
                    out._host_mirror = True  # host bookkeeping: moving it to a device later is an upload
                return out
            return inner

        for owner, attr, value in ((torch.Tensor, "tolist", counted("Tensor.tolist", tensor_tolist)),
                                   (torch.Tensor, "cpu", counted("Tensor.cpu", tensor_cpu)),
                                   (torch.Tensor, "numpy", counted("Tensor.numpy", tensor_numpy)),
                                   (torch.Tensor, "to", to),
                                   (torch, "tensor", factory("tensor", factory_tensor)),
                                   (torch, "as_tensor", factory("as_tensor", factory_as_tensor))):
            self._patches.append((owner, attr, getattr(owner, attr)))
            setattr(owner, attr, value)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)
        for owner, attr, value in reversed(self._patches):
            if value is _MISSING:
                delattr(owner, attr)
            else:
                setattr(owner, attr, value)
        self._patches.clear()


class _Region:
    def __init__(self, trace: HostTrace, name: str) -> None:
        self.trace, self.name = trace, name

    def __enter__(self) -> None:
        self.trace._regions.append(self.name)

    def __exit__(self, *exc: Any) -> None:
        self.trace._regions.pop()


_MISSING = object()


def _shapes(args: tuple) -> tuple:
    """The shapes and dtypes of an op's tensor arguments (lists of tensors included), in order."""
    out = []
    for a in args:
        for t in a if isinstance(a, (list, tuple)) else (a,):
            if isinstance(t, torch.Tensor):
                out.append((tuple(t.shape), str(t.dtype)))
    return tuple(out)


def _literal_cpu(device: Any) -> bool:
    """Host bookkeeping names its device as the literal string ``"cpu"``; anything else may be an accelerator."""
    return isinstance(device, str) and device == "cpu"


def _bool_index(args: tuple) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (indices or ()) if i is not None)


def sync_report(trace: HostTrace, records: list[PassRecord] | None = None) -> str:
    """A readable list of the syncs of ``records`` (default: the steady passes) by site (for assertion messages)."""
    records = trace.steady() if records is None else records
    lines = [f"{len(records)} passes, syncs per pass: {[r.sync_count for r in records]}, rows per pass: "
             f"{[r.batch for r in records]}"]
    lines += [f"  {n} x {what} at {site}" for (what, site), n in trace.sync_sites(records).most_common()]
    return "\n".join(lines)


def iter_syncs(trace: HostTrace) -> Iterator[tuple[int, str, str]]:
    """``(pass, what, site)`` of every sync, setup included."""
    for record in trace.records:
        for what, site in record.syncs:
            yield record.index, what, site
