"""From per-prompt records to ``summary.json``, a markdown report and the :class:`EvalReport` object.

``summary.json`` (the contract other tools rely on)::

    {"methods": [{"name": "specdec[self:int8,k=4]", "kind": "specdec", "draft": "self:int8", "k": 4, "batch_size": 1,
                  "prompts": 6, "tokens_per_s": 21.3, "speedup": 1.41,          # vs hf, same run
                  "speedup_vs_hf_compiled": 1.25,                               # null without hf-compiled
                  "speedup_vs": {"hf": 1.41, "hf-compiled": 1.25, "hf-assisted[self:int8]": 1.12},
                  "acceptance_rate": 0.71, "mean_accepted_length": 3.2, "mean_draft_length": 4.0,
                  "acceptance_by_position": [0.9, 0.8, 0.6, 0.5], "identical": 6, ...,
                  "groups": {"mt_bench": {...same figures...}, "translation": {...}}},
                 {"name": "hf-compiled", "kind": "hf-compiled", "compile_seconds": 107.2, "compiled_graphs": 0,
                  "identical": 6, ...}, ...],
     "groups": ["mt_bench", ...], "baselines": ["hf", ...], "batch_size": 1, "config": {...}}

With ``batch_size`` B > 1 (``specdec eval --batch-size B``) each method ran on left-padded batches
of B prompts: ``tokens_per_s`` is the batched throughput (all new tokens over the batches' wall
time) and ``speedup`` its ratio to HF ``generate`` on the same batches.

Every figure pools the prompts that every method of the run completed. Throughput is total new
tokens over total seconds; speedups are ratios of throughputs measured in the same run. Acceptance
rate, mean accepted length, speedup and identity are computed by specdec's local ``evaluate`` modules
(:mod:`specdec.eval.metrics`). ``tree`` is a specdec method's tree configuration (``null``: chains) and
``mean_tree_tokens`` the draft tokens the verifier scored per pass (a tree's nodes; a chain's ``k``).
With trees, ``acceptance_by_position`` is per depth and ``acceptance_rate`` accepted over scored nodes.
``mean_draft_length`` is draft tokens proposed per verifier pass (total
over total): ``k`` for a fixed-k method (less only where ``max_length`` leaves less room), less where
adaptive k drafts less. ``hf-compiled`` adds ``compile_seconds`` (the untimed compile before its first
timed call; the largest over the runs its records come from) and ``compiled_graphs`` (graphs compiled
inside timed calls, which should be 0); its ``identical`` counts greedy outputs equal to ``hf``'s.
Each specdec method has ``compile_verifier`` (its verify passes ran through ``torch.compile``), and with it
``verifier_compile_seconds`` (the untimed priming of its pass shapes; graphs another method compiled first are
shared, so they cost it little) and ``verifier_graphs_in_calls`` (pass shapes compiled inside timed calls, which
should be 0); both are ``null`` without it.

Prompts with a JSON schema (``specdec eval --dataset json-schema``, with or without ``--json-schema``) add ``valid``
(answers that parse as JSON and validate against their schema) and ``validity_rate`` (over the prompts the method
answered); both are ``null`` for prompts without one. A method that raised on a prompt has an error record for it:
``errors`` counts them and ``error`` is the first one's message (one line). Its figures are over the prompts it
answered, and each ``speedup_vs`` over the prompts both methods answered.

What a baseline adds here is read from its declaration (:class:`~specdec.eval.baselines.Baseline`): which one is
the reference (``speedup``, ``identical``), which speedups get a key of their own (``speedup_key``), its own figures
(``summarize``) and its paragraph in the report (``note``): no code here names a baseline.
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import Any, Iterable, Mapping, Sequence

from specdec import metrics
from specdec.eval.baselines import get_baseline, reference_baseline, speedup_keys
from specdec.eval.baseline_registry import SPECDEC
from specdec.eval.metrics import compute_metric
from specdec.eval.records import OUTPUT_FILES, REPORT_FILE, SUMMARY_FILE, load_records
from specdec.prompts import Prompt, group_order, plural

OVERALL = "overall"


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(float(x), digits)


def _figures(rows: Sequence[Mapping[str, Any]], baseline_rows: Mapping[str, Sequence[Mapping[str, Any]]],
             speculative: bool, greedy: bool, reference: Mapping[str, Sequence[int]], compare: bool = True) -> dict[str, Any]:
    """Pooled figures of one method over ``rows`` (one per prompt), against each baseline's rows on the same prompts.

    ``speculative``: the method drafts (acceptance figures); ``compare``: count its greedy outputs equal to the
    reference baseline's (``reference``: its output ids by prompt id).
    """
    tokens = [r["new_tokens"] for r in rows]  # rows: measured records only (no error records)
    seconds = [r["seconds"] for r in rows]
    total_s = sum(seconds)
    fig: dict[str, Any] = {
        "prompts": len(rows),
        "new_tokens": sum(tokens),
        "seconds": _round(total_s),
        "tokens_per_s": _round(metrics.throughput(tokens, seconds), 3) if rows else None,
        "time_to_first_token": _round(mean(r["time_to_first_token"] for r in rows) if rows else None, 5),
        "time_per_output_token": _round(mean(r["time_per_output_token"] for r in rows) if rows else None, 5),
    }
    ratios = {}
    for name, base in baseline_rows.items():
        # over the prompts both answered (all of them unless one raised on some)
        ours, theirs = _common(rows, base)
        ratios[name] = None if not ours else _round(compute_metric(
            "speedup", new_tokens=[r["new_tokens"] for r in ours], seconds=[r["seconds"] for r in ours],
            baseline_new_tokens=[r["new_tokens"] for r in theirs], baseline_seconds=[r["seconds"] for r in theirs],
        )["speedup"])
    for key, name in speedup_keys().items():  # "speedup" (against the reference), ... as the baselines declare
        fig[key] = ratios.get(name)
    fig["speedup_vs"] = ratios
    fig.update(_validity(rows))
    keys = ("proposed", "accepted", "acceptance_rate", "acceptance_by_position", "mean_accepted_length",
            "mean_draft_length", "mean_tree_tokens", "identical")
    fig.update(dict.fromkeys(keys))
    if greedy and compare:
        compared = [r for r in rows if r["prompt_id"] in reference]  # the reference answered them
        fig["identical"] = None if not compared else compute_metric(
            "token_exact_match", predictions=[r["output_ids"] for r in compared],
            references=[reference[r["prompt_id"]] for r in compared])["matches"]
    if not speculative:
        return fig
    if rows and all(r.get("proposed_per_position") is not None for r in rows):
        acc = compute_metric("acceptance_rate", accepted=[r["accepted_per_position"] for r in rows],
                             proposed=[r["proposed_per_position"] for r in rows])
        fig.update(proposed=acc["proposed"], accepted=acc["accepted"], acceptance_rate=_round(acc["acceptance_rate"]),
                   acceptance_by_position=[_round(x) for x in acc.get("acceptance_by_position", [])])
        if all(r.get("proposed") is not None for r in rows):  # trees: nodes scored, not positions
            proposed = sum(r["proposed"] for r in rows)
            fig.update(proposed=proposed, acceptance_rate=_round(metrics.acceptance_rate(acc["accepted"], proposed)))
    if rows and all(r.get("verifier_passes") is not None for r in rows):
        fig["mean_accepted_length"] = _round(compute_metric(
            "mean_accepted_length", committed=[r["committed_tokens"] for r in rows],
            verifier_passes=[r["verifier_passes"] for r in rows])["mean_accepted_length"])
        if fig["proposed"] is not None:  # pooled: total drafts proposed over total verifier passes
            fig["mean_draft_length"] = fig["mean_tree_tokens"] = _round(
                metrics.mean_draft_length(fig["proposed"], [r["verifier_passes"] for r in rows]))
    return fig


def _common(rows: Sequence[Mapping[str, Any]],
            base: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """``rows`` and ``base`` on the prompts both have (both lists whole when they cover the same prompts)."""
    ours = {r["prompt_id"] for r in rows}
    theirs = {r["prompt_id"] for r in base}
    return [r for r in rows if r["prompt_id"] in theirs], [r for r in base if r["prompt_id"] in ours]


def _validity(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``valid``: answers valid under their prompt's JSON schema; ``validity_rate``: over the answers checked
    (both ``None`` when no prompt has a schema)."""
    checked = [r["valid"] for r in rows if r.get("valid") is not None]
    if not checked:
        return {"valid": None, "validity_rate": None}
    return {"valid": sum(checked), "validity_rate": _round(sum(checked) / len(checked))}


def _errors(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``errors``: the pairs whose generation raised (error records); ``error``: the first one's message."""
    failed = [r for r in rows if r.get("error") is not None]
    return {"errors": len(failed), "error": failed[0]["error"] if failed else None}


def _verifier_compile_figures(rows: Sequence[Mapping[str, Any]], compiled: bool) -> dict[str, Any]:
    """A specdec method's ``compile_verifier``: whether its verify passes were compiled, the untimed priming of its
    graphs (largest over the runs that recorded ``rows``) and the pass shapes compiled inside timed calls."""
    seconds = [r["verifier_compile_seconds"] for r in rows if r.get("verifier_compile_seconds") is not None]
    return {"compile_verifier": compiled, "verifier_compile_seconds": _round(max(seconds)) if seconds else None,
            "verifier_graphs_in_calls": sum(r.get("verifier_graphs_in_call") or 0 for r in rows) if compiled else None}


def build_summary(records: Iterable[Mapping[str, Any]], methods: Sequence[Any], prompts: Sequence[Prompt],
                  config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``summary.json`` dict for ``methods`` (objects with ``name``/``kind``/``draft``/``k``/``speculative``)
    over the ``prompts`` that every method completed."""
    names = [m.name for m in methods]
    wanted = {p.id for p in prompts}
    by_key = {(str(r["prompt_id"]), r["method"]): r for r in records if r["method"] in names}
    # complete: every method has a record, measured or an error (a method that raised is not left out of the run)
    complete = [p for p in prompts if all((p.id, n) in by_key for n in names)]
    groups = group_order(complete)
    baselines = [m.name for m in methods if not m.kind == SPECDEC]
    greedy = not config.get("do_sample", False)
    ref = reference_baseline().name  # every run has it: the speedups' and the outputs' reference
    reference = {p.id: by_key[(p.id, ref)]["output_ids"] for p in complete
                 if by_key[(p.id, ref)].get("error") is None}
    batch_size = int(config.get("batch_size") or 1)  # tokens_per_s and speedups are then batched throughput

    def all_rows(name: str, group: str | None = None) -> list[Mapping[str, Any]]:
        return [by_key[(p.id, name)] for p in complete if group is None or p.group == group]

    def rows(name: str, group: str | None = None) -> list[Mapping[str, Any]]:
        """The method's measured records (its error records left out)."""
        return [r for r in all_rows(name, group) if r.get("error") is None]

    entries = []
    for m in methods:
        bases = {b: rows(b) for b in baselines if b != m.name or b == ref}
        compare = m.kind != ref
        entry = {"name": m.name, "kind": m.kind, "draft": m.draft, "k": m.k, "cache": getattr(m, "cache", None),
                 "batch_size": batch_size,
                 **_figures(rows(m.name), bases, m.speculative, greedy, reference, compare),
                 **_errors(all_rows(m.name))}
        baseline = get_baseline(m.kind)
        if baseline is not None and baseline.summarize is not None:  # its own figures (hf-compiled: compile cost)
            entry.update(baseline.summarize(rows(m.name)))
        if m.kind == SPECDEC:  # the configuration used: the last record's (auto: with what it learnt)
            entry["tree"] = next((r.get("tree") for r in reversed(rows(m.name)) if r.get("tree")), None)
            entry["draft_choice"] = next((r["draft_choice"] for r in rows(m.name) if r.get("draft_choice")), None)
            entry["verify"] = getattr(m, "verify", "token")
            entry.update(_verifier_compile_figures(rows(m.name), bool(getattr(m, "compiled", False))))
        entry["groups"] = {
            g: {**_figures(rows(m.name, g), {b: rows(b, g) for b in bases}, m.speculative, greedy, reference, compare),
                **_errors(all_rows(m.name, g))}
            for g in groups
        }
        entries.append(entry)
    return {
        "methods": entries,
        "groups": groups,
        "baselines": baselines,
        "prompts": len(complete),
        "batch_size": batch_size,
        "incomplete_prompts": len(wanted) - len(complete),
        "config": {**dict(config), "methods": names},
    }


# --------------------------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------------------------


def _fmt(x: Any, spec: str = ".2f", scale: float = 1.0) -> str:
    return "-" if x is None else format(x * scale, spec)


def _has_validity(summary: Mapping[str, Any]) -> bool:
    """Whether some answer was checked against a JSON schema (the ``valid`` column appears only then)."""
    return any(m.get("valid") is not None for m in summary["methods"])


def _has_errors(summary: Mapping[str, Any]) -> bool:
    """Whether some method raised (the ``errors`` column appears only then)."""
    return any(m.get("errors") for m in summary["methods"])


def _table_rows(summary: Mapping[str, Any], group: str | None) -> tuple[list[str], list[list[str]]]:
    baselines = summary["baselines"]
    ref = reference_baseline().name
    valid, errors = _has_validity(summary), _has_errors(summary)
    head = ["method", "prompts", "tokens", "tok/s", *[f"vs {b}" for b in baselines], "accept", "mean len",
            "draft len", "TTFT ms", "TPOT ms", "identical"]
    head += (["valid"] if valid else []) + (["errors"] if errors else [])
    body = []
    for m in summary["methods"]:
        f = m if group is None else m["groups"].get(group)
        if f is None:
            continue
        vs = [("-" if b == m["name"] and b != ref else _fmt(f["speedup_vs"].get(b))) for b in baselines]
        ident = "-" if f["identical"] is None else f"{f['identical']}/{f['prompts']}"
        extra = []
        if valid:
            extra.append("-" if f.get("valid") is None else f"{f['valid']}/{f['prompts']}")
        if errors:
            extra.append(str(f.get("errors") or 0))
        body.append([m["name"], str(f["prompts"]), str(f["new_tokens"]), _fmt(f["tokens_per_s"]), *vs,
                     _fmt(f["acceptance_rate"]), _fmt(f["mean_accepted_length"]), _fmt(f.get("mean_draft_length")),
                     _fmt(f["time_to_first_token"], ".0f", 1000), _fmt(f["time_per_output_token"], ".1f", 1000), ident,
                     *extra])
    return head, body


def _position_rows(summary: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    spec = [m for m in summary["methods"] if m.get("acceptance_by_position")]
    width = max((len(m["acceptance_by_position"]) for m in spec), default=0)
    head = ["method", *[str(i + 1) for i in range(width)]]
    body = [[m["name"], *[_fmt(x) for x in m["acceptance_by_position"]],
             *["" for _ in range(width - len(m["acceptance_by_position"]))]] for m in spec]
    return head, body


def _markdown_table(head: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" if i == 0 else "--:" for i in range(len(head))) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def _html_table(head: Sequence[str], body: Sequence[Sequence[str]], caption: str) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in body)
    return f"<table><caption>{html.escape(caption)}</caption><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"


def _describe(summary: Mapping[str, Any]) -> str:
    c = summary["config"]
    mode = "greedy" if not c.get("do_sample") else f"sampling (temperature {c.get('temperature')}, top-p {c.get('top_p')})"
    parts = [f"model `{c.get('model')}` ({c.get('dtype', '?')}, {c.get('device', '?')})", mode,
             f"{c.get('max_new_tokens')} new tokens", "chat template" if c.get("chat_template") else "raw prompts",
             plural(summary['prompts'], "prompt") + (f" from `{c['dataset']}`" if c.get("dataset") else "")]
    if c.get("per_group"):
        parts[-1] += f" ({c['per_group']} per group)"
    if c.get("batch_size", 1) > 1:
        parts.append(f"batches of {plural(c['batch_size'], 'prompt')} (throughput = all new tokens of a batch over its wall "
                     f"time; identity against `{reference_baseline().name}` on the same batch)")
    if c.get("num_processes", 1) > 1:
        parts.append(f"{c['num_processes']} processes")
    return ", ".join(parts) + "."


def _baseline_notes(summary: Mapping[str, Any]) -> list[str]:
    """The paragraphs the baselines of the run declare about their entries (``Baseline.note``)."""
    notes = []
    for m in summary["methods"]:
        baseline = get_baseline(m["kind"])
        if baseline is not None and baseline.note is not None:
            notes.append(baseline.note(m))
    return notes


def _verifier_compile_note(summary: Mapping[str, Any]) -> str:
    """One paragraph on compiled verify passes (``--compile-verifier``), or ``""``."""
    compiled = [m for m in summary["methods"] if m.get("compile_verifier")]
    if not compiled:
        return ""
    total = sum(m.get("verifier_compile_seconds") or 0.0 for m in compiled)
    note = (f"specdec's verify passes ran through `torch.compile` (`--compile-verifier`); priming their graphs took "
            f"{total:.1f} s in all before the first timed call, not in any tok/s.")
    inside = sum(m.get("verifier_graphs_in_calls") or 0 for m in compiled)
    if inside:
        note += f" {inside} more pass shape(s) compiled inside timed calls: those are in their tok/s."
    return note


def _choice_note(summary: Mapping[str, Any]) -> str:
    """One paragraph on what each `auto` method chose before its first timed call, or ``""``."""
    chose = [f"`{m['name']}` chose `{m['draft_choice']['chosen']}` ({m['draft_choice']['reason']}; measuring took "
             f"{m['draft_choice']['seconds']:.1f} s, in no tok/s)" for m in summary["methods"] if m.get("draft_choice")]
    return ("Drafters chosen by measuring on this machine: " + "; ".join(chose) + ".") if chose else ""


def _error_lines(summary: Mapping[str, Any]) -> list[str]:
    """One markdown line per method that raised on some prompts: how many, and the first message."""
    return [f"- `{m['name']}` raised on {m['errors']} prompt(s): {m['error']}" for m in summary["methods"]
            if m.get("errors")]


def _schema_note(summary: Mapping[str, Any]) -> str:
    """One paragraph on JSON-schema answers (``valid`` column), or ``""``."""
    if not _has_validity(summary):
        return ""
    how = ("generated under each prompt's JSON schema (`--json-schema`, xgrammar"
           + (f"; grammars compiled in {summary['config']['grammar_compile_seconds']:.2f} s before timing"
              if summary["config"].get("grammar_compile_seconds") is not None else "") + ")"
           if summary["config"].get("json_schema") else "generated without constraint")
    return (f"Answers were {how}; `valid` counts those that parse as JSON and validate against their prompt's schema "
            "(out of the prompts the method answered).")


def _sections(summary: Mapping[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    out = [(OVERALL, *_table_rows(summary, None))]
    if len(summary["groups"]) > 1:  # a single group's table would repeat the overall one
        out += [(g, *_table_rows(summary, g)) for g in summary["groups"]]
    return out


def render_markdown(summary: Mapping[str, Any], plots: Sequence[str] = ()) -> str:
    """The markdown report: one table overall and one per task group, then acceptance by draft position."""
    lines = ["# specdec evaluation", "", _describe(summary), ""]
    if summary["config"].get("command"):
        lines += ["```", summary["config"]["command"], "```", ""]
    lines += ["`vs X` columns are tokens/s ratios against method X in this run; `accept` is the draft acceptance rate, "
              "`mean len` the tokens committed per verifier pass, `draft len` the draft tokens proposed per verifier "
              "pass (k, or less where adaptive k drafts less; for `tree=` methods the tree's nodes, and `accept` is "
              f"accepted over scored nodes), `identical` the greedy outputs equal to `{reference_baseline().name}`'s.",
              ""]
    for note in (*_baseline_notes(summary), _choice_note(summary), _verifier_compile_note(summary), _schema_note(summary)):
        if note:
            lines += [note, ""]
    if _error_lines(summary):
        lines += ["Methods that raised (their figures are over the prompts they answered):", "",
                  *_error_lines(summary), ""]
    if summary.get("incomplete_prompts"):
        lines += [f"{summary['incomplete_prompts']} prompt(s) not completed by every method are left out.", ""]
    for title, head, body in _sections(summary):
        lines += [f"## {title}", "", _markdown_table(head, body), ""]
    head, body = _position_rows(summary)
    if body:
        lines += ["## acceptance by draft position", "", _markdown_table(head, body), ""]
    if plots:
        lines += ["## plots", ""] + [f"![{Path(p).stem.replace('_', ' ')}]({Path(p).name})" for p in plots] + [""]
    return "\n".join(lines)


def render_html(summary: Mapping[str, Any]) -> str:
    """HTML tables of the report (for Jupyter)."""
    parts = [f"<p>{html.escape(_describe(summary))}</p>"]
    notes = (*_baseline_notes(summary), _verifier_compile_note(summary), _schema_note(summary), *_error_lines(summary))
    for note in notes:
        if note:
            parts.append(f"<p>{html.escape(note)}</p>")
    parts += [_html_table(head, body, title) for title, head, body in _sections(summary)]
    head, body = _position_rows(summary)
    if body:
        parts.append(_html_table(head, body, "acceptance by draft position"))
    return "<div>" + "".join(parts) + "</div>"


@dataclass
class EvalReport:
    """Result of :func:`specdec.eval.run_eval`: the summary, the per-prompt records and where they live."""

    summary: dict[str, Any]
    records: list[dict[str, Any]] = field(default_factory=list)
    out_dir: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``summary.json`` contents."""
        return self.summary

    def method(self, name: str) -> dict[str, Any]:
        """The summary entry of method ``name`` (e.g. ``"specdec[self:int8,k=4]"``)."""
        for m in self.summary["methods"]:
            if m["name"] == name:
                return m
        raise KeyError(f"no method {name!r}; the run has {[m['name'] for m in self.summary['methods']]}")

    def markdown(self) -> str:
        """The markdown report (``report.md``)."""
        plots = [p for p in OUTPUT_FILES if p.endswith(".png") and self.out_dir and (self.out_dir / p).is_file()]
        return render_markdown(self.summary, plots)

    def __str__(self) -> str:
        return self.markdown()

    def _repr_html_(self) -> str:
        return render_html(self.summary)

    @classmethod
    def load(cls, out_dir: str | os.PathLike) -> "EvalReport":
        """Read a finished run back from its output directory."""
        out = Path(out_dir)
        return cls(json.loads((out / SUMMARY_FILE).read_text()), load_records(out), out)


def write_outputs(report: EvalReport, out_dir: str | os.PathLike, plots: bool = True) -> list[Path]:
    """Write ``summary.json``, the plots (matplotlib) and ``report.md`` into ``out_dir``; returns the paths."""
    out = Path(out_dir)
    written = [out / SUMMARY_FILE]
    written[0].write_text(json.dumps(report.summary, indent=2) + "\n")
    if plots:
        from specdec.eval.plots import write_plots

        written += write_plots(report.summary, out)
    (out / REPORT_FILE).write_text(render_markdown(report.summary, [p.name for p in written if p.suffix == ".png"]))
    return [*written, out / REPORT_FILE]
