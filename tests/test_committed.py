"""specdec.committed.CommittedRows: blocks committed row by row with transformers' stop rules.

End to end the same rules are checked against ``model.generate`` (test_batching.py, test_api.py); here they are
checked on hand-made blocks, where the expected rows can be written down.
"""

import torch

from specdec.arguments import prepare_generation
from specdec.committed import CommittedRows
from tiny_models import make_model

EOS, PAD = 2, 0


def _rows(ids: torch.Tensor, new: int = 6, eos: int | None = EOS) -> CommittedRows:
    setup = prepare_generation(make_model("llama"), ids, max_new_tokens=new, do_sample=False, eos_token_id=eos,
                               pad_token_id=PAD)
    return CommittedRows(setup, None, keep_scores=True, keep_logits=False)


def _block(tokens: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    t = torch.tensor(tokens)
    scores = torch.zeros(*t.shape, 4)
    return t, scores, scores


def test_a_block_stops_at_eos_and_nothing_after_it_is_committed():
    rows = _rows(torch.tensor([[5, 6], [7, 8]]))
    tokens, scores, logits = _block([[10, EOS, 11], [12, 13, 14]])
    assert rows.add_block(tokens, [3, 3], scores, logits) == [2, 3]  # row 0 took the EOS, not the token after it
    assert rows.row(0).tolist() == [5, 6, 10, EOS] and len(rows.scores[0]) == 2
    assert rows.retire() == [1] and rows.active == [1]  # row 0 leaves the batch, row 1 goes on
    assert rows.active_rows().owners == [1]


def test_max_length_cuts_a_block_and_ends_the_row():
    rows = _rows(torch.tensor([[5, 6]]), new=3)
    tokens, scores, logits = _block([[10, 11, 12, 13]])
    assert rows.add_block(tokens, [4], scores, logits) == [3]  # 2 + 3 new tokens: the fourth is never committed
    assert rows.retire() == [] and rows.done
    assert rows.sequences().tolist() == [[5, 6, 10, 11, 12]]


def test_without_eos_rows_run_until_all_stopped_and_are_cut_at_the_last_stop():
    """No EOS criterion: a row at max_length has stopped, the others go on; sequences end where the last stopped."""
    rows = _rows(torch.tensor([[5, 6], [7, 8]]), new=2, eos=None)
    tokens, scores, logits = _block([[10, 11], [12, 13]])
    assert rows.add_block(tokens, [1, 2], scores, logits) == [1, 2]
    assert rows.stopped_at == [None, 4] and rows.retire() == [0]  # row 1 is at max_length
    assert rows.add_block(torch.tensor([[14]]), [1], torch.zeros(1, 1, 4), torch.zeros(1, 1, 4)) == [1]
    assert rows.retire() == [] and rows.sequences().tolist() == [[5, 6, 10, 14], [7, 8, 12, 13]]
