"""``posexp report RUN --cols KEY``: what a column of the pivot holds."""

from __future__ import annotations

import pytest
from helpers.runs import ppl_rows, write_run

from posexp.reporting.pivot import build_pivot
from posexp.reporting.runs import read_run


def test_each_setting_under_one_pivoted_value_is_its_own_column_not_an_average(tmp_path):
    """A run evaluated with a window of 32 with and without sink tokens, and with string at two offsets: each is
    its own column showing its own row's number (before, each pair was averaged into one column)."""
    rows = ppl_rows({64: 7.0, 128: 8.0}, 64)
    rows += [{**r, "window": 32, "sinks": None} for r in ppl_rows({64: 7.0, 128: 7.5}, 64)]
    rows += [{**r, "window": 32, "sinks": 4} for r in ppl_rows({64: 7.1, 128: 7.7}, 64)]
    rows += [{**r, "scaling_factor": None, "scaling_options": options}
             for ppls, options in (({64: 7.2, 128: 8.2}, "offset=21 local=4"), ({128: 7.8}, "offset=64 local=4"))
             for r in ppl_rows(ppls, 64, "string")]
    rows += ppl_rows({64: 7.0, 128: 7.9}, 64, "yarn")
    run = read_run(write_run(tmp_path / "run", rows, ["encoder=rope"], "rope", train_len=64))
    windows = build_pivot([run], [], ["window"])
    assert windows.columns == [(None,), (32,), ("32 sinks=4",)]
    assert [windows.cell(windows.lines[0], 128, c).mean for c in windows.columns] == pytest.approx([8.0, 7.5, 7.7])
    scalings = build_pivot([run], [], ["scaling"])
    shown = {c[0]: scalings.cell(scalings.lines[0], 128, c).mean for c in scalings.columns}
    assert shown == pytest.approx({"none": 8.0, "string offset=21 local=4": 8.2, "string offset=64 local=4": 7.8,
                                   "yarn": 7.9})


def test_a_key_in_both_by_and_cols_is_one_line_naming_it(tmp_path):
    """--by encoder --cols encoder drew a diagonal table (each line one column, no difference anywhere) as if it
    compared something."""
    from posexp.errors import ConfigError

    runs = [read_run(write_run(tmp_path / enc, ppl_rows({64: 7.0, 128: 8.0}, 64), [f"encoder={enc}"], enc,
                               train_len=64)) for enc in ("rope", "alibi")]
    with pytest.raises(ConfigError, match=r"^--cols: encoder is a --by key too; .*--by encoder --cols seed") as e:
        build_pivot(runs, ["encoder"], ["encoder", "seed"])
    assert e.value.key == "--cols"


def test_a_difference_of_accuracies_stays_within_100_points(tmp_path):
    """Two paired seeds' exact-match differences of −90 and +70 points read −10.0 [−1026.5, +1006.5] in the pivot
    (csv and json too), though two accuracies differ by at most 100 points: cut there, as the comparisons are."""
    from helpers.runs import make_task_run

    from posexp.reporting.pivot import as_table

    accuracy = {("rope", 0): 0.1, ("rope", 1): 0.9, ("alibi", 0): 1.0, ("alibi", 1): 0.2}
    runs = [read_run(make_task_run(tmp_path / f"{enc}{seed}", {64: 1.0, 128: acc}, encoder=enc, seed=seed))
            for (enc, seed), acc in accuracy.items()]
    cells = as_table(build_pivot(runs, ["train_len"], ["encoder"])).json["cells"]  # alibi the baseline column
    rope = next(c for c in cells if c["encoder"] == "rope" and c["length"] == 128)
    assert rope["diff_vs_baseline"] == pytest.approx(-10.0)
    assert (rope["diff_low"], rope["diff_high"]) == (-100.0, 100.0)
