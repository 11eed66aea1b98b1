"""Big sweeps: Hydra's joblib / submitit launchers and the Optuna sweeper, the sweep cache, the objective.

The launcher tests need the plugins (``pip install -e '.[test]'`` brings the two
launchers, ``'.[sweeps]'`` the Optuna sweeper too) and skip, saying which, without them;
the Optuna test is ``-m slow``.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from pathlib import Path

import pytest
from posexp.commands.edge import typed
import yaml

from helpers import TINY_RUN, invoke

# On the shared tiny run (helpers.TINY_RUN), smaller still: these tests check wiring, not learning.
TINY = ("train.steps=6", "train.warmup_steps=2", "train.log_every=2", "eval.tokens=256", "eval.loss_by_position=false")


def _needs(module: str, package: str, extra: str):
    return pytest.mark.skipif(importlib.util.find_spec(module) is None,
                              reason=f"{package} is not installed (pip install -e '.[{extra}]')")


needs_joblib = _needs("hydra_plugins.hydra_joblib_launcher", "hydra-joblib-launcher", "test")
needs_submitit = _needs("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher", "test")
needs_optuna = _needs("hydra_plugins.hydra_optuna_sweeper", "hydra-optuna-sweeper", "sweeps")


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def _losses(run_dir: Path) -> dict[int, float]:
    return {r["length"]: r["loss"] for r in _results(run_dir)["rows"]}


# -- threads per parallel job ----------------------------------------------------------------------

def test_joblib_jobs_share_the_cores():
    from omegaconf import OmegaConf

    from posexp.commands.sweeps import job_threads

    joblib = lambda n: OmegaConf.create({"_target_": "x.JoblibLauncher", "n_jobs": n})  # noqa: E731
    assert job_threads(joblib(2), cores=8) == 4
    assert job_threads(joblib(3), cores=8) == 2  # floor
    assert job_threads(joblib(-1), cores=8) == 1  # -1: one job per core
    assert job_threads(joblib(-2), cores=8) == 1  # 7 jobs at once
    assert job_threads(joblib(16), cores=8) == 1  # never 0
    assert job_threads(OmegaConf.create({"_target_": "x.SlurmLauncher", "cpus_per_task": 6}), cores=64) == 6
    assert job_threads(OmegaConf.create({"_target_": "x.LocalLauncher", "cpus_per_task": None}), cores=8) is None
    assert job_threads(OmegaConf.create({"_target_": "x.BasicLauncher"}), cores=8) is None


def test_a_launchers_share_sets_the_jobs_threads_unless_train_threads_is_a_number(caplog):
    """train.threads=null and auto take the launcher's share (null: set here, and said in train.log); a number is
    run_train's to set."""
    import torch
    from omegaconf import OmegaConf

    from posexp.commands.sweeps import available_cores, set_job_threads
    from posexp.runtime.threads import choose, pin

    joblib = OmegaConf.create({"_target_": "x.JoblibLauncher", "n_jobs": 2})
    share = max(1, available_cores() // 2)
    torch.set_num_threads(share + 1)  # conftest's _torch_threads puts the session's count back
    try:
        with caplog.at_level("INFO", logger="posexp.sweeps"):
            assert set_job_threads(None, joblib) == share
        assert torch.get_num_threads() == share
        assert f"{share} torch threads for this job (JoblibLauncher)" in caplog.text
        assert set_job_threads("auto", joblib) == share and choose("auto").count == share
        torch.set_num_threads(share + 1)
        assert set_job_threads(share + 1, joblib) is None and torch.get_num_threads() == share + 1
    finally:
        pin(None)


# -- the objective a sweeper minimises ---------------------------------------------------------------

ROWS = {"rows": [{"length": 32, "loss": 4.0, "applicable": True}, {"length": 64, "loss": 4.5, "applicable": True},
                 {"length": 128, "loss": 5.5, "applicable": True}]}


@pytest.mark.parametrize("objective, expected", [("longest", 5.5), ("mean", 14.0 / 3), (64, 4.5)])
def test_objective_picks_the_loss_it_names(tiny, objective, expected):
    from posexp.commands.sweeps import objective_value

    cfg = tiny(*TINY, f"objective={objective}")
    assert objective_value(ROWS, typed(cfg).objective) == pytest.approx(expected)


def test_objective_of_an_unreachable_length_is_worst(tiny):
    from posexp.commands.sweeps import objective_value

    rows = {"rows": [*ROWS["rows"][:2], {"length": 128, "loss": None, "applicable": False}]}
    assert objective_value(rows, typed(tiny(*TINY)).objective) == math.inf


@pytest.mark.parametrize("bad", ["longst", "0", "-4"])
def test_bad_objective_is_refused_naming_the_key(tiny, bad):
    from posexp.commands.validation import validate
    from posexp.errors import ConfigError

    with pytest.raises(ConfigError, match="objective.*longest, mean or an eval length"):
        validate(typed(tiny(*TINY, f"objective={bad}")))


def test_bad_objective_on_the_command_line_is_one_line(tmp_path):
    result = invoke("train", *TINY_RUN, *TINY, "objective=longst", "hydra.run.dir=run", cwd=tmp_path)
    assert result.exit_code == 2
    assert "error: objective: must be longest, mean or an eval length" in result.stderr
    assert "Traceback" not in result.output and not (tmp_path / "run" / "results.json").exists()


# -- the cache key -----------------------------------------------------------------------------------

def test_cache_key_covers_training_and_nothing_else(tiny):
    from omegaconf import OmegaConf

    from posexp.training.cache import cache_key

    cfg = tiny(*TINY)
    base = cache_key(typed(cfg), "corpus-a")

    def key_with(dotted: str, value) -> str:  # one override, as on the command line
        changed = cfg.copy()
        OmegaConf.update(changed, dotted, value, merge=False)
        return cache_key(typed(changed), "corpus-a")

    same = {"eval.multiples": [1, 2, 4, 8], "eval.tokens": 512, "eval.protocol": "last_k", "eval.last_k": 16,
            "train.progress": True, "train.log_every": 3, "train.threads": 3, "train.checkpoint_every": 2,
            "objective": "mean", "cache": True, "cache_dir": "/elsewhere"}
    for dotted, value in same.items():
        assert key_with(dotted, value) == base, dotted
    changed = {"seed": 1, "base": 500.0, "train_len": 16, "train.lr": 0.001, "train.steps": 7,
               "model.d_model": 16, "data.val_fraction": 0.1}
    for dotted, value in changed.items():
        assert key_with(dotted, value) != base, dotted
    assert cache_key(typed(tiny(*TINY, "encoder=alibi")), "corpus-a") != base
    assert cache_key(typed(cfg), "corpus-b") != base  # other tokens, other weights


def test_an_incomplete_or_corrupt_entry_is_never_reused(tiny, tmp_path):
    from posexp.training.cache import ENTRY_FILE, WEIGHTS_FILE, cache_key, lookup

    cfg = typed(tiny(*TINY, "cache=true", f"cache_dir={tmp_path}"))
    entry = tmp_path / cache_key(cfg, "fp")
    entry.mkdir()
    (entry / WEIGHTS_FILE).write_bytes(b"half a file")
    assert lookup(cfg, "fp") is None  # weights without entry.json: a writer that died
    (entry / ENTRY_FILE).write_text(json.dumps({"format": 1, "key": entry.name, "sha256": "0" * 64}))
    assert lookup(cfg, "fp") is None  # weights that are not the ones recorded


# -- the cache end to end ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cached_pair(tmp_path_factory):
    """The same tiny training twice with cache=true; the second asks for other eval lengths."""
    cwd = tmp_path_factory.mktemp("cache")
    first = invoke("train", *TINY_RUN, *TINY, "cache=true", "hydra.run.dir=first", cwd=cwd)
    assert first.exit_code == 0, first.output
    second = invoke("train", *TINY_RUN, *TINY, "cache=true", "eval.multiples=[2,4,8]", "hydra.run.dir=second",
                    cwd=cwd)
    assert second.exit_code == 0, second.output
    return cwd, second


def test_second_identical_training_is_reused_not_repeated(cached_pair):
    cwd, result = cached_pair
    first, second = cwd / "first", cwd / "second"
    key = _results(first)["run"].get("cached_from")
    assert key is None  # the first one trained
    cached = _results(second)["run"]["cached_from"]
    assert cached["run_dir"] == str(first.resolve())
    message = f"trained weights reused from cache {cached['key']} (run {first.resolve()})"
    assert message in result.stdout.replace("\n", "")
    log = (second / "train.log").read_text()
    assert message in log
    assert "posexp.train" not in log  # no training step was logged
    assert (cwd / "outputs" / "cache" / cached["key"] / "model.safetensors").is_file()
    # the training curve and the training summary are the original's
    assert (second / "metrics.csv").read_text() == (first / "metrics.csv").read_text()
    assert _results(second)["run"]["train"]["final_loss"] == _results(first)["run"]["train"]["final_loss"]


def test_reused_weights_give_the_same_numbers_at_common_lengths(cached_pair):
    cwd, _ = cached_pair
    a, b = _losses(cwd / "first"), _losses(cwd / "second")
    assert sorted(a) == [32, 64, 128] and sorted(b) == [64, 128, 256]
    for length in (64, 128):
        assert a[length] == b[length]


def test_reused_run_is_a_complete_run_folder(cached_pair, tmp_path):
    """posexp eval accepts it: its checkpoint says it belongs to this run's config."""
    import shutil

    from posexp.commands.eval import reeval_main

    cwd, _ = cached_pair
    second = shutil.copytree(cwd / "second", tmp_path / "second")  # the other tests read the pair as it was made
    with open(second / "metrics.csv") as f:
        assert int(list(csv.DictReader(f))[-1]["step"]) == 6
    reeval_main([str(second), "eval.lengths=[32]"])
    assert _losses(second)[32] == _losses(cwd / "first")[32]


def test_training_key_change_misses_and_eval_change_hits(cached_pair, tiny):
    from posexp.training.cache import lookup
    from posexp.config.schema import DataConfig
    from posexp.data.corpus import load_corpus

    cwd, _ = cached_pair
    fingerprint = load_corpus(DataConfig()).fingerprint
    root = f"cache_dir={cwd / 'outputs' / 'cache'}"
    assert lookup(typed(tiny(*TINY, "cache=true", root, "eval.lengths=[100,300]")), fingerprint) is not None
    assert lookup(typed(tiny(*TINY, "cache=true", root, "train.lr=0.001")), fingerprint) is None
    assert lookup(typed(tiny(*TINY, "cache=true", root, "seed=3")), fingerprint) is None


# -- launchers and sweepers -------------------------------------------------------------------------

def test_missing_plugin_is_named_with_the_install_command(monkeypatch):
    from typer.testing import CliRunner

    from posexp.commands import sweeps
    from posexp.cli.app import app

    monkeypatch.setitem(sweeps.PLUGINS, "hydra/launcher=joblib",
                        ("hydra_plugins.posexp_not_installed", "hydra-joblib-launcher"))
    result = CliRunner().invoke(app, ["train", "-m", "hydra/launcher=joblib", "seed=0,1"])
    assert result.exit_code == 2
    assert "hydra/launcher=joblib needs the Hydra plugin hydra-joblib-launcher" in result.output
    assert "pip install -e '.[sweeps]'" in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow  # two processes of a joblib sweep; the basic launcher's sweep tests stay in the default suite
@needs_joblib
def test_joblib_sweep_runs_jobs_in_parallel_processes(tmp_path):
    """Two jobs at once, one thread each on 2 cores, logs per job, and a failed job fails the command."""
    from posexp.commands.sweeps import available_cores

    # job 1's text is shorter than one training window: a mistake that shows only when the job reads its
    # data (a config mistake such as train.steps=0 is refused before any job starts)
    (tmp_path / "big.txt").write_text(Path(json.__file__).read_text(encoding="utf-8") * 20, encoding="utf-8")
    (tmp_path / "tiny.txt").write_text("def f():\n    return 1\n", encoding="utf-8")
    # train.threads=null: the launcher's share of the cores is what this test checks
    result = invoke("train", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", *TINY_RUN, *TINY, "data=text",
                    "data.path=big.txt,tiny.txt", "train.threads=null", "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert result.exit_code == 1, result.output
    assert "1 sweep job(s) failed" in result.stderr and "sweep/1" in result.stderr
    ok, failed = _results(tmp_path / "sweep" / "0"), _results(tmp_path / "sweep" / "1")
    assert ok["run"]["status"] == "completed" and failed["run"]["status"] == "failed"
    assert "fewer than one window" in failed["run"]["error"]["message"]
    assert ok["run"]["train"]["threads"] == max(1, available_cores() // 2)
    log = (tmp_path / "sweep" / "0" / "train.log").read_text()
    assert "torch threads for this job" in log and "step 6 loss" in log  # logging works in the worker
    assert (tmp_path / "sweep" / "summary.md").is_file()


@needs_submitit
@pytest.mark.slow  # the joblib launcher test keeps a launcher in the default suite
def test_submitit_local_sweep(tmp_path):
    result = invoke("train", "-m", "hydra/launcher=submitit_local", "hydra.launcher.cpus_per_task=1", *TINY_RUN, *TINY,
                    "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    run = _results(tmp_path / "sweep" / "0")["run"]
    assert run["status"] == "completed" and run["train"]["threads"] == 1
    assert "step 6 loss" in (tmp_path / "sweep" / "0" / "train.log").read_text()


@pytest.mark.slow  # two full runs in a row, and the sweeps extra besides
@needs_optuna
def test_optuna_search_minimises_the_returned_objective(tmp_path):
    result = invoke("train", "-m", "search=base", *TINY_RUN, *TINY, "hydra.sweeper.n_trials=2",
                    "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    best = yaml.safe_load((tmp_path / "sweep" / "optimization_results.yaml").read_text())
    trials = {}
    for n in (0, 1):
        res = _results(tmp_path / "sweep" / str(n))
        trials[res["run"]["config"]["base"]] = max(res["rows"], key=lambda r: r["length"])["loss"]
    assert len(trials) == 2 and all(100 <= b <= 1e6 for b in trials)  # two proposals from the search range
    assert best["best_value"] == pytest.approx(min(trials.values()))
    assert best["best_params"]["base"] == pytest.approx(min(trials, key=trials.get))


def test_a_cache_that_cannot_be_written_at_the_end_is_said_on_the_terminal(tiny, tmp_path, monkeypatch, capsys):
    """A full disk when the finished training is stored in the cache was said in train.log alone."""
    import errno

    from posexp.commands.train import run_train
    from posexp.training import cache

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache, "_link_or_copy", full)
    run_train(tiny("cache=true", "train.steps=2", "eval.multiples=[1]", "eval.tokens=256"), tmp_path / "run", [])
    out = " ".join(capsys.readouterr().out.split())
    assert "warning: cache" in out and "No space left on device" in out and "the run itself is complete" in out
    assert (tmp_path / "run" / "results.json").is_file()  # the run itself finished
