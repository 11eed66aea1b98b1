"""One hash rule: a new run records its hash with the format it was computed in (2); a folder that records
another format (an older posexp's, which recorded none, or a newer one's) is refused in one line before anything
is read or written, never taken for an edited run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from posexp.commands.edge import typed
from posexp.commands.eval import reeval_main
from posexp.commands.resume import resume_main
from posexp.commands.train import run_train
from posexp.config.identity import HASH_FORMAT, config_hash
from posexp.errors import PosexpError
from posexp.runs.layout import HYDRA_CONFIG

OVERRIDES = ("train.steps=4", "train.warmup_steps=1", "train.log_every=2", "train.checkpoint_every=2",
             "eval.multiples=[1]", "eval.tokens=256", "eval.loss_by_position=false")


def _without_formats(run_dir: Path) -> None:
    """The folder as a posexp before recorded hash formats left it: each hash recorded, no format beside it."""
    for name in ("results.json", "checkpoint/meta.json", "checkpoint/resume.json"):
        path = run_dir / name
        if path.is_file():
            data = json.loads(path.read_text())
            (data["run"] if name == "results.json" else data).pop("hash_format", None)
            path.write_text(json.dumps(data))


def test_a_new_run_records_the_current_format(tiny, tmp_path):
    cfg = tiny(*OVERRIDES)
    run = run_train(cfg, tmp_path / "run", [])["run"]
    assert run["hash_format"] == HASH_FORMAT == 2 and run["config_hash"] == config_hash(typed(cfg))
    assert json.loads((tmp_path / "run" / "checkpoint" / "meta.json").read_text())["hash_format"] == 2


def test_a_folder_from_before_hash_formats_is_refused_not_taken_for_an_edited_run(tiny, tmp_path):
    run_dir, cfg = tmp_path / "run", tiny(*OVERRIDES)
    run_train(cfg, run_dir, [])
    (run_dir / HYDRA_CONFIG).parent.mkdir()
    (run_dir / HYDRA_CONFIG).write_text(OmegaConf.to_yaml(cfg))  # as posexp train's Hydra writes it
    _without_formats(run_dir)
    before = (run_dir / "results.json").read_text()
    refused = r"written by an older posexp \(hash format 1; this one reads format 2"
    with pytest.raises(PosexpError, match=refused) as caught:
        reeval_main([str(run_dir), "eval.multiples=[1,2]"])
    assert "edited" not in str(caught.value) and "\n" not in str(caught.value)
    assert (run_dir / "results.json").read_text() == before
    (run_dir / "results.json").unlink()  # killed before its results: resume reads the checkpoint's records
    with pytest.raises(PosexpError, match=refused):
        resume_main(run_dir)
    assert not (run_dir / "results.json").exists()


def test_a_run_from_a_newer_hash_format_is_said_to_be_from_a_newer_posexp_not_edited(tiny, tmp_path):
    run_dir = tmp_path / "run"
    run_train(tiny(*OVERRIDES), run_dir, [])
    results = json.loads((run_dir / "results.json").read_text())
    results["run"]["hash_format"] = HASH_FORMAT + 1
    (run_dir / "results.json").write_text(json.dumps(results))
    before = (run_dir / "results.json").read_text()
    with pytest.raises(PosexpError, match=rf"written by a newer posexp \(hash format {HASH_FORMAT + 1}") as caught:
        reeval_main([str(run_dir), "eval.multiples=[1,2]"])
    assert "edited" not in str(caught.value)
    assert (run_dir / "results.json").read_text() == before


def test_a_run_started_by_another_revision_of_its_encoder_is_not_trained_on(tiny, tmp_path, monkeypatch):
    """posexp resume of a run whose built-in encoder's code was revised since it started (FoX's gates weight-decayed
    from revision 2 on) is refused in one line naming both revisions, not trained on with other optimizer groups
    (which stopped at loading the optimizer state, with advice to delete the checkpoint)."""
    from posexp.encoders.fox import ForgettingAttention

    run_dir, cfg = tmp_path / "run", tiny(*OVERRIDES, "encoder=fox")
    run_train(cfg, run_dir, [])
    (run_dir / HYDRA_CONFIG).parent.mkdir()
    (run_dir / HYDRA_CONFIG).write_text(OmegaConf.to_yaml(cfg))
    (run_dir / "results.json").unlink()  # killed before its results: resume reads the checkpoint's records
    monkeypatch.setattr(ForgettingAttention, "revision", ForgettingAttention.revision + 1)
    with pytest.raises(PosexpError, match=r"started with encoder fox revision 2, revision 3 here \(a fix changed how "
                                          r"it is built or trained: posexp.encoders.fox says what\).*train it again "
                                          "with posexp train") as caught:
        resume_main(run_dir)
    assert "\n" not in str(caught.value)
    monkeypatch.setattr(ForgettingAttention, "revision", 2)
    assert resume_main(run_dir)["run"]["status"] == "completed"


def test_a_mix_records_its_layers_revisions_in_its_folder_and_is_resumed_only_by_that_code(tmp_path, monkeypatch):
    """encoder=mixed with a fox layer trained with fox's revision 2 but recorded none (only the mix's own options):
    its hash and cache key were a revision-1 mix's, and posexp resume trained on with other code. The mix records
    each revised layer's revision (encoder.options.fox.revision) in the config Hydra saved before the job started,
    which still hashes as results.json says, and another revision's code refuses to train it on."""
    from helpers import TINY_RUN, invoke
    from posexp.encoders.fox import ForgettingAttention

    run_dir = tmp_path / "run"
    result = invoke("train", *TINY_RUN, *OVERRIDES, "encoder=mixed", "encoder.layers=[rope,fox]",
                    f"hydra.run.dir={run_dir}")
    assert result.exit_code == 0, result.output
    assert OmegaConf.load(run_dir / HYDRA_CONFIG).encoder.options == {"fox": {"revision": 2}}
    assert json.loads((run_dir / "results.json").read_text())["run"]["config"]["encoder"]["options"] == {
        "fox": {"revision": 2}}
    reeval_main([str(run_dir), "eval.multiples=[1,2]"])  # refused were the folder's config to hash otherwise
    (run_dir / "results.json").unlink()
    monkeypatch.setattr(ForgettingAttention, "revision", 3)
    with pytest.raises(PosexpError, match=r"started with encoder fox revision 2, revision 3 here \(a fix changed how "
                                          r"it is built or trained: posexp.encoders.fox says what\)"):
        resume_main(run_dir)
