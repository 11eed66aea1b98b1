"""A pretrained model's evaluation (``posexp eval hf:MODEL``) stopped by Ctrl-C or killed while it measures, as only
a process of its own can be: what it says (or, killed, what the folder then says) is the command that finishes it,
and that command gives the numbers of an evaluation never stopped."""

from __future__ import annotations

import re
import shlex
import signal

import pytest

pytest.importorskip("transformers")

from helpers import invoke, start_cli  # noqa: E402
from helpers.hf_tiny import text_data  # noqa: E402
from helpers.runs import result_rows  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGKILL])
def test_a_stopped_or_killed_evaluation_resumes_as_it_says(stop, llama_dir, corpus_dir, pretrained_run,
                                                          tmp_path):
    # small query chunks make the evaluation last: the signal comes while it measures, once the model is loaded
    slow = (f"hf:{llama_dir}", *text_data(corpus_dir), "hf.query_chunk=16")
    proc = start_cli("eval", *slow, "hydra.run.dir=run", cwd=tmp_path)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("posexp pretrained"):
            break
    proc.send_signal(stop)
    _, err = proc.communicate(timeout=120)
    assert not (tmp_path / "run" / "results.json").exists(), "finished before it was stopped"
    if stop == signal.SIGINT:
        told = re.search(r"(posexp resume \S+)", err)
        assert told is not None and "evaluates the model again" in err, err
        command = shlex.split(told.group(1))
    else:  # killed: nothing said; the folder is then refused to a new evaluation, naming the command
        again = invoke("eval", *slow, "hydra.run.dir=run", cwd=tmp_path)
        told = re.search(r"(posexp resume \S+?);", " ".join(again.output.split()))
        assert again.exit_code != 0 and told is not None, again.output
        command = shlex.split(told.group(1))
    resumed = invoke(*command[1:], cwd=tmp_path)
    assert resumed.exit_code == 0, resumed.output
    assert [r["ppl"] for r in result_rows(tmp_path / "run")] == pytest.approx([r["ppl"] for r in result_rows(pretrained_run)],
                                                                        rel=1e-4)
    finished = invoke("resume", str(tmp_path / "run"))  # nothing left to resume: measure it again instead
    assert finished.exit_code != 0 and f"posexp eval hf:{llama_dir}" in " ".join(finished.output.split())
