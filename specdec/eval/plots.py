"""Plots of a ``summary.json``: speedup per task group, acceptance by draft position, speedup and mean
accepted length against the draft length k.

Figures are drawn on matplotlib's Agg canvas directly (no pyplot), so this works headless and never
switches the backend of a notebook that imports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from specdec.eval.baselines import get_baseline, reference_baseline

_DPI = 110


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI, bbox_inches="tight")  # keeps legends placed outside the axes
    return path


def plot_speedup_per_group(summary: Mapping[str, Any], path: Path) -> Path | None:
    """Grouped bars: speedup over the reference baseline (``hf``) per task group (and overall) for every other method."""
    reference = reference_baseline().name
    methods = [m for m in summary["methods"] if m["kind"] != reference]
    if not methods:
        return None
    groups = [*summary["groups"], "overall"]
    fig = Figure(figsize=(min(14.0, max(6.4, 2 + 0.3 * len(groups) * len(methods))), 4.2))
    ax = fig.add_subplot()
    width = 0.8 / len(methods)
    for j, m in enumerate(methods):
        values = [(m["groups"].get(g) or {}).get("speedup") if g != "overall" else m["speedup"] for g in groups]
        xs = [i + (j - (len(methods) - 1) / 2) * width for i in range(len(groups))]
        ax.bar(xs, [v or 0.0 for v in values], width, label=m["name"])
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_ylim(bottom=0)
    ax.set_xticks(range(len(groups)), groups, rotation=30, ha="right")
    ax.set_ylabel("speedup over hf (tokens/s ratio)")
    ax.set_title("speedup per task group")
    # outside the axes: with many methods an inside legend covers the bars
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


def plot_acceptance_by_position(summary: Mapping[str, Any], path: Path) -> Path | None:
    """Acceptance rate at each draft position, one line per speculative method."""
    methods = [m for m in summary["methods"] if m.get("acceptance_by_position")]
    if not methods:
        return None
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    for m in methods:
        rates = m["acceptance_by_position"]
        ax.plot(range(1, len(rates) + 1), rates, marker="o", label=m["name"])
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1.05)
    ax.set_title("acceptance by draft position")
    ax.legend(fontsize="small")
    return _save(fig, path)


def _reference_line(m: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The line style a baseline's entry declares for the speedup-against-k plot (None: not drawn there)."""
    baseline = get_baseline(m["kind"])
    return baseline.reference_line if baseline is not None and m["speedup"] else None


def plot_against_k(summary: Mapping[str, Any], path: Path) -> Path | None:
    """Speedup and mean accepted length against k for each specdec drafter (baselines that declare a reference
    line, such as HF assisted and hf-compiled, at their speedup)."""
    spec = [m for m in summary["methods"] if m["kind"] == "specdec"]
    if not spec:
        return None
    fig = Figure(figsize=(10, 4.2))
    ax_speed, ax_len = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for draft in dict.fromkeys(m["draft"] for m in spec):
        rows = sorted((m for m in spec if m["draft"] == draft), key=lambda m: m["k"])
        ks = [m["k"] for m in rows]
        line = ax_speed.plot(ks, [m["speedup"] or 0.0 for m in rows], marker="o", label=f"specdec {draft}")[0]
        ax_len.plot(ks, [m["mean_accepted_length"] or 0.0 for m in rows], marker="o", label=f"specdec {draft}")
        for m in summary["methods"]:  # a baseline with this drafter: in the drafter's colour unless it names one
            style = _reference_line(m)
            if style is not None and m["draft"] == draft:
                ax_speed.axhline(m["speedup"], **{"color": line.get_color(), "label": f"{m['kind']} {draft}", **style})
    for m in summary["methods"]:  # baselines without a drafter (hf-compiled)
        style = _reference_line(m)
        if style is not None and m["draft"] is None:
            ax_speed.axhline(m["speedup"], **{"label": m["kind"], **style})
    ax_speed.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ks = sorted({m["k"] for m in spec})
    for ax, label in ((ax_speed, "speedup over hf"), (ax_len, "mean accepted length (tokens / verifier pass)")):
        ax.set_xticks(ks)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("draft length k")
        ax.set_ylabel(label)
        ax.legend(fontsize="small")
    ax_speed.set_title("speedup against k")
    ax_len.set_title("mean accepted length against k")
    return _save(fig, path)


def write_plots(summary: Mapping[str, Any], out_dir: str | Path) -> list[Path]:
    """Write every plot that has data into ``out_dir``; returns the files written."""
    out = Path(out_dir)
    made = [
        plot_speedup_per_group(summary, out / "speedup_per_group.png"),
        plot_acceptance_by_position(summary, out / "acceptance_by_position.png"),
        plot_against_k(summary, out / "speedup_vs_k.png"),
    ]
    return [p for p in made if p is not None]
