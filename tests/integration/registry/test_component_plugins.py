"""A task, a tracker and an exporter from a package outside posexp: one module each (and the task's yaml), found
through the one registry (posexp.registry) with no list to edit, each run end to end through the CLI, in this
process: each test starts as a new ``posexp`` would once the package is installed (the registries read the entry
points again, the schemas are stored afresh) and puts the registries back after it."""

from __future__ import annotations

import json
import logging
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import TINY_RUN, invoke
from helpers.plugins import FIRST_TASK, JSONL_TRACKER

TASK_YAML = '''
# @package _global_
#   posexp train task=first task.repeats=2
defaults:
  - /schema/task/first@task
  - _self_
task:
  name: first
  description: "write the first symbol again"
  repeats: 2
train_len: 16
'''

TRACKER_YAML = '''
# @package logger.jsonl
defaults:
  - /schema/logger/jsonl@_here_
  - _self_
prefix: lab
'''

EXPORTER = '''
"""encoder=none -> GPT-2 with a position table of zeros: the same function, no positions added."""
from typing import Any, Optional

from posexp.hf.exporters import EXPORTERS, Exporter, Mapping, common_config, hidden, norm, put


@EXPORTERS.register("nope_gpt2")
class NoPEGPT2(Exporter):
    encoder = "none"
    target = "GPT-2 (zero position table)"

    def refusal(self, model) -> Optional[str]:
        if not model.shape.tie_embeddings:
            return "this exporter writes tied embeddings only: train with model.tie_embeddings=true"
        return None

    def mapping(self, model, reach):
        from transformers import GPT2Config

        shape = model.shape
        config = GPT2Config(n_embd=shape.d_model, n_layer=shape.n_layers, n_head=shape.n_heads,
                            n_inner=hidden(model), n_positions=reach, activation_function="gelu",
                            layer_norm_epsilon=model.ln_f.eps, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            **common_config(model))
        return Mapping("GPT2LMHeadModel", "none -> GPT-2, zero position table (exact)", config, _fill, reach)


def _fill(model: Any, hf: Any) -> None:
    t = hf.transformer
    put(t.wte.weight, model.wte.weight)
    t.wpe.weight.zero_()
    for block, h in zip(model.blocks, t.h):
        for ours, theirs in ((block.ln1, h.ln_1), (block.ln2, h.ln_2)):
            put(theirs.weight, norm(ours)[0])
            put(theirs.bias, norm(ours)[1])
        put(h.attn.c_attn.weight, block.attn.qkv.weight.T)
        put(h.attn.c_proj.weight, block.attn.proj.weight.T)
        put(h.mlp.c_fc.weight, block.mlp.fc.weight.T)
        put(h.mlp.c_proj.weight, block.mlp.proj.weight.T)
    put(t.ln_f.weight, norm(model.ln_f)[0])
    put(t.ln_f.bias, norm(model.ln_f)[1])
    put(hf.lm_head.weight, model.lm_head.weight)
'''

ENTRY_POINTS = '''
[posexp.tasks]
first = lab.first

[posexp.trackers]
jsonl = lab.jsonl_tracker

[posexp.exporters]
nope_gpt2 = lab.nope_gpt2
'''


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Path:
    """An installed-looking package ``lab`` (its distribution's entry points name each module), a config folder
    with the task's and the tracker's yaml, and nothing of posexp edited."""
    root = tmp_path_factory.mktemp("lab")
    package = root / "site" / "lab"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name, text in (("first", FIRST_TASK), ("jsonl_tracker", JSONL_TRACKER), ("nope_gpt2", EXPORTER)):
        (package / f"{name}.py").write_text(textwrap.dedent(text).lstrip())
    dist = root / "site" / "lab-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: lab\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS.lstrip())
    for group, name, text in (("task", "first", TASK_YAML), ("logger", "jsonl", TRACKER_YAML)):
        (root / "conf" / group).mkdir(parents=True, exist_ok=True)
        (root / "conf" / group / f"{name}.yaml").write_text(text.lstrip())
    return root


@pytest.fixture
def installed(lab, monkeypatch) -> Path:
    """``lab`` installed (its site folder on ``sys.path``) before posexp starts: the task, tracker and exporter
    registries read their entry points anew and the config schemas are stored anew, as in a new process; the
    registries, and ``lab``'s modules, are as they were after the test."""
    from posexp.commands import validation
    from posexp.hf.exporters import EXPORTERS
    from posexp.tasks.task import TASKS
    from posexp.tracking.tracker import TRACKERS

    # saved before lab is on the path: reading a registry loads it, entry points included
    saved = [(registry, dict(registry), registry._loaded) for registry in (TASKS, TRACKERS, EXPORTERS)]
    monkeypatch.syspath_prepend(str(lab / "site"))
    monkeypatch.setattr(validation, "_stored", {})
    for registry, _, _ in saved:
        registry._loaded = False
    yield lab
    for registry, classes, loaded in saved:
        registry.reset_to(classes)
        registry._loaded = loaded
    for name in [m for m in sys.modules if m == "lab" or m.startswith("lab.")]:
        del sys.modules[name]


@pytest.fixture
def own_lab(tmp_path, monkeypatch) -> Path:
    """A researcher's project folder (:func:`helpers.plugins.write_lab`: ``my_lab/`` and ``conf/``), its components
    found through ``--config-dir conf``; after the test the task and tracker registries, ``sys.path`` and the
    modules imported from it are as they were, so that the next test imports its own ``my_lab`` afresh."""
    from helpers.plugins import write_lab
    from posexp.tasks.task import TASKS
    from posexp.tracking.tracker import TRACKERS

    saved = [(registry, dict(registry)) for registry in (TASKS, TRACKERS)]
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield write_lab(tmp_path / "lab")
    for registry, classes in saved:
        registry.reset_to(classes)
    for name in [m for m in sys.modules if m == "my_lab" or m.startswith("my_lab.")]:
        del sys.modules[name]


def _posexp(lab: Path, *args: str):
    """``posexp ARGS`` run from the lab folder (its ``conf/``)."""
    return invoke(*args, cwd=lab)


FAST = (*TINY_RUN, "train.steps=3", "eval.examples=8", "eval.multiples=[1,2]")


def test_a_plugin_task_trains_with_its_own_options_and_reports_to_a_plugin_tracker(installed):
    lab = installed
    run = lab / "first-run"
    done = _posexp(lab, "train", "--config-dir", "conf", "task=first", "task.symbols=6", "logger=jsonl",
                   "encoder=rope", *FAST, f"hydra.run.dir={run}")
    assert done.exit_code == 0, done.output[-4000:]
    results = json.loads((run / "results.json").read_text())
    assert results["run"]["task"]["options"] == {"symbols": 6, "repeats": 2}  # the yaml's, and the command line's
    assert results["run"]["vocab_size"] == 8
    rows = results["rows"]
    assert [r["length"] for r in rows] == [32, 64] and all(r["answer_tokens"] == 8 * 2 for r in rows)
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "lab" and kinds[-1] == "finish" and events[-1]["status"] == "completed"  # logger.jsonl.prefix
    assert events[0]["config"]["task"]["repeats"] == 2
    assert {e["length"] for e in events if e["event"] == "eval"} == {32, 64} and "train" in kinds

    # posexp eval finds the plugin tracker's run again, from the record in the run folder
    again = _posexp(lab, "eval", str(run), "eval.lengths=[48]", "eval.examples=8")
    assert again.exit_code == 0, again.output[-4000:]
    assert 48 in {json.loads(line).get("length") for line in (run / "events.jsonl").read_text().splitlines()}


def _listed(lab: Path, name: str) -> str:
    """What ``posexp list --config-dir conf`` says the task or tracker ``name`` is."""
    done = _posexp(lab, "list", "--config-dir", "conf")
    assert done.exit_code == 0, done.output[-3000:]
    return next(line for line in done.stdout.splitlines() if line.strip("│ ").startswith(f"{name} ")).split("│")[2]


def test_posexp_list_says_what_a_plugin_task_is_from_the_task_description_its_yaml_sets(installed):
    """A plugin task's row was empty when its yaml had no header comment, though it set task.description."""
    assert _listed(installed, "first").strip() == "write the first symbol again"


def test_posexp_list_says_what_a_plugin_task_is_from_its_class_as_an_encoders(own_lab):
    """A yaml that lists the task's options and says nothing of it: the class's description, as an encoder's."""
    assert _listed(own_lab, "first").strip() == "read a string, then write its first symbol again"


def test_posexp_list_says_what_a_plugin_tracker_is_from_its_class(own_lab):
    """A tracker's yaml that names its module and options only: its row was empty; the class's description."""
    assert _listed(own_lab, "jsonl").strip() == "every event of a run as one JSON line"


def test_a_plugin_task_whose_init_raises_stops_train_in_one_line(installed):
    """What the task's own __init__ raised was Python's traceback; it is one line naming the task, as an encoder's."""
    done = _posexp(installed, "train", "--config-dir", "conf", "task=first", "task.repeats=0", *FAST,
                   f"hydra.run.dir={installed / 'raised'}")
    assert done.exit_code != 0 and "Traceback" not in done.output, done.output[-3000:]
    assert done.stderr.strip().splitlines() == ["error: task=first: First(symbols=None, min_size=None, repeats=0) "
                                                "raised ValueError: repeats must be at least 1"]
    assert not (installed / "raised").exists()


def test_a_plugin_task_that_raises_in_posexp_eval_says_one_line_as_training_does(own_lab):
    """A task's generator that fails only at a length training never reached printed Python's traceback from
    posexp eval: one line naming the task and the run's train.log, which holds the traceback."""
    lab = own_lab
    source = lab / "my_lab" / "first.py"
    source.write_text(source.read_text().replace(
        "    def generate(self, size, count, rng, **options):\n",
        "    def generate(self, size, count, rng, **options):\n"
        "        if size > 40:\n"
        "            raise ValueError(f'my bug: no instance of {size} symbols')\n"))
    run = lab / "run"
    trained = _posexp(lab, "train", "--config-dir", "conf", "task=first", *FAST, "eval.multiples=[1]",
                      f"hydra.run.dir={run}")
    assert trained.exit_code == 0, trained.output[-3000:]
    done = _posexp(lab, "eval", str(run), "eval.lengths=[64]", "eval.examples=8")
    assert done.exit_code == 1 and "Traceback" not in done.output, done.output[-3000:]
    assert done.stderr.strip().splitlines() == [
        "error: task=first: First.generate raised ValueError: my bug: no instance of 62 symbols; the evaluation "
        f"stopped, results.json is as it was, the traceback is in {run / 'train.log'}"]
    assert "Traceback" in (run / "train.log").read_text()


PARTIAL_TRACKER = '''
from pathlib import Path

from posexp.tracking.tracker import TRACKERS, Tracker


@TRACKERS.register("steps")
class Steps(Tracker):
    """A newcomer's tracker: the training curve only."""

    def __init__(self, path):
        self.path = path

    @classmethod
    def start(cls, run, prefix: str = "run"):
        return cls(run.run_dir / "steps.txt")

    def log_train(self, step, values):
        with self.path.open("a") as f:
            f.write(f"{step} {values}\\n")
'''


def test_a_plugin_tracker_that_leaves_calls_unimplemented_is_refused_in_one_line_before_training(own_lab):
    """A tracker of start and log_train trained with 'logger=steps: could not record its run id (NotImplementedError:
    )' and was dropped, nothing logged: one line before the run names what it lacks."""
    (own_lab / "my_lab" / "steps.py").write_text(PARTIAL_TRACKER.lstrip())
    (own_lab / "conf" / "logger" / "steps.yaml").write_text("# @package logger.steps\nmodule: my_lab.steps\n")
    done = _posexp(own_lab, "train", "--config-dir", "conf", "logger=steps", *FAST, f"hydra.run.dir={own_lab / 'run'}")
    assert done.exit_code == 2 and done.output.strip().splitlines() == [
        "error: logger: steps: Steps does not implement reopen, log_curve, log_eval, log_artifacts, finish, record, "
        "where; a tracker implements each call of Tracker (posexp/tracking/tracker.py): start, reopen, log_train, "
        "log_curve, log_eval, log_artifacts, finish, record, where"], done.output[-2000:]
    assert not (own_lab / "run").exists()


@pytest.mark.parametrize("args,line", [
    (("task=first", "task.repeat=3"), "task.repeat: not an option of task 'first'; did you mean task.repeats? its "
                                      "options are: symbols, min_size, repeats"),
    (("logger=jsonl", "+logger.jsonl.prefx=a"), "logger.jsonl.prefx: not an option of logger 'jsonl'; did you mean "
                                                "logger.jsonl.prefix? its options are: path, prefix"),
])
def test_an_option_a_plugin_does_not_take_is_one_line_naming_its_options(installed, args, line):
    lab = installed
    done = _posexp(lab, "train", "--config-dir", "conf", *args, *FAST, f"hydra.run.dir={lab / 'refused'}")
    out = done.output.strip()
    assert done.exit_code == 2 and out.splitlines() == [f"error: {line}"], out
    assert not (lab / "refused").exists()


@pytest.mark.slow  # two trainings and two exports through the CLI (~60 s)
def test_a_plugin_exporter_writes_a_none_run_as_gpt2_and_its_refusal_is_its_own(installed):
    lab = installed
    pytest.importorskip("transformers")
    run = lab / "none-run"
    done = _posexp(lab, "train", "encoder=none", *TINY_RUN, "train.steps=3", "eval.multiples=[1]",
                   "eval.tokens=256", f"hydra.run.dir={run}")
    assert done.exit_code == 0, done.output[-4000:]
    exported = _posexp(lab, "export", str(run), str(lab / "none-hf"))
    assert exported.exit_code == 0, exported.output[-4000:]
    record = json.loads((lab / "none-hf" / "posexp_export.json").read_text())
    assert record["architecture"] == "GPT2LMHeadModel" and record["exact"] is True
    assert record["max_abs_logit_diff"] < 1e-4  # measured on the reloaded folder: the same function as the run's

    untied = lab / "untied-run"
    done = _posexp(lab, "train", "encoder=none", "model.tie_embeddings=false", *TINY_RUN, "train.steps=3",
                   "eval.multiples=[1]", "eval.tokens=256", f"hydra.run.dir={untied}")
    assert done.exit_code == 0, done.output[-4000:]
    refused = _posexp(lab, "export", str(untied), str(lab / "untied-hf"))
    out = refused.output.strip()
    assert refused.exit_code != 0 and out.splitlines() == [
        "error: this exporter writes tied embeddings only: train with model.tie_embeddings=true"], out
    assert not (lab / "untied-hf").exists()


def test_a_plugin_tasks_yaml_named_like_a_builtin_is_said_to_be_shadowed(tmp_path, caplog):
    """conf/task/copy.yaml naming the user's module trained posexp's own task=copy (Hydra reads posexp's
    task/copy.yaml first), silently: a line says so, as a plugin encoder that takes a built-in's name is told."""
    from helpers.plugins import write_lab

    lab = write_lab(tmp_path / "lab")
    (lab / "conf" / "task" / "first.yaml").rename(lab / "conf" / "task" / "copy.yaml")
    with caplog.at_level(logging.WARNING, logger="posexp.registry"):
        done = _posexp(lab, "train", "--config-dir", "conf", "task=copy", "--cfg", "job")
    assert done.exit_code == 0, done.output[-2000:]
    assert [r.getMessage() for r in caplog.records if r.name == "posexp.registry"] == [
        f"the plugin task 'copy' ({lab / 'conf' / 'task' / 'copy.yaml'}) is shadowed by posexp's built-in "
        "task/copy.yaml, which Hydra reads first; rename yours (the file and its name)"]  # logger/jsonl.yaml is not
