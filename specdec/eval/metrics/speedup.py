"""speedup: throughput of a method over a baseline's on the same prompts, as a ratio.

Throughput is pooled (total new tokens / total seconds), so long generations weigh more than short
ones, as they do for a user. A local ``evaluate`` module::

    m = evaluate.load(specdec.eval.metrics.metric_path("speedup"))
    m.compute(new_tokens=[64, 64], seconds=[2.0, 2.2], baseline_new_tokens=[64, 64], baseline_seconds=[4.1, 4.0])
"""

import datasets
import evaluate

from specdec import metrics

_DESCRIPTION = "Pooled tokens/s of a method divided by pooled tokens/s of a baseline, on the same prompts."
_INPUTS = """
Args:
    new_tokens, seconds: the method's generated tokens and wall-clock seconds, per prompt.
    baseline_new_tokens, baseline_seconds: the baseline's, on the same prompts.
Returns:
    speedup: tokens_per_s / baseline_tokens_per_s (0.0 if the baseline has no throughput);
    tokens_per_s, baseline_tokens_per_s.
"""


class Speedup(evaluate.Metric):
    def _info(self):
        ints, floats = datasets.Value("int64"), datasets.Value("float64")
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_INPUTS,
            features=datasets.Features(
                {"new_tokens": ints, "seconds": floats, "baseline_new_tokens": ints, "baseline_seconds": floats}
            ),
        )

    def _compute(self, new_tokens, seconds, baseline_new_tokens, baseline_seconds):
        return {
            "speedup": metrics.speedup(new_tokens, seconds, baseline_new_tokens, baseline_seconds),
            "tokens_per_s": metrics.throughput(new_tokens, seconds),
            "baseline_tokens_per_s": metrics.throughput(baseline_new_tokens, baseline_seconds),
        }
