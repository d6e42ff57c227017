"""Self-distillation data: the verifier writes the responses a draft head learns from.

Everything is appended to JSON Lines files one batch at a time, so an interrupted run resumes where it
stopped (rows already on disk are skipped; a torn or broken line is dropped and its row made again, and a
row written twice is kept once). A line that parses but holds what this module never writes (a token id
outside the verifier's vocabulary, a missing or non-integer id list, a field of the wrong type) is broken
too: kept, it would crash a later stage on every rerun. A row whose prompt encodes differently now (edited
data, another tokenizer) is refused rather than trusted.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from tqdm.auto import tqdm

from specdec.prompts import encode_prompt
from specdec.training.prompts import TrainHeadError, TrainPrompt, write_atomic
from specdec.training.self_instruct import LICENSE, SOURCE, build_prompt, normalise, self_instruct_requests


Row = dict[str, Any]


def read_jsonl(path: Path, usable: Callable[[Row], bool] = lambda row: True) -> list[Row]:
    """Rows of a JSON Lines file written by this module, the first usable one of each id.

    Lines that are not a JSON object with a string id (a torn write, interleaved writes of an older unlocked
    run), or that ``usable`` refuses, are dropped: their rows are simply made again.
    """
    return _read_rows(path, usable)[0]


def _read_rows(path: Path, usable: Callable[[Row], bool] = lambda row: True) -> tuple[list[Row], bool]:
    """``(rows, clean)``: the first usable row of each id, and whether the file held nothing else."""
    if not path.is_file():
        return [], True
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    clean = True
    for line in path.read_text(encoding="utf-8", errors="replace").split("\n"):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            clean = False
            continue
        if not isinstance(row, dict) or not isinstance(row.get("id"), str) or not usable(row) or row["id"] in seen:
            clean = False
            continue
        seen.add(row["id"])
        rows.append(row)
    return rows, clean


def _token_ids(value: Any, vocab_size: int) -> bool:
    """Whether ``value`` is a list of token ids of a vocabulary of ``vocab_size`` (ints; JSON's true is no id)."""
    return isinstance(value, list) and all(type(t) is int and 0 <= t < vocab_size for t in value)


def sample_row(vocab_size: int) -> Callable[[Row], bool]:
    """Whether a ``samples.jsonl`` row is one :func:`distill` writes for a verifier of ``vocab_size`` token ids: the
    later stages index the verifier's embedding with its ids and read its other fields."""
    def usable(row: Row) -> bool:
        return all(isinstance(row.get(k), str) for k in ("group", "source", "license")) \
            and _token_ids(row.get("prompt_ids"), vocab_size) and _token_ids(row.get("response_ids"), vocab_size)
    return usable


def _prompt_row(row: Row) -> bool:
    """Whether a ``self_prompts.jsonl`` row is one :func:`write_self_prompts` writes: a prompt, or a skipped request."""
    if row.get("skipped") is True:
        return True
    names = {f.name for f in fields(TrainPrompt)}
    return set(row) == names and all(isinstance(row[n], str) or (n == "response" and row[n] is None) for n in names)


def _vocab_size(model: Any) -> int:
    """The token ids ``model`` embeds: what a sample's ids must stay below."""
    embeddings = model.get_input_embeddings()
    return int(getattr(embeddings, "num_embeddings", None) or model.config.get_text_config().vocab_size)


def _rewrite_clean(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rewrite ``path`` with only its complete rows (after a torn write), atomically."""
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))


def _end_line(path: Path) -> None:
    """A torn last line gets its end, so the next row appended starts on a line of its own."""
    if path.is_file() and path.stat().st_size:
        with path.open("rb+") as f:
            f.seek(-1, 2)
            if f.read(1) != b"\n":
                f.write(b"\n")


def _check_made(out: Path, row: Row, usable: Callable[[Row], bool]) -> None:
    """Refuse to write a row that reading ``out`` would drop: it would be made again, and dropped, on every run."""
    if not usable(row):
        raise TrainHeadError(f"the row made for id {row['id']!r} cannot go in {out}: its token ids lie outside the "
                             "verifier's vocabulary (does the tokenizer belong to the model?)")


def _check_prompt(out: Path, row: dict[str, Any], ids: list[int]) -> None:
    """Refuse a recorded response to other prompt tokens than this run's under the same id."""
    if "prompt_ids" in row and row["prompt_ids"] != ids:
        raise TrainHeadError(f"{out} holds a response to another prompt under id {row['id']!r} (edited --data, or "
                             "another tokenizer or chat template); use --overwrite to start afresh")


def _generate(model: Any, tokenizer: Any, rows: list[torch.Tensor], max_new_tokens: int, do_sample: bool,
              temperature: float) -> list[list[int]]:
    """Generate for left-padded ``rows``; each output is cut after its first end-of-sequence token."""
    device = model.device
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((len(rows), width), pad, dtype=torch.long, device=device)
    mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    for b, row in enumerate(rows):
        ids[b, width - len(row):], mask[b, width - len(row):] = row.to(device), 1
    kwargs: dict[str, Any] = dict(do_sample=do_sample, temperature=temperature, top_p=1.0, top_k=0) if do_sample else \
        dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, pad_token_id=pad, **kwargs)
    eos = set(_eos_ids(model, tokenizer))
    texts = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        texts.append(row[:cut])
    return texts


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    eos = eos if eos is not None else tokenizer.eos_token_id
    return list(eos) if isinstance(eos, (list, tuple)) else ([eos] if eos is not None else [])


def _batched(model: Any, tokenizer: Any, items: list[dict[str, Any]], out: Path, encode: Callable[[dict], torch.Tensor],
             finish: Callable[[dict, list[int], torch.Tensor], dict | None], *, usable: Callable[[Row], bool],
             batch_size: int, max_new_tokens: int, do_sample: bool, temperature: float, desc: str,
             progress: bool) -> list[dict[str, Any]]:
    """Generate for every item whose usable row (``usable``: see :func:`read_jsonl`) is not in ``out`` yet, in
    batches of similar prompt length, appending ``finish(item, response_ids, prompt_ids)`` rows (``None``: skip the
    item, but remember it was done)."""
    done, clean = _read_rows(out, usable)
    if not clean:
        _rewrite_clean(out, done)
    out.parent.mkdir(parents=True, exist_ok=True)
    seen = {r["id"]: r for r in done}
    todo = []
    for item in items:
        ids = encode(item)
        if item["id"] in seen:
            _check_prompt(out, seen[item["id"]], ids.tolist())
        else:
            todo.append((item, ids))
    todo.sort(key=lambda pair: len(pair[1]))  # similar lengths share a batch: less padding
    _end_line(out)
    with out.open("a", encoding="utf-8") as f, tqdm(total=len(todo), desc=desc, disable=not progress) as bar:
        for start in range(0, len(todo), batch_size):
            chunk = todo[start:start + batch_size]
            responses = _generate(model, tokenizer, [ids for _, ids in chunk], max_new_tokens, do_sample, temperature)
            for (item, ids), response in zip(chunk, responses):
                row = finish(item, response, ids) or {"id": item["id"], "skipped": True}
                _check_made(out, row, usable)
                f.write(json.dumps(row) + "\n")
                done.append(row)
            f.flush()
            bar.update(len(chunk))
    return [r for r in done if not r.get("skipped")]


def write_self_prompts(model: Any, tokenizer: Any, count: int, out: Path, *, seed: int = 0, batch_size: int = 32,
                       max_new_tokens: int = 160, avoid: Iterable[str] = (), progress: bool = True) -> list[TrainPrompt]:
    """``count`` requests to the verifier for prompts of every Spec-Bench task type (articles to summarise, text
    to translate either way, passages to answer questions about, word problems, programming tasks, text to
    extract from, instructions, chat; :mod:`specdec.training.self_instruct`), sampled at temperature 0.8;
    resumable. A prompt that comes out like an earlier one, or like one in ``avoid``, is dropped."""
    requests = self_instruct_requests(count, seed)
    by_id = {r["id"]: r for r in requests}
    made = read_jsonl(out, _prompt_row)
    seen = {normalise(p) for p in avoid} | {normalise(r["prompt"]) for r in made if r.get("prompt")}

    def finish(request: dict, response: list[int], _: torch.Tensor) -> dict | None:
        prompt = build_prompt(request, tokenizer.decode(response, skip_special_tokens=True))
        if prompt is None or normalise(prompt) in seen:
            return None
        seen.add(normalise(prompt))
        return TrainPrompt(request["id"], request["group"], prompt, SOURCE, LICENSE).to_json()

    torch.manual_seed(seed)
    rows = _batched(model, tokenizer, requests, out, lambda r: encode_prompt(tokenizer, r["ask"])[0], finish,
                    usable=_prompt_row, batch_size=batch_size, max_new_tokens=max_new_tokens, do_sample=True,
                    temperature=0.8, desc="verifier writes prompts", progress=progress)
    return [TrainPrompt(**r) for r in rows if r["id"] in by_id]


#: temperatures of the sampled responses (``distill(sampled=...)``), taken in turn
SAMPLE_TEMPERATURES = (0.7, 0.85, 1.0)


def sampled_share(item_id: str, share: float) -> bool:
    """Whether prompt ``item_id`` also gets a sampled response: a fixed share of prompts, by a hash of the id
    (the same prompts on every rerun, whatever the order)."""
    return share > 0 and (zlib.crc32(item_id.encode()) % 10_000) < share * 10_000


def distill(model: Any, tokenizer: Any, prompts: Iterable[TrainPrompt], out: Path, *, batch_size: int = 32,
            max_new_tokens: int = 192, sampled: float = 0.0, seed: int = 0,
            progress: bool = True) -> list[dict[str, Any]]:
    """Greedy responses of the verifier to ``prompts``, appended to ``out`` (JSON Lines: id, group, source,
    license, ``prompt_ids``, ``response_ids``); resumable. Prompts that come with a ``response`` keep it
    (tokenized, plus end of sequence). A ``sampled`` share of the prompts also gets a sampled response (id
    ``ID@tT``, temperatures :data:`SAMPLE_TEMPERATURES` in turn, ``temperature`` recorded). Returns every
    sample in ``out``."""
    items = [p.to_json() for p in prompts]
    usable = sample_row(_vocab_size(model))
    given = [p for p in items if p.get("response")]
    if given:
        done, clean = _read_rows(out, usable)
        if not clean:
            _rewrite_clean(out, done)
        recorded = {r["id"]: r for r in done}
        out.parent.mkdir(parents=True, exist_ok=True)
        eos = _eos_ids(model, tokenizer)[:1]
        _end_line(out)
        with out.open("a", encoding="utf-8") as f:
            for p in given:
                prompt_ids = encode_prompt(tokenizer, p["prompt"])[0].tolist()
                response = tokenizer(p["response"], add_special_tokens=False)["input_ids"] + eos
                if p["id"] in recorded:
                    _check_prompt(out, recorded[p["id"]], prompt_ids)
                    if recorded[p["id"]].get("response_ids") != response:
                        raise TrainHeadError(f"{out} holds another response under id {p['id']!r} (edited --data); "
                                             "use --overwrite to start afresh")
                    continue
                row = {**{k: p[k] for k in ("id", "group", "source", "license")}, "prompt_ids": prompt_ids,
                       "response_ids": response}
                _check_made(out, row, usable)
                f.write(json.dumps(row) + "\n")
        items = [p for p in items if not p.get("response")]

    def finish(item: dict, response: list[int], ids: torch.Tensor) -> dict:
        return {**{k: item[k] for k in ("id", "group", "source", "license")}, "prompt_ids": ids.tolist(),
                "response_ids": response}

    def encode(p: dict) -> torch.Tensor:
        return encode_prompt(tokenizer, p["prompt"])[0]

    samples = _batched(model, tokenizer, items, out, encode, finish, usable=usable, batch_size=batch_size,
                       max_new_tokens=max_new_tokens, do_sample=False, temperature=1.0,
                       desc="verifier writes responses", progress=progress)
    extra = [p for p in items if sampled_share(p["id"], sampled)]
    for i, temperature in enumerate(SAMPLE_TEMPERATURES):
        chosen = [{**p, "id": f"{p['id']}@t{temperature}", "temperature": temperature}
                  for p in extra[i::len(SAMPLE_TEMPERATURES)]]
        if not chosen:
            continue
        torch.manual_seed(seed + i)
        samples = _batched(model, tokenizer, chosen, out, encode,
                           lambda item, response, ids: {**finish(item, response, ids), "temperature": item["temperature"]},
                           usable=usable, batch_size=batch_size, max_new_tokens=max_new_tokens, do_sample=True,
                           temperature=temperature, desc=f"sampled responses (T={temperature})", progress=progress)
    return samples
