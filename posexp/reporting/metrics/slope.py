"""``slope@Kx``: how fast perplexity grows with context, as one exponent.

The ordinary least-squares slope of ln(ppl) on ln(L / train_len) over every evaluated length L from the training
length (1×) up to and including K× the training length, in the rows the table shows:

    slope = Σ (xᵢ − x̄)(yᵢ − ȳ) / Σ (xᵢ − x̄)²,   xᵢ = ln(Lᵢ / train_len),  yᵢ = ln(pplᵢ)

that is, the exponent b of a power law ppl ∝ L^b fitted on log-log axes (the logs' base cancels). 0: flat;
> 0: perplexity grows with length (lower is better); 1: doubling the context doubles the perplexity. It is
n/a when a length of the span is not applicable (or has no positive perplexity), and not evaluated when the run
has no row at K× or fewer than two lengths in the span. K is above 1.
"""

from __future__ import annotations

import math
from typing import Any

from posexp.reporting.metrics import LOWER, Metric, MetricSpec, Value


def loglog_slope(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of ln(y) on ln(x) over (x, y) points with x, y > 0 and two or more distinct x."""
    xs = [math.log(x) for x, _ in points]
    ys = [math.log(y) for _, y in points]
    mean_x, mean_y = math.fsum(xs) / len(xs), math.fsum(ys) / len(ys)
    return (math.fsum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
            / math.fsum((x - mean_x) ** 2 for x in xs))


class Slope(MetricSpec):
    kind, pattern, forms, examples = "slope", "slope@{x}", "slope@Kx (log-log slope of ppl from 1x to Kx)", \
        ("slope@4x", "slope@8x")
    better, decimals, min_multiple, relative = LOWER, 3, 1.0, False  # an exponent: 0 is "flat"

    def error(self, raw: str, text: str) -> str:
        return f"{raw!r}: slope takes the upper end of its span as a multiple above 1, e.g. slope@8x"

    def value(self, metric: Metric, row: Any, report: Any) -> Value:
        train_len, cells = row.run.train_len, row.cells
        if train_len is None or metric.multiple is None:
            return None, None
        upper = int(round(metric.multiple * train_len))
        span = [n for n in sorted(cells) if train_len <= n <= upper]
        if upper not in cells or train_len not in cells or len(span) < 2:
            return None, None
        if any(not cells[n].applicable or not cells[n].mean or cells[n].mean <= 0 for n in span):
            return False, None
        return True, loglog_slope([(n / train_len, cells[n].mean) for n in span])

    def describe(self, metric: Metric, report: Any) -> str:
        return (f"{metric.name} = least-squares slope of ln(ppl) on ln(length / training length) over the evaluated "
                f"lengths from 1× to {metric.multiple:g}× the training length: the exponent b of ppl ∝ length^b "
                "(0 = flat; lower is better; n/a when a length in the span is n/a).")
