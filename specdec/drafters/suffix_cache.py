"""The cross-call cache of suffix decoding: earlier calls' outputs, bounded, shared by threads, saved to a file.

A :class:`SuffixCache` belongs to the model-level :class:`~specdec.drafters.suffix.SuffixDrafter` (every per-call
copy shares it); each finished call adds its rows' outputs. It holds at most ``budget`` tokens: the oldest
sequences go first (FIFO, as arctic-inference's ``SuffixDecodingCache``). One lock guards it, so calls on several
threads may read and feed it at once. :meth:`SuffixCache.save` writes a JSON file through a temporary file and a
rename (a crash never leaves half a file); :meth:`SuffixCache.load` refuses a corrupted or foreign file in one line.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import tempfile
import threading
from array import array
from pathlib import Path

from specdec.drafters.suffix_index import Continuations, TokenIndex
from specdec.errors import SpecdecError

#: the default token budget of a cache (docs/suffix.md: at most about 0.25 KB of memory a token)
DEFAULT_BUDGET = 100_000
#: what a saved cache's ``format`` field says, and the version this code reads and writes
FILE_FORMAT = "specdec-suffix-cache"
FILE_VERSION = 1


class SuffixCacheError(SpecdecError, ValueError):
    """A suffix cache file that cannot be read (corrupted, another format or version), or a bad budget."""


def check_budget(budget: object) -> int:
    """``budget`` as a token count, or a one-line :class:`SuffixCacheError`."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise SuffixCacheError(f"a suffix cache budget is a token count >= 0, got {budget!r}")
    return budget


class SuffixCache:
    """Earlier outputs, indexed for suffix matching; at most ``budget`` tokens (0: it keeps nothing).

    Args:
        budget: tokens kept; adding past it drops the oldest sequences (a sequence longer than the budget keeps
            its last ``budget`` tokens).
    """

    def __init__(self, budget: int = DEFAULT_BUDGET) -> None:
        self.budget = check_budget(budget)
        self._lock = threading.Lock()
        self._index = TokenIndex()
        self._next = 0  # the next sequence id: ids grow, so the oldest sequence's entries lead every list
        self.learning = True  # False: calls still read the cache but add nothing (specdec eval's cold runs)

    @property
    def tokens(self) -> int:
        """Tokens held now (never above :attr:`budget`)."""
        return self._index.tokens

    @property
    def sequences(self) -> int:
        """Sequences held now."""
        return len(self._index.seqs)

    def add(self, tokens: list[int]) -> None:
        """Add one sequence (a call's output), evicting the oldest ones past the budget. Empty ones are skipped."""
        tokens = [int(t) for t in tokens][-self.budget :] if self.budget else []
        if len(tokens) < 2:  # a single token has no continuation: nothing to draft from it
            return
        with self._lock:
            while self._index.tokens + len(tokens) > self.budget:
                self._index.remove_oldest()
            self._index.extend(self._next, tokens)
            self._next += 1

    def match(self, context: list[int], depth: int) -> list[Continuations]:
        """The continuations of ``context``'s longest suffix found in the cache (:meth:`TokenIndex.match`)."""
        if not self._index.tokens:  # read without the lock: an empty cache costs nothing
            return []
        with self._lock:
            return self._index.match(context, depth)

    def clear(self) -> None:
        """Forget everything (the budget and :attr:`learning` stay)."""
        with self._lock:
            self._index = TokenIndex()

    def contents(self) -> list[list[int]]:
        """The sequences held, oldest first (copies)."""
        with self._lock:
            return [list(s) for s in self._index.seqs.values()]

    def nbytes(self) -> int:
        """Memory the cache holds now, in bytes (the dict tables, key ints and arrays, as ``sys.getsizeof`` counts them)."""
        with self._lock:
            index = self._index
            size = sys.getsizeof(index.seqs) + sys.getsizeof(index.ends)
            for seq in index.seqs.values():
                size += sys.getsizeof(seq)
            for key, codes in index.ends.items():
                size += sys.getsizeof(key) + sys.getsizeof(codes)
            return size

    # --- files ------------------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> Path:
        """Write the cache to ``path`` (JSON: its sequences as base64 int32), atomically: a temporary file in the
        same directory, renamed over ``path`` once complete. Returns the path."""
        path = Path(path)
        sequences = self.contents()
        body = {"format": FILE_FORMAT, "version": FILE_VERSION, "budget": self.budget,
                "sequences": [base64.b64encode(_bytes(s)).decode("ascii") for s in sequences]}
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(body, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def load(self, path: str | os.PathLike) -> None:
        """Replace the contents with those saved in ``path`` (this cache's budget applies: the oldest past it are
        dropped). Raises :class:`SuffixCacheError` (one line) for a missing, corrupted or foreign file; the cache is
        unchanged then."""
        sequences = read_file(path)
        keep, kept = [], 0
        for seq in reversed(sequences):  # the newest first, until the budget is full
            if len(seq) < 2:
                continue
            if kept + len(seq) > self.budget:
                break
            keep.append(seq)
            kept += len(seq)
        index = TokenIndex()
        for sid, seq in enumerate(reversed(keep)):
            index.extend(sid, seq)
        with self._lock:
            self._index, self._next = index, len(index.seqs)


def read_file(path: str | os.PathLike) -> list[list[int]]:
    """The sequences of a saved cache, checked; a one-line :class:`SuffixCacheError` naming ``path`` otherwise."""
    where = str(path)
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise SuffixCacheError(f"cannot read suffix cache {where}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise SuffixCacheError(f"{where} is not a suffix cache file (not text: corrupted or another format)") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as e:
        raise SuffixCacheError(f"{where} is not a suffix cache file (corrupted or truncated JSON: {e.msg} at "
                               f"line {e.lineno})") from None
    if not isinstance(body, dict) or body.get("format") != FILE_FORMAT:
        raise SuffixCacheError(f"{where} is not a suffix cache file (no format {FILE_FORMAT!r}): save one with "
                               "drafter.save(path)")
    if body.get("version") != FILE_VERSION:
        raise SuffixCacheError(f"{where} is a suffix cache of version {body.get('version')!r}; this specdec reads "
                               f"version {FILE_VERSION}: save it again with this version")
    raw = body.get("sequences")
    if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
        raise SuffixCacheError(f"{where} is corrupted: 'sequences' must be a list of base64 strings")
    out = []
    for i, s in enumerate(raw):
        try:
            data = base64.b64decode(s, validate=True)
        except ValueError:
            raise SuffixCacheError(f"{where} is corrupted: sequence {i} is not base64") from None
        if len(data) % 4:
            raise SuffixCacheError(f"{where} is corrupted: sequence {i} is not a whole number of int32 token ids")
        seq = array("i")
        seq.frombytes(data)
        if sys.byteorder == "big":  # files are little-endian everywhere
            seq.byteswap()
        if any(t < 0 for t in seq):
            raise SuffixCacheError(f"{where} is corrupted: sequence {i} holds a negative token id")
        out.append(seq.tolist())
    return out


def _bytes(tokens: list[int]) -> bytes:
    """``tokens`` as little-endian int32 (the file's layout on every machine)."""
    data = array("i", tokens)
    if sys.byteorder == "big":
        data.byteswap()
    return data.tobytes()
