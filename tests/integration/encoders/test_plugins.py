"""Encoders from outside the package: the worked example (scripts/plugin_example) copied into a folder outside
the repository, an installed package's entry point, and the provenance that keeps their results honest; the CLI
runs in this process, each test with the registry, the imported plugin modules and ``sys.path`` put back after it.
The example swept and edited between commands, each a fresh interpreter, is tests/process/test_plugin_project.py.

Nothing is installed: the example is used from its folder (``--config-dir``, ``hydra.searchpath``), and an
"installed" package is a ``*.dist-info`` folder with an ``entry_points.txt`` on ``sys.path``, which is all
:mod:`importlib.metadata` reads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import sys
from pathlib import Path

import pytest

from helpers import REPO, TINY_RUN, invoke

EXAMPLE = REPO / "scripts" / "plugin_example"
TINY = (*TINY_RUN, "train.steps=6", "train.warmup_steps=2", "train.log_every=2", "eval.tokens=256",
        "eval.loss_by_position=false")


@pytest.fixture
def project(tmp_path, registry_state) -> Path:
    """The worked example as a researcher's own project folder, outside the repository (its modules not imported
    yet, and forgotten again after the test)."""
    folder = tmp_path / "project"
    shutil.copytree(EXAMPLE, folder)
    assert REPO not in folder.parents
    return folder


@pytest.fixture
def registry_state(monkeypatch, tmp_path):
    """The encoder registry, the plugin modules and ``sys.path`` as they were, after the test: the modules imported
    from the test's folder are forgotten (what the test's commands imported of torch and posexp stays, as a
    second import of some of torch's modules registers their operators twice)."""
    import posexp.encoders as encoders

    saved, loaded, path = dict(encoders._REGISTRY), dict(encoders._loaded), list(sys.path)
    broken, by_module = dict(encoders._BROKEN), {k: set(v) for k, v in encoders._BY_MODULE.items()}
    modules = set(sys.modules)
    yield encoders
    encoders._REGISTRY.reset_to(saved)
    encoders._loaded.update(loaded)
    for state, was in ((encoders._BROKEN, broken), (encoders._BY_MODULE, by_module)):
        state.clear()
        state.update(was)
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        module = sys.modules[name]
        files = [getattr(module, "__file__", None), *getattr(module, "__path__", [])]
        if any(f and Path(f).is_relative_to(tmp_path) for f in files):
            del sys.modules[name]


def _add_encoder(project: Path, name: str, source: str) -> None:
    """The researcher's encoder ``name``: ``source`` as ``my_encoders/NAME.py`` and a yaml naming it, on its schema."""
    (project / "my_encoders" / f"{name}.py").write_text(source)
    (project / "conf" / "encoder" / f"{name}.yaml").write_text(
        f"defaults:\n  - /schema/encoder/{name}@_here_\n  - _self_\nmodule: my_encoders.{name}\n")


def _dist(site: Path, name: str, entry_points: str, module: str = "", code: str = "") -> None:
    """An installed distribution as importlib.metadata sees it: ``NAME-0.1.dist-info`` (and its module)."""
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[posexp.encoders]\n{entry_points}\n")
    if module:
        (site / f"{module}.py").write_text(code)


PLUGIN_CODE = '''
from posexp.encoders import PositionalEncoder


class Damped(PositionalEncoder):
    """Adds nothing: a plugin with one option, for the registry's tests."""

    def __init__(self, d_model: int, n_heads: int, width: int = 3):
        super().__init__(d_model, n_heads)
        self.width = width
'''


# -- the worked example, through the CLI ------------------------------------------------------------

def test_searchpath_works_like_config_dir_and_resume_checks_the_source(project):
    trained = invoke("train", "hydra.searchpath=[file://conf]", "encoder=logrope", "encoder.scale=16", *TINY,
                     "hydra.run.dir=run", cwd=project)
    assert trained.exit_code == 0, trained.output[-3000:]
    results = json.loads((project / "run" / "results.json").read_text())
    assert results["run"]["config"]["encoder"]["scale"] == 16.0
    assert (project / "run" / "encoder_source.json").is_file()  # what posexp resume compares with
    # an interrupted run of an edited plugin: resume refuses in one line (results.json gone as if killed)
    (project / "run" / "results.json").unlink()
    source = project / "my_encoders" / "logrope.py"
    source.write_text(source.read_text() + "\n# edited\n")
    refused = invoke("resume", "run", cwd=project)
    assert refused.exit_code != 0 and "changed since the run was trained" in refused.stderr
    assert "--allow-changed-encoder" in refused.stderr
    resumed = invoke("resume", "run", "--allow-changed-encoder", cwd=project)
    assert resumed.exit_code == 0, resumed.output[-2000:]
    assert (project / "run" / "results.json").is_file()


RAISES_IN_ROTATE = '''
from posexp.encoders import PositionalEncoder, register


@register("slipped")
class Slipped(PositionalEncoder):
    """Builds, then raises in its first forward: a researcher's bug that shows only once a model runs."""

    def rotate(self, q, k, q_pos, k_pos):
        raise IndexError("my bug: position 40 out of range")
'''


def test_a_plugin_encoder_that_raises_while_training_says_one_line_and_leaves_its_traceback_in_train_log(project):
    """Python's traceback on the terminal, train.log without it and a folder that said 'an unfinished run; continue
    it with posexp resume' (which raised the same again): one line naming the encoder and train.log, which holds the
    traceback, and a results.json that records the run as failed, as a failed sweep job's does."""
    _add_encoder(project, "slipped", RAISES_IN_ROTATE)
    done = invoke("train", "--config-dir", "conf", "encoder=slipped", *TINY, "hydra.run.dir=run", cwd=project)
    run = project / "run"
    assert done.exit_code == 1 and "Traceback" not in done.output, done.output[-3000:]
    assert done.stderr.strip().splitlines() == [
        "error: encoder=slipped: Slipped.rotate raised IndexError: my bug: position 40 out of range; the run "
        f"stopped, the traceback is in {run / 'train.log'}"]
    log = (run / "train.log").read_text()
    assert "Traceback" in log and 'raise IndexError("my bug: position 40 out of range")' in log
    recorded = json.loads((run / "results.json").read_text())["run"]
    assert recorded["status"] == "failed" and "Slipped.rotate raised IndexError" in recorded["error"]["message"]
    assert recorded["encoder_source"]["module"] == "my_encoders.slipped"


BROKEN_RETURNS = '''
import torch
from posexp.encoders import PositionalEncoder, register


@register("mislaid")
class Mislaid(PositionalEncoder):
    """A bias laid out (Lq, Lk, H): the model's own code fails on it, not the researcher's."""

    def bias(self, q_pos, k_pos):
        return torch.zeros(len(q_pos), len(k_pos), self.n_heads)


@register("doubled")
class Doubled(PositionalEncoder):
    """Embeds in float64 in a float32 model."""

    def embed(self, x, pos):
        return x.double()


@register("undefined")
class Undefined(PositionalEncoder):
    """A bias of NaN: the loss is NaN from the first step."""

    def bias(self, q_pos, k_pos):
        return torch.full((self.n_heads, len(q_pos), len(k_pos)), float("nan"))
'''


@pytest.mark.parametrize("name,returned", [
    ("mislaid", "bias returned shape (16, 35, 2), the contract's is (2, 16, 35)"),
    ("doubled", "embed returned torch.float64 for torch.float32 inputs"),
    ("undefined", "bias returned NaN/inf where a query sees the key")])
def test_a_plugin_hook_returning_what_the_contract_does_not_allow_stops_training_in_one_line_naming_it(
        project, name, returned):
    """A hook's wrong shape or dtype crashed training with Python's traceback from posexp's attention code (and its
    NaN read as a diverged loss, "try a lower train.lr"): one line naming the hook, what it returned and what the
    contract wants, as posexp check finds it, the traceback in train.log and the run recorded as failed."""
    (project / "my_encoders" / "broken_returns.py").write_text(BROKEN_RETURNS)
    (project / "conf" / "encoder" / f"{name}.yaml").write_text(
        f"defaults:\n  - /schema/encoder/{name}@_here_\n  - _self_\nmodule: my_encoders.broken_returns\n")
    done = invoke("train", "--config-dir", "conf", f"encoder={name}", *TINY, "hydra.run.dir=run", cwd=project)
    run = project / "run"
    assert done.exit_code == 1 and "Traceback" not in done.output, done.output[-3000:]
    message = (f"encoder={name}: {returned} (posexp check --config-dir {project / 'conf'} {name} says more); the run "
               f"stopped, the traceback is in {run / 'train.log'}")
    assert done.stderr.strip().splitlines() == [f"error: {message}"]
    assert "Traceback" in (run / "train.log").read_text()
    recorded = json.loads((run / "results.json").read_text())["run"]
    assert recorded["status"] == "failed" and recorded["error"]["message"] == message


def test_a_plugin_encoder_that_raises_in_posexp_analyze_says_one_line_as_training_does(project):
    """posexp analyze printed Python's traceback: one line naming the encoder and analyze.log, which holds it."""
    _add_encoder(project, "slipped", RAISES_IN_ROTATE)
    done = invoke("analyze", "--config-dir", "conf", "encoder=slipped", "hydra.run.dir=out", cwd=project)
    assert done.exit_code == 1 and "Traceback" not in done.output, done.output[-3000:]
    assert done.stderr.strip().splitlines() == [
        "error: encoder=slipped: Slipped.rotate raised IndexError: my bug: position 40 out of range; the analysis "
        f"stopped, the traceback is in {project / 'out' / 'analyze.log'}"]
    assert 'raise IndexError("my bug: position 40 out of range")' in (project / "out" / "analyze.log").read_text()


RAISES_PAST_TRAINING = '''
from posexp.encoders import PositionalEncoder, register


@register("short")
class Short(PositionalEncoder):
    """Trains, then raises past the training length: a researcher's bug that only a longer evaluation reaches."""

    def rotate(self, q, k, q_pos, k_pos):
        if len(q_pos) > 32:
            raise IndexError("my bug: no angle past position 31")
        return q, k
'''


def test_a_plugin_encoder_that_raises_in_posexp_eval_or_analyze_of_a_run_says_one_line_as_training_does(project):
    """posexp eval and posexp analyze RUN printed Python's traceback: one line naming the encoder and the run's
    train.log, which holds the traceback, and a results.json left as it was."""
    _add_encoder(project, "short", RAISES_PAST_TRAINING)
    trained = invoke("train", "--config-dir", "conf", "encoder=short", *TINY, "eval.lengths=[32]",
                     "hydra.run.dir=run", cwd=project)
    run = project / "run"
    assert trained.exit_code == 0, trained.output[-3000:]
    before = (run / "results.json").read_bytes()
    done = invoke("eval", "run", "eval.lengths=[64]", cwd=project)
    assert done.exit_code == 1 and "Traceback" not in done.output, done.output[-3000:]
    assert done.stderr.strip().splitlines() == [
        "error: encoder=short: Short.rotate raised IndexError: my bug: no angle past position 31; the evaluation "
        f"stopped, results.json is as it was, the traceback is in {Path('run') / 'train.log'}"]
    log = (run / "train.log").read_text()
    assert "Traceback" in log and 'raise IndexError("my bug: no angle past position 31")' in log
    assert (run / "results.json").read_bytes() == before
    analysed = invoke("analyze", "run", cwd=project)
    assert analysed.exit_code == 1 and "Traceback" not in analysed.output, analysed.output[-3000:]
    assert analysed.stderr.strip().splitlines() == [
        "error: encoder=short: Short.rotate raised IndexError: my bug: no angle past position 31; the analysis "
        f"stopped, the traceback is in {Path('run') / 'train.log'}"]
    assert (run / "train.log").read_text().count("Traceback") == log.count("Traceback") + 1


@pytest.mark.parametrize("args,expected", [
    (("encoder=logrope",), "--config-dir CONF"),  # the yaml's folder not given
    (("--config-dir", "conf", "+encoder._target_=my_encoders.logrope.LogRoPE"), "module: PACKAGE.MODULE"),
    (("plugins=[my_encoders.logrope]",), "--config-dir CONF"),
    (("--config-path", "conf", "encoder=logrope"), "use --config-dir DIR"),
    (("--config-dir", "conf", "encoder=logrope", "encoder.scael=2"), "did you mean encoder.scale?"),
    (("--config-dir", "nowhere", "encoder=logrope"), "no such folder"),
])
def test_wrong_guesses_fail_in_one_line_naming_the_way_that_works(project, args, expected):
    result = invoke("train", *args, *TINY, cwd=project)
    assert result.exit_code != 0
    assert expected in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (project / "outputs").exists()  # refused before any run folder


WRONG_SIGNATURE = '''
from posexp.encoders import PositionalEncoder, register


@register("twoargs")
class TwoArgs(PositionalEncoder):
    """Rotates with the positions left out: the model passes four tensors."""

    def rotate(self, q, k):
        return q, k
'''


def test_a_plugin_hook_that_cannot_take_the_contracts_arguments_is_broken_in_one_line(project):
    """Training printed Python's traceback at the first step (TwoArgs.rotate() takes 3 positional arguments but 5
    were given), and posexp check failed each check with it: the encoder cannot be used, said as a plugin whose
    options make no schema is, before anything runs."""
    _add_encoder(project, "twoargs", WRONG_SIGNATURE)
    why = "TwoArgs.rotate(self, q, k) does not take the contract's arguments (q, k, q_pos, k_pos)"
    _one_line(invoke("train", "--config-dir", "conf", "encoder=twoargs", *TINY, cwd=project), "encoder=twoargs", why)
    checked = invoke("check", "--config-dir", "conf", "twoargs", "--format", "json", cwd=project)
    assert checked.exit_code == 1 and "Traceback" not in checked.output, checked.output[-2000:]
    (build,) = json.loads(checked.stdout)["checks"]
    assert build["name"] == "build" and why in build["detail"]


def test_a_typo_in_a_plugins_yaml_stops_train_in_one_line_naming_the_keys(project):
    """Hydra's text ('In 'encoder/logrope': ConfigKeyError raised while composing config:; Key 'scael' not in
    'LogRoPEOptions'; ...') was all a key misspelt in the yaml got: the line a misspelt command-line key gets, after
    the yaml that sets it."""
    yaml = project / "conf" / "encoder" / "logrope.yaml"
    yaml.write_text(yaml.read_text().replace("scale: 64.0", "scael: 64.0"))
    result = invoke("train", "--config-dir", "conf", "encoder=logrope", *TINY, cwd=project)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.strip().splitlines() == [
        "error: In 'encoder/logrope': encoder.scael is not a config key; did you mean encoder.scale? keys of encoder: "
        "name, module, base, scale, lr_mult"], result.stderr


def test_a_typo_in_a_plugins_yaml_stops_check_in_one_line_naming_its_options(project):
    """'logrope.yaml: encoder.scael: Key 'scael' not in 'LogRoPEOptions'' named no option the encoder takes: the
    line a misspelt option of posexp check's command line gets, after the yaml's path."""
    yaml = project / "conf" / "encoder" / "logrope.yaml"
    yaml.write_text(yaml.read_text().replace("scale: 64.0", "scael: 64.0"))
    result = invoke("check", "--config-dir", "conf", "logrope", cwd=project)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.strip().splitlines() == [
        f"error: {yaml}: encoder.scael: not an option of encoder 'logrope'; did you mean scale? its options are: "
        "base, scale, lr_mult"], result.stderr


def test_list_shows_plugins_with_where_they_come_from(project):
    result = invoke("list", "--config-dir", "conf", cwd=project)
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if "logrope" in line)
    assert "base, scale" in row and "my_encoders.logrope" in row
    assert "built-in" in next(line for line in result.stdout.splitlines() if line.strip("│ ").startswith("rope "))


# -- the registry ------------------------------------------------------------------------------------

def test_plugin_schema_comes_from_init_and_a_typo_gets_a_did_you_mean(project, registry_state, monkeypatch):
    from posexp.errors import ConfigError

    monkeypatch.chdir(project)
    encoders = registry_state
    cls = encoders.load_plugin("logrope", "my_encoders.logrope")
    schema = encoders.options_schema(cls)()
    assert (schema.name, schema.module, schema.scale, schema.base) == ("logrope", "my_encoders.logrope", 64.0, 1e4)
    with pytest.raises(ConfigError, match=r"encoder\.scael: .*did you mean encoder\.scale\?"):
        encoders.create("logrope", d_model=32, n_heads=2, module="my_encoders.logrope", scael=2.0)


def test_cache_key_changes_when_the_plugin_source_or_a_helper_beside_it_changes(project, registry_state, monkeypatch, compose):
    from posexp.training.cache import cache_key

    monkeypatch.chdir(project)
    registry_state.load_plugin("logrope", "my_encoders.logrope")
    from posexp.commands.validation import register_configs

    register_configs()
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from posexp.config.schema import config_dir

    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = hydra_compose("config", overrides=["encoder=logrope", f"hydra.searchpath=[file://{project / 'conf'}]"])
    before = cache_key(cfg, "corpus")
    assert cache_key(cfg, "corpus") == before
    helper = project / "my_encoders" / "helpers.py"  # a module the encoder could import, beside it
    helper.write_text("SCALE = 1.0\n")
    with_helper = cache_key(cfg, "corpus")
    assert with_helper != before
    helper.write_text("SCALE = 2.0\n")  # the helper changed, the encoder's own file did not
    assert cache_key(cfg, "corpus") != with_helper
    source = project / "my_encoders" / "logrope.py"
    before = cache_key(cfg, "corpus")
    source.write_text(source.read_text() + "\n# a comment is a change of the source\n")
    assert cache_key(cfg, "corpus") != before
    # built-in runs keep the key they had: no plugin hash in it
    rope = compose("encoder=rope")
    assert cache_key(rope, "corpus") == cache_key(compose("encoder=rope"), "corpus")


def test_entry_point_plugin_is_found_without_installing(tmp_path, registry_state, monkeypatch):
    site = tmp_path / "site"
    _dist(site, "damped-pe", "damped = damped_pe:Damped", "damped_pe", PLUGIN_CODE)
    monkeypatch.syspath_prepend(str(site))
    registry_state._loaded["entry_points"] = False
    reg = registry_state.registry()
    assert reg["damped"].__name__ == "Damped"
    assert registry_state.option_names("damped") == ["width"]
    assert registry_state.origin("damped").startswith("damped-pe 0.1")
    record = registry_state.source_record("damped")
    assert (record["distribution"], record["version"]) == ("damped-pe", "0.1")
    assert record["sha256"] == hashlib.sha256((site / "damped_pe.py").read_bytes()).hexdigest()


def test_entry_point_plugin_trains_by_name_and_checks_its_options(tmp_path, registry_state, monkeypatch):
    site = tmp_path / "site"
    _installed(registry_state, monkeypatch, (site, "damped-pe", "damped = damped_pe:Damped", "damped_pe", PLUGIN_CODE))
    ok = invoke("train", "encoder=damped", "encoder.width=5", "--cfg", "job", cwd=tmp_path)
    typo = invoke("train", "encoder=damped", "encoder.widht=5", *TINY, cwd=tmp_path)
    assert ok.exit_code == 0, ok.output[-2000:]
    assert "width: 5" in ok.stdout
    assert typo.exit_code != 0 and "did you mean encoder.width?" in typo.stderr


def _installed(registry_state, monkeypatch, *dists: tuple) -> None:
    """Each ``(folder, distribution, entry point, module, code)`` installed on ``sys.path``, the registry set to read
    the entry points again (the command line's completion reads them at each call)."""
    for folder, *spec in dists:
        _dist(folder, *spec)
        monkeypatch.syspath_prepend(str(folder))
    registry_state._loaded["entry_points"] = False


def test_two_plugins_claiming_one_name_is_one_clear_error(tmp_path, registry_state, monkeypatch):
    from posexp.errors import ConfigError

    _installed(registry_state, monkeypatch,
               (tmp_path / "a", "pe-one", "damped = damped_pe:Damped", "damped_pe", PLUGIN_CODE),
               (tmp_path / "b", "pe-two", "damped = other_pe:Damped", "other_pe", PLUGIN_CODE))
    assert "rope" in registry_state.registry()  # the others go on
    with pytest.raises(ConfigError, match=r"two installed plugins claim the encoder name 'damped': .*pe-(one|two)"
                                          r".* and .*pe-(one|two)"):
        registry_state.get("damped")


def test_a_builtin_name_wins_over_a_plugin_and_says_so(tmp_path, registry_state, monkeypatch, caplog):
    from posexp.encoders.rope import RoPE
    from posexp.errors import ConfigError

    _dist(tmp_path / "site", "fake-rope", "rope = fake_rope:Damped", "fake_rope", PLUGIN_CODE)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    registry_state._loaded["entry_points"] = False
    with caplog.at_level(logging.WARNING, logger="posexp.encoders"):
        assert registry_state.registry()["rope"] is RoPE
    assert "shadowed by posexp's built-in 'rope'" in caplog.text and "fake-rope" in caplog.text
    # a module of the user's that registers a built-in name: the built-in stays, loading it by that name says why
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "my_rope.py").write_text(PLUGIN_CODE.replace("class Damped", "@register('rope')\nclass Damped")
                                                   .replace("import PositionalEncoder", "import PositionalEncoder, register"))
    monkeypatch.chdir(tmp_path / "mine")
    with pytest.raises(ConfigError, match="built-in encoder, which wins"):
        registry_state.load_plugin("rope", "my_rope")
    assert registry_state.registry()["rope"] is RoPE


def test_two_user_modules_claiming_one_name_is_one_clear_error(tmp_path, registry_state, monkeypatch):
    from posexp.errors import ConfigError

    code = PLUGIN_CODE.replace("class Damped", "@register('twin')\nclass Damped").replace(
        "import PositionalEncoder", "import PositionalEncoder, register")
    (tmp_path / "first_pe.py").write_text(code)
    (tmp_path / "second_pe.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    registry_state.load_plugin("twin", "first_pe")
    with pytest.raises(ConfigError, match="two plugins claim the encoder name 'twin': first_pe .* and second_pe"):
        registry_state.load_plugin("twin", "second_pe")


def test_posexp_check_takes_the_users_config_folder(project):
    """The worked example is checked against the contract before any training, from its own folder."""
    result = invoke("check", "--config-dir", "conf", "logrope", "--format", "json", cwd=project)
    assert result.exit_code == 0, result.output
    checks = {c["name"]: c["status"] for c in json.loads(result.stdout)["checks"]}
    assert checks["causality"] == "pass" and checks["absolute positions"] == "pass"


def test_posexp_check_builds_the_encoder_with_its_yamls_values_as_train_does(project):
    """A value the yaml sets is the one checked (before, the ``__init__`` default was, and the yaml's failed only
    at train); an option on the command line is over it."""
    yaml = project / "conf" / "encoder" / "logrope.yaml"
    yaml.write_text(yaml.read_text().replace("scale: 64.0", "scale: -1.0"))
    refused = invoke("check", "--config-dir", "conf", "logrope", "--format", "json", cwd=project)
    assert refused.exit_code == 2 and "encoder.scale: must be > 0 tokens (got -1.0)" in refused.output
    given = invoke("check", "--config-dir", "conf", "logrope", "scale=32", "--format", "json", cwd=project)
    assert given.exit_code == 0, given.output
    yaml.write_text(yaml.read_text().replace("scale: -1.0", "scale: many"))
    typed = invoke("check", "--config-dir", "conf", "logrope", "--format", "json", cwd=project)
    assert typed.exit_code == 2 and "Traceback" not in typed.output
    assert "logrope.yaml: encoder.scale: Value 'many' of type 'str' could not be converted to Float" in typed.output


ROTARY_PLUGIN = '''
from posexp.encoders.rope import RoPE


class HalfRope(RoPE):
    """RoPE from outside posexp: acts inside attention, so ``encoder=mixed`` can use it as a layer."""
'''


@pytest.mark.slow  # a mixed run trained and re-evaluated; a plugin encoder's record is tested by default
def test_a_plugin_layer_of_a_mix_is_recorded_and_checked_like_a_plugin_encoder(tmp_path, registry_state, monkeypatch):
    site = tmp_path / "site"
    _installed(registry_state, monkeypatch, (site, "half-rope", "halfrope = half_rope:HalfRope", "half_rope",
                                             ROTARY_PLUGIN))
    out = tmp_path / "run"
    trained = invoke("train", "encoder=mixed", "encoder.layers=[rope,halfrope]", *TINY, f"hydra.run.dir={out}",
                     cwd=tmp_path)
    assert trained.exit_code == 0, trained.output[-2000:]
    run = json.loads((out / "results.json").read_text())["run"]
    assert "encoder_source" not in run  # the encoder is the built-in mix; its plugin layer is what is recorded
    record = run["layer_sources"]["halfrope"]
    assert (record["distribution"], record["class"]) == ("half-rope", "HalfRope")
    assert record["sha256"] == hashlib.sha256((site / "half_rope.py").read_bytes()).hexdigest()
    assert set(run["layer_sources"]) == {"halfrope"}  # rope is built-in

    (site / "half_rope.py").write_text(ROTARY_PLUGIN + "\n# edited after training\n")
    changed = invoke("eval", str(out), "eval.tokens=256", cwd=tmp_path)
    assert changed.exit_code != 0
    assert "the source of encoder 'halfrope' changed" in changed.stderr and "Traceback" not in changed.output
    allowed = invoke("eval", str(out), "eval.tokens=256", "--allow-changed-encoder", cwd=tmp_path)
    assert allowed.exit_code == 0, allowed.output[-2000:]


def test_a_plugin_layer_changes_the_cache_key_and_builtin_mixes_keep_theirs(tmp_path, registry_state, monkeypatch,
                                                                              compose):
    from posexp.commands.edge import typed
    from posexp.training.cache import cache_key

    site = tmp_path / "site"
    _dist(site, "half-rope", "halfrope = half_rope:HalfRope", "half_rope", ROTARY_PLUGIN)
    monkeypatch.syspath_prepend(str(site))
    registry_state._loaded["entry_points"] = False
    builtin = typed(compose("encoder=mixed", "encoder.layers=[rope,none]"))
    mixed = typed(compose("encoder=mixed", "encoder.layers=[rope,halfrope]"))
    key, builtin_key = cache_key(mixed, "corpus"), cache_key(builtin, "corpus")
    (site / "half_rope.py").write_text(ROTARY_PLUGIN + "\n# edited\n")
    assert cache_key(mixed, "corpus") != key  # an edited layer is another training
    assert cache_key(builtin, "corpus") == builtin_key


# -- one broken plugin never takes the others down ------------------------------------------------------------------

NO_DEFAULT = '''
from posexp.encoders import PositionalEncoder, register


@register("nohints")
class NoHints(PositionalEncoder):
    def __init__(self, d_model, n_heads, alpha):
        super().__init__(d_model, n_heads)
'''

PLAIN = PLUGIN_CODE.replace("class Damped", "@register('plain')\nclass Damped").replace(
    "import PositionalEncoder", "import PositionalEncoder, register")


def _broken_neighbours(project: Path) -> None:
    """Three broken plugins beside the example's good one: an option without a default, a yaml without its
    schema line, a yaml naming a module whose file is missing."""
    enc = project / "my_encoders"
    (enc / "nohints.py").write_text(NO_DEFAULT)
    (enc / "plain.py").write_text(PLAIN)
    conf = project / "conf" / "encoder"
    (conf / "nohints.yaml").write_text("defaults:\n  - /schema/encoder/nohints@_here_\n  - _self_\n"
                                       "module: my_encoders.nohints\n")
    (conf / "plain.yaml").write_text("module: my_encoders.plain\nwidth: 4\n")  # no defaults: no schema
    (conf / "gone.yaml").write_text("defaults:\n  - /schema/encoder/gone@_here_\n  - _self_\n"
                                    "module: my_encoders.gone\n")


def _one_line(result, *expected: str) -> None:
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output[-2000:]
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert all(text in result.stderr for text in expected), result.stderr


@pytest.mark.slow  # an end-to-end run of several seconds; the default suite stays near 10 minutes
def test_broken_plugins_are_listed_with_why_and_the_good_one_still_lists_checks_and_trains(project):
    _broken_neighbours(project)
    listed = invoke("list", "--config-dir", "conf", cwd=project)
    assert listed.exit_code == 0, listed.output[-2000:]
    rows = {line.strip("│ ").split(" ")[0]: line for line in listed.stdout.splitlines() if "│" in line}
    assert "base, scale" in rows["logrope"] and all("broken" in rows[n] for n in ("nohints", "plain", "gone"))
    why = {line.split(":")[0].split()[-1]: line for line in listed.stdout.splitlines() if line.startswith("broken ")}
    assert "needs a default" in why["nohints"] and "/schema/encoder/plain@_here_" in why["plain"]
    assert "has no gone.py" in why["gone"] and len(why) == 3

    good = invoke("check", "--config-dir", "conf", "logrope", "train_len=32", "--format", "json", cwd=project)
    assert good.exit_code == 0, good.output[-2000:]
    for name, reason in (("nohints", "needs a default"), ("plain", "/schema/encoder/plain@_here_")):
        bad = invoke("check", "--config-dir", "conf", name, "--format", "json", cwd=project)
        assert bad.exit_code == 1 and "Traceback" not in bad.output, bad.output[-2000:]
        (build,) = json.loads(bad.stdout)["checks"]
        assert build["name"] == "build" and reason in build["detail"]

    trained = invoke("train", "--config-dir", "conf", "encoder=logrope", *TINY, "hydra.run.dir=run", cwd=project)
    assert trained.exit_code == 0, trained.output[-3000:]
    _one_line(invoke("train", "--config-dir", "conf", "encoder=plain", *TINY, cwd=project),
              "encoder=plain", "/schema/encoder/plain@_here_")
    _one_line(invoke("train", "--config-dir", "conf", "-m", "encoder=logrope,nohints", *TINY, cwd=project),
              "encoder=nohints", "needs a default")
    _one_line(invoke("train", "--config-dir", "conf", "-m", "encoder=nohints,nope", *TINY, cwd=project),
              "encoder=nohints", "needs a default")  # the broken plugin is named first, as a lone value is
    assert not (project / "outputs").exists() and not (project / "multirun").exists()


RAISES = '''
from posexp.encoders import PositionalEncoder, register


@register("odd")
class Odd(PositionalEncoder):
    def __init__(self, d_model: int, n_heads: int, width: int = 3):
        super().__init__(d_model, n_heads)
        if width % 2:
            raise ValueError("width must be even")
'''


def test_a_plugin_whose_init_raises_stops_train_in_one_line_as_check_says_it(project):
    """posexp check said what a plugin's __init__ raised in one line; posexp train printed Python's traceback."""
    (project / "my_encoders" / "odd.py").write_text(RAISES)
    (project / "conf" / "encoder" / "odd.yaml").write_text("defaults:\n  - /schema/encoder/odd@_here_\n"
                                                            "  - _self_\nmodule: my_encoders.odd\nwidth: 3\n")
    _one_line(invoke("train", "--config-dir", "conf", "encoder=odd", *TINY, "hydra.run.dir=run", cwd=project),
              "encoder=odd", "Odd(d_model=", "width=3) raised ValueError: width must be even")
    assert not (project / "run").exists()


def test_the_plugin_module_is_found_beside_the_config_folder_from_any_working_folder(project, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = invoke("check", "--config-dir", str(project / "conf"), "logrope", "train_len=32", "--format", "json",
                    cwd=elsewhere)
    assert result.exit_code == 0, result.output[-2000:]
    assert {c["name"]: c["status"] for c in json.loads(result.stdout)["checks"]}["causality"] == "pass"


def test_a_registry_module_may_register_classes_defined_in_another_module(tmp_path, registry_state, monkeypatch):
    """``labenc/reg.py`` registers two classes of ``labenc/classes.py``: the second name was "registers none"."""
    package = tmp_path / "labenc"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "classes.py").write_text(PLUGIN_CODE + "\n\nclass LogMLP(Damped):\n    pass\n")
    (package / "reg.py").write_text("from posexp.encoders import register\nfrom labenc import classes\n"
                                    "from labenc.classes import Damped\n\nregister('damped')(Damped)\n"
                                    "register('logmlp')(classes.LogMLP)\n")
    monkeypatch.chdir(tmp_path)
    assert registry_state.load_plugin("damped", "labenc.reg").__name__ == "Damped"
    assert registry_state.load_plugin("logmlp", "labenc.reg").__name__ == "LogMLP"


BROKEN_ENTRY = "raise ImportError('needs libfoo 2')\n"


def test_a_broken_installed_plugin_is_listed_and_skipped(tmp_path, registry_state, monkeypatch):
    from posexp.errors import ConfigError

    _installed(registry_state, monkeypatch, (tmp_path / "good", "damped-pe", "damped = damped_pe:Damped", "damped_pe",
                                             PLUGIN_CODE),
               (tmp_path / "bad", "bad-pe", "badpe = bad_pe:Bad", "bad_pe", BROKEN_ENTRY))
    assert "damped" in registry_state.registry() and "rope" in registry_state.registry()
    assert "needs libfoo 2" in registry_state.broken()["badpe"]
    with pytest.raises(ConfigError, match="'badpe' cannot be used: .*bad-pe.*needs libfoo 2"):
        registry_state.get("badpe")


def test_a_plugin_package_named_like_a_standard_module_is_told_so(tmp_path, registry_state, monkeypatch):
    """``encodings/`` (a natural name for one's encoders) is shadowed by the standard library's: "no module here"."""
    from posexp.errors import ConfigError

    (tmp_path / "encodings").mkdir()
    (tmp_path / "encodings" / "__init__.py").write_text("")
    (tmp_path / "encodings" / "myenc.py").write_text(PLUGIN_CODE)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"your encodings/ .* shadowed by .*encodings.* rename your package"):
        registry_state.load_plugin("myenc", "encodings.myenc")
    (tmp_path / "json.py").write_text(PLUGIN_CODE)  # imported without error: the standard json
    with pytest.raises(ConfigError, match=r"your json.py .* shadowed by .*json.* rename your package"):
        registry_state.load_plugin("myjson", "json")


def test_a_run_whose_plugin_helper_changed_is_refused_like_a_changed_encoder_file(project, registry_state,
                                                                                  monkeypatch, tmp_path):
    """The encoder's own file unchanged, a module of its package it may import edited since training."""
    from posexp.commands.plugin_source import check_plugin_sources
    from posexp.errors import PosexpError

    monkeypatch.chdir(project)
    (project / "my_encoders" / "helpers.py").write_text("SCALE = 1.0\n")
    registry_state.load_plugin("logrope", "my_encoders.logrope")
    recorded = registry_state.source_record("logrope")
    assert recorded["package_sha256"]
    results = {"run": {"encoder_source": recorded}}
    encoder = {"name": "logrope", "module": "my_encoders.logrope"}
    check_plugin_sources(tmp_path, {"encoder": encoder}, results)  # as trained: nothing to say
    (project / "my_encoders" / "helpers.py").write_text("SCALE = 2.0\n")
    with pytest.raises(PosexpError, match=r"a file of the package my_encoders of encoder 'logrope' changed since"):
        check_plugin_sources(tmp_path, {"encoder": encoder}, results)
    said: list[str] = []
    check_plugin_sources(tmp_path, {"encoder": encoder}, results, allow_changed=True, warn=said.append)
    assert said and "going on with the code as it is now" in said[0]
