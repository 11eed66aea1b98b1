"""``posexp eval hf:MODEL`` as a user runs it: a small random transformers model saved in a folder with a byte-level
BPE tokenizer (no download), evaluated on posexp's data under posexp's protocols into a run folder, swept with
``-m``, reported beside posexp's own runs per byte, and refused in one line where it cannot run."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from helpers import REPO, invoke  # noqa: E402
from helpers.hf_tiny import CODE  # noqa: E402


def _run(tmp_path: Path, *args: str, name: str = "run"):
    out = tmp_path / name
    result = invoke("eval", *args, f"hydra.run.dir={out}")
    return result, out


def _rows(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "results.json").read_text())["rows"]


def test_a_pretrained_model_is_evaluated_into_a_run_folder_with_its_provenance(llama_dir, corpus_dir, tmp_path):
    result, out = _run(tmp_path, f"hf:{llama_dir}", "data=text", f"data.path={corpus_dir}", "eval.tokens=1024")
    assert result.exit_code == 0, result.output
    run = json.loads((out / "results.json").read_text())["run"]
    assert run["train_len"] == 64  # the config's context length: multiples 1, 2, 4 of it
    assert [r["length"] for r in _rows(out)] == [64, 128, 256]
    model = run["pretrained"]
    assert model["architecture"] == "LlamaForCausalLM" and len(model["weights_sha256"]) == 64
    vocab = len(transformers.AutoTokenizer.from_pretrained(llama_dir))
    assert run["tokenizer"] == "pretrained" and run["vocab_size"] == vocab and 0 < run["tokens_per_byte"] < 1
    assert all(r["applicable"] and math.isfinite(r["ppl"]) for r in _rows(out))
    for name in ("results.md", "results.csv", "ppl_vs_length.png", ".hydra/config.yaml"):
        assert (out / name).exists(), name
    again = invoke("eval", str(out), "eval.scaling=linear")  # no weights of its own: the command that measures it
    assert again.exit_code != 0 and f"posexp eval hf:{llama_dir} data=text" in " ".join(again.output.split())


def test_the_rows_are_the_models_own_cross_entropy_on_the_tokens_of_its_tokenizer(llama_dir, corpus_dir, tmp_path):
    """The perplexity posexp writes is exp of the mean cross-entropy a plain transformers forward gives on the
    windows posexp scores (nonoverlap: consecutive windows of L tokens)."""
    from posexp.config.schema import DataConfig
    from posexp.data.corpus import load_corpus
    from posexp.data.tokenizer import PRETRAINED, TokenizerSpec
    from posexp.commands.pretrained import tokenizer_fingerprint

    result, out = _run(tmp_path, f"hf:{llama_dir}", "data=text", f"data.path={corpus_dir}", "eval.tokens=512",
                       "eval.lengths=[64]")
    assert result.exit_code == 0, result.output
    tok = transformers.AutoTokenizer.from_pretrained(llama_dir)
    val = load_corpus(DataConfig(name="text", path=str(corpus_dir)), TokenizerSpec(
        PRETRAINED, pretrained=tok, fingerprint=tokenizer_fingerprint(tok, tok.eos_token_id), separator=tok.eos_token_id)).val
    model = transformers.AutoModelForCausalLM.from_pretrained(llama_dir).eval()
    windows = torch.from_numpy(val[:513].astype("int64"))
    losses = []
    with torch.no_grad():
        for s in range(0, 512, 64):
            logits = model(windows[s:s + 64][None]).logits[0]
            losses.append(torch.nn.functional.cross_entropy(logits, windows[s + 1:s + 65], reduction="sum"))
    expected = math.exp(float(sum(losses)) / 512)
    assert _rows(out)[0]["ppl"] == pytest.approx(expected, rel=1e-5)


def test_a_sweep_over_scalings_writes_one_run_per_scaling_and_the_report_compares_them(llama_dir, corpus_dir,
                                                                                        tmp_path):
    sweep = tmp_path / "sweep"
    result = invoke("eval", "-m", f"hf:{llama_dir}", "data=text", f"data.path={corpus_dir}", "eval.tokens=512",
                    "eval.lengths=[64,128]", "eval.scaling=none,linear", f"hydra.sweep.dir={sweep}")
    assert result.exit_code == 0, result.output
    scaled = {r["scaling"]: r for d in ("0", "1") for r in _rows(sweep / d) if r["length"] == 128}
    assert set(scaled) == {None, "linear"}
    assert scaled["linear"]["scaling_factor"] == 2.0 and scaled["linear"]["ppl"] != scaled[None]["ppl"]
    report = invoke("report", str(sweep), "--by", "eval.scaling", "--view", "scaling=linear")
    assert report.exit_code == 0, report.output


def test_rotary_scalings_of_a_model_without_rope_are_not_applicable(corpus_dir, tmp_path, llama_dir):
    folder = tmp_path / "tiny-gpt2"
    tok = transformers.AutoTokenizer.from_pretrained(llama_dir)
    tok.save_pretrained(folder)
    config = transformers.GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                     eos_token_id=tok.eos_token_id, bos_token_id=None)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    result, out = _run(tmp_path, f"hf:{folder}", "data=text", f"data.path={corpus_dir}", "eval.tokens=512",
                       "eval.lengths=[64,128]", "eval.scaling=yarn")
    assert result.exit_code == 0, result.output
    assert [r["applicable"] for r in _rows(out)] == [False, False]
    result, out = _run(tmp_path, f"hf:{folder}", "data=text", f"data.path={corpus_dir}", "eval.tokens=512",
                       "eval.lengths=[64,128]", name="plain")
    rows = _rows(out)
    assert rows[0]["applicable"] and not rows[1]["applicable"]  # GPT-2's table holds 64 positions
    assert "64" in rows[1]["reason"]


def test_per_byte_report_beside_a_posexp_run_of_the_same_text(llama_dir, corpus_dir, tmp_path):
    """Runs of different tokenizers on the same text are compared per UTF-8 byte: the pretrained run's per-token
    perplexity becomes exp(loss x tokens per byte) and the table says so."""
    result, hf = _run(tmp_path, f"hf:{llama_dir}", "data=text", f"data.path={corpus_dir}", "eval.tokens=1024",
                      name="hf")
    assert result.exit_code == 0, result.output
    own = tmp_path / "own"
    trained = invoke("train", "experiment=smoke", "data=text", f"data.path={corpus_dir}", "train_len=64",
                     "eval.multiples=[1,2,4]", "eval.tokens=1024", f"hydra.run.dir={own}")
    assert trained.exit_code == 0, trained.output
    from posexp.reporting import build_report

    report = build_report([hf, own])
    assert all(row.per_byte for row in report.rows)
    info = json.loads((hf / "results.json").read_text())["run"]
    expected = math.exp(_rows(hf)[0]["loss"] * info["tokens_per_byte"])
    assert report.rows[0].cells[64].mean == pytest.approx(expected)
    assert report.rows[1].cells[64].mean == pytest.approx(_rows(own)[0]["ppl"])  # bytes: unchanged
    assert not any("different corpus" in row.flags for row in report.rows)


@pytest.mark.parametrize("args,says", [
    (["hf:/nowhere/model"], "hf model '/nowhere/model'"),
    (["hf:{llama}", "eval.scaling=stretch"], "eval.scaling: unknown scaling 'stretch'"),
    (["hf:{llama}", "hf.device_map=everywhere"], "hf.device_map: must be auto"),
])
def test_what_cannot_run_is_one_line_and_leaves_no_folder(args, says, llama_dir, tmp_path):
    result, out = _run(tmp_path, *[a.format(llama=llama_dir) for a in args])
    assert result.exit_code != 0
    assert says in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_zero_shot_passkey_instances_hold_the_key_at_its_depth_in_exactly_the_length(llama_dir, corpus_dir):
    """Every instance is L + 1 tokens of the model's tokenizer: the paper's prompt, filler, the key sentence at the
    depth asked, the question, and the key's own tokens as the answer (however the tokenizer splits digits)."""
    import numpy as np

    from posexp.evaluation.accuracy import eval_instances
    from posexp.tasks.passkey_text import PROMPT, QUESTION, TextPasskey

    tok = transformers.AutoTokenizer.from_pretrained(llama_dir)
    filler = np.asarray(tok(CODE * 20, add_special_tokens=False)["input_ids"])
    task = TextPasskey(lambda t: tok(t, add_special_tokens=False)["input_ids"], filler, len(tok), digits=5)
    for depth in (0.0, 1.0):
        made = eval_instances(task, 400, 3, depth)
        assert made.tokens.shape == (3, 401)
        for row, answer in zip(made.tokens, made.answer):
            text = tok.decode(row)
            key = tok.decode(row[answer]).strip()
            assert len(key) == 5 and key.isdigit() and text.startswith(PROMPT)
            needle, question = text.index(f"The pass key is {key}."), text.index(QUESTION.strip())
            assert text.endswith(f"{QUESTION} {key}") and needle < question
            before, after = len(text[len(PROMPT):needle]), len(text[needle:question])
            assert (before < 5) if depth == 0.0 else (after < 80)  # at the start of the filler, or right before
    assert eval_instances(task, 400, 3, 0.5).tokens.tolist() == eval_instances(task, 400, 3, 0.5).tokens.tolist()


def test_zero_shot_passkey_of_a_pretrained_model_writes_accuracy_rows(llama_dir, corpus_dir, tmp_path):
    result, out = _run(tmp_path, f"hf:{llama_dir}", "data=text", f"data.path={corpus_dir}", "task.name=passkey",
                       "eval.lengths=[256]", "eval.examples=4", "eval.depths=[0.0,1.0]")
    assert result.exit_code == 0, result.output
    rows = _rows(out)
    assert [(r["metric"], r["length"], r["depth"], r["examples"]) for r in rows] == [
        ("accuracy", 256, 0.0, 4), ("accuracy", 256, 1.0, 4)]
    assert json.loads((out / "results.json").read_text())["run"]["task"]["zero_shot"] is True
    refused, _ = _run(tmp_path, f"hf:{llama_dir}", "task.name=copy", name="copy")
    assert refused.exit_code != 0 and "task.name: a pretrained model is measured on lm or passkey" in refused.output


def test_hf_model_on_the_command_line_is_hf_model_and_a_comma_list_sweeps_models():
    from posexp.commands.pretrained import pretrained_arguments

    assert pretrained_arguments(["-m", "hf:./a,./b", "eval.scaling=none,yarn"]) == [
        "-m", "hf.model=./a,./b", "eval.scaling=none,yarn"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_pretrained_model_evaluates_on_cuda_in_bf16_as_on_the_cpu(llama_dir, corpus_dir, tmp_path):
    common = [f"hf:{llama_dir}", "data=text", f"data.path={corpus_dir}", "eval.tokens=1024", "eval.lengths=[64,256]"]
    _, cpu = _run(tmp_path, *common, name="cpu")
    result, gpu = _run(tmp_path, *common, "device=cuda", "precision=bf16", "eval.scaling=yarn", name="gpu")
    assert result.exit_code == 0, result.output
    plain, _ = _run(tmp_path, *common, "device=cuda", "precision=bf16", name="gpu-plain")
    assert plain.exit_code == 0, plain.output
    for ours, theirs in zip(_rows(tmp_path / "gpu-plain"), _rows(cpu)):
        assert ours["ppl"] == pytest.approx(theirs["ppl"], rel=0.02)  # bf16 weights and activations
    assert all(r["applicable"] for r in _rows(gpu))


@pytest.mark.slow  # three trainings, exports and evaluations; the export's logits and hf:'s rows are checked fast
@pytest.mark.parametrize("encoder", ["rope", "learned", "alibi"])
def test_an_exported_run_evaluated_as_a_pretrained_model_gives_its_own_perplexities(encoder, tmp_path):
    """The round trip: posexp train, posexp export, posexp eval hf:DIR: the same tokens (the exported byte tokenizer
    and its document separator), the same lengths (the export records train_len), the same perplexities."""
    run, exported = tmp_path / "run", tmp_path / "hf"
    extra = ["model.norm_bias=false"] if encoder == "alibi" else []
    trained = invoke("train", "experiment=smoke", f"encoder={encoder}", *extra, f"hydra.run.dir={run}")
    assert trained.exit_code == 0, trained.output
    assert invoke("export", str(run), str(exported)).exit_code == 0
    result, out = _run(tmp_path, f"hf:{exported}", "eval.tokens=1024", name="again")
    assert result.exit_code == 0, result.output
    own, again = _rows(run), _rows(out)
    assert [r["length"] for r in again] == [r["length"] for r in own]
    for a, b in zip(own, again):
        assert a["applicable"] == b["applicable"] and a["targets"] == b["targets"]
        if a["applicable"]:
            assert b["ppl"] == pytest.approx(a["ppl"], rel=1e-4)
    assert json.loads((out / "results.json").read_text())["run"]["pretrained"]["posexp_export"]["run"] == str(run)


def test_an_unnamed_architecture_evaluates_under_every_protocol_scaling_window_and_passkey(llama_dir):
    """A model class nothing in posexp names (Mistral) goes through the same evaluation as posexp's own model: the
    three protocols, every scaling it offers (the position remappings included), a window with sinks, loss by
    position and the zero-shot passkey."""
    import dataclasses

    import numpy as np

    from posexp.config.schema import EvalConfig
    from posexp.encoders.scaling import SCALINGS
    from posexp.evaluation.accuracy import evaluate_task
    from posexp.evaluation.perplexity import EvalHooks, evaluate
    from posexp.hf.model import HFLanguageModel
    from posexp.tasks.passkey_text import TextPasskey

    tok = transformers.AutoTokenizer.from_pretrained(llama_dir)
    config = transformers.MistralConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                        max_position_embeddings=32, sliding_window=None, initializer_range=0.2)
    torch.manual_seed(0)
    lm = HFLanguageModel(transformers.AutoModelForCausalLM.from_config(config).eval(), "mistral", chunk=16)
    val = np.asarray(tok(CODE * 30, add_special_tokens=False)["input_ids"])
    base = EvalConfig(lengths=[32, 64], tokens=256, batch_tokens=256)
    settings = [dataclasses.replace(base, protocol="sliding", stride=16),
                dataclasses.replace(base, protocol="last_k", last_k=8),
                dataclasses.replace(base, window=8, sinks=2),
                *(dataclasses.replace(base, scaling=s) for s in SCALINGS if s not in ("none", "longrope", "ms_poe")),
                dataclasses.replace(base, scaling="ms_poe", ms_poe_skip_layers=0)]  # its default skips both layers
    for e in settings:
        positions: list = []
        rows = evaluate(lm, val, e, 32, torch.device("cpu"), hooks=EvalHooks(positions=positions))
        assert all(r["applicable"] and math.isfinite(r["ppl"]) for r in rows), (e, rows)
        assert [p["position_count"].sum() for p in positions] == [r["tokens"] for r in rows]
    task = TextPasskey(lambda t: tok(t, add_special_tokens=False)["input_ids"], val, len(tok), digits=3)
    rows = evaluate_task(lm, task, dataclasses.replace(base, lengths=[320], examples=2, depths=[0.5]), 32,
                         torch.device("cpu"))
    assert [(r["length"], r["depth"], r["examples"]) for r in rows] == [(320, 0.5, 2)]


def test_without_transformers_both_commands_say_which_install_brings_it(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a))
    for args in (["eval", "hf:some/model"], ["export", str(tmp_path), str(tmp_path / "out")]):
        result = invoke(*args)
        assert result.exit_code == 2, result.output
        assert "needs transformers, not installed here: pip install -e '.[hf]'" in result.output
        assert "Traceback" not in result.output


@pytest.mark.parametrize("bos", ("auto", "true"))
def test_the_reproduce_script_gives_a_cell_with_transformers_alone(llama_dir, corpus_dir, tmp_path, bos, monkeypatch,
                                                                  capsys):
    import runpy
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(llama_dir, folder)
    config = transformers.AutoConfig.from_pretrained(folder)
    config.bos_token_id = config.eos_token_id  # a BOS only the config names (GPT-2's is its end-of-text token)
    config.save_pretrained(folder)
    result, out = _run(tmp_path, f"hf:{folder}", "data=text", f"data.path={corpus_dir}", f"hf.bos={bos}",
                       "data.val_fraction=0.5",
                       "eval.lengths=[32]", "eval.tokens=256")
    assert result.exit_code == 0, result.output
    run = json.loads((out / "results.json").read_text())["run"]
    text = run["text"]
    assert text["documents"] and text["separator"] == config.eos_token_id, text
    assert text["bos"] == (config.bos_token_id if bos == "true" else None)  # this tokenizer adds no BOS itself
    script = REPO / "scripts" / "reproduce_cell.py"  # the README points to it; run as `python script RUN` runs it
    capsys.readouterr()
    monkeypatch.setattr("sys.argv", [str(script), str(out)])
    runpy.run_path(str(script), run_name="__main__")
    printed = capsys.readouterr().out
    ours, recorded = (float(v) for v in re.findall(r"ppl at \d+: ([0-9.]+), results.json: ([0-9.]+)", printed)[0])
    assert math.isclose(ours, recorded, rel_tol=1e-5), printed


def test_a_bos_a_model_cannot_have_is_refused_in_one_line(llama_dir, corpus_dir, tmp_path):
    result, _ = _run(tmp_path, f"hf:{llama_dir}", "data=text", f"data.path={corpus_dir}", "hf.bos=maybe")
    assert result.exit_code == 2 and "hf.bos" in result.output and "auto, true, false" in result.output
