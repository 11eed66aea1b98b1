"""posexp report over task runs: their own tables (never mixed with perplexity), intervals over seeds,
acc@Kx and maxlen@accP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from posexp.errors import ConfigError
from posexp.evaluation.accuracy import wilson_interval
from posexp.reporting.task_report import build_task_report, parse_task_metric
from posexp.reporting.runs import load_run
from posexp.reporting.summary import report_main
from test_report import make_run


def make_task_run(folder: Path, accuracy: dict[int, float | None], task: str = "copy", encoder: str = "rope",
                  seed: int = 0, train_len: int = 64, examples: int = 200) -> Path:
    """A task run's folder as the trainer writes it; None = not applicable."""
    rows = []
    for length, acc in accuracy.items():
        exact = None if acc is None else round(acc * examples)
        low, high = (None, None) if acc is None else wilson_interval(exact, examples)
        rows.append({"metric": "accuracy", "task": task, "length": length, "multiple": length / train_len,
                     "depth": None, "protocol": "teacher_forced", "scaling": None, "scaling_factor": None,
                     "applicable": acc is not None, "exact_match": None if acc is None else exact / examples,
                     "exact_match_low": low, "exact_match_high": high, "examples": examples})
    overrides = [f"task={task}", f"encoder={encoder}", f"seed={seed}"]
    run = {"label": " ".join(overrides), "overrides": overrides, "encoder": encoder, "train_len": train_len,
           "seed": seed, "status": "completed", "task": {"name": task, "options": {}},
           "config": {"encoder": {"name": encoder}, "seed": seed, "train_len": train_len, "task": {"name": task}}}
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"run": run, "rows": rows}))
    return folder


def test_seeds_are_averaged_with_a_t_interval_and_metrics_follow_the_definition(tmp_path):
    runs = [load_run(make_task_run(tmp_path / str(s), {64: 1.0, 128: acc2, 256: 0.2}, seed=s))
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


def test_a_single_run_shows_its_wilson_interval_and_not_applicable_lengths(tmp_path):
    run = load_run(make_task_run(tmp_path / "r", {64: 0.5, 128: None}, encoder="learned"))
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
                metrics=["ratio", "acc@2x"])
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


@pytest.mark.parametrize("bad", ["acc@", "acc@twox", "maxlen@acc0", "maxlen@acc150"])
def test_unknown_task_metrics_name_the_option(bad):
    with pytest.raises(ConfigError) as e:
        parse_task_metric(bad)
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
    at2 = build_report([tmp_path / "a"], metrics=["gain@2x"]).groups[0].metrics["gain@2x"]
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
        runs.append(load_run(folder))
    report = build_task_report(runs, ["encoder"], ["acc@2x", "tok@2x", "tok@64"])
    (group,) = report.groups
    assert group.metrics["acc@2x"].mean == pytest.approx(0.0)
    assert group.metrics["tok@2x"].mean == pytest.approx(30.0) and group.metrics["tok@64"].mean == pytest.approx(85.0)
    assert "per-token" in parse_task_metric("tok@2x").describe()


@pytest.mark.parametrize("fmt", ["csv", "json", "markdown", "latex"])
def test_task_runs_print_in_every_machine_format(tmp_path, fmt):
    """--format prints the task tables to stdout as it does the perplexity table (it printed nothing)."""
    import io

    make_task_run(tmp_path / "s" / "0", {64: 1.0, 128: 0.5})
    out = io.StringIO()
    report_main([tmp_path / "s"], console=Console(file=out, width=200), fmt=fmt,
                err_console=Console(file=io.StringIO()))
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
    report_main([tmp_path / "sweep"], console=Console(file=out, width=200), fmt="json",
                err_console=Console(file=io.StringIO()))
    data = json.loads(out.getvalue())
    assert data["groups"] and data["tasks"][0]["task"] == "copy"


def test_runs_trained_at_different_lengths_are_never_averaged(tmp_path):
    runs = [load_run(make_task_run(tmp_path / str(i), {n: 0.5, 2 * n: 0.1}, seed=i, train_len=n))
            for i, n in enumerate((32, 64))]
    report = build_task_report(runs, ["encoder"])
    assert sorted(g.label for g in report.groups) == ["encoder=rope train_len=32", "encoder=rope train_len=64"]
    assert all(len(g.runs) == 1 for g in report.groups)


def test_a_filtered_report_keeps_the_sweeps_own_summary(tmp_path):
    import io

    sweep = tmp_path / "sweep"
    make_task_run(sweep / "0", {64: 1.0, 128: 0.5})
    make_task_run(sweep / "1", {64: 1.0, 128: 0.2}, encoder="alibi")
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    (sweep / "summary.md").write_text("the sweep's own summary\n")
    report_main([sweep], console=Console(file=io.StringIO(), width=200), where=["encoder=alibi"])
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
        report_main([tmp_path / "s"], console=Console(file=io.StringIO()), metrics=[metric])
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
    report = build_task_report([load_run(tmp_path / "sweep" / name) for name in ("m0", "m1", "r0", "r1")],
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
