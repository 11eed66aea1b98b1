"""The one metric registry (posexp.reporting.metrics): a metric is declared once, and the parser, --metric's help,
shell completion, table decimals and verdict directions all read the declaration."""

from __future__ import annotations

import pytest

from posexp.errors import ConfigError
from posexp.reporting import metrics
from posexp.reporting.metrics import ACCURACY, HIGHER, LOWER, PERPLEXITY, MetricSpec, parse_metric


@pytest.fixture
def registry(monkeypatch):
    """A copy of the registry for the test to add to; the real one is left as it was."""
    metrics.specs()
    monkeypatch.setattr(metrics, "_REGISTRY", dict(metrics._REGISTRY))
    return metrics._REGISTRY


def test_a_metric_without_a_direction_fails_when_it_is_declared(registry):
    with pytest.raises(ValueError, match="declares no direction: set better = LOWER or HIGHER"):
        class NoDirection(MetricSpec):
            kind, pattern, forms = "nodir", "nodir@{x}", "nodir@Kx"
    with pytest.raises(ValueError, match="declares no direction"):
        class WrongDirection(MetricSpec):
            kind, pattern, forms, better = "wrongdir", "wrongdir", "wrongdir", "up"
    assert "nodir" not in registry and "wrongdir" not in registry


def test_a_kind_is_declared_once(registry):
    with pytest.raises(ValueError, match="kind 'ppl_at' is PplAt's already"):
        class Twin(MetricSpec):
            kind, pattern, forms, better = "ppl_at", "twin@{at}", "twin@Kx", LOWER


def test_every_declared_metric_parses_from_its_examples_and_names_a_direction():
    for spec in metrics.specs():
        assert spec.better in (LOWER, HIGHER) and spec.applies in (PERPLEXITY, ACCURACY)
        for example in spec.examples:
            parsed = parse_metric(example, 0.1, spec.applies)
            assert parsed.spec.family == spec.family and parsed.name.startswith(spec.family)


def test_a_new_metric_reaches_parser_help_completion_and_verdicts_from_its_declaration(registry):
    from posexp.cli.completion import _metrics

    class Peak(MetricSpec):
        kind, pattern, forms, examples, better, decimals = "peak", "peak@{at}", "peak@Kx", ("peak@4x",), HIGHER, 1

        def value(self, metric, row, report):
            return True, 1.0

        def describe(self, metric, report):
            return f"{metric.name} = a test metric."

    parsed = parse_metric("peak@4x", 0.1)
    assert (parsed.kind, parsed.multiple, parsed.decimals) == ("peak", 4.0, 1)
    assert parsed.higher_is_better
    assert "peak@Kx" in metrics.metric_help(PERPLEXITY) and "peak@Kx" not in metrics.metric_help(ACCURACY)
    assert "ratio@4x,peak@4x" in _metrics([], "ratio@4x,pe").items
    assert metrics.applies_to("peak@4x") == PERPLEXITY
    with pytest.raises(ConfigError, match="'four' is not a length"):
        parse_metric("peak@four", 0.1)


@pytest.mark.parametrize("name,better", [("ratio@4x", LOWER), ("ppl@1024", LOWER), ("auc", LOWER), ("auc@8x", LOWER),
                                         ("maxlen", HIGHER), ("gain", HIGHER), ("gain@4x", HIGHER)])
def test_the_verdict_direction_of_each_perplexity_metric(name, better):
    assert parse_metric(name, 0.1).higher_is_better == (better == HIGHER)


def test_task_names_go_to_task_runs_and_the_rest_to_language_model_runs():
    from posexp.reporting.task_report import split_task_metrics

    assert split_task_metrics("ratio@4x,acc@2x,maxlen,maxlen@acc90,efflen@85,ppl") == (
        ["ratio@4x", "maxlen", "ppl"], ["acc@2x", "maxlen@acc90", "efflen@85"])


def test_shown_values_read_another_field_of_the_rows_the_table_shows(tmp_path):
    """What a metric of a field beside ppl (ppl_key) reads: the shown view's rows only, n/a kept apart."""
    from helpers.runs import make_run

    from posexp.reporting import build_report
    from posexp.reporting.metrics import shown_values

    extra = [{"length": 256, "protocol": "sliding", "scaling": None, "applicable": True, "ppl": 9.0, "ppl_key": 99.0}]
    folder = make_run(tmp_path / "r", {128: 3.0, 256: 4.0, 512: None}, extra_rows=extra)
    report = build_report([folder])
    rows = {r["length"]: r for r in report.rows[0].run.rows if r["protocol"] == "nonoverlap"}
    rows[128]["ppl_key"], rows[256]["ppl_key"] = 5.0, float("nan")
    assert shown_values(report.rows[0], report, "ppl_key") == {128: (True, 5.0), 256: (False, None),
                                                               512: (False, None)}
