"""The run folder's one owner: every command finds the same runs (that reporting stays torch-free is checked in a
fresh interpreter, tests/process/test_fresh_interpreter.py)."""

from __future__ import annotations

from pathlib import Path

from posexp.runs.layout import (CHECKPOINT, MULTIRUN_YAML, RESULTS_JSON, find_runs, is_run_dir, merge_loss_by_position, read_loss_by_position, runs_under, write_loss_by_position_csv, write_results_json)


def _fake_run(folder: Path, status: str = "completed", weights: bool = True) -> Path:
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text("seed: 0\n")
    if weights:
        (folder / CHECKPOINT).parent.mkdir()
        (folder / CHECKPOINT).write_bytes(b"not read by the finders")
    write_results_json(folder, {"run": {"status": status}, "rows": []})
    return folder


def test_report_eval_analyze_and_sweeps_see_the_same_runs(tmp_path):
    from posexp.analysis import attention as app
    from posexp.commands.eval import find_eval_runs
    from posexp.commands.sweeps import failed_runs

    sweep = tmp_path / "sweep"
    runs = [_fake_run(sweep / str(i), status="failed" if i == 10 else "completed") for i in range(12)]
    (sweep / MULTIRUN_YAML).write_text("hydra: {}\n")
    (sweep / ".submitit").mkdir()  # hidden folders never hold runs
    (sweep / ".submitit" / RESULTS_JSON).write_text("{}")

    assert runs_under(sweep) == runs  # natural order: 2 before 10
    assert find_runs([sweep]) == runs
    assert find_eval_runs([sweep]) == runs
    assert app.is_run_dir is is_run_dir  # analyze asks the same question
    assert [d for d in runs_under(sweep) if is_run_dir(d, needs_weights=True)] == runs
    assert failed_runs(sweep, since=0.0) == [str(runs[10])]


def test_a_run_without_weights_is_reported_but_not_evaluated(tmp_path):
    from posexp.commands.eval import find_eval_runs

    sweep = tmp_path / "sweep"
    kept, dropped = _fake_run(sweep / "0"), _fake_run(sweep / "1", weights=False)
    warnings: list[str] = []
    assert find_runs([sweep]) == [kept, dropped]
    assert find_eval_runs([sweep], warnings.append) == [kept]
    assert len(warnings) == 1 and str(dropped) in warnings[0]
    assert is_run_dir(dropped) and not is_run_dir(dropped, needs_weights=True)


def test_loss_by_position_merge_replaces_remeasured_keys(tmp_path):
    def row(length: int, position: int, loss: float, scaling=None) -> dict:
        return {"protocol": "nonoverlap", "stride": None, "last_k": None, "scaling": scaling, "scaling_factor": None,
                "length": length, "position": position, "loss": loss, "count": 2}

    write_loss_by_position_csv(tmp_path, [row(64, 0, 1.0), row(64, 1, 2.0), row(128, 0, 3.0)])
    merged = merge_loss_by_position(tmp_path, [row(64, 0, 5.0)])
    assert [(r["length"], r["position"], r["loss"]) for r in merged] == [(128, 0, 3.0), (64, 0, 5.0)]
    write_loss_by_position_csv(tmp_path, merged)
    assert read_loss_by_position(tmp_path) == merged


def test_weights_are_written_with_the_permissions_of_every_other_run_file(tmp_path):
    """safetensors writes a fresh 0o600 file; a lab mate must be able to load the weights as the results."""
    import os
    import stat

    import torch

    from posexp.runs.atomic import atomic_write_json
    from posexp.training.checkpoint import save_weights

    old = os.umask(0o022)
    try:
        save_weights(torch.nn.Linear(2, 2), tmp_path / "model.safetensors", "0" * 16, step=1)
        atomic_write_json(tmp_path / "results.json", {})
    finally:
        os.umask(old)
    mode = {name: stat.S_IMODE((tmp_path / name).stat().st_mode) for name in ("model.safetensors", "results.json")}
    assert mode == {"model.safetensors": 0o644, "results.json": 0o644}


def test_runs_behind_symbolic_links_are_found_once_and_a_loop_ends(tmp_path):
    """A folder of links to the runs one wants to compare is reported like the runs themselves."""
    for name in ("a", "b"):
        write_results_json(tmp_path / "runs" / name, {"run": {}, "rows": []})
    pick = tmp_path / "pick"
    pick.mkdir()
    (pick / "first").symlink_to(tmp_path / "runs" / "a", target_is_directory=True)
    (pick / "again").symlink_to(tmp_path / "runs" / "a", target_is_directory=True)
    (pick / "loop").symlink_to(pick, target_is_directory=True)
    found = find_runs([pick])
    assert [p.resolve() for p in found] == [(tmp_path / "runs" / "a").resolve()]
