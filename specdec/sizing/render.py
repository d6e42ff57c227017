"""A :class:`~specdec.sizing.Plan` as text and HTML: the breakdown table and the headline numbers."""

from __future__ import annotations

import html as _html
from typing import TYPE_CHECKING

from specdec.sizing.memory import GiB, format_bytes

if TYPE_CHECKING:
    from specdec.sizing.result import Plan


def rows(p: "Plan") -> list[tuple[str, int | None, str]]:
    """``(component, bytes, detail)`` rows of the breakdown, totals and budget."""
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


def summary(p: "Plan") -> list[str]:
    """The lines under the table: KV per token by layer kind, the naive figure, the limits, advice."""
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


def title(p: "Plan") -> str:
    """One line: the models, dtypes, batch, context and the batch's extra cache slots."""
    draft = f" + draft {p.drafter}" if p.drafter else ""
    quant = f" (verifier linears {p.weight_quant})" if p.weight_quant else ""
    slack = f" (+{p.cache_len - p.context:,} cache slots per row for the ragged batch)" if p.cache_len > p.context else ""
    return (f"{p.verifier}{draft} | weights {p.dtype}{quant}, KV {p.kv_dtype} | batch {p.batch} x context "
            f"{p.context:,}{slack}")


def table(p: "Plan") -> str:
    """Readable text table of the breakdown and the headline numbers."""
    body = rows(p)
    w0 = max(len(r[0]) for r in body)
    lines = [title(p), f"{'component':<{w0}}  {'bytes':>17}  {'GiB':>9}  detail"]
    for name, value, detail in body:
        if name in ("total", "memory budget"):
            lines.append("-" * (w0 + 32))
        gib = f"{value / GiB:9.2f}" if value is not None else f"{'-':>9}"
        lines.append(f"{name:<{w0}}  {value:>17,}  {gib}  {detail}".rstrip())
    lines.append("")
    lines.extend(summary(p))
    return "\n".join(lines)


def html(p: "Plan") -> str:
    """The same table for Jupyter (``Plan._repr_html_``)."""
    esc = _html.escape
    body = "".join(
        f"<tr><td>{esc(n)}</td><td style='text-align:right'>{v:,}</td>"
        f"<td style='text-align:right'>{v / GiB:.2f}</td><td>{esc(d)}</td></tr>"
        for n, v, d in rows(p)
    )
    items = "".join(f"<li>{esc(s)}</li>" for s in summary(p))
    return (
        f"<div><b>{esc(title(p))}</b><table><thead><tr><th>component</th><th>bytes</th><th>GiB</th>"
        f"<th>detail</th></tr></thead><tbody>{body}</tbody></table><ul>{items}</ul></div>"
    )
