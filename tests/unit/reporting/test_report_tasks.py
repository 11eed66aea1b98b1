"""posexp report over task runs: their own tables (never mixed with perplexity), intervals over seeds,
acc@Kx and maxlen@accP."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from posexp.errors import ConfigError, PosexpError
from posexp.evaluation.accuracy import wilson_interval
from posexp.reporting.metrics import ACCURACY, parse_metric
from posexp.reporting.task_report import build_task_report, did_not_learn, task_table_lines
from posexp.reporting.runs import read_run
from posexp.reporting.summary import report_main
from posexp.reporting.options import ReportOptions
from helpers import REPO
from helpers.runs import make_run, make_task_run


def test_seeds_are_averaged_with_a_t_interval_and_metrics_follow_the_definition(tmp_path):
    runs = [read_run(make_task_run(tmp_path / str(s), {64: 1.0, 128: acc2, 256: 0.2}, seed=s))
            for s, acc2 in ((0, 0.95), (1, 0.85))]
    report = build_task_report(runs, ["encoder"], ["acc@2x", "maxlen@acc90", "maxlen@acc80"])
    (group,) = report.groups
    cell = group.cells[128]
    assert cell.n == 2 and cell.mean == pytest.approx(90.0)
    assert cell.low < 85 and cell.high > 95  # t(0.975, 1) = 12.71: wide with two seeds
    assert group.metrics["acc@2x"].mean == pytest.approx(90.0)
    # seed 0 keeps >= 90% of its 100% up to 128 tokens; seed 1 (85%) only at 64
    assert group.metrics["maxlen@acc90"].mean == pytest.approx((128 + 64) / 2)
    assert group.metrics["maxlen@acc80"].mean == pytest.approx(128)


def test_task_runs_of_an_encoders_earlier_revision_are_never_averaged_with_its_latest(tmp_path):
    """fox task runs trained before its fix (no encoder.revision) and after it (revision 2) were averaged as seeds of
    one --by encoder group; the earlier one stands apart, named, and is not compared."""
    def fox(seed: int, acc: float, revision: dict) -> object:
        folder = make_task_run(tmp_path / str(seed), {64: 1.0, 128: acc}, encoder="fox", seed=seed)
        results = json.loads((folder / "results.json").read_text())
        results["run"]["config"]["encoder"].update(revision)
        (folder / "results.json").write_text(json.dumps(results))
        return read_run(folder)

    runs = [fox(0, 0.9, {"revision": 2}), fox(1, 0.8, {"revision": 2}), fox(2, 0.1, {})]
    report = build_task_report(runs, ["encoder"], ["acc@2x"])
    groups = {g.label: g for g in report.groups}
    assert groups["encoder=fox"].n == 2 and groups["encoder=fox"].cells[128].mean == pytest.approx(85.0)
    assert groups["encoder=fox [fox revision 1 (2 in others)]"].flags == ["earlier encoder revision"]
    assert [d.verdict for d in report.comparisons["copy"].differences] == ["not compared"]
    assert "copy: encoder=fox [fox revision 1 (2 in others)]: earlier encoder revision: trained by other code; not " \
           "comparable with the other runs" in report.warnings


def test_the_interval_of_an_accuracy_over_seeds_stays_within_0_and_100_percent(tmp_path):
    """Two seeds at 90% and 100%: t(0.975, 1) = 12.7 made it 95 ± 63.5, up to 158.5%. The t-interval is cut at
    100% (and 0%), said as [low, high]; one inside the bounds keeps its ± form."""
    runs = [read_run(make_task_run(tmp_path / str(s), {64: 1.0, 128: acc2, 256: acc4}, seed=s))
            for s, acc2, acc4 in ((0, 0.9, 0.5), (1, 1.0, 0.1))]
    report = build_task_report(runs, ["encoder"], ["acc@2x", "acc@4x"])
    (group,) = report.groups
    for stat in (group.cells[128], group.cells[256], group.metrics["acc@2x"], group.metrics["acc@4x"]):
        assert 0.0 <= stat.low <= stat.mean <= stat.high <= 100.0
    assert group.cells[128].low == pytest.approx(95.0 - 63.53, abs=0.01) and group.cells[128].high == 100.0
    assert (group.cells[256].low, group.cells[256].high) == (0.0, 100.0)
    text = "\n".join(task_table_lines(report))
    assert "| 95.0 [31.5, 100.0] | 30.0 [0.0, 100.0] |" in text and "± 63.5" not in text
    assert "cut there" in text
    assert group.cells[64].text(1) == "100.0 ± 0.0"


def test_the_interval_of_a_difference_of_accuracies_stays_within_100_points(tmp_path):
    """acc@4x of 50% and 10% against 0% and 5% over two paired seeds: the difference −27.50 read [−313.39, +258.39]
    points, though two accuracies differ by 100 points at most."""
    runs = [read_run(make_task_run(tmp_path / f"{enc}{s}", {64: 1.0, 256: acc4}, encoder=enc, seed=s))
            for enc, accs in (("rope", (0.5, 0.1)), ("alibi", (0.0, 0.05))) for s, acc4 in enumerate(accs)]
    report = build_task_report(runs, ["encoder"], ["acc@4x"])
    (diff,) = report.comparisons["copy"].differences
    assert diff.difference == pytest.approx(-27.5) and (diff.low, diff.high) == (-100.0, 100.0)
    assert "−27.50 [−100.00, +100.00]" in "\n".join(task_table_lines(report))


def test_the_interval_of_a_length_over_seeds_does_not_go_below_0_tokens(tmp_path):
    """maxlen@acc90 of 64 and 128 tokens over two seeds read 96 ± 407: down to −311 tokens."""
    runs = [read_run(make_task_run(tmp_path / str(s), {64: 1.0, 128: acc2}, seed=s)) for s, acc2 in ((0, 0.95), (1, 0.5))]
    (group,) = build_task_report(runs, ["encoder"], ["maxlen@acc90", "efflen@90", "maxlen@rel90"]).groups
    for name in ("maxlen@acc90", "efflen@90", "maxlen@rel90"):
        stat = group.metrics[name]
        assert stat.mean == 96 and stat.low == 0.0 and stat.high == pytest.approx(96 + 12.706 * 32, abs=0.1)
        assert stat.text(0) == f"96 [0, {stat.high:.0f}]"


def test_a_single_run_shows_its_wilson_interval_and_not_applicable_lengths(tmp_path):
    run = read_run(make_task_run(tmp_path / "r", {64: 0.5, 128: None}, encoder="learned"))
    (group,) = build_task_report([run]).groups
    low, high = wilson_interval(100, 200)
    assert group.cells[64].low == pytest.approx(100 * low) and group.cells[64].high == pytest.approx(100 * high)
    assert group.cells[128].applicable is False
    assert group.metrics["acc@2x"].applicable is False


def test_lm_and_task_runs_get_separate_tables(tmp_path):
    make_run(tmp_path / "sweep" / "0", {128: 10.0, 256: 12.0})
    make_task_run(tmp_path / "sweep" / "1", {64: 1.0, 128: 0.5})
    make_task_run(tmp_path / "sweep" / "2", {64: 0.9, 128: 0.1}, task="mqar")
    report_main([tmp_path / "sweep"], console=Console(file=open(tmp_path / "out.txt", "w"), width=200),
                options=ReportOptions(metrics=["ratio", "acc@2x"]))
    text = (tmp_path / "sweep" / "reports" / "default" / "report.md").read_text()
    perplexity, tasks = text.split("## Tasks: accuracy vs context length")
    assert "task=copy" not in perplexity and "task=mqar" not in perplexity  # no task run in the perplexity table
    assert "### task copy" in tasks and "### task mqar" in tasks and "acc@2x" in tasks and "50.0" in tasks
    assert (tmp_path / "sweep" / "reports" / "default" / "report_accuracy_vs_length.png").is_file()
    assert "## Tasks" in (tmp_path / "sweep" / "reports" / "default" / "summary.md").read_text()


def test_a_report_of_task_runs_only(tmp_path):
    make_task_run(tmp_path / "s" / "0", {64: 1.0, 128: 0.5})
    report_main([tmp_path / "s"], console=Console(file=open(tmp_path / "out.txt", "w"), width=200))
    text = (tmp_path / "s" / "reports" / "default" / "report.md").read_text()
    assert text.startswith("# Tasks: accuracy vs context length") and "maxlen@acc90" in text


def test_task_runs_are_named_by_what_sets_them_apart_as_perplexity_runs_are(tmp_path):
    """A sweep's task table named each run by every override it had (``experiment=smoke task=copy encoder=rope
    train.threads=1``), the shared ones too, where the perplexity table names it ``encoder=rope``."""
    runs = [read_run(make_task_run(tmp_path / str(i), {64: 0.9, 128: 0.5}, encoder=encoder, seed=0))
            for i, encoder in enumerate(["rope", "alibi"])]
    report = build_task_report(runs)
    assert [g.label for g in report.groups] == ["encoder=rope", "encoder=alibi"]
    assert report.shared_overrides == ["task=copy", "seed=0"]
    assert "Overrides shared by all runs: `task=copy`, `seed=0`." in task_table_lines(report)
    assert [g.label for g in build_task_report(runs[:1]).groups] == ["task=copy encoder=rope seed=0"]  # alone: all


@pytest.mark.parametrize("bad", ["acc@", "acc@twox", "maxlen@acc0", "maxlen@acc150"])
def test_unknown_task_metrics_name_the_option(bad):
    with pytest.raises(ConfigError) as e:
        parse_metric(bad, applies=ACCURACY)
    assert e.value.key == "--metric" and "acc@Kx" in str(e.value)


def _last_k_rows(losses: dict[int, float], train_len: int = 128) -> list[dict]:
    return [{"length": n, "multiple": n / train_len, "protocol": "last_k", "last_k": 64, "scaling": None,
             "applicable": True, "ppl": 2.718281828 ** loss, "loss": loss} for n, loss in losses.items()]


def test_context_gain_is_the_fall_of_the_last_k_loss_and_shows_by_default_with_last_k_rows(tmp_path):
    from posexp.reporting.lm_report import build_report

    make_run(tmp_path / "a", {128: 10.0, 512: 12.0}, extra_rows=_last_k_rows({128: 2.0, 256: 1.9, 512: 1.85}))
    make_run(tmp_path / "b", {128: 10.0, 512: 12.0}, overrides=["encoder=alibi"], encoder="alibi",
             extra_rows=_last_k_rows({128: 2.0, 512: 2.1}))
    report = build_report([tmp_path / "a", tmp_path / "b"])
    assert "gain" in [m.name for m in report.metrics]
    gains = {g.label: g.metrics["gain"].mean for g in report.groups}
    assert gains["encoder=rope"] == pytest.approx(0.15) and gains["encoder=alibi"] == pytest.approx(-0.1)
    at2 = build_report([tmp_path / "a"], ReportOptions(metrics=["gain@2x"])).groups[0].metrics["gain@2x"]
    assert at2.mean == pytest.approx(0.1)
    without = build_report([make_run(tmp_path / "c", {128: 10.0})])
    assert "gain" not in [m.name for m in without.metrics]


def test_tok_metrics_read_the_per_token_accuracy_where_exact_match_is_zero(tmp_path):
    runs = []
    for seed, tokens in ((0, {64: 0.9, 128: 0.4}), (1, {64: 0.8, 128: 0.2})):
        folder = make_task_run(tmp_path / str(seed), {64: 0.5, 128: 0.0}, seed=seed)
        results = json.loads((folder / "results.json").read_text())
        for row in results["rows"]:
            row["token_accuracy"] = tokens[row["length"]]
        (folder / "results.json").write_text(json.dumps(results))
        runs.append(read_run(folder))
    report = build_task_report(runs, ["encoder"], ["acc@2x", "tok@2x", "tok@64"])
    (group,) = report.groups
    assert group.metrics["acc@2x"].mean == pytest.approx(0.0)
    assert group.metrics["tok@2x"].mean == pytest.approx(30.0) and group.metrics["tok@64"].mean == pytest.approx(85.0)
    assert "per-token" in parse_metric("tok@2x", applies=ACCURACY).describe()


@pytest.mark.parametrize("fmt", ["csv", "json", "markdown", "latex"])
def test_task_runs_print_in_every_machine_format(tmp_path, fmt):
    """--format prints the task tables to stdout as it does the perplexity table (it printed nothing)."""
    import io

    make_task_run(tmp_path / "s" / "0", {64: 1.0, 128: 0.5})
    out = io.StringIO()
    report_main([tmp_path / "s"], console=Console(file=out, width=200), err_console=Console(file=io.StringIO()),
                options=ReportOptions(fmt=fmt))
    text = out.getvalue()
    if fmt == "json":
        (record,) = json.loads(text)["tasks"]
        assert record["task"] == "copy" and record["exact_match"]["128"]["mean"] == pytest.approx(50.0)
    else:
        assert "50.0" in text and ("copy" in text)


def test_json_of_lm_and_task_runs_is_one_document(tmp_path):
    import io

    make_run(tmp_path / "sweep" / "0", {128: 10.0, 256: 12.0})
    make_task_run(tmp_path / "sweep" / "1", {64: 1.0, 128: 0.5})
    out = io.StringIO()
    report_main([tmp_path / "sweep"], console=Console(file=out, width=200), err_console=Console(file=io.StringIO()),
                options=ReportOptions(fmt="json"))
    data = json.loads(out.getvalue())
    assert data["groups"] and data["tasks"][0]["task"] == "copy"


def test_csv_of_lm_and_task_runs_is_one_table(tmp_path):
    """It was two csv tables joined by a blank line, which a csv reader takes as one table of garbled lines: now one
    table in the task csv's shape, a line per group and value, the perplexity groups under task lm."""
    import io

    make_run(tmp_path / "sweep" / "0", {128: 10.0, 256: 12.0})
    make_task_run(tmp_path / "sweep" / "1", {64: 1.0, 128: 0.5})
    out = io.StringIO()
    report_main([tmp_path / "sweep"], console=Console(file=out, width=200), err_console=Console(file=io.StringIO()),
                options=ReportOptions(fmt="csv"))
    lines = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert all(None not in line and None not in line.values() for line in lines)  # every line fills the header
    values = {(line["task"], line["what"]): float(line["mean"]) for line in lines if line["mean"]}
    assert values[("lm", "ppl@256")] == pytest.approx(12.0) and values[("lm", "ratio")] == pytest.approx(1.2)
    assert values[("copy", "exact_match@128")] == pytest.approx(50.0)


def test_a_task_sweep_job_without_results_is_warned(tmp_path):
    """A report of perplexity runs named a sweep job with no results.json (failed, running or interrupted); one of
    task runs left it out without a word."""
    import io

    sweep = tmp_path / "sweep"
    make_task_run(sweep / "0", {64: 1.0, 128: 0.5})
    (sweep / "1" / ".hydra").mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    out = io.StringIO()
    summary = report_main([sweep], console=Console(file=out, width=300))
    assert f"warning: {sweep}: sweep job 1 has no results.json" in out.getvalue()
    assert "sweep job 1 has no results.json" in summary.read_text()


def test_runs_trained_at_different_lengths_are_never_averaged(tmp_path):
    runs = [read_run(make_task_run(tmp_path / str(i), {n: 0.5, 2 * n: 0.1}, seed=i, train_len=n))
            for i, n in enumerate((32, 64))]
    report = build_task_report(runs, ["encoder"])
    assert sorted(g.label for g in report.groups) == ["encoder=rope train_len=32", "encoder=rope train_len=64"]
    assert all(len(g.runs) == 1 for g in report.groups)


def test_runs_scored_on_different_instances_are_never_averaged(tmp_path):
    """Two seeds of task=babilong task.variant=qa7, one trained before its generator changed (its instances, and so
    its fingerprint, another's): ``--by encoder`` averaged them into one mean as if seeds of one experiment. They
    are shown apart, each labelled with its instances, and a warning says why."""
    runs = []
    for seed, fingerprint in ((0, "c20844be32439279"), (1, "10d9502d2a62b811")):
        run = make_task_run(tmp_path / str(seed), {64: 0.9, 128: 0.3}, task="babilong", seed=seed)
        recorded = json.loads((run / "results.json").read_text())
        recorded["run"]["corpus_fingerprint"] = fingerprint
        (run / "results.json").write_text(json.dumps(recorded))
        runs.append(read_run(run))
    report = build_task_report(runs, ["encoder"])
    assert sorted(g.label for g in report.groups) == ["encoder=rope [instances 10d9502d2a62]",
                                                      "encoder=rope [instances c20844be3243]"]
    assert all(len(g.runs) == 1 for g in report.groups)
    assert any("scored on different instances" in w for w in report.warnings)
    (comparison,) = report.comparisons.values()  # nor compared, as if one of them were the other's baseline
    assert all(d.reason == "measured differently: different instances" for d in comparison.differences)
    same = build_task_report([runs[0], read_run(make_task_run(tmp_path / "2", {64: 0.8, 128: 0.2}, seed=2))],
                             ["encoder"])  # another task: its own group, nothing to tell apart
    assert sorted(g.label for g in same.groups) == ["encoder=rope", "encoder=rope"] and not same.warnings


def test_a_filtered_report_keeps_the_sweeps_own_summary(tmp_path):
    import io

    sweep = tmp_path / "sweep"
    make_task_run(sweep / "0", {64: 1.0, 128: 0.5})
    make_task_run(sweep / "1", {64: 1.0, 128: 0.2}, encoder="alibi")
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    (sweep / "summary.md").write_text("the sweep's own summary\n")
    report_main([sweep], console=Console(file=io.StringIO(), width=200), options=ReportOptions(where=["encoder=alibi"]))
    assert (sweep / "summary.md").read_text() == "the sweep's own summary\n"
    (written,) = (sweep / "reports").iterdir()
    assert written.name == "where-encoder=alibi" and "alibi" in (written / "summary.md").read_text()


@pytest.mark.parametrize("kind,metric,allowed", [("task", "ratio", "acc@Kx"), ("lm", "acc@2x", "ratio@Kx")])
def test_a_metric_no_selected_run_has_is_an_error_naming_those_that_apply(tmp_path, kind, metric, allowed):
    """It was left out of the table in silence."""
    import io

    if kind == "task":
        make_task_run(tmp_path / "s" / "0", {64: 1.0, 128: 0.5})
    else:
        make_run(tmp_path / "s" / "0", {128: 10.0, 256: 12.0})
    with pytest.raises(ConfigError) as e:
        report_main([tmp_path / "s"], console=Console(file=io.StringIO()), options=ReportOptions(metrics=[metric]))
    assert e.value.key == "--metric" and metric in str(e.value) and allowed in str(e.value)


def _cells(output: str, edge: str) -> set[str]:
    """The text of every table cell on lines that start with ``edge`` (┃ headers, │ rows), one line each."""
    return {cell.strip() for line in output.splitlines() if line.startswith(edge) for cell in line.split(edge)}


@pytest.mark.parametrize("by", [(), ("--by", "encoder")])
def test_task_tables_at_40_columns_keep_every_label_readable_and_every_number_whole(tmp_path, by):
    from typer.testing import CliRunner

    from posexp.cli.app import app

    accuracy = {64: 1.0, 128: 0.955, 256: 0.5, 512: 0.125, 1024: 0.0, 2048: None}
    for seed in range(2):
        make_task_run(tmp_path / "sweep" / f"r{seed}", {n: a and a - seed / 100 for n, a in accuracy.items()},
                      task="reverse", seed=seed)
        make_task_run(tmp_path / "sweep" / f"m{seed}", {64: 1.0, 128: 0.5}, task="mqar", encoder="alibi", seed=seed)
    result = CliRunner().invoke(app, ["report", str(tmp_path / "sweep"), *by], env={"COLUMNS": "40"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert max(len(line) for line in out.splitlines()) <= 40 and "…" not in out, out
    report = build_task_report([read_run(tmp_path / "sweep" / name) for name in ("m0", "m1", "r0", "r1")],
                               list(by[1:]))
    headers, cells = _cells(out, "┃"), _cells(out, "│")
    assert {"encoder" if by else "run"} | {"n", "acc@2x", "acc@4x", "maxlen@acc90"} <= headers | {"encoder"}, out
    assert {str(n) for n in accuracy} <= headers, out
    numbers = 0
    for group in report.groups:
        for stat in [*group.cells.values(), *group.metrics.values()]:
            for decimals in (0, 1):
                text = stat.text(decimals, of=len(group.runs))
                numbers += text in cells
    assert numbers >= sum(len(g.cells) + len(g.metrics) for g in report.groups), out


# -- maxlen@acc90 is absolute; runs that never learned are marked -----------------------------------------

def test_maxlen_at_acc90_is_an_absolute_threshold_and_the_relative_form_has_its_own_name(tmp_path):
    """A passkey model at 0.2% got maxlen@acc90 = 128, the same as one at 95%: 90% of 0.2% is easy to keep."""
    never = read_run(make_task_run(tmp_path / "never", {64: 0.002, 128: 0.002, 256: 0.002}, task="passkey",
                                   examples=1000))
    good = read_run(make_task_run(tmp_path / "good", {64: 0.97, 128: 0.93, 256: 0.5}, task="passkey",
                                  encoder="alibi"))
    report = build_task_report([never, good], ["encoder"], ["maxlen@acc90", "maxlen@rel90", "maxlen@acc50"])
    value = {g.label: {name: s.mean for name, s in g.metrics.items()} for g in report.groups}
    assert value["encoder=rope"] == {"maxlen@acc90": 0, "maxlen@rel90": 256, "maxlen@acc50": 0}
    assert value["encoder=alibi"] == {"maxlen@acc90": 128, "maxlen@rel90": 128, "maxlen@acc50": 256}
    assert "every evaluated length has exact-match accuracy >= 90%" in parse_metric("maxlen@acc90", applies=ACCURACY).describe()
    assert "of the accuracy at the training length" in parse_metric("maxlen@rel90", applies=ACCURACY).describe()


def test_report_help_and_readme_define_maxlen_at_acc90():
    from typer.testing import CliRunner

    from posexp.cli.app import app

    result = CliRunner().invoke(app, ["report", "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0
    assert "maxlen@acc90: the longest length up to which every evaluated length has exact match >= 90%" \
        in " ".join(result.output.replace("│", " ").split())
    readme = (REPO / "README.md").read_text()
    assert re.search(r"`maxlen@acc90` \(the longest length up to which every evaluated length has exact match\s+"
                     r">= 90%", readme)


def _with_answer_tokens(folder: Path, per_instance: int) -> Path:
    results = json.loads((folder / "results.json").read_text())
    for row in results["rows"]:
        row["answer_tokens"] = per_instance * row["examples"]
    (folder / "results.json").write_text(json.dumps(results))
    return folder


def test_a_run_that_did_not_learn_at_1x_is_marked_with_chance_from_the_answer_alphabet(tmp_path):
    import io

    # parity answers one bit: chance is 50%, and 52% at 1x is a guess; 90% is learned
    make_task_run(tmp_path / "s" / "p0", {64: 0.52, 128: 0.5}, task="parity", encoder="nope")
    make_task_run(tmp_path / "s" / "p1", {64: 0.90, 128: 0.6}, task="parity", encoder="rope")
    for folder in ("p0", "p1"):
        _with_answer_tokens(tmp_path / "s" / folder, 1)
    # copy without a recorded answer size: exact match <= 5% did not learn; one of two seeds
    make_task_run(tmp_path / "s" / "c0", {64: 0.03, 128: 0.0}, seed=0)
    make_task_run(tmp_path / "s" / "c1", {64: 0.60, 128: 0.1}, seed=1)
    report = build_task_report([read_run(tmp_path / "s" / n) for n in ("p0", "p1", "c0", "c1")], ["encoder"])
    shown = {(g.task, g.label): g.shown_label for g in report.groups}
    assert shown[("parity", "encoder=nope")] == "encoder=nope (did not learn at 1×)"
    assert shown[("parity", "encoder=rope")] == "encoder=rope"
    assert shown[("copy", "encoder=rope")] == "encoder=rope (1 of 2 did not learn at 1×)"
    (warning,) = report.warnings
    assert warning.startswith("did not learn at 1×: ") and "parity: encoder=nope" in warning
    assert "copy: encoder=rope" in warning
    out = io.StringIO()
    report_main([tmp_path / "s"], console=Console(file=out, width=200), err_console=Console(file=io.StringIO()),
                options=ReportOptions(by=["encoder"], fmt="markdown"))
    assert "| encoder=nope (did not learn at 1×) | 1 |" in out.getvalue()
    data = io.StringIO()
    report_main([tmp_path / "s"], console=Console(file=data, width=200), err_console=Console(file=io.StringIO()),
                options=ReportOptions(by=["encoder"], fmt="json"))
    assert {(r["task"], r["group"]): r["did_not_learn"] for r in json.loads(data.getvalue())["tasks"]} == {
        ("parity", "encoder=nope"): 1, ("parity", "encoder=rope"): 0, ("copy", "encoder=rope"): 1}


def test_chance_comes_from_each_tasks_answer_alphabet():
    """Every shipped task's answer tokens take exactly the values its answer alphabet says, so chance (a uniform
    guess of each) is that many values to the power of the answer's length."""
    import numpy as np

    from posexp.tasks import chance_exact_match
    from helpers.tasks import SHIPPED, make

    for name in SHIPPED:
        task = make(name)
        expected = type(task).answer_values(task.options())
        # enough instances to see every value of a large alphabet (niah's 64 values, cwe's 512 words)
        count = 400 if expected is None else max(400, 8 * expected)
        made = task.instances(task.shortest_length(max(task.min_size, 4)), count, np.random.default_rng(0))
        values = len(np.unique(made.tokens[made.answer]))
        assert values == expected, name
    assert chance_exact_match("parity", {}, 1) == 0.5
    assert chance_exact_match("passkey", {"digits": 5}, 5) == pytest.approx(1e-5)
    assert chance_exact_match("copy", {"symbols": 4}, 3) == pytest.approx(4.0 ** -3)
    assert chance_exact_match("lm", {}, 3) is None


def test_chance_of_a_task_whose_answers_vary_in_length_is_the_mean_over_its_instances(tmp_path):
    """Flip-flop's instances hold from one read to many: a uniform guess gets an instance right with 2^-reads, whose
    mean over instances is well above 2^-(mean reads) (0.107 against 0.0625 at train_len 64). Chance from the mean
    put a run at 13% exact match more than 5 points above it: "learned", though within 3 points of chance."""
    import numpy as np

    from posexp.tasks import chance_exact_match
    from helpers.tasks import make

    task = make("flipflop")
    made = task.instances(64, 20000, np.random.default_rng(0))
    reads = made.answer.sum(axis=1)
    guessed = float(np.mean(0.5 ** reads))
    assert chance_exact_match("flipflop", {}, float(reads.mean()), task.size_for(64)) == pytest.approx(guessed, rel=0.05)
    run = make_task_run(tmp_path / "ff", {64: 0.13, 128: 0.02}, task="flipflop", train_len=64)
    recorded = json.loads((run / "results.json").read_text())
    for row in recorded["rows"]:
        row.update(size=task.size_for(row["length"]), answer_tokens=int(row["examples"] * 4))
    (run / "results.json").write_text(json.dumps(recorded))
    assert did_not_learn(read_run(run))


@pytest.mark.parametrize("variant", ["qa1", "qa2", "qa7"])
def test_a_babilong_model_that_always_says_one_word_is_at_chance_and_did_not_learn(tmp_path, variant):
    """Chance was a uniform guess of each answer byte (7^-3.5 for qa7's counts, 18^-6.5 for the places), about 0:
    a model that always answered "one" (qa7) or "kitchen" (qa1), never reading a fact, beat it by 25 and 17 points
    and was called learned. Chance is the best such constant answer, one word in four or six; a run 3 points above
    it did not learn, one at 45% did."""
    import numpy as np

    from posexp.tasks import chance_exact_match
    from helpers.tasks import make

    task = make("babilong", variant=variant)
    made = task.instances(256, 2000, np.random.default_rng(0), split="val")
    words = [bytes(row[answer].tolist()) for row, answer in zip(made.tokens, made.answer)]
    constant = max(words.count(w) for w in set(words)) / len(words)  # the best word to always say, and its score
    chance = chance_exact_match("babilong", task.options(), float(made.answer.sum(1).mean()), task.size_for(256))
    assert chance == pytest.approx(constant, abs=0.03)
    for accuracy, learned in ((chance + 0.03, False), (0.45, True)):
        run = make_task_run(tmp_path / f"{variant}-{accuracy}", {256: accuracy, 512: 0.1}, task="babilong",
                            train_len=256)
        recorded = json.loads((run / "results.json").read_text())
        recorded["run"]["task"]["options"] = task.options()
        for row in recorded["rows"]:
            row.update(size=task.size_for(row["length"]), answer_tokens=int(row["examples"] * 4))
        (run / "results.json").write_text(json.dumps(recorded))
        assert did_not_learn(read_run(run)) is not learned


@pytest.mark.parametrize("version,learned", [(1, False), (2, True)])
def test_an_old_qa7_run_is_judged_against_the_chance_of_its_own_instances(tmp_path, version, learned):
    """qa7's version 1 instances answered "one" 87% of the time: a run of them at 90%, reported alone, was called
    learned against the 1/4 of today's balanced instances. Its chance is that of the instances it was scored on."""
    import numpy as np

    from helpers.tasks import make

    task = make("babilong", variant="qa7")
    run = make_task_run(tmp_path / "qa7", {256: 0.9, 512: 0.5}, task="babilong", train_len=256)
    recorded = json.loads((run / "results.json").read_text())
    recorded["run"]["task"].update(options=task.options(), generator_version=version)
    for row in recorded["rows"]:
        row.update(size=task.size_for(row["length"]), answer_tokens=int(row["examples"] * 4))
    (run / "results.json").write_text(json.dumps(recorded))
    assert did_not_learn(read_run(run)) is not learned
    report = build_task_report([read_run(run)])
    assert any("did not learn" in w for w in report.warnings) is not learned
    assert np.isclose(task.chance(task.options(), 4.0, version=version), 22887 / 26329 if version == 1 else 0.25)


def test_efflen_is_the_longest_length_at_or_above_the_threshold_whatever_comes_before(tmp_path):
    """RULER's effective length: a dip at 128 (a run that recovers) does not end it, as it ends maxlen@acc85."""
    run = read_run(make_task_run(tmp_path / "r", {64: 0.95, 128: 0.6, 256: 0.9, 512: 0.3}))
    report = build_task_report([run], ["encoder"], ["efflen@85", "maxlen@acc85", "efflen@99"])
    (group,) = report.groups
    assert group.metrics["efflen@85"].mean == 256 and group.metrics["maxlen@acc85"].mean == 64
    assert group.metrics["efflen@99"].mean == 0
    with pytest.raises(ConfigError, match="efflen@P"):
        build_task_report([run], ["encoder"], ["efflen@0"])


def test_a_ruler_task_shows_its_effective_length_by_default(tmp_path):
    """RULER (Hsieh et al. 2024) reports a task's effective length (exact match >= 85%): a niah run's table shows
    efflen@85 without --metric; a task of another family keeps the plain defaults."""
    niah = make_task_run(tmp_path / "niah", {64: 1.0, 128: 0.9, 256: 0.5}, task="niah")
    recorded = json.loads((niah / "results.json").read_text())
    recorded["run"]["task"]["citation"] = "Hsieh et al. 2024 (RULER, needle in a haystack)"
    (niah / "results.json").write_text(json.dumps(recorded))
    report = build_task_report([read_run(niah)])
    assert [m.name for m in report.metrics] == ["acc@2x", "acc@4x", "maxlen@acc90", "efflen@85"]
    assert report.groups[0].metrics["efflen@85"].mean == 128
    copy = build_task_report([read_run(make_task_run(tmp_path / "copy", {64: 1.0, 128: 0.9}))])
    assert [m.name for m in copy.metrics] == ["acc@2x", "acc@4x", "maxlen@acc90"]


def test_where_on_task_runs_is_checked_as_on_perplexity_runs(tmp_path):
    """A --where no task run passes gave an empty report and exit status 0; beside perplexity runs, a --where only
    the task runs pass (task.name=copy) stopped the report as if no run matched."""
    import io

    tasks = tmp_path / "tasks"
    make_task_run(tasks / "0", {64: 1.0, 128: 0.5})
    make_task_run(tasks / "1", {64: 1.0, 128: 0.2}, encoder="alibi")

    def report(*folders, **options):
        out = io.StringIO()
        report_main(list(folders), tmp_path / "out", console=Console(file=out, width=200),
                    options=ReportOptions(fmt="csv", **options))
        return out.getvalue()

    with pytest.raises(PosexpError, match=r"^no run matches encoder=nope \(of 2 runs; they have encoder rope, alibi\)"):
        report(tasks, where=["encoder=nope"])
    for option in ("where", "by"):
        with pytest.raises(ConfigError, match=r"unknown config key 'nope'") as e:
            report(tasks, **{option: ["nope=1" if option == "where" else "nope"]})
        assert e.value.key == f"--{option}"
    make_run(tmp_path / "lm" / "0", {128: 10.0, 256: 12.0})
    text = report(tasks, tmp_path / "lm", where=["task.name=copy"], by=["encoder"])
    assert "copy,encoder=alibi" in text and "copy,encoder=rope" in text and "ppl@" not in text


def test_a_task_run_whose_results_cannot_be_read_is_left_out_with_a_warning(tmp_path):
    """It stopped the whole report, though --help promises the others are reported (with --strict it stops)."""
    import io

    sweep = tmp_path / "sweep"
    make_task_run(sweep / "0", {64: 1.0, 128: 0.5})
    make_task_run(sweep / "1", {64: 1.0, 128: 0.2}, seed=1)
    (sweep / "1" / "results.json").write_text('{"run": {"encoder": "rope",')  # cut short while written
    out = io.StringIO()
    report_main([sweep], tmp_path / "out", console=Console(file=out, width=300))
    assert "task=copy encoder=rope seed=0" in out.getvalue()
    assert f"warning: not in the table: {sweep / '1' / 'results.json'}: not valid JSON" in out.getvalue()
    with pytest.raises(PosexpError, match="not valid JSON"):
        report_main([sweep], tmp_path / "out", console=Console(file=io.StringIO()), options=ReportOptions(strict=True))


def test_a_task_metric_without_its_length_is_named_as_a_task_metric(tmp_path):
    """--metric acc of task runs said 'acc: metrics of perplexity runs, and the runs selected are task runs'."""
    import io

    make_task_run(tmp_path / "s" / "0", {64: 1.0, 128: 0.5})
    for family in ("acc", "tok", "efflen"):
        with pytest.raises(ConfigError) as e:
            report_main([tmp_path / "s"], tmp_path / "out", console=Console(file=io.StringIO()),
                        options=ReportOptions(metrics=[family]))
        assert str(e.value).startswith(f"--metric: unknown task metric {family!r}; choose from acc@Kx"), str(e.value)


def test_sort_orders_each_tasks_groups_and_shows_a_metric_it_sorts_by(tmp_path):
    runs = [read_run(make_task_run(tmp_path / enc, {64: 1.0, 128: acc2, 256: acc4}, encoder=enc))
            for enc, acc2, acc4 in (("rope", 0.5, 0.1), ("alibi", 0.9, 0.7), ("t5", 0.7, 0.2))]
    runs.append(read_run(make_task_run(tmp_path / "mqar", {64: 1.0, 128: 0.2}, task="mqar")))
    report = build_task_report(runs, ["encoder"], ["acc@2x"], sort="-acc@4x")
    assert [(g.task, g.label) for g in report.groups] == [  # each task's groups best first; the tasks stay apart
        ("copy", "encoder=alibi"), ("copy", "encoder=t5"), ("copy", "encoder=rope"), ("mqar", "encoder=rope")]
    assert [m.name for m in report.metrics] == ["acc@2x", "acc@4x"]  # the column it is sorted by is in the table
    assert [g.label for g in build_task_report(runs[:3], ["encoder"], sort="encoder").groups] == [
        "encoder=alibi", "encoder=rope", "encoder=t5"]
    with pytest.raises(ConfigError, match="--sort.*cannot sort by 'ratio'.*acc@Kx"):
        build_task_report(runs, ["encoder"], sort="ratio")  # a perplexity metric, named with the task metrics


def test_sort_by_a_metric_of_one_kind_orders_that_kinds_table_and_leaves_the_other(tmp_path):
    make_run(tmp_path / "s" / "0", {128: 10.0, 256: 12.0}, ["encoder=rope"])
    make_run(tmp_path / "s" / "1", {128: 10.0, 256: 11.0}, ["encoder=alibi"], encoder="alibi")
    for enc, acc in (("rope", 0.2), ("alibi", 0.8)):
        make_task_run(tmp_path / "s" / f"task-{enc}", {64: 1.0, 128: acc}, encoder=enc)
    parts = {}
    for sort in ("ratio", "-ratio", "acc@2x", "-acc@2x"):
        report_main([tmp_path / "s"], tmp_path / sort, console=Console(file=open(tmp_path / "out.txt", "w"), width=200),
                    options=ReportOptions(by=["encoder"], sort=sort))
        text = (tmp_path / sort / "report.md").read_text().replace(str(tmp_path / sort), "OUT")
        parts[sort] = text.split("## Tasks: accuracy vs context length")

    def first(text):  # the group on the table's first line (perplexity: "| alibi |", tasks: "| encoder=alibi |")
        at = {enc: min(i for p in ("", "encoder=") if (i := text.find(f"| {p}{enc} |")) >= 0) for enc in ("rope", "alibi")}
        return min(at, key=at.__getitem__)

    assert [first(parts[s][0]) for s in ("ratio", "-ratio")] == ["alibi", "rope"]  # alibi: ratio 1.1, rope 1.2
    assert parts["ratio"][1] == parts["-ratio"][1]  # a perplexity metric leaves the task table as it was
    assert [first(parts[s][1]) for s in ("acc@2x", "-acc@2x")] == ["rope", "alibi"]  # rope 20%, alibi 80%
    assert parts["acc@2x"][0] == parts["-acc@2x"][0]  # and a task metric the perplexity table


def test_task_groups_are_compared_with_the_baseline_as_perplexity_groups_are(tmp_path):
    """Task runs were shown side by side with no verdict (--baseline and --margin "not used"): three seeds of alibi
    against three of rope on passkey got no better/worse/inconclusive line, nor a bold best."""
    for i, (encoder, seed, at2x) in enumerate([("rope", 0, 0.50), ("rope", 1, 0.55), ("rope", 2, 0.45),
                                               ("alibi", 0, 0.80), ("alibi", 1, 0.90), ("alibi", 2, 0.82)]):
        make_task_run(tmp_path / "s" / str(i), {64: 1.0, 128: at2x}, encoder=encoder, seed=seed)
    runs = [read_run(tmp_path / "s" / str(i)) for i in range(6)]
    report = build_task_report(runs, ["encoder"], ["acc@2x"], baseline=["encoder=alibi"], margin="5")
    (comparison,) = report.comparisons.values()
    (diff,) = comparison.differences
    assert (comparison.reference, diff.group, diff.method, diff.n) == ("encoder=alibi", "encoder=rope", "paired t", 3)
    assert diff.difference == pytest.approx(100 * (0.50 - 0.84)) and diff.verdict == "worse"  # percentage points
    assert diff.p_adjusted < 0.05 and comparison.margin is not None
    lines = task_table_lines(report)
    assert "## Comparison, task copy" in lines and "| encoder=alibi | 3 | 100.0 ± 0.0 | **84.0 ± 13.1** | **84.0 ± 13.1** |" in lines
    out = tmp_path / "out.txt"
    report_main([tmp_path / "s"], console=Console(file=open(out, "w"), width=200),
                options=ReportOptions(by=["encoder"], baseline=["encoder=alibi"], fmt="json"))
    document = json.loads(out.read_text())
    assert document["task_comparisons"]["copy"]["reference"] == "encoder=alibi"
    report_main([tmp_path / "s"], console=Console(file=open(out, "w"), width=200), options=ReportOptions(by="encoder"))
    assert "task copy: each group − encoder=rope (paired t, 95% interval)" in out.read_text()
    with pytest.raises(ConfigError, match="^--baseline: no group has encoder=t5"):
        build_task_report(runs, ["encoder"], baseline="encoder=t5")
    # a sweep's own summary (no --by): a line per run, compared over what the sweep varies, as perplexity runs are
    alone = build_task_report(runs)
    assert len(alone.groups) == 6 and alone.comparisons["copy"].by == ["encoder"]
    report_main([tmp_path / "s"], console=Console(file=open(out, "w"), width=200))
    assert "task copy: Grouped by encoder (what the runs' overrides vary)" in out.read_text()
    assert "## Comparison, task copy" in (tmp_path / "s" / "reports" / "default" / "summary.md").read_text()
    with pytest.raises(ConfigError, match="--tolerance"):  # checked whichever runs there are, as for perplexity
        report_main([tmp_path / "s"], console=Console(file=open(tmp_path / "out.txt", "w")),
                    options=ReportOptions(tolerance=-1.0))
