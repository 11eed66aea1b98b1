"""``ppl_key@Kx``: key-token perplexity (LongPPL, Fang et al. 2024) at K times the training length.

The perplexity of a run over the key tokens an evaluator model picked (``eval.key_tokens.evaluator``;
:mod:`posexp.evaluation.key_tokens`): the targets it predicts much better with the row's whole context than with
its last ``short_len`` tokens (LSD > alpha and LCL > beta, the paper's 2 and -2). Every run evaluated with one
evaluator and rule is scored on the same targets, so the column compares how well each run uses its far context.
Not evaluated when the run's row at K× has no ``ppl_key`` (evaluated without an evaluator); n/a when no key
token fell in that row or the length is not applicable.
"""

from __future__ import annotations

from typing import Any

from posexp.reporting.metrics import LOWER, Metric, Value, ValueAt


class PplKey(ValueAt):
    kind, pattern, forms = "ppl_key", "ppl_key@{at}", "ppl_key@Kx, ppl_key@N (key-token perplexity, LongPPL)"
    examples, better, decimals, reads = ("ppl_key@4x", "ppl_key@8x"), LOWER, 2, "ppl_key"

    def value(self, metric: Metric, row: Any, report: Any) -> Value:
        length = metric.at(row.run.train_len)
        if not any(r.get("key_tokens") is not None and int(r.get("length", -1)) == length for r in row.run.rows):
            return None, None
        return super().value(metric, row, report)

    def describe(self, metric: Metric, report: Any) -> str:
        return (f"{metric.name} = perplexity at {metric.where()} over the key tokens only (LongPPL, Fang et al. 2024): "
                "the targets the key-token evaluator predicts with log p(long) - log p(short) > alpha and log p(long) "
                "> beta (eval.key_tokens; lower is better; n/a where no key token fell).")
