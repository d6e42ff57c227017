"""What the planner returns (:class:`Plan`) and raises (:class:`PlanError`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from specdec.sizing import render


class PlanError(MemoryError):
    """A request does not fit in memory. The message says what to change.

    ``plan`` holds the :class:`Plan` computed before giving up, when there is one.
    """

    def __init__(self, message: str, plan: "Plan | None" = None) -> None:
        super().__init__(message)
        self.plan = plan


@dataclass
class Plan:
    """Memory plan for a verifier (and optional drafter) at a batch size and context length.

    All sizes are bytes. ``context`` is tokens per row (prompt + generated); the managed caches
    hold ``cache_len`` slots per row, :func:`specdec.slots.cache_slots` as the engine allocates them
    (``context`` for one row, plus slack for a ragged batch). ``kv_cache_bytes`` is the verifier's KV
    requirement for ``batch x context`` with sliding layers capped at their window (what any
    windowed cache needs); the breakdown's cache rows are what specdec's managed cache allocates
    (full context on every layer, plus the batch slack), and they are what the totals,
    ``max_batch`` and ``max_context`` use.
    """

    verifier: str
    drafter: str | None
    dtype: str
    kv_dtype: str
    weight_quant: str | None
    draft_quant: str | None
    draft_len: int
    batch: int
    context: int
    cache_len: int
    verifier_params: int
    drafter_params: int
    verifier_weight_bytes: int
    drafter_weight_bytes: int
    verifier_cache_bytes: int
    drafter_cache_bytes: int
    activation_bytes: int
    runtime_reserve_bytes: int
    total_bytes: int
    kv_bytes_per_token: int
    kv_bytes_per_token_by_type: dict[str, int]
    kv_layers: dict[str, int]
    kv_windows: dict[str, int | None]
    naive_kv_bytes_per_token: int
    kv_cache_bytes: int
    naive_kv_cache_bytes: int
    drafter_kv_bytes_per_token: int
    kv_heads: int
    query_heads: int
    head_dim: int
    model_max_context: int | None
    prefill_tokens: int
    kv_geometry: str
    drafter_shares_weights: bool = False
    memory_bytes: int | None = None
    free_bytes: int | None = None
    fits: bool | None = None
    max_batch: int | None = None
    max_context: int | None = None
    max_context_limited_by: str | None = None
    naive_max_batch: int | None = None
    advice: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def headroom_bytes(self) -> int:
        """Activation estimate plus runtime reserve."""
        return self.activation_bytes + self.runtime_reserve_bytes

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field (sizes in bytes)."""
        d = asdict(self)
        d["headroom_bytes"] = self.headroom_bytes
        d["naive_factor"] = self.naive_kv_bytes_per_token / self.kv_bytes_per_token if self.kv_bytes_per_token else None
        return d

    def title(self) -> str:
        """One-line description of the setup."""
        return render.title(self)

    def table(self) -> str:
        """Readable text table of the breakdown and the headline numbers."""
        return render.table(self)

    def _repr_html_(self) -> str:
        return render.html(self)

    def __str__(self) -> str:
        return self.table()
