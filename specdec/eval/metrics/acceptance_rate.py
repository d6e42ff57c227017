"""acceptance_rate: accepted draft tokens over proposed draft tokens, overall and by draft position.

A local ``evaluate`` module (no hub access needed)::

    import evaluate
    from specdec.eval.metrics import metric_path
    m = evaluate.load(metric_path("acceptance_rate"))
    m.compute(accepted=[3, 1], proposed=[4, 4])                     # one total per generation
    m.compute(accepted=[[2, 1, 0], [1, 0, 0]], proposed=[[2, 2, 2], [1, 1, 1]])   # per draft position
"""

import datasets
import evaluate

from specdec import metrics

_DESCRIPTION = "Accepted draft tokens / proposed draft tokens of speculative decoding, pooled over generations."
_INPUTS = """
Args:
    accepted: accepted draft tokens per generation, an int or a list by draft position.
    proposed: proposed draft tokens per generation, same shape as ``accepted``.
Returns:
    acceptance_rate: pooled ratio (0.0 when nothing was proposed);
    acceptance_by_position: pooled ratio at each draft position (per-position inputs only);
    accepted, proposed: the pooled counts.
"""


class AcceptanceRate(evaluate.Metric):
    def _info(self):
        ints = datasets.Value("int64")
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_INPUTS,
            features=[
                datasets.Features({"accepted": ints, "proposed": ints}),
                datasets.Features({"accepted": datasets.Sequence(ints), "proposed": datasets.Sequence(ints)}),
            ],
        )

    def _compute(self, accepted, proposed):
        by_position = None
        if accepted and isinstance(accepted[0], (list, tuple)):
            accepted, proposed = metrics.pool_positions(accepted, proposed)
            by_position = metrics.acceptance_by_position(accepted, proposed)
        total_accepted, total_proposed = int(metrics.total(accepted)), int(metrics.total(proposed))
        result = {
            "acceptance_rate": metrics.acceptance_rate(total_accepted, total_proposed),
            "accepted": total_accepted,
            "proposed": total_proposed,
        }
        if by_position is not None:
            result["acceptance_by_position"] = by_position
        return result
