"""A call's stopping criteria evaluated on host ints: where in a committed block a row stops.

transformers' criteria return device tensors, so calling them once per committed token costs a device sync per
token. The criteria ``generate`` builds from its arguments are simple functions of the token ids and the length:
``MaxLengthCriteria`` (``max_length``), ``EosTokenCriteria`` (one or several ids) and ``MaxTimeCriteria`` are
checked here on the host tokens the engine already read. Any other criterion (``stop_strings``, a user's own
``StoppingCriteria``) is called once per pass for all rows together, on the batch of every prefix the pass
committed, left padded as ``generate`` pads a ragged batch: one device read per pass instead of one per token.
"""

from __future__ import annotations

import time

import torch
from transformers import StoppingCriteriaList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, MaxTimeCriteria

from specdec.transfer import upload


class StopRules:
    """The host form of ``criteria`` (see the module doc). ``pad``: the id left padding of prefixes uses."""

    def __init__(self, criteria: StoppingCriteriaList, pad: int) -> None:
        self.max_length: int | None = None
        self.eos: frozenset[int] = frozenset()
        self.deadlines: list[float] = []
        self.device_rules = StoppingCriteriaList()
        self.pad = pad
        for c in criteria:
            if type(c) is MaxLengthCriteria:
                self.max_length = c.max_length if self.max_length is None else min(self.max_length, c.max_length)
            elif type(c) is EosTokenCriteria:
                self.eos |= frozenset(int(i) for i in c.eos_token_id.flatten().tolist())  # once per call
            elif type(c) is MaxTimeCriteria:
                self.deadlines.append(c.initial_timestamp + c.max_time)
            else:
                self.device_rules.append(c)

    def first_stops(self, rows: list[list[int]], starts: list[int], device: torch.device) -> list[int | None]:
        """Per row, the index in its new block (``rows[b][starts[b]:]``) of the first token after which the row
        stops, or ``None``. ``rows[b]``: the row's host tokens (left padding included) after the block."""
        out = [self._host_stop(row, start) for row, start in zip(rows, starts)]
        if self.device_rules:
            for b, j in enumerate(self._device_stops(rows, starts, device)):
                if j is not None and (out[b] is None or j < out[b]):
                    out[b] = j
        return out

    def _host_stop(self, row: list[int], start: int) -> int | None:
        timed_out = any(time.time() > d for d in self.deadlines)  # noqa: DTZ005  (as MaxTimeCriteria)
        for j in range(len(row) - start):
            if timed_out or row[start + j] in self.eos or \
                    (self.max_length is not None and start + j + 1 >= self.max_length):
                return j
        return None

    def _device_stops(self, rows: list[list[int]], starts: list[int], device: torch.device) -> list[int | None]:
        """Call the device criteria once on every prefix this pass committed (all rows), read back once."""
        prefixes = [(b, j, row[: start + j + 1]) for b, (row, start) in enumerate(zip(rows, starts))
                    for j in range(len(row) - start)]
        if not prefixes:
            return [None] * len(rows)
        width = max(len(p) for _, _, p in prefixes)
        ids = upload([[self.pad] * (width - len(p)) + p for _, _, p in prefixes], torch.long, device)
        done = self.device_rules(ids, None).tolist()
        out: list[int | None] = [None] * len(rows)
        for (b, j, _), stop in zip(prefixes, done):
            if stop and out[b] is None:
                out[b] = j
        return out
