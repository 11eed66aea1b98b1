"""A pretrained model as a careless or unlucky user meets it: a damaged model folder, a typo on a machine without
network, a folder with a comma, and a pretrained model's run handed to the
commands that read posexp's own runs. Each is one line that says what to type, and that line works."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import socket
import time
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from helpers import invoke  # noqa: E402
from helpers.hf_tiny import text_data  # noqa: E402
from helpers.runs import result_rows  # noqa: E402

from posexp.hf import loading  # noqa: E402

def _one_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in output, output
    return " ".join(lines[0].split())


# -- a damaged model folder (items 2, 3, 4) ------------------------------------------------------------------------

def _no_weights(folder: Path) -> None:
    (folder / "model.safetensors").unlink()


def _truncated(folder: Path) -> None:
    with open(folder / "model.safetensors", "r+b") as fh:
        fh.truncate(5000)


def _no_tokenizer(folder: Path) -> None:
    for f in [*folder.glob("tokenizer*"), *folder.glob("special_tokens_map.json")]:
        f.unlink()


@pytest.mark.parametrize("damage,says", [
    (_no_weights, "has config.json but no weight file (looked for model.safetensors"),
    (_truncated, "model.safetensors is incomplete or damaged (5,000 bytes of the"),
    (_no_tokenizer, "holds no tokenizer files (looked for tokenizer.json, tokenizer.model"),
])
def test_a_damaged_model_folder_is_one_line_saying_what_it_lacks_and_leaves_no_run_folder(damage, says, llama_dir,
                                                                                         corpus_dir, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(llama_dir, folder)
    damage(folder)
    out = tmp_path / "run"
    result = invoke("eval", f"hf:{folder}", *text_data(corpus_dir), f"hydra.run.dir={out}")
    assert result.exit_code != 0
    line = _one_line(result.output)
    assert says in line and "Hugging Face cache" not in line and "sentencepiece or tiktoken" not in line
    assert not out.exists()


# -- a typo on a machine without network (item 5) ------------------------------------------------------------------

def test_a_typo_of_a_local_folder_offline_is_said_at_once_naming_the_folder(llama_dir, corpus_dir, tmp_path,
                                                                            monkeypatch):
    shutil.copytree(llama_dir, tmp_path / "tiny-llama")
    probes = []

    def no_network(*args, **kwargs):
        probes.append(args)
        raise OSError(-2, "Name or service not known")

    loading.hub_reachable.cache_clear()
    monkeypatch.setattr(socket, "create_connection", no_network)
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(key, raising=False)
    try:
        start = time.monotonic()
        result = invoke("eval", "hf:tiny-lama", *text_data(corpus_dir), "hydra.run.dir=run", cwd=tmp_path)
        took = time.monotonic() - start
    finally:
        loading.hub_reachable.cache_clear()
    assert result.exit_code != 0 and took < 10
    line = _one_line(result.output)
    assert "did you mean hf:tiny-llama?" in line and "cannot reach huggingface.co" in line and "Retry" not in line
    assert len(probes) == 1 and not (tmp_path / "run").exists()


# -- a folder with a comma (item 7) --------------------------------------------------------------------------------

def test_a_folder_with_a_comma_runs_as_given_and_as_the_message_quotes_it(llama_dir, corpus_dir, tmp_path):
    shutil.copytree(llama_dir, tmp_path / "llama,64")
    refused = invoke("eval", "hf:nope,64", *text_data(corpus_dir), cwd=tmp_path)
    line = _one_line(refused.output)
    suggested = re.search(r"quote it: (posexp eval .*)$", line)
    assert refused.exit_code != 0 and suggested is not None, line
    typed = shlex.split(suggested.group(1).replace("nope,64", "llama,64"))  # as a shell hands it over
    for args in (["hf:llama,64"], typed[2:], ["hf.model='llama,64'"]):
        result = invoke("eval", *args, *text_data(corpus_dir), "eval.multiples=[1]", "hydra.run.dir=run", cwd=tmp_path)
        assert result.exit_code == 0, (args, result.output)
        run = json.loads((tmp_path / "run" / "results.json").read_text())["run"]
        assert run["pretrained"]["name"] == "llama,64" and len(result_rows(tmp_path / "run")) == 1
        shutil.rmtree(tmp_path / "run")


# -- a sweep of pretrained evaluations handed to posexp eval (item 8) ----------------------------------------------

def test_posexp_eval_of_a_sweep_of_pretrained_runs_says_the_command_and_it_works(llama_dir, corpus_dir,
                                                                                 tmp_path):
    swept = invoke("eval", "-m", f"hf:{llama_dir}", *text_data(corpus_dir), "eval.multiples=[1]",
                   "eval.scaling=none,linear",
                   f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert swept.exit_code == 0, swept.output
    again = invoke("eval", str(tmp_path / "sweep"), "eval.lengths=[64]")
    assert again.exit_code != 0
    line = _one_line(again.output)
    assert "pretrained models' evaluations" in line and "no checkpoint" not in line
    command = shlex.split(line.split("measure them again as new runs: ")[1])
    assert command[:3] == ["posexp", "eval", "-m"] and "eval.scaling=none,linear" in command
    result = invoke(*command[1:], f"hydra.sweep.dir={tmp_path / 'again'}")
    assert result.exit_code == 0, result.output
    jobs = sorted((tmp_path / "again").glob("[0-9]/results.json"))
    assert len(jobs) == 2 and all([r["length"] for r in result_rows(j.parent)] == [64] for j in jobs)


# -- a pretrained model's run handed to export, finetune, analyze and load_run (item 9) ----------------------------

@pytest.mark.parametrize("command,then", [
    (("export", "{run}", "{tmp}/out"), "AutoModelForCausalLM.from_pretrained("),
    (("finetune", "{run}"), "posexp eval hf:{model} data=text eval.tokens=1024 data.path={corpus} eval.scaling=yarn"),
    (("analyze", "{run}"), "posexp analyze encoder=rope base=10000 train_len=64"),
])
def test_commands_of_posexp_runs_say_a_pretrained_run_is_one_and_what_to_type(command, then, pretrained_run,
                                                                              llama_dir, corpus_dir,
                                                                              tmp_path):
    args = [a.format(run=pretrained_run, tmp=tmp_path) for a in command]
    result = invoke(*args)
    assert result.exit_code != 0
    line = _one_line(result.output)
    assert "the run of pretrained model" in line and "weights stay in the model's own folder" in line
    assert then.format(model=llama_dir, corpus=corpus_dir) in line and "schema" not in line
    assert not (tmp_path / "out").exists()


def test_load_run_model_of_a_pretrained_run_is_the_transformers_model_it_measured(pretrained_run, llama_dir,
                                                                                  tmp_path):
    import torch

    import posexp
    from posexp.errors import PosexpError

    run = posexp.load_run(pretrained_run)
    assert run.config.hf.model == str(llama_dir) and len(run.results) == 3
    model = run.model
    reference = transformers.AutoModelForCausalLM.from_pretrained(llama_dir).eval()
    tokens = torch.randint(0, reference.config.vocab_size, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens).logits, reference(tokens).logits)
    # the run's record names another folder's weights: refused, not silently another model
    moved = tmp_path / "run"
    shutil.copytree(pretrained_run, moved)
    results = json.loads((moved / "results.json").read_text())
    results["run"]["pretrained"]["weights_sha256"] = "0" * 64
    (moved / "results.json").write_text(json.dumps(results))
    with pytest.raises(PosexpError, match="changed since the run measured them"):
        posexp.load_run(moved).model


def test_posexp_resume_of_a_stopped_sweep_of_pretrained_runs_finishes_it(llama_dir, corpus_dir, tmp_path):
    from posexp.commands.sweep_resume import plan_sweep, resume_sweep

    sweep = tmp_path / "sweep"
    swept = invoke("eval", "-m", f"hf:{llama_dir}", *text_data(corpus_dir), "eval.multiples=[1]",
                   "eval.scaling=none,linear",
                   f"hydra.sweep.dir={sweep}")
    assert swept.exit_code == 0, swept.output
    measured = [result_rows(sweep / str(n))[0]["ppl"] for n in (0, 1)]
    for name in ("results.json", "results.csv", "results.md"):  # job 0 killed while measuring
        (sweep / "0" / name).unlink()
    shutil.rmtree(sweep / "1")  # job 1 never started
    plan = plan_sweep(sweep)
    assert (plan.finished, plan.resume, list(plan.start), plan.command) == ([], [0], [1], "eval")
    ran: list[list[str]] = []

    def runner(args: list[str]) -> int:
        ran.append(args)
        return invoke(*args).exit_code

    assert resume_sweep(sweep, lambda _: None, runner=runner) == []
    assert [a[0] for a in ran] == ["resume", "eval"]
    assert [result_rows(sweep / str(n))[0]["ppl"] for n in (0, 1)] == pytest.approx(measured, rel=1e-4)
