"""mean_accepted_length: tokens committed per verifier forward pass, pooled over generations.

Each verifier pass commits the accepted draft tokens plus one token of the verifier's own, so the
value is at least 1 and at most ``k + 1``. A local ``evaluate`` module::

    m = evaluate.load(specdec.eval.metrics.metric_path("mean_accepted_length"))
    m.compute(committed=[40, 63], verifier_passes=[20, 21])
"""

import datasets
import evaluate

from specdec import metrics

_DESCRIPTION = "Tokens committed per verifier forward pass of speculative decoding, pooled over generations."
_INPUTS = """
Args:
    committed: tokens committed by verifier passes, per generation.
    verifier_passes: verifier forward passes, per generation.
Returns:
    mean_accepted_length: sum(committed) / sum(verifier_passes) (0.0 without passes).
"""


class MeanAcceptedLength(evaluate.Metric):
    def _info(self):
        ints = datasets.Value("int64")
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_INPUTS,
            features=datasets.Features({"committed": ints, "verifier_passes": ints}),
        )

    def _compute(self, committed, verifier_passes):
        return {"mean_accepted_length": metrics.mean_accepted_length(committed, verifier_passes)}
