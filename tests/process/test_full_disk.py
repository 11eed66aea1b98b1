"""A disk that really fills up during a run: on a size-limited tmpfs, mounted in a user namespace (``unshare``), which
only a process of its own can have. The simulated full disk of tests/integration/runs/test_disk_and_folders.py keeps
the case in the default suite."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers import TINY_RUN


def _error_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    return lines[0]


@pytest.mark.slow  # two runs in fresh interpreters; the simulated full disk above keeps this in the default suite
def test_a_real_full_disk_leaves_a_run_that_resumes(tmp_path):
    """On a size-limited tmpfs (mounted in a user namespace, no privileges needed where the kernel allows
    them): training fills it, stops in one line, and resumes once there is space."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    disk = tmp_path / "disk"
    disk.mkdir()
    posexp = f"{sys.executable} -m posexp"
    # 700 KiB: room for the .hydra files, the log and the first checkpoint pair (about 430 KiB), not a second
    script = (f"mount -t tmpfs -o size=700k none {disk} || exit 99; cd {disk}; "
              f"{posexp} train {' '.join(TINY_RUN)} train.steps=12 train.checkpoint_every=4 hydra.run.dir=run "
              "2>err.txt; echo $? > code.txt; cp err.txt code.txt run/checkpoint/resume.json "
              f"{tmp_path}/ 2>/dev/null; rm err.txt code.txt; mount -o remount,size=16m {disk}; "
              f"{posexp} resume run > /dev/null 2>{tmp_path}/resume_err.txt; echo $? > {tmp_path}/resume_code.txt; "
              f"cp run/results.json {tmp_path}/")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200"})
    if done.returncode == 99 or not (tmp_path / "code.txt").exists():
        pytest.skip(f"no tmpfs can be mounted here: {done.stderr.strip()[:200]}")
    err = (tmp_path / "err.txt").read_text()
    assert (tmp_path / "code.txt").read_text().strip() == "2", err
    line = _error_line(err)
    assert "could not be written (No space left on device)" in line and f"posexp resume {disk / 'run'}" in line
    assert "Logging error" not in err and "Traceback" not in err, err  # train.log's failed writes stay quiet
    assert (tmp_path / "resume_code.txt").read_text().strip() == "0", (tmp_path / "resume_err.txt").read_text()
    assert json.loads((tmp_path / "results.json").read_text())["run"]["status"] == "completed"
