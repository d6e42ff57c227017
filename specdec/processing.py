"""The call's logits processors, applied row by row exactly as ``model.generate`` applies them.

``generate`` calls its processors on the whole batch, and some processors are built from the whole
batch: the repetition penalty ignores each row's left padding (read from the attention mask), and
``prefix_allowed_tokens_fn`` receives each row's batch index. specdec applies processors row by row,
each row with its own context (rows accept different numbers of drafts, so their lengths differ), so
each row gets a processor list built for that row alone (:class:`RowProcessors`).
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import torch
from transformers import LogitsProcessorList
from transformers.generation import logits_process as lp

from specdec.constraints.adapt import constrained_rows

#: one processor input: (the row's index in the call's batch, that row's context ``[length]``)
RowContext = tuple[int, torch.LongTensor]

#: transformers' processors that read only the scores, never ``input_ids``: applied to many rows in one call
CONTEXT_FREE = tuple(getattr(lp, name) for name in (
    "TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper", "TypicalLogitsWarper",
    "EpsilonLogitsWarper", "EtaLogitsWarper", "TopHLogitsWarper", "SuppressTokensLogitsProcessor",
    "LogitNormalization", "InfNanRemoveLogitsProcessor") if hasattr(lp, name))  # older transformers lack some


class RowProcessors:
    """The processors of one call: ``batched`` for the whole batch (the first token), ``rows[r]`` for row ``r``.

    Truthy when the call has any processor. ``rows`` may be ``None``: every row then uses ``batched``
    (right for processors that read nothing but each row's own context).
    """

    def __init__(self, batched: LogitsProcessorList | None, rows: Sequence[LogitsProcessorList] | None = None):
        self.batched = batched if batched is not None else LogitsProcessorList()
        self.rows = list(rows) if rows is not None else None

    def __bool__(self) -> bool:
        return len(self.batched) > 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        """The whole batch at once (``input_ids [B, L]``, the call's original rows), as ``generate`` calls it."""
        return self.batched(input_ids, scores)

    def for_row(self, row: int) -> LogitsProcessorList:
        """The processor list of the call's row ``row`` (its index in the batch ``generate`` was given)."""
        return self.batched if self.rows is None else self.rows[row]

    def apply(self, contexts: Sequence[RowContext], logits: torch.Tensor) -> torch.Tensor:
        """Processed scores ``[n, V]`` for ``logits [n, V]``: entry ``i`` with ``contexts[i] = (row, ids)``.

        Processors run in their order; a run of context-free ones (temperature, top-k/p, ...: they read
        only the scores) runs once over all ``n`` entries, the others once per entry with its own row's
        processor and context. A tree's nodes of one depth are then one call of each warper, not one per node.
        """
        if not self:
            return logits
        lists = [self.for_row(r) for r, _ in contexts]
        out = logits
        for i, processor in enumerate(lists[0]):
            if isinstance(processor, CONTEXT_FREE):
                out = processor(torch.zeros(out.shape[0], 1, dtype=torch.long, device=out.device), out)  # ids unread
            else:
                out = torch.cat([lists[j][i](ids.unsqueeze(0), out[j : j + 1]) for j, (_, ids) in enumerate(contexts)])
        return out


def build_row_processors(model, config, input_ids: torch.LongTensor, attention_mask: torch.Tensor,
                         logits_processor: LogitsProcessorList, prefix_allowed_tokens_fn: Callable | None) -> RowProcessors:
    """transformers' own processors for ``generate(input_ids, attention_mask=...)``: the batch's, and each row's.

    Each row's list is built as ``generate`` would build it for a batch of that row alone, with the
    row's prompt and attention mask (padding) and with ``prefix_allowed_tokens_fn`` told the row's batch index.
    """
    length, device = input_ids.shape[1], input_ids.device
    # grammar processors keep parser state between calls: each row gets its own, answering for any context
    batched_user, row_user = constrained_rows(logits_processor, input_ids)

    def build(ids: torch.LongTensor, mask: torch.Tensor, prefix_fn: Callable | None,
              user: list) -> LogitsProcessorList:
        return model._get_logits_processor(
            generation_config=config,
            input_ids_seq_length=length,
            encoder_input_ids=ids,  # encoder_repetition_penalty / encoder_no_repeat_ngram_size read the prompt
            prefix_allowed_tokens_fn=prefix_fn,
            logits_processor=LogitsProcessorList(user),
            device=device,
            model_kwargs={"attention_mask": mask},
        )

    batched = build(input_ids, attention_mask, prefix_allowed_tokens_fn, batched_user)
    if not batched:
        return RowProcessors(batched)
    rows = [build(input_ids[r : r + 1], attention_mask[r : r + 1], None if prefix_allowed_tokens_fn is None
                  else functools.partial(_at_row, prefix_allowed_tokens_fn, r), row_user[r])
            for r in range(input_ids.shape[0])]
    return RowProcessors(batched, rows)


def _at_row(fn: Callable, row: int, _batch_id: int, ids: torch.Tensor) -> list[int]:
    """``prefix_allowed_tokens_fn`` called for a one-row batch, with the row's index in the real batch."""
    return fn(row, ids)
