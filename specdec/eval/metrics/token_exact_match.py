"""token_exact_match: generations whose token ids equal the plain model's, token for token.

Unlike the hub's ``exact_match`` (strings, and a script on the hub), this compares token ids and
loads offline. A local ``evaluate`` module::

    m = evaluate.load(specdec.eval.metrics.metric_path("token_exact_match"))
    m.compute(predictions=[[1, 2, 3]], references=[[1, 2, 3]])   # {'exact_match': 1.0, 'matches': 1, 'total': 1}
"""

import datasets
import evaluate

from specdec import metrics

_DESCRIPTION = "Fraction (and count) of generations identical, token for token, to the reference generation."
_INPUTS = """
Args:
    predictions: generated token ids per prompt (the method under test).
    references: generated token ids per prompt (plain ``model.generate``).
Returns:
    exact_match: matches / total (0.0 for no prompts); matches; total.
"""


class TokenExactMatch(evaluate.Metric):
    def _info(self):
        ids = datasets.Sequence(datasets.Value("int64"))
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_INPUTS,
            features=datasets.Features({"predictions": ids, "references": ids}),
        )

    def _compute(self, predictions, references):
        matches, total = metrics.exact_matches(predictions, references), len(predictions)
        return {"exact_match": metrics.ratio(matches, total), "matches": matches, "total": total}
