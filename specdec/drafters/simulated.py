"""Simulated acceptance: a real drafter's cost with a chosen acceptance, so a random-weight model measures a user's speed.

Acceptance does not depend on the device; cost does. On a GPU lent for minutes there are no trained heads for an 8B
verifier, and a random head accepts nothing, so its speed says nothing about a user's. :class:`SimulatedDrafter`
runs a real drafter every pass (``start``, ``propose``, ``commit``, ``keep_rows``, ``finish``, exactly as the
engine calls them: its full cost, its cache kept in step with the accepted counts) and replaces the tokens it
proposes: per row and draft position, the verifier's known greedy token with the profile's *conditional*
acceptance probability (seeded draws on the host), and after the first draw that fails a wrong token (any token
but the greedy one). Greedy verification then accepts exactly the drawn prefix, so tokens per pass follow the
:class:`AcceptanceProfile` while every pass costs what the real drafter costs.

The verifier's greedy continuation is computed once, outside the timed call::

    sim = SimulatedDrafter(EagleDrafter(head, model), AcceptanceProfile.for_tokens_per_pass(3.0, k=4))
    sim.prepare(model, ids, attention_mask=mask, max_new_tokens=128)     # one model.generate(do_sample=False)
    spec = SpeculativeModel(model, sim, num_draft_tokens=4)
    spec.generate(ids, attention_mask=mask, max_new_tokens=128, do_sample=False)   # == generate's output
    sim.label                                                              # 'SIMULATED[3 tokens/pass ...] ...'

Under greedy decoding the committed rows are always prefixes of that reference, so the true next tokens of a row
with ``n`` tokens generated are ``reference[n : n + k]``: no device read per pass (the pattern is drawn on the
host, the reference indexed with host ints, one non-blocking upload). Every figure it yields is a simulation:
report it with :attr:`SimulatedDrafter.label`. Greedy only (sampling raises ``ValueError``); chains only.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from specdec.drafters.base import DraftContext, Drafter, DraftChain, Rows, WrappingDrafter
from specdec.metrics import expected_tokens
from specdec.transfer import upload

#: Conditional acceptance per draft position (position j: P(draft j accepted | drafts 0..j-1 accepted)) of the
#: shipped head (``eagle``: head-v2, shipped from BENCHMARKS.md section 18 on), greedy chain k=5 on Spec-Bench
#: (30 prompts, 128 new tokens, SmolLM2 fp32 verifier): ``accepted_per_position[j] / accepted_per_position[j - 1]``
#: (``/ proposed_per_position[0]`` at j = 0) pooled over the records of ``specdec[eagle:runs/head-v2,k=5]`` in
#: ``benchmarks/results/heads/head-v2-final/eval-greedy/records.jsonl`` (accepted 683, 303, 127, 68, 36 of 1,850
#: first drafts; 1.65 tokens a pass measured, 1.66 expected from these rates).
SHIPPED_HEAD_RATES = (0.369, 0.444, 0.419, 0.535, 0.529)
SHIPPED_HEAD_SOURCE = ("BENCHMARKS.md section 18: head-v2 (shipped `eagle`), Spec-Bench greedy chain k=5, "
                       "benchmarks/results/heads/head-v2-final/eval-greedy/records.jsonl")


@dataclass(frozen=True)
class AcceptanceProfile:
    """Conditional acceptance per draft position: ``rates[j]`` = P(draft ``j`` accepted | drafts ``0..j-1`` were).

    Positions past the list use its last rate. ``name`` labels every figure measured with it; ``source`` says where
    the rates come from.
    """

    rates: tuple[float, ...]
    name: str
    source: str = ""

    def __post_init__(self) -> None:
        rates = tuple(float(r) for r in self.rates)
        if not rates or not all(0.0 <= r <= 1.0 for r in rates):
            raise ValueError(f"acceptance rates must be a non-empty list of probabilities in [0, 1], got {self.rates!r}")
        object.__setattr__(self, "rates", rates)

    def rate(self, position: int) -> float:
        """Conditional acceptance of draft ``position`` (0-based)."""
        return self.rates[min(position, len(self.rates) - 1)]

    def expected_tokens_per_pass(self, k: int) -> float:
        """Expected tokens a pass of ``k`` drafts commits: the verifier's own token plus the accepted prefix."""
        total, reach = 1.0, 1.0
        for j in range(k):
            reach *= self.rate(j)
            total += reach
        return total

    def draw(self, rng: random.Random, k: int) -> int:
        """Drafts accepted in one pass of ``k``: Bernoulli trials of each position's rate up to the first failure."""
        accepted = 0
        while accepted < k and rng.random() < self.rate(accepted):
            accepted += 1
        return accepted

    @classmethod
    def constant(cls, a: float, name: str | None = None) -> "AcceptanceProfile":
        """The same conditional acceptance ``a`` at every position."""
        return cls((a,), name or f"constant a={a:.3f}", "parametric")

    @classmethod
    def for_tokens_per_pass(cls, target: float, k: int) -> "AcceptanceProfile":
        """The constant ``a`` whose pass of ``k`` drafts commits ``target`` tokens on average:
        ``(1 - a**(k+1)) / (1 - a) == target`` (:func:`specdec.metrics.expected_tokens`), by bisection."""
        if k < 1 or not 1.0 <= target <= k + 1:
            raise ValueError(f"tokens per pass must lie in [1, k + 1] = [1, {k + 1}] for k={k}, got {target}")
        lo, hi = 0.0, 1.0
        for _ in range(100):  # expected_tokens rises monotonically from 1 (a=0) to k + 1 (a=1)
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if expected_tokens(mid, k) < target else (lo, mid)
        a = 1.0 if target == k + 1 else 0.0 if target == 1 else (lo + hi) / 2  # the ends exactly
        return cls((a,), f"{target:g} tokens/pass at k={k} (a={a:.3f})", "parametric")

    @classmethod
    def shipped_head(cls) -> "AcceptanceProfile":
        """The shipped head's measured per-position acceptance (:data:`SHIPPED_HEAD_RATES`)."""
        return cls(SHIPPED_HEAD_RATES, "shipped head's acceptance (head-v2, Spec-Bench greedy)", SHIPPED_HEAD_SOURCE)

    def describe(self, k: int | None = None) -> str:
        """One line for reports: the name, the rates, the expected tokens per pass at ``k`` and the source."""
        rates = ", ".join(f"{r:.3f}" for r in self.rates)
        text = f"SIMULATED acceptance '{self.name}': conditional rates by position [{rates}]"
        if k is not None:
            text += f", {self.expected_tokens_per_pass(k):.2f} tokens/pass expected at k={k}"
        return text + (f"; source: {self.source}" if self.source else "")


def _prompt_key(ids: list[int], mask: list[int] | None) -> tuple[int, ...]:
    """A row's real prompt tokens (left padding dropped): the same prompt is found in any batch layout."""
    return tuple(ids if mask is None else (t for t, m in zip(ids, mask) if m))


class SimulatedDrafter(WrappingDrafter):
    """Runs ``inner`` at full cost every pass but proposes what ``profile`` says a drafter would get accepted.

    Args:
        inner: the drafter whose cost is paid (a :class:`Drafter` instance: a head, a model drafter, prompt lookup).
        profile: the conditional acceptance per draft position (:class:`AcceptanceProfile`).
        seed: seeds the host draws; every call starts from it, so a call's pattern is reproducible.
        name: how :attr:`label` names the inner drafter (default: its class name).

    Call :meth:`prepare` (or :meth:`set_reference`) with the call's prompts before ``generate``; a call whose prompt
    was not prepared raises ``ValueError``. Where a row's reference runs out (a call longer than the prepared one),
    its drafts are wrong tokens (rejected; counted in ``stats()['simulated_beyond_reference']``).

    ``stats()`` (``SpecStats.drafter_stats``) adds to the inner drafter's: ``simulated`` (the label),
    ``simulated_row_passes``, ``simulated_accepted`` (drafts drawn to be accepted: under greedy decoding exactly the
    verifier's count) and ``simulated_expected_tokens`` (what the profile expects those row-passes to commit, at
    each pass's own ``k``). Per pass it adds no device sync: one non-blocking upload of host indices and a gather.
    """

    supports_tree = False

    def __init__(self, inner: Drafter, profile: AcceptanceProfile, seed: int = 0, name: str | None = None) -> None:
        if not isinstance(inner, Drafter):
            raise TypeError(f"SimulatedDrafter wraps a Drafter instance, got {type(inner).__name__}")
        self.inner, self.profile, self.seed = inner, profile, seed
        self.name = name or type(inner).__name__
        # real prompt tokens -> (greedy new tokens, whether they end at a stop token); shared by the per-call copies
        self._references: dict[tuple[int, ...], tuple[list[int], bool]] = {}
        self._reset()

    def _reset(self) -> None:
        """Per-call state (:meth:`start` fills it)."""
        self._rng = random.Random(self.seed)
        self._table: torch.Tensor | None = None  # [2 * B * L] on the device: references, then wrong tokens
        self._lengths: list[int] = []  # per owner: reference tokens known
        self._complete: list[bool] = []  # per owner: the reference ends where the row stops
        self._width, self._batch, self._prompt = 0, 0, 0
        self._passes = self._accepted = self._beyond = 0
        self._expected = 0.0  # tokens the profile expects the row-passes to commit, given each pass's drafts

    # ---- what reports print -----------------------------------------------------------------------------
    @property
    def label(self) -> str:
        """A short label for every figure this drafter yields: ``SIMULATED[profile] over inner``."""
        return f"SIMULATED[{self.profile.name}] over {self.name}"

    def describe(self, k: int | None = None) -> str:
        """What the figures mean, for reports: the profile (rates, expected tokens per pass, source) and the drafter."""
        return (f"{self.profile.describe(k)}. The drafter {self.name} runs every pass at full cost; its tokens are "
                "replaced by the verifier's greedy token with the profile's acceptance (seeded), else a wrong one.")

    # ---- the reference ----------------------------------------------------------------------------------
    def prepare(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                max_new_tokens: int = 128, **generate_kwargs: Any) -> torch.Tensor:
        """Run ``model.generate(do_sample=False)`` once on these prompts and keep each row's greedy continuation
        (outside any timed call). Pass the stop settings the timed calls use (``eos_token_id``, ``pad_token_id``).
        Returns the sequences."""
        if generate_kwargs.pop("do_sample", False):
            raise ValueError("SimulatedDrafter simulates greedy decoding only: prepare with do_sample=False")
        with torch.no_grad():
            out = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                                 do_sample=False, **generate_kwargs)
        sequences = out if isinstance(out, torch.Tensor) else out.sequences
        eos = generate_kwargs.get("eos_token_id", getattr(model.generation_config, "eos_token_id", None))
        self.set_reference(input_ids, attention_mask, sequences, eos_token_id=eos)
        return sequences

    def set_reference(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                      sequences: torch.Tensor | Sequence[Sequence[int]],
                      eos_token_id: int | Sequence[int] | None = None) -> None:
        """Keep ``sequences`` (prompt, left padding included, then the greedy new tokens; ``generate``'s layout) as
        the reference of these prompts: e.g. specdec's own output where a bf16 near-tie broke the other way. A row
        ends at its first ``eos_token_id``: what ``generate`` pads it with after that is no continuation."""
        stops = set() if eos_token_id is None else {int(eos_token_id)} if isinstance(eos_token_id, int) else \
            {int(t) for t in eos_token_id}
        ids = input_ids.tolist()  # once, outside the timed call
        masks = attention_mask.tolist() if attention_mask is not None else [None] * len(ids)
        rows = sequences.tolist() if isinstance(sequences, torch.Tensor) else [list(r) for r in sequences]
        if len(rows) != len(ids):
            raise ValueError(f"{len(rows)} reference rows for {len(ids)} prompts")
        width = input_ids.shape[1]
        for row_ids, mask, row in zip(ids, masks, rows):
            if list(row[:width]) != row_ids:
                raise ValueError("a reference row does not start with its prompt (generate's layout: prompt, then new tokens)")
            new = [int(t) for t in row[width:]]
            end = next((i + 1 for i, t in enumerate(new) if t in stops), None)
            # a row that stopped is complete: drafting past its end is no shortfall of the reference
            self._references[_prompt_key(row_ids, mask)] = (new if end is None else new[:end], end is not None)

    # ---- the drafter --------------------------------------------------------------------------------------
    def for_call(self) -> "SimulatedDrafter":
        call = super().for_call()  # shares the references
        call._reset()
        return call

    def start(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, max_len: int, *,
              verifier: Any = None, hidden: torch.Tensor | None = None) -> None:
        self.inner.start(input_ids, attention_mask, max_len, verifier=verifier, hidden=hidden)
        self._reset()
        ids = input_ids.tolist()  # once per call, before the first pass
        masks = attention_mask.tolist() if attention_mask is not None else [None] * len(ids)
        references = []
        for b, (row, mask) in enumerate(zip(ids, masks)):
            found = self._references.get(_prompt_key(row, mask))
            if found is None:
                raise ValueError(f"SimulatedDrafter: the prompt of row {b} was not prepared; call "
                                 "drafter.prepare(model, input_ids, attention_mask, max_new_tokens=...) with this "
                                 "call's prompts before generate")
            references.append(found[0])
            self._complete.append(found[1])
        self._lengths = [len(r) for r in references]
        self._batch, self._prompt = len(references), input_ids.shape[1]
        self._width = width = max(max(self._lengths), 1)
        padded = [r + [0] * (width - len(r)) for r in references]
        # a wrong token differs from the greedy one and stays in the vocabulary: t - 1, or 1 for token 0
        wrong = [[t - 1 if t > 0 else 1 for t in r] for r in padded]
        flat = [t for r in padded for t in r] + [t for r in wrong for t in r]
        self._table = upload(flat, torch.long, input_ids.device)

    def propose(self, rows: Rows, k: int, ctx: DraftContext) -> DraftChain:
        if ctx.do_sample:
            raise ValueError("SimulatedDrafter simulates greedy decoding only (do_sample=False): under sampling the "
                             "verifier's next token is not known in advance")
        self.inner.propose(rows, k, ctx)  # the real drafter's full cost; its tokens are replaced below
        if k <= 0:
            return DraftChain(torch.zeros(len(rows), 0, dtype=torch.long, device=rows.device))
        index = []
        wrong_base = self._batch * self._width
        for b, owner in enumerate(rows.owners):
            done = rows.length(b) - self._prompt  # tokens generated so far: the reference's next index
            known = max(0, min(k, self._lengths[owner] - done))
            accepted = min(self.profile.draw(self._rng, k), known)
            self._passes += 1
            self._accepted += accepted
            self._beyond += 0 if self._complete[owner] else k - known
            self._expected += self.profile.expected_tokens_per_pass(known)
            base = owner * self._width
            last = max(self._lengths[owner] - 1, 0)
            index.append([base + done + j if j < accepted else wrong_base + base + min(done + j, last)
                          for j in range(k)])
        return DraftChain(torch.take(self._table, upload(index, torch.long, rows.device)))

    # commit and keep_rows are the inner drafter's: the accepted counts are those a real drafter of this acceptance
    # would see, and this drafter finds rows by owner, so nothing of its own moves

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.inner.stats())
        out.update(simulated=self.label, simulated_row_passes=self._passes, simulated_accepted=self._accepted,
                   simulated_expected_tokens=self._expected, simulated_beyond_reference=self._beyond)
        return out

    def finish(self) -> None:
        self.inner.finish()
        self._table = None
