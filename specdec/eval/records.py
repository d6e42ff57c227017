"""The output directory: records on disk, what a resume must match, and the files a run writes.

Records go to ``records.jsonl`` (``records.rankN.jsonl`` per process under ``accelerate launch``),
one JSON line per (prompt, method), as each prompt finishes. A rerun skips recorded pairs, and refuses
a directory recorded with other settings (``eval_config.json``, :data:`RESUME_KEYS`) or other prompt
text (each record's :func:`prompt_hash`). A method that raised on a prompt leaves an error record
(:func:`make_error_record`), which a rerun tries again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from specdec import metrics
from specdec.errors import ResumeError, SpecdecError  # ResumeError: also train-head's
from specdec.eval.methods import HF, MethodSpec
from specdec.prompts import Prompt

if TYPE_CHECKING:
    from specdec.eval.measure import Measurement

CONFIG_FILE = "eval_config.json"
RECORDS_FILE = "records.jsonl"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"
PLOT_FILES = ("speedup_per_group.png", "acceptance_by_position.png", "speedup_vs_k.png")
#: files a run writes besides its records (``--overwrite`` removes exactly these)
OUTPUT_FILES = (SUMMARY_FILE, REPORT_FILE, *PLOT_FILES)
#: settings that change what a recorded (prompt, method) pair means: a resume must match them
RESUME_KEYS = ("model", "dataset", "dtype", "device", "device_name", "num_processes", "max_new_tokens", "do_sample",
               "temperature", "top_p", "seed", "chat_template", "prompt_lookup_num_tokens", "batch_size",
               "compile_drafter", "compile_verifier", "json_schema", "warmup")
#: keys that only matter to some methods: ``None`` (no such method in that run) matches any value
_OPTIONAL_KEYS = ("prompt_lookup_num_tokens",)
# runs recorded before these keys existed
_RESUME_DEFAULTS = {"batch_size": 1, "compile_drafter": False, "compile_verifier": False, "json_schema": False}
#: longest error message a record keeps
_ERROR_CHARS = 300


def shard_path(out_dir: Path, rank: int = 0, world: int = 1) -> Path:
    """The JSONL file this process appends to."""
    return out_dir / (RECORDS_FILE if world == 1 else f"records.rank{rank}.jsonl")


def load_records(out_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record in ``out_dir`` (all shards), first occurrence of each (prompt, method) pair kept: the first
    measured one where there is one, else the last error record (a rerun tries an error again and appends).

    A line cut short by an interrupted run is skipped (its pair is simply run again).
    """
    out_dir = Path(out_dir)
    files = sorted(out_dir.glob("records*.jsonl"), key=lambda p: (p.name != RECORDS_FILE, p.name))
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for path in files:
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            key = (str(rec["prompt_id"]), rec["method"])
            if key not in seen or seen[key].get("error") is not None:
                seen[key] = rec
    return list(seen.values())


class OutputDirError(SpecdecError, ValueError):
    """The output directory cannot be used: an existing file, or a place this process cannot write to."""


def check_out_dir(path: str | os.PathLike) -> Path:
    """Raise :class:`OutputDirError` (one line) unless ``path`` is, or can be made, a writable directory.

    Nothing is left behind: writability is probed with a temporary entry that is removed at once (a
    permission check alone would pass for root on a read-only or virtual file system).
    """
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"output directory {str(out)!r} is an existing file, not a directory")
    probe = out
    while not probe.exists():  # the nearest ancestor that exists is where the directory would be made
        probe = probe.parent
    if not probe.is_dir():
        raise OutputDirError(f"cannot create output directory {str(out)!r}: {str(probe)!r} is a file, not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".specdec-probe-", dir=probe))
    except OSError as err:
        reason = err.strerror or str(err)
        if probe == out:
            raise OutputDirError(f"output directory {str(out)!r} is not writable ({reason})") from None
        raise OutputDirError(f"cannot create output directory {str(out)!r}: {str(probe)!r} is not writable ({reason})") from None
    return out


def prompt_hash(text: str) -> str:
    """What a record stores of its prompt's text (SHA-256, 16 hex digits): a resume refuses other text under its id."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def end_partial_line(path: Path) -> None:
    """An interrupted run may leave half a line: end it, so the next record starts on a line of its own."""
    if path.is_file() and path.stat().st_size:
        with path.open("rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")


_UNRECORDED = object()


def check_config(out_dir: Path, config: Mapping[str, Any]) -> dict[str, Any]:
    """Refuse to resume ``out_dir`` if it was recorded with other settings; returns the config to write back
    (``config``, plus the recorded value of an optional key this run does not use)."""
    path = out_dir / CONFIG_FILE
    if not path.is_file():
        return dict(config)
    try:
        old = json.loads(path.read_text())
    except json.JSONDecodeError:
        raise ResumeError(f"{path} is not valid JSON: cannot tell what its results were measured with; "
                          "use another output directory, or overwrite it (--overwrite)") from None
    merged = dict(config)
    differ = []
    for key in RESUME_KEYS:
        then, now = old.get(key, _RESUME_DEFAULTS.get(key, _UNRECORDED)), config.get(key)
        if key in _OPTIONAL_KEYS and (then is None or now is None):
            if now is None and then is not _UNRECORDED:
                merged[key] = then  # kept: a later run that uses it again must match it
            continue
        if then != now:
            differ.append(f"{key}: {'not recorded' if then is _UNRECORDED else repr(then)} there, {now!r} now")
    if differ:
        raise ResumeError(f"{out_dir} holds results of another configuration ({'; '.join(differ)}); "
                          "use another output directory, or overwrite it (--overwrite)")
    return merged


def check_prompts(out_dir: Path, prompts: Sequence[Prompt], records: Iterable[Mapping[str, Any]]) -> None:
    """Refuse to resume when a prompt id was recorded with other text (edited data set, another prompt column)."""
    recorded: dict[str, Any] = {}
    for r in records:
        recorded.setdefault(str(r["prompt_id"]), r.get("prompt_sha256"))
    differ = [p.id for p in prompts if p.id in recorded and recorded[p.id] != prompt_hash(p.text)]
    if differ:
        ids = ", ".join(differ[:5]) + (f" and {len(differ) - 5} more" if len(differ) > 5 else "")
        raise ResumeError(f"{out_dir} holds results for other text under prompt id(s) {ids} (edited data set, or "
                          "another --prompt-column?); use another output directory, or --overwrite")


def clear(out_dir: Path) -> None:
    """Remove what a previous run wrote (only our own files)."""
    for path in [*out_dir.glob("records*.jsonl"), *(out_dir / n for n in (CONFIG_FILE, *OUTPUT_FILES))]:
        if path.is_file():
            path.unlink()


def error_message(err: BaseException) -> str:
    """``err`` in one line: its type, its message and where it was raised (a bare ``assert`` has no message)."""
    frames = traceback.extract_tb(err.__traceback__)
    # the innermost frame, as package/module.py (a bare file name such as hf.py is ambiguous)
    where = f" ({'/'.join(Path(frames[-1].filename).parts[-3:])}:{frames[-1].lineno})" if frames else ""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}{': ' + text if text else ''}{where}"[:_ERROR_CHARS]


def make_error_record(prompt: Prompt, index: int, method: MethodSpec, slot: int, prompt_tokens: int, error: str,
                      rank: int) -> dict[str, Any]:
    """The record of a (prompt, method) pair whose generation raised: ``error`` is the one-line message. It has no
    measurement (no ``new_tokens``, ``seconds``, ``output_ids``); the summary counts it in the method's ``errors``."""
    return {"prompt_id": prompt.id, "prompt_index": index, "group": prompt.group,
            "prompt_sha256": prompt_hash(prompt.text), "method": method.name, "kind": method.kind,
            "draft": method.draft, "k": method.k, "cache": method.cache, "order": slot, "rank": rank,
            "prompt_tokens": prompt_tokens, "error": error}


def make_record(prompt: Prompt, index: int, method: MethodSpec, slot: int, m: "Measurement", prompt_tokens: int,
                reference: list[int] | None, greedy: bool, text: str, rank: int) -> dict[str, Any]:
    """The record of one (prompt, method) pair: ``m`` measured in ``slot`` of the rotation, by process ``rank``;
    ``identical`` compares a greedy output with ``reference`` (``hf``'s output for the prompt)."""
    new = len(m.output_ids)
    rec: dict[str, Any] = {
        "prompt_id": prompt.id, "prompt_index": index, "group": prompt.group, "prompt_sha256": prompt_hash(prompt.text),
        "method": method.name, "kind": method.kind, "draft": method.draft, "k": method.k, "cache": method.cache,
        "order": slot, "rank": rank, "prompt_tokens": prompt_tokens, "new_tokens": new,
        "seconds": m.seconds, "tokens_per_s": metrics.throughput(new, m.seconds),
        "time_to_first_token": m.time_to_first_token, "time_per_output_token": m.time_per_output_token,
        "proposed": None, "accepted": None, "acceptance_rate": None, "proposed_per_position": m.proposed_per_position,
        "accepted_per_position": m.accepted_per_position, "acceptance_by_position": None,
        "committed_tokens": m.committed_tokens, "verifier_passes": m.verifier_passes, "mean_accepted_length": None,
        "mean_draft_length": None, "mean_tree_tokens": None, "tree": m.tree, "identical": None,
        "output_ids": m.output_ids, "text": text,
    }
    if m.proposed_per_position is not None:
        accepted = sum(m.accepted_per_position or [])
        proposed = m.proposed if m.proposed is not None else sum(m.proposed_per_position)
        rec.update(proposed=proposed, accepted=accepted, acceptance_rate=metrics.acceptance_rate(accepted, proposed),
                   acceptance_by_position=metrics.acceptance_by_position(m.accepted_per_position or [],
                                                                         m.proposed_per_position))
    if m.verifier_passes:
        rec["mean_accepted_length"] = metrics.mean_accepted_length(m.committed_tokens, m.verifier_passes)
        if rec["proposed"] is not None:  # the k actually drafted per pass (below k where adaptive k drafts less)
            rec["mean_draft_length"] = rec["mean_tree_tokens"] = metrics.mean_draft_length(rec["proposed"],
                                                                                           m.verifier_passes)
    if m.compiled_graphs is not None:
        rec["compiled_graphs"] = m.compiled_graphs
    if m.draft_choice is not None:
        rec["draft_choice"] = m.draft_choice
    if greedy and method.kind != HF and reference is not None:
        rec["identical"] = m.output_ids == reference
    return rec
