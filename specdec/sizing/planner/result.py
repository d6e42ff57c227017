"""What the planner returns: :class:`Plan`, which prints itself as a text table (and as HTML in
Jupyter) of the breakdown and the headline numbers. What it raises, :class:`~specdec.sizing.PlanError`,
lives with :func:`~specdec.sizing.check_fits` in the core."""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field
from typing import Any

from specdec.sizing.memory import GiB, format_bytes


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
        """One line: the models, dtypes, batch, context and the batch's extra cache slots."""
        draft = f" + draft {self.drafter}" if self.drafter else ""
        quant = f" (verifier linears {self.weight_quant})" if self.weight_quant else ""
        slack = (f" (+{self.cache_len - self.context:,} cache slots per row for the ragged batch)"
                 if self.cache_len > self.context else "")
        return (f"{self.verifier}{draft} | weights {self.dtype}{quant}, KV {self.kv_dtype} | batch {self.batch} x "
                f"context {self.context:,}{slack}")

    def table(self) -> str:
        """Readable text table of the breakdown and the headline numbers."""
        body = self._rows()
        w0 = max(len(r[0]) for r in body)
        lines = [self.title(), f"{'component':<{w0}}  {'bytes':>17}  {'GiB':>9}  detail"]
        for name, value, detail in body:
            if name in ("total", "memory budget"):
                lines.append("-" * (w0 + 32))
            gib = f"{value / GiB:9.2f}" if value is not None else f"{'-':>9}"
            lines.append(f"{name:<{w0}}  {value:>17,}  {gib}  {detail}".rstrip())
        lines.append("")
        lines.extend(self._summary())
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """The same table for Jupyter."""
        esc = html.escape
        body = "".join(
            f"<tr><td>{esc(n)}</td><td style='text-align:right'>{v:,}</td>"
            f"<td style='text-align:right'>{v / GiB:.2f}</td><td>{esc(d)}</td></tr>"
            for n, v, d in self._rows()
        )
        items = "".join(f"<li>{esc(s)}</li>" for s in self._summary())
        return (
            f"<div><b>{esc(self.title())}</b><table><thead><tr><th>component</th><th>bytes</th><th>GiB</th>"
            f"<th>detail</th></tr></thead><tbody>{body}</tbody></table><ul>{items}</ul></div>"
        )

    def __str__(self) -> str:
        return self.table()

    def _rows(self) -> list[tuple[str, int | None, str]]:
        """``(component, bytes, detail)`` rows of the breakdown, totals and budget."""
        p = self
        out: list[tuple[str, int | None, str]] = [
            (f"verifier weights ({p.weight_quant or p.dtype})", p.verifier_weight_bytes,
             f"{p.verifier_params / 1e9:.3g}B params"),
        ]
        if p.drafter:
            detail = f"{p.drafter_params / 1e9:.3g}B params"
            if p.drafter_shares_weights:
                detail += ", quantized copy sharing the embedding"
            out.append((f"drafter weights ({p.draft_quant or p.dtype})", p.drafter_weight_bytes, detail))
        out.append(("verifier KV cache", p.verifier_cache_bytes,
                    f"{p.batch} x {p.cache_len} slots x {p.kv_bytes_per_token:,} B"))
        if p.drafter:
            out.append(("drafter KV cache", p.drafter_cache_bytes,
                        f"{p.batch} x {p.cache_len} slots x {p.drafter_kv_bytes_per_token:,} B"))
        out.append(("activations (est.)", p.activation_bytes, f"prefill {p.batch} x {p.prefill_tokens} tokens"))
        out.append(("runtime reserve", p.runtime_reserve_bytes, "CUDA context / allocator / process"))
        out.append(("total", p.total_bytes, ""))
        if p.memory_bytes is not None:
            out.append(("memory budget", p.memory_bytes, ""))
            out.append(("free" if (p.free_bytes or 0) >= 0 else "short by", abs(p.free_bytes or 0),
                        "fits" if p.fits else "DOES NOT FIT"))
        return out

    def _summary(self) -> list[str]:
        """The lines under the table: KV per token by layer kind, the naive figure, the limits, advice."""
        p = self
        pieces = []
        for kind, n in p.kv_layers.items():
            per = p.kv_bytes_per_token_by_type.get(kind, 0)
            win = p.kv_windows.get(kind)
            pieces.append(f"{n} {kind}" + (f" (window {win:,})" if win else "") + f": {per:,} B")
        factor = p.naive_kv_bytes_per_token / p.kv_bytes_per_token if p.kv_bytes_per_token else float("inf")
        lines = [
            f"KV per token: {p.kv_bytes_per_token:,} B ({p.kv_dtype}; {p.kv_geometry}; layers: {'; '.join(pieces)})",
            f"naive ({p.query_heads} query heads, no windows): {p.naive_kv_bytes_per_token:,} B per token "
            f"= {factor:.1f}x too much",
            f"verifier KV for {p.batch} x {p.context:,} tokens: {p.kv_cache_bytes:,} B "
            f"({format_bytes(p.kv_cache_bytes)}); naive: {format_bytes(p.naive_kv_cache_bytes)}",
        ]
        if p.memory_bytes is not None:
            limit = f" (model limit {p.model_max_context:,})" if p.max_context_limited_by == "model" else ""
            lines.append(f"max batch at context {p.context:,}: {p.max_batch} (a query-head count would say "
                         f"{p.naive_max_batch}); max context at batch {p.batch}: {p.max_context:,}{limit}")
        if p.advice:
            lines.append(p.advice)
        lines.extend(p.notes)
        return lines
