"""posexp finetune: a finished run trained on at a longer length, its positions scaled as evaluation scales them.

What a user relies on: the fine-tune starts from the parent's weights and trains with exactly the
frequencies the evaluation-time scaling uses; the new run records where it came from; it resumes, caches
and refuses bad input like a training run.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import TINY_RUN, invoke, sigterm_at_step

PARENT_LEN = 32  # experiment=smoke's train_len
# a fine-tune of a smoke parent in seconds: 2x its length, a few steps, two eval lengths
QUICK = ("train_len=64", "train.steps=6", "train.batch_size=4", "train.warmup_steps=2", "train.log_every=1",
         "train.checkpoint_every=2", "train.threads=1", "train.progress=false", "eval.tokens=1024")


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def _numbers(run_dir: Path) -> list[tuple]:
    return [(r["length"], r["ppl"], r["loss"]) for r in _results(run_dir)["rows"]]


def _error_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def parents(tmp_path_factory) -> dict[str, Path]:
    """Finished smoke runs to fine-tune: rope, a learned table and a bias (alibi)."""
    root = tmp_path_factory.mktemp("parents")
    out = {}
    for encoder in ("rope", "learned", "alibi"):
        result = invoke("train", *TINY_RUN, f"encoder={encoder}", f"hydra.run.dir={root / encoder}")
        assert result.exit_code == 0, result.output
        out[encoder] = root / encoder
    return out


@pytest.fixture(scope="module")
def linear_child(parents, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("child") / "linear"
    result = invoke("finetune", str(parents["rope"]), *QUICK, "scaling=linear", f"hydra.run.dir={run_dir}")
    assert result.exit_code == 0, result.output
    return run_dir


# -- one implementation of the scaled frequencies -------------------------------------------------------

def _child_cfg(parent: Path, *overrides: str):
    from hydra import compose, initialize_config_dir

    from posexp.commands.finetune import check_finetune
    from posexp.config.schema import config_dir
    from posexp.commands.validation import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        app = compose("finetune", overrides=[f"parent={parent}", *overrides])
    return check_finetune(app)


@pytest.mark.parametrize("scaling", ["linear", "ntk", "dynamic_ntk", "yarn", "llama3"])
def test_training_uses_the_frequencies_evaluation_uses(parents, scaling):
    """The fine-tuned encoder is the evaluation-time scaled copy: same frequencies, same YaRN temperature, at
    the training length and beyond (dynamic NTK follows the length read)."""
    from posexp.model.factory import build_encoder, build_model
    from posexp.encoders.extension import scaled_encoder

    cfg = _child_cfg(parents["rope"], "train_len=128", f"scaling={scaling}")
    factor = 1.0 if scaling == "dynamic_ntk" else 128 / PARENT_LEN
    assert cfg.finetune.scaling_factor == factor
    trained = build_model(cfg, 256).encoder
    evaluated = scaled_encoder(build_encoder(cfg), scaling, factor, PARENT_LEN)
    for seq_len in (128, 512):
        (theta, scale), (theta_eval, scale_eval) = trained.frequencies(seq_len), evaluated.frequencies(seq_len)
        assert torch.equal(theta, theta_eval) and scale == scale_eval
    if scaling == "yarn":  # YaRN's temperature sqrt(1/t) = 0.1 ln s + 1 (Peng et al. 2023, §3.4) trains too
        assert trained.attention_scaling == pytest.approx(0.1 * torch.log(torch.tensor(4.0)).item() + 1)


def test_a_learned_table_is_resized_by_interpolation_or_new_rows(parents):
    """linear: row m of the new table is the parent's table read at m / s, exactly what evaluation-time
    interpolation reads; none: the parent's rows are kept and new ones added."""
    from posexp.model.factory import build_model
    from posexp.training.checkpoint import parent_weights

    for scaling in ("linear", "none"):
        cfg = _child_cfg(parents["learned"], "train_len=64", f"scaling={scaling}")
        parent_model = build_model(cfg, 256, init=lambda m: None)  # shape only
        parent_table = load_file(str(parents["learned"] / "checkpoint" / "model.safetensors"))["encoder.wpe.weight"]
        model = build_model(cfg, 256, init=parent_weights(cfg.finetune))
        table = model.encoder.wpe.weight.detach()
        assert table.shape == (64, parent_model.encoder.wpe.weight.shape[1])
        if scaling == "none":
            assert torch.equal(table[:PARENT_LEN], parent_table)
        else:
            assert torch.equal(table[::2], parent_table)  # m / 2 on a trained row
            assert torch.allclose(table[1:-1:2], (parent_table[:-1] + parent_table[1:]) / 2, atol=1e-6)


# -- the command ------------------------------------------------------------------------------------

def test_finetune_records_its_lineage_and_evaluates_at_the_new_length(parents, linear_child):
    from posexp.training.checkpoint import sha256_file

    parent_run = _results(parents["rope"])["run"]
    run = _results(linear_child)["run"]
    assert (run["parent"], run["scaling"], run["scaling_factor"], run["train_len"]) == \
        (str(parents["rope"].resolve()), "linear", 2.0, 64)
    ft = run["finetune"]
    assert ft["parent_config_hash"] == parent_run["config_hash"]
    assert ft["parent_weights_sha256"] == sha256_file(parents["rope"] / "checkpoint" / "model.safetensors")
    assert (ft["parent_train_len"], ft["steps"], ft["tokens"]) == (PARENT_LEN, 6, 6 * 4 * 64)
    assert [r["length"] for r in _results(linear_child)["rows"]] == [64, 128, 256]  # 1x, 2x, 4x the new length
    assert run["config"]["encoder"] == parent_run["config"]["encoder"]


def test_a_bias_encoding_fine_tunes_directly(parents, tmp_path):
    """ALiBi has nothing to interpolate: scaling=none trains it at the new length as it is."""
    run_dir = tmp_path / "alibi"
    result = invoke("finetune", str(parents["alibi"]), *QUICK, f"hydra.run.dir={run_dir}")
    assert result.exit_code == 0, result.output
    run = _results(run_dir)["run"]
    assert (run["encoder"], run["scaling"], run["scaling_factor"], run["train_len"]) == ("alibi", "none", 1.0, 64)


def test_finetune_starts_from_the_parents_weights(parents, tmp_path, monkeypatch):
    """With a learning rate too small to move them, the fine-tuned weights are the parent's; the parent is read
    and its weights hashed once (the job takes the config its check built)."""
    import posexp.commands.finetune as finetune

    read, hashed = [], []
    child_config, weights_sha256 = finetune.child_config, finetune._weights_sha256
    monkeypatch.setattr(finetune, "child_config", lambda app, *given: read.append(1) or child_config(app, *given))
    monkeypatch.setattr(finetune, "_weights_sha256", lambda p: hashed.append(1) or weights_sha256(p))
    run_dir = tmp_path / "still"
    result = invoke("finetune", str(parents["rope"]), *QUICK, "train.lr=1e-12", f"hydra.run.dir={run_dir}")
    assert result.exit_code == 0, result.output
    assert len(read) == len(hashed) == 1
    parent = load_file(str(parents["rope"] / "checkpoint" / "model.safetensors"))
    child = load_file(str(run_dir / "checkpoint" / "model.safetensors"))
    assert parent.keys() == child.keys()
    assert all(torch.allclose(parent[k], child[k], atol=1e-6) for k in parent)


def test_a_killed_finetune_resumes_to_the_same_numbers(parents, linear_child, tmp_path, monkeypatch):
    from posexp.data.corpus import BatchSampler

    sample = sigterm_at_step(monkeypatch, BatchSampler, "batch", 2)
    run_dir = tmp_path / "killed"
    result = invoke("finetune", str(parents["rope"]), *QUICK, "scaling=linear", f"hydra.run.dir={run_dir}")
    assert result.exit_code == 128 + signal.SIGTERM, result.output
    assert not (run_dir / "results.json").exists()
    monkeypatch.setattr(BatchSampler, "batch", sample)
    resumed = invoke("resume", str(run_dir))
    assert resumed.exit_code == 0, resumed.output
    assert _numbers(run_dir) == _numbers(linear_child)
    assert _results(run_dir)["run"]["finetune"] == _results(linear_child)["run"]["finetune"]


def test_a_finished_finetune_is_reused_from_the_cache(parents, tmp_path):
    args = (str(parents["rope"]), *QUICK, "scaling=yarn", "cache=true", f"cache_dir={tmp_path / 'cache'}")
    first = invoke("finetune", *args, f"hydra.run.dir={tmp_path / 'a'}")
    assert first.exit_code == 0, first.output
    second = invoke("finetune", *args, f"hydra.run.dir={tmp_path / 'b'}")
    assert second.exit_code == 0, second.output
    assert "reused from cache" in second.stdout
    assert _numbers(tmp_path / "a") == _numbers(tmp_path / "b")
    # another scaling is another training
    third = invoke("finetune", *args[:-2], "scaling=ntk", *args[-1:], f"hydra.run.dir={tmp_path / 'c'}")
    assert third.exit_code == 0 and "reused from cache" not in third.stdout


@pytest.mark.parametrize("case,key", [
    ("unfinished", "not a finished run"),
    ("shorter", "train_len: must be at least the parent's training length 32"),
    ("unsupported", "scaling: 'ntk' does not apply to encoder 'learned'"),
    ("corpus", "data: the parent"),
    ("encoder", "encoder: encoder=alibi: a fine-tune keeps the parent's"),
    ("rerope", "scaling: rerope is an evaluation-time position remapping with nothing to train; evaluate with "
               "posexp eval RUN eval.scaling=rerope"),
    ("unknown", "scaling: unknown scaling 'yarn2' for fine-tuning; choose one of: none, linear"),
    ("self_extend", "scaling: self_extend is an evaluation-time position remapping with nothing to train"),
    ("bias", "scaling: 'linear' does not apply to encoder 'alibi', which fine-tunes with scaling=none"),
    ("no_parent", "give the run folder to fine-tune first"),
])
def test_bad_input_is_one_line_and_leaves_no_folder(parents, tmp_path, case, key):
    unfinished = tmp_path / "unfinished"
    shutil.copytree(parents["rope"], unfinished)
    (unfinished / "results.json").unlink()
    args = {
        "unfinished": (str(unfinished), "train_len=64"),
        "shorter": (str(parents["rope"]), "train_len=16"),
        "unsupported": (str(parents["learned"]), "train_len=64", "scaling=ntk"),
        "corpus": (str(parents["rope"]), "train_len=64", "data=text", "data.path=/etc/hostname"),
        "encoder": (str(parents["rope"]), "encoder=alibi"),
        "rerope": (str(parents["rope"]), "scaling=rerope"),
        "self_extend": (str(parents["rope"]), "scaling=self_extend"),
        "unknown": (str(parents["rope"]), "scaling=yarn2"),
        "bias": (str(parents["alibi"]), "scaling=linear"),
        "no_parent": ("train_len=64",),
    }[case]
    run_dir = tmp_path / "new"
    result = invoke("finetune", *args, f"hydra.run.dir={run_dir}")
    assert result.exit_code == 2, result.output
    lines = _error_lines(result)
    assert len(lines) == 1 and lines[0].startswith("error: ") and key in lines[0], lines
    assert not run_dir.exists()


@pytest.mark.slow  # a three-job fine-tune sweep; the report's parent columns are tested on single runs by default
def test_a_sweep_of_scalings_reports_by_scaling_with_the_parent_beside(parents, tmp_path):
    sweep = tmp_path / "sweep"
    result = invoke("finetune", str(parents["rope"]), *QUICK, "-m", "scaling=none,linear",
                    f"hydra.sweep.dir={sweep}")
    assert result.exit_code == 0, result.output
    assert sorted(_results(sweep / job)["run"]["scaling"] for job in ("0", "1")) == ["linear", "none"]
    report = invoke("report", str(sweep), "--by", "scaling", "--metric", "ppl@1x", "--format", "csv")
    assert report.exit_code == 0, report.output
    import csv
    import io

    table = list(csv.DictReader(io.StringIO(report.stdout)))
    assert "scaling" in table[0] and "parent ppl@1x" in table[0], list(table[0])
    parent_ppl = next(r["ppl"] for r in _results(parents["rope"])["rows"] if r["length"] == PARENT_LEN)
    assert len(table) == 2 and all(float(row["parent ppl@1x"]) == pytest.approx(parent_ppl) for row in table), table


def test_evaluation_does_not_scale_a_run_fine_tuned_with_a_scaling_again(linear_child):
    before = (linear_child / "results.json").read_bytes()
    result = invoke("eval", str(linear_child), "eval.scaling=ntk")
    assert result.exit_code == 2, result.output
    assert _error_lines(result) == ["error: eval.scaling: this run fine-tunes with scaling=linear, which evaluation "
                                    "applies as trained; another evaluation-time scaling on top (ntk) is not "
                                    "defined: use eval.scaling=none"]
    assert (linear_child / "results.json").read_bytes() == before


# -- experiment trackers: the parent's by default, or the ones the fine-tune names --------------------

def test_a_finetune_reports_to_the_parents_trackers_unless_told_otherwise(parents, tmp_path):
    import shutil

    from omegaconf import OmegaConf

    tracked = tmp_path / "tracked"
    shutil.copytree(parents["rope"], tracked)
    saved = OmegaConf.load(tracked / ".hydra" / "config.yaml")
    saved.logger = {"tensorboard": {"log_dir": None}, "mlflow": None, "wandb": None}
    OmegaConf.save(saved, tracked / ".hydra" / "config.yaml")
    assert _child_cfg(tracked, "train_len=64").logger.get("tensorboard") is not None  # inherited
    assert _child_cfg(tracked, "train_len=64", "logger=none").logger.get("tensorboard") is None
    chosen = _child_cfg(parents["rope"], "train_len=64", "logger=tensorboard").logger
    assert chosen.get("tensorboard") is not None and chosen.get("mlflow") is None


def test_a_finetune_with_logger_tensorboard_writes_its_curve_and_rows(parents, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "tb"
    result = invoke("finetune", str(parents["rope"]), *QUICK, "scaling=linear", "logger=tensorboard",
                    f"hydra.run.dir={run_dir}")
    assert result.exit_code == 0, result.output
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(1, 7))
    rows = {r["length"]: r["ppl"] for r in _results(run_dir)["rows"] if r["protocol"] == "nonoverlap"}
    assert {e.step: e.value for e in acc.Scalars("eval/ppl/nonoverlap")} == pytest.approx(rows, rel=1e-6)


def test_the_run_folder_is_read_where_it_stands_among_flags_and_overrides(tmp_path, monkeypatch):
    """``posexp finetune myrun train_len=256 --cfg job``: a bare folder name, with a flag and its value after."""
    from posexp.commands.finetune import parent_argument

    (tmp_path / "myrun").mkdir()
    monkeypatch.chdir(tmp_path)
    out = parent_argument(["myrun", "train_len=256", "--cfg", "job"])
    assert out == [f"parent={tmp_path / 'myrun'}", "train_len=256", "--cfg", "job"]


def test_two_run_folders_are_one_line(tmp_path, monkeypatch):
    from posexp.commands.finetune import parent_argument
    from posexp.errors import PosexpError

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PosexpError, match=r"takes one run folder; got a and b"):
        parent_argument(["a", "b", "train_len=256"])


def test_a_parent_overwritten_since_the_fine_tune_is_flagged_not_shown(parents, linear_child, tmp_path):
    """Report's parent columns showed the numbers of whatever run now stands in the parent's folder."""
    parent, child = tmp_path / "parent", tmp_path / "child"
    shutil.copytree(parents["rope"], parent)
    shutil.copytree(linear_child, child)
    results = _results(child)
    results["run"]["parent"] = str(parent)
    (child / "results.json").write_text(json.dumps(results))

    def report(*args):
        out = invoke("report", str(child), "--format", "csv", *args)
        assert out.exit_code == 0, out.output
        return out

    def finetune_diffs(csv_text):  # the context-extension table's differences of the fine-tune to its parent
        rows = list(csv.DictReader(io.StringIO(csv_text)))
        return [r["diff_vs_parent"] for r in rows if r["kind"] == "finetune"]

    assert "parent ppl@1x" in report("--by", "encoder", "--metric", "ppl@1x").stdout  # the parent as it was
    assert any(finetune_diffs(report().stdout))
    weights = parent / "checkpoint" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")  # overwritten by another run since
    flagged = report("--by", "encoder", "--metric", "ppl@1x")
    assert "parent ppl@1x" not in flagged.stdout
    assert "was overwritten or changed since the fine-tune" in flagged.output
    table = report()
    assert not any(finetune_diffs(table.stdout)) and "was overwritten or changed since the fine-tune" in table.output


# -- the context-extension table -------------------------------------------------------------------------

def test_report_of_a_parent_and_its_fine_tune_is_one_extension_table(parents, linear_child, tmp_path, monkeypatch):
    parent = tmp_path / "parent"  # the most natural name for the run one fine-tunes
    shutil.copytree(parents["rope"], parent)
    child = tmp_path / "ft"
    shutil.copytree(linear_child, child)
    recorded = _results(child)
    recorded["run"]["parent"] = str(parent)  # the copy's lineage points at the copied parent
    (child / "results.json").write_text(json.dumps(recorded))
    assert invoke("eval", str(parent), "eval.scaling=yarn", "eval.tokens=1024").exit_code == 0
    monkeypatch.chdir(tmp_path)
    result = invoke("report", "parent", "ft")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "rope@32" in out and "+yarn (eval)" in out and "+linear ft→64, 6 steps" in out, out
    assert "not comparable" not in out and "different train length" not in out
    table = json.loads(invoke("report", "parent", "ft", "--format", "json").stdout)
    assert [line["kind"] for line in table["lines"]] == ["parent", "eval", "finetune"]
    ft = table["lines"][2]
    for n, diff in ft["diff_vs_parent"].items():  # each line carries its difference to the parent
        if str(n) in table["lines"][0]["ppl"] and table["lines"][0]["ppl"][str(n)] is not None:
            assert diff == pytest.approx(ft["ppl"][str(n)] - table["lines"][0]["ppl"][str(n)])
    latex = invoke("report", "parent", "ft", "--format", "latex").stdout
    assert r"\begin{tabular}" in latex and "+linear ft→64, 6 steps" in latex
    written = tmp_path / "reports" / "parent+ft"
    assert (written / "extension.csv").is_file() and "# Context extension" in (written / "report.md").read_text()
    assert not (parent / "report.md").exists()  # nothing written into the runs' own folders


def test_a_fine_tune_is_measured_on_its_parents_token_budget(parents, linear_child, tmp_path):
    parent_budget = {r["eval_tokens"] for r in _results(parents["rope"])["rows"]}
    quick = [a for a in QUICK if not a.startswith("eval.tokens=")]
    result = invoke("finetune", str(parents["rope"]), *quick, "eval.multiples=[1]", f"hydra.run.dir={tmp_path / 'ft'}")
    assert result.exit_code == 0, result.output
    # the parent's budget, not eval.tokens' default (65,536) that the fine-tune's own config would give
    assert {r["eval_tokens"] for r in _results(tmp_path / "ft")["rows"]} == parent_budget != {65536}


def test_eval_of_a_sweep_leaves_the_sweeps_own_summary_and_says_how_to_report(parents, tmp_path):
    sweep = tmp_path / "sweep"
    shutil.copytree(parents["rope"], sweep / "0")
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    (sweep / "summary.md").write_text("the sweep as it ended\n")
    result = invoke("eval", str(sweep), "eval.lengths=[32]", "eval.tokens=512")
    assert result.exit_code == 0, result.output
    assert (sweep / "summary.md").read_text() == "the sweep as it ended\n"
    assert f"posexp report {sweep}" in " ".join(result.output.split())


@pytest.mark.parametrize("name", ["parent", "parent_rope"])
def test_a_run_folder_named_parent_is_a_folder(tmp_path, monkeypatch, name):
    """``posexp finetune parent train_len=512``: the most natural name of the run one fine-tunes was read as a
    ``parent`` override and refused ("parent: not an override KEY=VALUE")."""
    from posexp.commands.finetune import parent_argument

    (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path)
    assert parent_argument([name, "train_len=512"]) == [f"parent={tmp_path / name}", "train_len=512"]
    # the override spelled out is still the override
    assert parent_argument([f"parent={tmp_path / name}", "train_len=512"]) == [f"parent={tmp_path / name}",
                                                                               "train_len=512"]


@pytest.mark.parametrize("target,flags", [("", ()), ("", ("--overwrite",)), ("inner", ("--overwrite",)),
                                          ("", ("--overwrite", "-m", "scaling=linear,ntk"))],
                         ids=["same", "same-overwrite", "inside-overwrite", "sweep-overwrite"])
def test_a_fine_tune_into_its_own_parent_is_refused_before_anything_is_deleted(parents, tmp_path, target, flags):
    """``posexp finetune runs/fp ... hydra.run.dir=runs/fp --overwrite`` deleted the parent's weights and results."""
    parent = tmp_path / "fp"
    shutil.copytree(parents["rope"], parent)
    before = {p.relative_to(parent): p.stat().st_size for p in parent.rglob("*")}
    key = "hydra.sweep.dir" if "-m" in flags else "hydra.run.dir"
    result = invoke("finetune", *flags, str(parent), *QUICK, f"{key}={parent / target if target else parent}")
    assert result.exit_code == 2, result.output
    (line,) = _error_lines(result)
    assert f"{key}=" in line and f"the parent run {parent}" in line and "choose another" in line
    assert {p.relative_to(parent): p.stat().st_size for p in parent.rglob("*")} == before


@pytest.mark.parametrize("fmt", ["json", "markdown", "rich"])
def test_a_parent_replaced_by_another_run_is_flagged_in_every_format_and_by_eval(parents, linear_child, tmp_path,
                                                                                 fmt):
    """The parent's folder now holds another run: the report's parent columns went blank with no word of why."""
    parent, child = tmp_path / "parent", tmp_path / "child"
    shutil.copytree(parents["alibi"], parent)  # another run stands where the child's parent was
    shutil.copytree(linear_child, child)
    results = _results(child)
    results["run"]["parent"] = str(parent)
    (child / "results.json").write_text(json.dumps(results))
    config = child / ".hydra" / "config.yaml"
    config.write_text(config.read_text().replace(str(parents["rope"]), str(parent)))
    out = invoke("report", str(child), "--metric", "auc", "--format", fmt)
    assert out.exit_code == 0, out.output
    assert "was overwritten or changed since the fine-tune" in out.output
    if fmt == "rich":
        evaluated = invoke("eval", str(child), "eval.lengths=[64]", "eval.tokens=256")
        assert evaluated.exit_code == 0, evaluated.output
        assert "was overwritten or changed since the fine-tune" in evaluated.output


def test_a_longrope_fine_tune_trains_with_the_factors_evaluation_reads(parents):
    """scaling=longrope with longrope_factors: the encoder trained is eval.scaling=longrope's copy with the same
    per-frequency factors (Ding et al. 2024 fine-tune with their searched factors); without them, one line naming
    longrope_factors."""
    from posexp.encoders.extension import scaled_encoder
    from posexp.errors import ConfigError
    from posexp.model.factory import build_encoder, build_model

    n = build_encoder(_child_cfg(parents["rope"], "train_len=128")).inv_freq.numel()
    factors = [1.0 + i / n for i in range(n)]
    cfg = _child_cfg(parents["rope"], "train_len=128", "scaling=longrope", f"longrope_factors={factors}")
    trained = build_model(cfg, 256).encoder
    evaluated = scaled_encoder(build_encoder(cfg), "longrope", 128 / PARENT_LEN, PARENT_LEN, longrope_factors=factors)
    (theta, scale), (theta_eval, scale_eval) = trained.frequencies(128), evaluated.frequencies(128)
    assert torch.equal(theta, theta_eval) and scale == scale_eval
    assert not torch.equal(theta, build_encoder(cfg).inv_freq)  # rescaled, not the parent's
    with pytest.raises(ConfigError, match=rf"^longrope_factors: .*{n} of them"):
        _child_cfg(parents["rope"], "train_len=128", "scaling=longrope")


def test_a_longrope_fine_tune_takes_n_hat_as_evaluation_does(parents, tmp_path):
    """longrope_start (LongRoPE's n^, Ding et al. 2024, §3.2), given or from posexp search's factors file: the
    encoder trained keeps the first n^ positions unscaled exactly as eval.longrope_start does; the lineage records
    it; one line when it comes without scaling=longrope."""
    import json

    from posexp.encoders.extension import scaled_encoder
    from posexp.errors import ConfigError
    from posexp.model.factory import build_encoder, build_model

    n = build_encoder(_child_cfg(parents["rope"], "train_len=128")).inv_freq.numel()
    factors = [1.0 + i / n for i in range(n)]
    (tmp_path / "factors.json").write_text(json.dumps({"factors": factors, "start": 3}))
    for how in ([f"longrope_factors={factors}", "longrope_start=3"], [f"longrope_file={tmp_path}"]):
        cfg = _child_cfg(parents["rope"], "train_len=128", "scaling=longrope", *how)
        assert cfg.finetune.longrope_start == 3 and list(cfg.finetune.longrope_factors) == factors
        trained = build_model(cfg, 256).encoder
        evaluated = scaled_encoder(build_encoder(cfg), "longrope", 128 / PARENT_LEN, PARENT_LEN, factors, 3)
        q, pos = torch.randn(1, 2, 8, trained.head_dim), torch.arange(8)
        assert trained.longrope_start == 3 and torch.equal(trained.rotate(q, q, pos, pos)[0],
                                                           evaluated.rotate(q, q, pos, pos)[0])
    with pytest.raises(ConfigError, match=r"^longrope_start: only applies with scaling=longrope"):
        _child_cfg(parents["rope"], "train_len=128", "longrope_start=3")


def test_a_fine_tune_without_longrope_factors_keeps_the_hash_it_had():
    """The lineage's new key, unset, leaves every earlier fine-tune's config hash (and its folder) as it was."""
    from posexp.config.identity import weights_of

    lineage = {"parent": "p", "parent_config_hash": "h", "parent_weights_sha256": "s", "parent_train_len": 32,
               "parent_corpus_fingerprint": None, "scaling": "yarn", "scaling_factor": 4.0}
    before = weights_of({"train_len": 128, "finetune": dict(lineage)})
    assert weights_of({"train_len": 128, "finetune": {**lineage, "longrope_factors": None}}) == before
    assert weights_of({"train_len": 128, "finetune": {**lineage, "longrope_factors": [1.0, 2.0]}}) != before


@pytest.mark.parametrize("encoder", [("encoder=fox",), ("encoder=mixed", "encoder.layers=[rope,fox]")],
                         ids=["fox", "mixed"])
def test_a_finetune_of_a_parent_of_an_earlier_encoder_revision_records_its_own(tmp_path, monkeypatch, encoder):
    """A fine-tune trains with this posexp's encoder code: where a fix revised the encoder since the parent was
    trained (FoX's gates weight-decayed), the new run records the revision it trains with (a mix: its fox layer's,
    in encoder.options), so it never shares a hash or a cache entry with a fine-tune of the same parent by the code
    of before."""
    from posexp.encoders.fox import ForgettingAttention

    parent = tmp_path / "fox"
    assert invoke("train", *TINY_RUN, *encoder, f"hydra.run.dir={parent}").exit_code == 0
    monkeypatch.setattr(ForgettingAttention, "revision", 3)
    child = tmp_path / "child"
    result = invoke("finetune", str(parent), *QUICK, "scaling=none", f"hydra.run.dir={child}")
    assert result.exit_code == 0, result.output
    from omegaconf import OmegaConf

    def revision(run_dir: Path) -> int:
        saved = OmegaConf.load(run_dir / ".hydra" / "config.yaml")["encoder"]
        return saved["options"]["fox"]["revision"] if saved["name"] == "mixed" else saved["revision"]

    assert (revision(parent), revision(child)) == (2, 3)
    assert _results(child)["run"]["config_hash"] != _results(parent)["run"]["config_hash"]
