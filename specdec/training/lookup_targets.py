"""What prompt lookup would draft at every position of a training sequence, for a head that serves a composite.

A composite drafter (:class:`~specdec.drafters.CompositeDrafter`) drafts by prompt lookup where the text repeats
and asks its head only elsewhere, so a head trained for it can weigh the targets the lookup already drafts right
less (``train-head --lookup-weight``). :func:`lookup_drafts` gives, in one pass over a sequence, the first token
:func:`specdec.drafters.prompt_lookup.lookup` drafts after each prefix, with composite's n-gram sizes and window.
"""

from __future__ import annotations

from collections.abc import Sequence

from specdec.drafters.composite import LOOKUP_NGRAMS
from specdec.drafters.prompt_lookup import WINDOW

MIN_NGRAM, MAX_NGRAM = LOOKUP_NGRAMS  # composite's lookup


def lookup_drafts(ids: Sequence[int], min_ngram: int = MIN_NGRAM, max_ngram: int = MAX_NGRAM,
                  window: int = WINDOW) -> list[int]:
    """``out[t]``: the token prompt lookup drafts after ``ids[:t]`` (its first), or -1 where it drafts nothing.

    Equal to ``lookup(ids[max(0, t - window):t], 1, min_ngram, max_ngram)`` at every ``t``: the longest suffix
    n-gram first, its latest earlier occurrence inside the window; here in one pass, keeping per n-gram size the
    latest position each n-gram ended at."""
    latest: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_ngram + 1)]
    out = [-1] * len(ids)
    for t in range(len(ids)):
        start = max(0, t - window)  # the context lookup searches ends at t and starts here
        for n in range(min(max_ngram, t - start - 1), min_ngram - 1, -1):
            follow = latest[n].get(tuple(ids[t - n:t]))  # where the token after its latest occurrence sits
            if follow is not None and follow - n >= start:
                out[t] = ids[follow]
                break
        for n in range(min_ngram, max_ngram + 1):  # the n-grams ending at t, followed by ids[t]
            if t - n >= 0:
                latest[n][tuple(ids[t - n:t])] = t
    return out
