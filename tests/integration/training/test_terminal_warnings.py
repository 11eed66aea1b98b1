"""Settings that train but not as meant (a warmup longer than the run, an unwritable cache_dir) are warned on the
terminal of ``posexp train`` and in its train.log."""

from __future__ import annotations

import re

from helpers import TINY_RUN, invoke

# ---------------------------------------------------------------------------- warnings on the terminal


def test_warmup_longer_than_the_run_and_an_unwritable_cache_dir_are_warned_on_the_terminal(tmp_path):
    (tmp_path / "a_file").write_text("")
    cache_dir = tmp_path / "a_file" / "cache"
    run = tmp_path / "run"
    r = invoke("train", *TINY_RUN, "train.warmup_steps=20", "cache=true", f"cache_dir={cache_dir}",
               f"hydra.run.dir={run}", cwd=tmp_path)
    assert r.exit_code == 0, r.output
    assert (run / "results.json").is_file()
    warnings = [x for x in r.stdout.splitlines() if x.startswith("warning:")]
    warmup = [x for x in warnings if "train.warmup_steps=20" in x]
    cache = [x for x in warnings if f"cache_dir {cache_dir}" in x and "cannot be written" in x]
    assert len(warmup) == 1 and "train.steps=20" in warmup[0]
    assert len(cache) == 1, r.stdout  # said once: not again when the finished training would be stored
    log = (run / "train.log").read_text()
    assert re.search(r"WARNING\] - train\.warmup_steps=20", log) and "cannot be written" in log
    assert "Traceback" not in r.output


def test_training_progress_is_readable_with_columns_0(tmp_path):
    """COLUMNS=0 made training's own console zero characters wide: its progress lines (and warnings) printed
    nothing at all."""
    r = invoke("train", *TINY_RUN, "train.progress=true", f"hydra.run.dir={tmp_path / 'run'}", columns=0,
               cwd=tmp_path)
    assert r.exit_code == 0, r.output
    lines = [x for x in r.stderr.splitlines() if x.startswith("train ")]
    assert lines and all(re.fullmatch(r"train \S+ step [\d,]+/[\d,]+ \(\d+%\)  loss \d+\.\d{3}  .* eta \d+:\d\d:\d\d",
                                      x) for x in lines), r.stderr
    assert lines[-1].split()[3].split("/")[0] == lines[-1].split()[3].split("/")[1]  # through the last step
