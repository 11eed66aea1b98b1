"""Damaged runs and narrow terminals (issue 15, items 5, 7 and 13).

7: ``posexp report`` and ``posexp eval`` over many runs with one damaged results.json report
   or evaluate the others and name the damaged one in a one-line warning (exit 0);
   ``--strict`` stops at the first (exit 2).
5: a NaN or infinite number never keeps results.json from being written (it is written as
   null, its row saying so in ``note``), and a run damaged that way is reported, re-evaluated
   and resumed.
13: the report and the per-run table keep every number whole on one line at 80 columns and
    when piped; a long evaluation says how far it is, a short one prints nothing more.
"""

from __future__ import annotations

import io
import json
import math
import shutil
import statistics
from pathlib import Path

import pytest
from rich.console import Console

from helpers import TINY_RUN, invoke
from posexp.runs.layout import write_results_json
from posexp.reporting.options import ReportOptions

EVAL = {"tokens": 65536, "protocol": "nonoverlap"}
PIPED = 80  # the width Rich lays out for when the output is not a terminal (as when piped)


def strict_json(path: Path) -> dict:
    """The file as a strict JSON reader (not Python's) reads it: NaN and Infinity are refused."""
    def refuse(constant):
        raise ValueError(f"{path}: {constant} is not JSON")
    return json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)


def make_run(folder: Path, ppls: dict[int, float], label: str, encoder: str = "rope", seed: int = 0) -> Path:
    """A finished run folder as the trainer writes it (only what the report reads)."""
    rows = [{"length": n, "multiple": n / 128, "protocol": "nonoverlap", "scaling": None, "applicable": True,
             "ppl": p, "loss": math.log(p), "ppl_low": p * 0.97, "ppl_high": p * 1.03, "tokens": 65536,
             "tokens_per_s": 40000.0, "peak_mem_mb": 210.0} for n, p in ppls.items()]
    run = {"label": label, "overrides": label.split(), "encoder": encoder, "base": 10000.0, "train_len": 128,
           "seed": seed, "config": {"encoder": {"name": encoder}, "train_len": 128, "seed": seed},
           "corpus": "stdlib", "corpus_fingerprint": "fp", "eval_settings": dict(EVAL), "status": "completed",
           "params": 1000, "train": {"steps": 10, "tokens": 1000, "final_loss": 1.0}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps({"run": run, "rows": rows}), encoding="utf-8")
    return folder


DAMAGE = {
    "not_json": b"this is not JSON\n",
    "truncated": b'{"run": {"label": "x"}, "rows": [{"length": 1',
    "wrong_shape": b'[1, 2, 3]\n',
    "rows_not_a_list": b'{"run": {}, "rows": {"length": 128}}\n',
    "unreadable": b'{"run": {"label": "caf\xe9"}, "rows": []}\n',  # not UTF-8: cannot be read as text
    # hand edits: a value of the wrong type, an impossible one
    "ppl_a_string": b'{"run": {"label": "x"}, "rows": [{"length": 128, "ppl": "4.6"}]}\n',
    "ppl_zero": b'{"run": {"label": "x"}, "rows": [{"length": 128, "ppl": 0}]}\n',
    "accuracy_above_1": b'{"run": {"label": "x"}, "rows": [{"length": 128, "exact_match": 1.5}]}\n',
    "evaluations_a_string": b'{"run": {"label": "x"}, "rows": [{"length": 128, "ppl": 4.6}], "evaluations": "x"}\n',
}


def _sweep_with_one_damaged(tmp_path: Path, damage: bytes) -> Path:
    sweep = tmp_path / "sweep"
    for i in range(3):
        make_run(sweep / str(i), {128: 3.0 + i, 256: 3.5 + i}, f"seed={i}", seed=i)
    (sweep / "1" / "results.json").write_bytes(damage)
    return sweep


def _warning_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "warning:" in line]


# -- 7: report ----------------------------------------------------------------------------------

@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
def test_report_leaves_out_a_damaged_run_and_names_it_in_one_line(damage, tmp_path):
    sweep = _sweep_with_one_damaged(tmp_path, DAMAGE[damage])
    result = invoke("report", str(sweep), columns=PIPED)
    assert result.exit_code == 0, result.output
    assert "seed=0" in result.output and "seed=2" in result.output and "5.00" in result.output
    bad = str(sweep / "1" / "results.json")
    warnings = [line for line in _warning_lines(result.output) if bad in line]
    assert len(warnings) == 1, result.output  # the whole warning, path included, on one line
    assert "seed=1" not in result.output
    written = sweep / "reports" / "default" / "summary.md"
    assert bad in written.read_text().replace("\\", "")  # named in what it writes (unescaped)


def test_report_strict_stops_at_the_first_damaged_run(tmp_path):
    sweep = _sweep_with_one_damaged(tmp_path, DAMAGE["truncated"])
    result = invoke("report", "--strict", str(sweep), columns=PIPED)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and str(sweep / "1" / "results.json") in result.output
    assert "not valid JSON" in result.output and "Traceback" not in result.output
    assert not (sweep / "summary.md").exists()


def test_report_with_every_run_damaged_is_an_error(tmp_path):
    for i in range(2):
        (tmp_path / "sweep" / str(i)).mkdir(parents=True)
        (tmp_path / "sweep" / str(i) / "results.json").write_text("{")
    result = invoke("report", str(tmp_path / "sweep"), columns=PIPED)
    assert result.exit_code == 2, result.output
    assert str(tmp_path / "sweep" / "0" / "results.json") in result.output and "1 more" in result.output


def test_report_and_eval_help_say_what_a_damaged_run_does():
    for command in ("report", "eval"):
        result = invoke(command, "--help")
        assert "--strict" in result.output and "exit status 0" in result.output, result.output


# -- 7 and 5: eval on trained runs ------------------------------------------------------------------

def _trained_sweep(trained: Path, tmp_path: Path, damage: str) -> Path:
    """Two copies of the trained run, the second with ``damage`` for its results.json."""
    sweep = tmp_path / "sweep"
    for i in range(2):
        shutil.copytree(trained, sweep / str(i))
    (sweep / "1" / "results.json").write_text(damage)
    return sweep


def test_eval_skips_a_damaged_run_and_evaluates_the_others(trained, tmp_path):
    sweep = _trained_sweep(trained, tmp_path, '{"run": {"label": "x"}, "rows": [')
    before = (sweep / "1" / "results.json").read_bytes()
    result = invoke("eval", str(sweep), "eval.lengths=[32]", columns=PIPED)
    assert result.exit_code == 0, result.output
    warnings = [line for line in _warning_lines(result.output) if str(sweep / "1") in line]
    assert len(warnings) == 1 and "not valid JSON" in warnings[0], result.output
    assert len(strict_json(sweep / "0" / "results.json")["evaluations"]) == 1
    assert (sweep / "1" / "results.json").read_bytes() == before


def test_eval_strict_evaluates_nothing_when_a_run_is_damaged(trained, tmp_path):
    sweep = _trained_sweep(trained, tmp_path, "[]")
    good = (sweep / "0" / "results.json").read_bytes()
    result = invoke("eval", "--strict", str(sweep), "eval.lengths=[32]", columns=PIPED)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and str(sweep / "1" / "results.json") in result.output
    assert (sweep / "0" / "results.json").read_bytes() == good


def test_training_whose_evaluation_is_not_finite_still_writes_results_json(tmp_path, monkeypatch):
    import posexp.commands.train as train_command

    measure = train_command.evaluate_config

    def diverging(*args, **kwargs):
        rows, positions = measure(*args, **kwargs)
        rows[-1].update(ppl=math.inf, loss=math.nan, ppl_low=math.nan, ppl_high=math.inf)
        return rows, positions

    monkeypatch.setattr(train_command, "evaluate_config", diverging)
    run_dir = tmp_path / "run"
    result = invoke("train", *TINY_RUN, f"hydra.run.dir={run_dir}")
    assert result.exit_code == 0, result.output
    rows = strict_json(run_dir / "results.json")["rows"]
    assert rows[-1]["applicable"] is True and rows[-1]["ppl"] is None and rows[-1]["loss"] is None
    assert "non-finite" in rows[-1]["note"] and "loss (nan)" in rows[-1]["note"]
    assert all(r["ppl"] is not None for r in rows[:-1])
    assert "n/a" in result.output and "non-finite" in result.output  # the table says it too


def test_write_results_json_writes_a_non_finite_number_as_null_with_a_note(tmp_path):
    write_results_json(tmp_path, {"run": {"train": {"final_loss": math.nan}},
                                  "rows": [{"length": 64, "applicable": True, "ppl": math.inf, "loss": 800.0}]})
    data = strict_json(tmp_path / "results.json")
    assert data["run"]["train"]["final_loss"] is None
    assert data["rows"] == [{"length": 64, "applicable": True, "ppl": None, "loss": 800.0,
                             "note": "non-finite ppl (inf)"}]


def _hand_edit(run_dir: Path, length: int, text: str) -> None:
    """Replace the numbers of one row with ``text`` (``NaN``, ``null``), as an older version or an editor left them."""
    data = json.loads((run_dir / "results.json").read_text())
    row = next(r for r in data["rows"] if r["length"] == length)
    for key in ("ppl", "loss", "ppl_low", "ppl_high"):
        row[key] = f"@{key}@"
    raw = json.dumps(data, indent=2)
    for key in ("ppl", "loss", "ppl_low", "ppl_high"):
        raw = raw.replace(f'"@{key}@"', text)
    (run_dir / "results.json").write_text(raw)


@pytest.mark.parametrize("written", ["NaN", "null"])
def test_eval_re_evaluates_a_run_with_non_finite_or_null_numbers(written, trained, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    _hand_edit(run_dir, 128, written)
    result = invoke("eval", str(run_dir), "eval.lengths=[32]", columns=PIPED)
    assert result.exit_code == 0, result.output
    rows = {r["length"]: r for r in strict_json(run_dir / "results.json")["rows"]}
    assert rows[128]["ppl"] is None and rows[32]["ppl"] is not None
    if written == "NaN":
        assert "non-finite" in rows[128]["note"]
    # and re-measuring the damaged length replaces it
    result = invoke("eval", str(run_dir), "eval.lengths=[128]", columns=PIPED)
    assert result.exit_code == 0, result.output
    rows = {r["length"]: r for r in strict_json(run_dir / "results.json")["rows"]}
    assert math.isfinite(rows[128]["ppl"]) and "note" not in rows[128]


@pytest.mark.parametrize("written", ["NaN", "null"])
def test_report_shows_non_finite_or_null_numbers_as_not_applicable(written, tmp_path):
    runs = [make_run(tmp_path / str(i), {128: 3.0, 256: 3.25}, f"seed={i}", seed=i) for i in range(2)]
    _hand_edit(runs[1], 256, written)
    result = invoke("report", str(tmp_path))
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if "seed=1" in line)
    assert "n/a" in line and "nan" not in line.lower().replace("n/a", ""), line
    assert "3.25" in next(line for line in result.output.splitlines() if "seed=0" in line)


def test_a_run_whose_results_json_was_never_written_is_resumed(trained, tmp_path):
    """What an older version left when results.json could not hold a NaN: every file but results.json."""
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    (run_dir / "results.json").unlink()
    result = invoke("resume", str(run_dir))
    assert result.exit_code == 0, result.output
    assert strict_json(run_dir / "results.json")["run"]["status"] == "completed"


# -- 13: 80 columns, piped -------------------------------------------------------------------------

def _whole_on_one_line(text: str, output: str) -> bool:
    """``mean ±hw`` whole on one line, or (a narrow table stacks the interval) the mean whole and ``±hw`` whole
    right below it, ending in the same column."""
    lines = output.splitlines()
    if any(text in line for line in lines):
        return True
    mean, hw = text.split(" ±")
    ends = lambda line, part: {i + len(part) for i in range(len(line)) if line.startswith(part, i)}  # noqa: E731
    return any(ends(a, mean) & ends(b, "±" + hw) for a, b in zip(lines, lines[1:]))


def test_report_keeps_every_number_whole_at_80_columns(tmp_path):
    from posexp.reporting import build_report, print_report
    from posexp.reporting.render import lm_table

    lengths = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
    runs = [make_run(tmp_path / f"{e}{s}", {n: 3.1234 + n / 1000 * (s + 1) for n in lengths},
                     f"encoder={e} seed={s}", encoder=e, seed=s)
            for e in ("rope", "alibi", "t5") for s in range(2)]
    for by in (None, "encoder"):
        report = build_report(runs, ReportOptions(by=by))
        console = Console(width=80, file=io.StringIO())
        print_report(report, console)
        out = console.file.getvalue()
        assert max(len(line) for line in out.splitlines()) <= 80
        assert "…" not in out
        cells = 0
        for section in lm_table(report).sections:  # each number as the terminal shows it, its interval beside
            for line in section.rows:
                for cell in line:
                    if cell.stat is not None and cell.stat.applicable and cell.beside is not None:
                        assert _whole_on_one_line(cell.beside, out), (cell.beside, out)
                        cells += 1
        assert cells >= 6 * len(lengths) // (2 if by else 1)


def test_posexp_report_piped_at_80_columns_keeps_numbers_whole(tmp_path):
    lengths = [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    for s in range(4):
        make_run(tmp_path / "sweep" / str(s), {n: 10.123 + n / 97 * (s + 1) for n in lengths}, f"seed={s}", seed=s)
    result = invoke("report", str(tmp_path / "sweep"), "--by", "encoder", columns=PIPED)
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    for n in lengths:
        values = [10.123 + n / 97 * (s + 1) for s in range(4)]
        mean, sd = sum(values) / 4, statistics.stdev(values)
        half = sd / 4 ** 0.5 * 3.182446  # t(0.975, 3)
        assert _whole_on_one_line(f"{mean:.2f} ±{half:.2f}", result.output), (mean, half, result.output)


def test_the_per_run_table_keeps_every_number_whole_at_80_columns():
    from posexp.rendering.results import results_table

    rows = []
    for i, n in enumerate([64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]):
        rows.append({"length": n, "multiple": n / 64, "protocol": "sliding", "stride": 64, "last_k": None,
                     "scaling": "yarn", "scaling_factor": n / 64, "applicable": True, "ppl": 1234.5678 + i,
                     "loss": 7.1234, "ppl_low": 1200.1234 + i, "ppl_high": 1270.5678 + i, "tokens": 65536,
                     "tokens_per_s": 12345678.0, "peak_mem_mb": 123456.0})
    results = {"run": {"label": "encoder=rope base=500000 model.n_layers=12 train.steps=100000",
                       "train_len": 64}, "rows": rows}
    console = Console(width=80, file=io.StringIO())
    console.print(results_table(results))
    out = console.file.getvalue()
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out
    for r in rows:
        for text in (str(r["length"]), f"{r['ppl']:.3f}", f"{r['ppl_low']:.2f}–{r['ppl_high']:.2f}",
                     f"{r['loss']:.4f}"):
            assert _whole_on_one_line(text, out), (text, out)


# -- 13: progress ----------------------------------------------------------------------------------

class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_short_evaluation_prints_no_progress_a_long_one_a_line_per_tenth_when_piped():
    from posexp.evaluation.runner import EvalProgress

    clock = FakeClock()
    console = Console(file=io.StringIO(), width=80)  # not a terminal
    progress = EvalProgress(console, [64, 128, 256], clock=clock, after=3.0)
    for n in (64, 128):
        progress(n, 0, 4)
        clock.now += 0.5
        progress(n, 4, 4)
    assert console.file.getvalue() == ""  # quicker than `after`: nothing
    clock.now += 5
    progress(256, 0, 8)
    clock.now += 2
    progress(256, 4, 8)
    progress(256, 8, 8)
    progress.close()
    lines = console.file.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["67%", "83%", "100%"]  # each tenth passed, once
    assert lines[-1] == "eval 100%  length 256 (3 of 3): 8/8 windows  0:00:08 so far  eta 0:00:00"


def test_piped_training_prints_a_plain_line_every_tenth():
    from posexp.training.progress import PlainProgress

    clock = FakeClock()
    console = Console(file=io.StringIO(), width=80)  # not a terminal, as under nohup or a scheduler
    plain = PlainProgress(console, "rope", steps=100, step=0, tokens=0, clock=clock)
    for step in range(5, 101, 5):  # train.log_every=5
        clock.now += 1.0
        plain(step, 2.0, tokens=step * 1000)
    lines = console.file.getvalue().splitlines()
    assert len(lines) == 10 and lines[0].startswith("train rope step 10/100 (10%)")
    assert lines[4] == "train rope step 50/100 (50%)  loss 2.000  5,000 tokens/s  eta 0:00:10"
    assert lines[-1].startswith("train rope step 100/100 (100%)") and lines[-1].endswith("eta 0:00:00")


def test_on_a_terminal_the_progress_line_is_transient():
    from posexp.evaluation.runner import EvalProgress

    clock = FakeClock()
    console = Console(file=io.StringIO(), width=80, force_terminal=True)
    progress = EvalProgress(console, [64], clock=clock, after=0.0)
    progress(64, 0, 2)
    assert progress.bar is not None and progress.task is not None
    progress(64, 2, 2)
    assert progress.task is None  # the length's line is gone when it is done
    progress.close()
    assert progress.bar is None


def test_evaluate_reports_windows_done_per_length():
    import numpy as np
    import torch

    from posexp.encoders import create
    from helpers import evaluate_at
    from posexp.model.gpt import GPT, ModelShape

    torch.manual_seed(0)
    model = GPT(ModelShape(d_model=16, n_layers=1, n_heads=2), create("alibi", d_model=16, n_heads=2)).eval()
    val = np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8)
    calls = []
    rows = evaluate_at(model, val, [16, 32], 16, tokens=256, batch_tokens=64, device=torch.device("cpu"),
                    progress=lambda n, done, total: calls.append((n, done, total)))
    assert len(rows) == 2
    for n in (16, 32):
        mine = [c for c in calls if c[0] == n]
        assert mine[0][1] == 0 and mine[-1][1] == mine[-1][2] > 0
        assert np.all(np.diff([c[1] for c in mine]) > 0)


@pytest.mark.parametrize("value,expected", [(math.nan, "nan"), (1e4, "inf")])
def test_a_model_with_non_finite_losses_is_measured_not_crashed(value, expected):
    """A diverged model's NaN losses (or losses past exp's float range) become a row, not an assertion/overflow."""
    import numpy as np
    import torch

    from posexp.encoders import create
    from helpers import evaluate_at
    from posexp.model.gpt import GPT, ModelShape

    model = GPT(ModelShape(d_model=16, n_layers=1, n_heads=2), create("alibi", d_model=16, n_heads=2)).eval()
    model.token_losses = lambda x, y, pos=None: torch.full(y.shape, value)
    val = np.arange(300, dtype=np.uint16) % 256
    row = evaluate_at(model, val, [16], 16, tokens=128, batch_tokens=64, device=torch.device("cpu"))[0]
    assert row["applicable"] and str(row["ppl"]) == expected


def test_eval_of_a_failed_sweep_job_that_kept_its_weights_writes_its_rows(trained, tmp_path):
    """A job that failed after training (say, out of memory while evaluating) has weights but no train record:
    posexp eval raised KeyError('train') while writing results.md."""
    run = tmp_path / "job"
    shutil.copytree(trained, run)
    recorded = json.loads((run / "results.json").read_text())["run"]
    failed = {k: recorded[k] for k in ("label", "overrides", "encoder", "train_len", "seed", "config",
                                       "config_hash", "hash_format", "eval_settings") if k in recorded}
    failed.update(status="failed", error={"message": "out of memory", "type": "RuntimeError"})
    write_results_json(run, {"run": failed, "rows": []})
    result = invoke("eval", str(run), "eval.lengths=[40]")
    assert result.exit_code == 0, result.output
    assert [row["length"] for row in json.loads((run / "results.json").read_text())["rows"]] == [40]
    assert "recorded as failed" in (run / "results.md").read_text()
