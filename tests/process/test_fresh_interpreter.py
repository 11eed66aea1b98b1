"""What only a fresh interpreter shows: which modules a use of posexp loads (a TAB, ``import posexp``, ``--help``,
a report never wait for torch; reporting never loads Hydra, a default run no tracker), that a registered module
imported first registers, a BPE learned alike under any hash seed, and ``python -m posexp``'s exit status and one
message for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from posexp.cli import shell

from helpers import REPO, TINY_RUN, run_cli

# One interpreter walks from the lightest use of posexp to the heaviest; after each step it prints which of the
# heavy modules are loaded so far (a step that loaded one shows it, since no step unloads anything).
LIGHT_STEPS = """
import contextlib, io, json, os, sys

HEAVY = ("torch", "hydra", "typer", "rich", "pandas", "posexp.commands")
RUN, MISSING = sys.argv[1], sys.argv[2]


def step(name, **said):
    print(json.dumps({"step": name, "loaded": [m for m in HEAVY if m in sys.modules], **said}), file=sys.stderr)


def command(*argv):
    sys.argv = ["posexp", *argv]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main()
        except SystemExit:
            pass
    return out.getvalue()


os.environ.update({%(shell)r: "bash", %(line)r: "posexp train encoder=ro"})
from posexp.cli import main
step("tab", said=command().splitlines())
del os.environ[%(shell)r], os.environ[%(line)r]
import posexp
step("import posexp", names=dir(posexp))
from posexp.reporting.runs import read_run
run = read_run(RUN)
run.curve, run.config_data
step("read a run for a report")
step("posexp report MISSING", said=command("report", MISSING))
posexp.load_run, posexp.load_runs
step("posexp.load_run")
step("posexp --help", said=command("--help"))
""" % {"shell": shell.SHELL_VAR, "line": shell.LINE_VAR}


def test_a_tab_an_import_a_report_and_help_load_only_what_they_need(trained, tmp_path):
    """A TAB loads neither torch nor Hydra (nor Typer and Rich); ``import posexp`` and ``dir(posexp)`` load neither
    torch nor pandas; a run read for a report imports neither the model side (commands, torch) nor Hydra;
    ``posexp report`` (its error too) and ``posexp --help`` never wait for torch to load."""
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    done = subprocess.run([sys.executable, "-c", LIGHT_STEPS, str(trained), str(tmp_path / "missing")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    steps = {s["step"]: s for s in (json.loads(line) for line in done.stderr.splitlines() if line.startswith('{"step"'))}
    assert len(steps) == 6, done.stderr
    assert steps["tab"]["said"] == ["words:ro", "rope"] and steps["tab"]["loaded"] == []
    assert {"load_run", "load_runs", "find_runs", "create"} <= set(steps["import posexp"]["names"])
    assert not {"torch", "pandas"} & set(steps["import posexp"]["loaded"])
    assert not {"torch", "hydra", "posexp.commands"} & set(steps["read a run for a report"]["loaded"])
    assert "no such folder" in steps["posexp report MISSING"]["said"]
    assert "torch" not in steps["posexp report MISSING"]["loaded"]
    assert "torch" not in steps["posexp.load_run"]["loaded"]
    assert "train" in steps["posexp --help"]["said"]
    assert "torch" not in steps["posexp --help"]["loaded"]
    import posexp

    assert all(callable(getattr(posexp, name)) for name in posexp.__all__)


@pytest.mark.parametrize("overrides,needles", [(["encoder=nope"], ["encoder", "rope", "alibi"]),
                                               (["train_len=0"], ["train_len", "positive"])],
                         ids=["encoder=nope", "train_len=0"])
def test_bad_input_in_a_fresh_interpreter_is_one_message(tmp_path, overrides, needles):
    """``python -m posexp`` exits 2 with the message alone (tests/integration/cli/test_commands.py holds every case,
    in this process)."""
    proc = run_cli("train", *TINY_RUN, *overrides, "hydra.run.dir=run", cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in out
    assert all(needle in out for needle in needles), out
    assert not (tmp_path / "run").exists()


# The first thing a fresh interpreter does with posexp, and the top-level packages it must not have loaded since.
FIRST_USES = {
    # reporting reads finished run folders; the Hydra callback that starts a sweep's summary lives in posexp.cli
    "every reporting module and the run layout": (
        "import pkgutil, importlib, posexp.runs.layout, posexp.reporting as r\n"
        "for m in pkgutil.walk_packages(r.__path__, 'posexp.reporting.'): importlib.import_module(m.name)",
        {"hydra", "omegaconf", "torch"}),
    "the metric registry read": (
        "from posexp.reporting.metrics import metric_examples; metric_examples()",
        {"hydra", "rich", "torch", "omegaconf"}),
    "a default run (logger=none)": (
        "from posexp.cli.app import main\n"
        f"sys.argv = ['posexp', 'train', *{list(TINY_RUN)!r}, 'train.steps=4', 'train.log_every=2', "
        "'train.warmup_steps=1', 'eval.multiples=[1,2]', 'hydra.run.dir=run']\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code",
        {"tensorboard", "mlflow", "wandb", "tensorboardX"}),
    # `from posexp.encoders.rope import RoPE` first: its @register must not load the whole package, whose irope
    # module imports rope back while rope is half-initialised
    **{f"import {module} first": (f"import {module}; import posexp.encoders as e; e.create('rope', d_model=32, "
                                  "n_heads=4)", set())
       for module in ("posexp.encoders.rope", "posexp.encoders.alibi", "posexp.tasks.ruler", "posexp.tasks.copy")},
}


@pytest.mark.parametrize("use", FIRST_USES)
def test_a_first_use_of_posexp_loads_none_of_what_it_does_not_need(use, tmp_path):
    """Reporting (every module of it, and the run layout) never loads torch, Hydra or OmegaConf, nor the metric
    registry Rich; a default run never imports tensorboard, mlflow or wandb, installed or not; a registered module
    imported before its package registers without error."""
    code, heavy = FIRST_USES[use]
    loaded = f"{{m.split('.')[0] for m in sys.modules}} & set({sorted(heavy)!r})"
    script = f"import json, sys\n{code}\nprint(json.dumps(sorted({loaded})))"
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
    if "train" in code:
        assert (tmp_path / "run" / "results.json").is_file()


# posexp's BPE trained in a fresh interpreter, on the tokenizer tests' text
_TRAIN_IN_SUBPROCESS = """
import sys
sys.path[:0] = [{root!r}, {root!r} + '/tests']
from helpers.text import sample_text, train_bpe
print(train_bpe([sample_text(3000, s) for s in range(4)], 600, 2).to_str())
"""


def test_bpe_training_is_deterministic_across_processes():
    """Two fresh interpreters (different hash seeds, thread timing) learn the same vocabulary and merges."""
    root = str(REPO)
    outs = [subprocess.run([sys.executable, "-c", _TRAIN_IN_SUBPROCESS.format(root=root)], capture_output=True,
                           text=True, env={"PYTHONHASHSEED": str(seed), "RAYON_NUM_THREADS": str(threads),
                                           "PATH": "/usr/bin:/bin"}, timeout=120)
            for seed, threads in ((1, 1), (2, 2))]
    for out in outs:
        assert out.returncode == 0, out.stderr
    assert outs[0].stdout == outs[1].stdout
    assert json.loads(outs[0].stdout)["model"]["merges"]  # it did learn merges
