"""Per-call speculative decoding statistics."""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field

from specdec import metrics


class _Rates:
    """The derived figures of a stats object's counts, each one of :mod:`specdec.metrics`' functions.

    Subclasses have ``proposed``, ``accepted``, ``proposed_per_position`` and ``accepted_per_position``
    and say what their verifier passes (per row) and committed tokens add up to.
    """

    proposed: int
    accepted: int
    proposed_per_position: list[int]
    accepted_per_position: list[int]

    def _passes(self) -> int:
        """Verifier passes, each counted once per row it served."""
        raise NotImplementedError

    def _committed(self) -> int:
        """Tokens those passes committed."""
        raise NotImplementedError

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens over proposed draft tokens."""
        return metrics.acceptance_rate(self.accepted, self.proposed)

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per row per verifier pass (accepted drafts + the verifier's own token)."""
        return metrics.mean_accepted_length(self._committed(), self._passes())

    @property
    def acceptance_by_position(self) -> list[float]:
        """Acceptance rate at each draft position."""
        return metrics.acceptance_by_position(self.accepted_per_position, self.proposed_per_position)

    @property
    def mean_draft_length(self) -> float:
        """Draft tokens proposed per row per verifier pass: ``k`` when fixed, less where adaptive k drafts less."""
        return metrics.mean_draft_length(self.proposed, self._passes())

    def _rates(self) -> dict[str, float | list[float]]:
        """The four figures under their ``to_dict`` keys."""
        return {"acceptance_rate": self.acceptance_rate, "mean_accepted_length": self.mean_accepted_length,
                "acceptance_by_position": self.acceptance_by_position, "mean_draft_length": self.mean_draft_length}


@dataclass
class RowStats(_Rates):
    """What one row of a batch did: the same counts as :class:`SpecStats`, for that row alone."""

    proposed: int = 0
    accepted: int = 0
    verifier_passes: int = 0  # passes this row took part in (it leaves the batch when it finishes)
    committed: int = 0  # tokens committed by those passes (accepted drafts + the verifier's own)
    accepted_lengths: list[int] = field(default_factory=list)  # accepted drafts per pass
    proposed_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)

    def record(self, proposed: int, accepted: int, committed: int, positions: int | None = None) -> None:
        """One pass: ``proposed`` drafts (a tree's nodes) spanning ``positions`` depths (default: a chain's)."""
        self.verifier_passes += 1
        self.proposed += proposed
        self.accepted += accepted
        self.committed += committed
        self.accepted_lengths.append(accepted)
        _count_positions(self.proposed_per_position, self.accepted_per_position,
                         [proposed if positions is None else positions], [accepted])

    def _passes(self) -> int:
        return self.verifier_passes

    def _committed(self) -> int:
        return self.committed

    def to_dict(self) -> dict:
        """Plain-JSON view including the derived rates."""
        return {**asdict(self), **self._rates()}


def _count_positions(proposed_at: list[int], accepted_at: list[int], positions: list[int], accepted: list[int]) -> None:
    """Add one pass to per-position (per-depth) counts: row ``b`` drafted at positions ``0..positions[b]-1``
    and had ``accepted[b]`` accepted."""
    while len(proposed_at) < max(positions, default=0):
        proposed_at.append(0)
        accepted_at.append(0)
    for span in positions:
        for i in range(span):
            proposed_at[i] += 1
    for n in accepted:
        for i in range(n):
            accepted_at[i] += 1


@dataclass
class SpecStats(_Rates):
    """What one speculative ``generate`` call did.

    Counts are batch totals, summed over rows; ``rows[b]`` has row ``b``'s own counts (rows in the
    order of the input batch). ``accepted_per_position[i]`` counts draft tokens accepted at draft
    position ``i`` (0-based; with trees: depth ``i + 1``) out of ``proposed_per_position[i]`` rows that
    drafted there. With trees, ``proposed`` counts tree nodes and ``tree`` is the configuration used.

    ``tree`` is ``None`` for a chain run: it names a tree configuration, and chains have none.
    :attr:`mean_tree_tokens` is a count of every run, chains included: the draft tokens the verifier scored per
    row per pass (a chain's ``k``, less where adaptive ``k`` drafts less; a tree's nodes), so ``"tree": null``
    beside a number there is a chain that scored that many drafts a pass, not a tree that went missing.
    """

    num_draft_tokens: int
    batch_size: int = 1
    new_tokens: int = 0
    proposed: int = 0
    accepted: int = 0
    verifier_forwards: int = 0  # verification passes, prefill excluded
    drafted_passes: int = 0  # of those, passes with >= 1 draft (adaptive k may choose plain passes: k = 0)
    drafter_forwards: int = 0
    drafter_stats: dict = field(default_factory=dict)  # the drafter's own counts (composite: lookup / model steps)
    committed_per_step: list[int] = field(default_factory=list)  # tokens committed, one entry per row per pass
    proposed_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    time_to_first_token: float = 0.0
    draft_seconds: float = 0.0  # time spent proposing (drafter passes and their processing)
    total_time: float = 0.0
    rows: list[RowStats] = field(default_factory=list)
    tree: dict | None = None
    draft_choice: dict | None = None  # draft="auto": the drafter chosen, why, and the ranking it measured
    verify: str = "token"  # how sampled drafts were verified (specdec.rules: token, block, traversal; greedy: alike)

    def __post_init__(self) -> None:
        if not self.rows:
            self.rows = [RowStats() for _ in range(self.batch_size)]

    def _passes(self) -> int:
        return len(self.committed_per_step)  # one entry per row per pass

    def _committed(self) -> int:
        return sum(self.committed_per_step)

    @property
    def mean_tree_tokens(self) -> float:
        """Draft tokens the verifier scored per row per pass, for chains and trees alike: a tree's nodes, a
        chain's drafts (``k``, or what adaptive ``k`` drafted). The same count as :attr:`mean_draft_length`,
        under the name the tree reports use; a number on a chain run too (``tree`` is ``None`` there)."""
        return self.mean_draft_length

    @property
    def time_per_output_token(self) -> float:
        """Seconds per generated token after the first (the decode phase)."""
        rest = self.new_tokens / max(self.batch_size, 1) - 1
        return (self.total_time - self.time_to_first_token) / rest if rest > 0 else 0.0

    @property
    def tokens_per_second(self) -> float:
        return metrics.throughput(self.new_tokens, self.total_time)

    def record_step(self, proposed: int | list[tuple[int, int]], accepted_per_row: list[int],
                    committed_per_row: list[int], row_ids: list[int] | None = None) -> None:
        """Account one verification pass: ``proposed`` drafts for each row (an int: a chain of that many;
        a list: per row ``(drafts, positions spanned)``, e.g. a tree's nodes and depth), what each row
        accepted and committed. ``row_ids`` are the rows' indices in the input batch (default: 0, 1, ...).
        """
        row_ids = list(range(len(accepted_per_row))) if row_ids is None else row_ids
        per_row = [(proposed, proposed)] * len(accepted_per_row) if isinstance(proposed, int) else proposed
        self.verifier_forwards += 1
        self.drafted_passes += int(any(n > 0 for n, _ in per_row))
        self.proposed += sum(n for n, _ in per_row)
        self.accepted += sum(accepted_per_row)
        self.committed_per_step.extend(committed_per_row)
        _count_positions(self.proposed_per_position, self.accepted_per_position, [s for _, s in per_row],
                         accepted_per_row)
        while len(self.rows) <= max(row_ids, default=-1):
            self.rows.append(RowStats())
        for r, a, c, (n, span) in zip(row_ids, accepted_per_row, committed_per_row, per_row):
            self.rows[r].record(n, a, c, span)

    def to_dict(self) -> dict:
        """Plain-JSON view including the derived rates (``specdec generate --json``'s outputs). Every key is
        there on every run: ``tree`` is ``null`` on a chain run and ``mean_tree_tokens`` still a number (the
        draft tokens scored per pass, see :attr:`mean_tree_tokens`)."""
        data = asdict(self)
        data.pop("committed_per_step")
        data["rows"] = [row.to_dict() for row in self.rows]
        data.update(
            **self._rates(),
            mean_tree_tokens=self.mean_tree_tokens,
            time_per_output_token=self.time_per_output_token,
            tokens_per_second=self.tokens_per_second,
        )
        return data

    def _rows(self) -> list[tuple[str, str]]:
        by_pos = ", ".join(f"{r:.2f}" for r in self.acceptance_by_position)
        return [
            ("new tokens", str(self.new_tokens)),
            ("draft length k", str(self.num_draft_tokens)),
            *([("tree", ", ".join(f"{k}={v}" for k, v in self.tree.items() if k in ("mode", "top_k", "depth",
                                                                                      "total_tokens", "nodes")))]
              if self.tree else []),
            ("mean draft length", f"{self.mean_draft_length:.2f} tokens / verifier pass"),
            ("acceptance rate", f"{self.acceptance_rate:.3f} ({self.accepted}/{self.proposed})"),
            ("mean accepted length", f"{self.mean_accepted_length:.2f} tokens / verifier pass"),
            ("acceptance by position", by_pos or "-"),
            *([("per row: accepted length", ", ".join(f"{r.mean_accepted_length:.2f}" for r in self.rows)),
               ("per row: acceptance", ", ".join(f"{r.acceptance_rate:.2f}" for r in self.rows))]
              if len(self.rows) > 1 else []),
            ("verifier passes", str(self.verifier_forwards)),
            ("passes that drafted", str(self.drafted_passes)),
            ("drafter forwards", str(self.drafter_forwards)),
            ("time to first token", f"{self.time_to_first_token * 1000:.1f} ms"),
            ("time per output token", f"{self.time_per_output_token * 1000:.1f} ms"),
            ("tokens/s", f"{self.tokens_per_second:.2f}"),
        ]

    def __str__(self) -> str:
        return "\n".join(f"{k:>24}: {v}" for k, v in self._rows())

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in self._rows())
        return f"<table><caption>speculative decoding</caption>{rows}</table>"
