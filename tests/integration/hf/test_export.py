"""``posexp export RUN DIR``: a run as a transformers model folder that reloads with the run's logits and ids.

learned -> GPT-2, rope -> GPT-NeoX, alibi -> MPT (posexp/hf/architectures.py); every other encoding is refused in
one line. Tiny runs trained here (a few steps each); nothing is downloaded.
"""

from __future__ import annotations

import json
import random
import stat
import types
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from posexp.config.schema import EvalConfig, TrainConfig  # noqa: E402
from posexp.encoders import create  # noqa: E402
from posexp.errors import PosexpError  # noqa: E402
from posexp.hf.architectures import EXPORTABLE, build, plan  # noqa: E402
from posexp.commands.export import export_run  # noqa: E402
from posexp.hf.export import EXPORT_JSON  # noqa: E402
from posexp.model.gpt import GPT, ModelShape  # noqa: E402

from helpers import TINY_RUN, invoke_main  # noqa: E402

# each run's own options on top of the smoke experiment (train_len 32); alibi trains without LayerNorm biases,
# which MPT's norms lack
RUNS = {"rope": ("encoder=rope",), "learned": ("encoder=learned",),
        "alibi": ("encoder=alibi", "model.norm_bias=false")}
TRAIN_LEN = 32
TOL = 1e-5
TEXTS = ["hello world", "  two  spaces\n\tand a tab\r\n", "héllo ünïcode: naïve café", "日本語のテキスト 😀🎉",
         "\x00NUL\x01\x1f\x7f controls", "Ā and ġ are GPT-2's byte characters, written literally", "<|doc|> </s> <s>", ""]


def _random_text(rng: random.Random, n: int) -> str:
    """Random code points from the whole of Unicode (no surrogates): 1- to 4-byte UTF-8 sequences."""
    points = [rng.choice([rng.randrange(0, 128), rng.randrange(128, 0xD800), rng.randrange(0xE000, 0x110000)])
              for _ in range(n)]
    return "".join(map(chr, points))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, _private_cache):
    """One tiny trained run per exportable encoding, and its export."""
    from hydra import compose, initialize_config_dir

    from posexp.commands.train import run_train
    from posexp.commands.validation import register_configs
    from posexp.config.schema import config_dir

    register_configs()
    root = tmp_path_factory.mktemp("export")
    out = {}
    for name, options in RUNS.items():
        overrides = [*TINY_RUN, "train.steps=3", "eval.multiples=[1]", "eval.tokens=256", *options]
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
        run_train(cfg, root / name, [])
        out[name] = (root / name, export_run(root / name, root / f"{name}-hf"))
    torch.set_num_threads(1)
    return out


def _posexp_model(run_dir: Path):
    import posexp

    return posexp.load_run(run_dir).model


@pytest.mark.parametrize("name", EXPORTABLE)
def test_the_exported_model_gives_the_runs_logits(runs, name):
    from transformers import AutoModelForCausalLM

    run_dir, export = runs[name]
    ours = _posexp_model(run_dir)
    theirs = AutoModelForCausalLM.from_pretrained(str(export.folder), dtype=torch.float32).eval()
    # past the training length too, where the encoding reads that far (a learned table ends there)
    lengths = [TRAIN_LEN // 2, TRAIN_LEN] + ([] if name == "learned" else [3 * TRAIN_LEN])
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for n in lengths:
            tokens = torch.randint(0, 256, (2, n), generator=generator)
            diff = (theirs(tokens).logits - ours(tokens)).abs().max().item()
            assert diff < TOL, (name, n, diff)
    # the run's weights, not a fresh model's: the logits are not those of the class's random initialisation
    assert type(theirs).__name__ == export.architecture
    assert export.max_abs_diff < TOL


@pytest.mark.parametrize("name", EXPORTABLE)
def test_posexp_export_json_names_the_run_and_the_mapping(runs, name):
    run_dir, export = runs[name]
    record = json.loads((export.folder / EXPORT_JSON).read_text())
    info = json.loads((run_dir / "results.json").read_text())["run"]
    assert record["run"] == str(run_dir.resolve()) and record["config_hash"] == info["config_hash"]
    assert record["encoder"] == name and record["exact"] is True and record["architecture"] == export.architecture
    config = json.loads((export.folder / "config.json").read_text())
    assert config["architectures"] == [export.architecture] and "auto_map" not in config  # no remote code
    assert (export.folder / "model.safetensors").is_file()
    # the longest sequence: a learned table's rows; rope and alibi read on, to 16 x train_len at least
    tokenizer_config = json.loads((export.folder / "tokenizer_config.json").read_text())
    assert tokenizer_config["model_max_length"] == (TRAIN_LEN if name == "learned" else 16 * TRAIN_LEN)


def test_the_exported_files_follow_the_umask_as_the_runs_checkpoint_does(runs):
    from posexp.runs.atomic import file_mode
    _, export = runs["rope"]
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in export.folder.iterdir() if path.is_file()}
    assert modes["model.safetensors"] == modes["config.json"] == file_mode(), modes
    assert set(modes.values()) == {file_mode()}, modes


def test_the_exported_tokenizer_gives_the_byte_tokenizers_ids(runs):
    from transformers import AutoTokenizer

    from posexp.data.tokenizer import ByteTokenizer

    tok = AutoTokenizer.from_pretrained(str(runs["rope"][1].folder))
    rng = random.Random(0)
    texts = TEXTS + [_random_text(rng, rng.randrange(1, 60)) for _ in range(100)]
    for text in texts:
        ids = tok(text)["input_ids"]
        assert ids == ByteTokenizer().encode_batch([text])[0].tolist(), text
        assert tok.decode(ids) == text
    # any byte sequence, valid UTF-8 or not, decodes as Python decodes it
    for _ in range(100):
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 20)))
        assert tok.decode(list(raw)) == raw.decode("utf-8", errors="replace")
    assert len(tok) == 256 and len(set(tok.convert_ids_to_tokens(list(range(256))))) == 256


def test_a_bpe_tokenizer_is_written_as_itself(tmp_path):
    from transformers import AutoTokenizer

    from posexp.data.tokenizer import DOC_TOKEN, BPETokenizer, TokenizerSpec
    from posexp.hf.tokenizer_export import save_tokenizer

    rng = random.Random(1)
    corpus = [[f"the quick brown fox {i} jumps over the lazy dog; héllo wörld {i % 7}" for i in range(200)]]
    bpe = BPETokenizer.train(corpus, TokenizerSpec("bpe", vocab_size=300, min_frequency=2))
    save_tokenizer(bpe._tok, tmp_path, eos_token=DOC_TOKEN)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    for text in TEXTS + ["the quick brown fox", _random_text(rng, 40)]:
        assert tok(text)["input_ids"] == bpe.encode_batch([text])[0].tolist(), text
    assert tok.eos_token == DOC_TOKEN and tok.eos_token_id == bpe.separator


@pytest.mark.slow
def test_a_bpe_run_exports_with_its_own_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    import posexp
    from posexp.data.corpus import corpus_from_config
    from posexp.data.tokenizer import BPETokenizer

    run_dir = tmp_path / "bpe"
    proc = invoke_main("train", *TINY_RUN, "tokenizer=bpe", "tokenizer.vocab_size=300", "train.steps=2",
                       "eval.multiples=[1]", "eval.tokens=256", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert proc.exit_code == 0, proc.stderr
    done = export_run(run_dir, tmp_path / "hf")
    assert done.max_abs_diff < TOL
    bpe = BPETokenizer.load(corpus_from_config(posexp.load_run(run_dir).config).tokenizer_file)
    tok = AutoTokenizer.from_pretrained(str(done.folder))
    rng = random.Random(2)
    for text in TEXTS + ["def f(x):\n    return x + 1\n", _random_text(rng, 50)]:
        assert tok(text)["input_ids"] == bpe.encode_batch([text])[0].tolist(), text
    record = json.loads((done.folder / EXPORT_JSON).read_text())
    assert record["tokenizer"] == "bpe" and record["document_separator_id"] == bpe.separator == tok.eos_token_id


def test_a_run_whose_tokens_are_not_text_is_refused_in_one_line(tmp_path):
    from posexp.hf.tokenizer_export import export_tokenizer

    for info, says in (({"tokenizer": "task", "vocab_size": 20}, "tokenizer=byte or tokenizer=bpe"),
                       ({"tokenizer": "byte", "vocab_size": 300}, "300 tokens")):
        with pytest.raises(PosexpError) as e:
            export_tokenizer(None, info, tmp_path)
        assert "\n" not in str(e.value) and says in str(e.value)
    assert not any(tmp_path.iterdir())


def _cfg(name: str, positions: str = "contiguous"):
    return types.SimpleNamespace(encoder={"name": name}, train_len=TRAIN_LEN, eval=EvalConfig(),
                                 train=TrainConfig(positions=positions))


def _random_model(shape: ModelShape, name: str, **options) -> GPT:
    torch.manual_seed(0)
    model = GPT(shape, create(name, shape.d_model, shape.n_heads, **options)).eval()
    with torch.no_grad():
        for p in model.parameters():  # every weight away from its initial value, norm biases included
            p.add_(0.05 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("name, shape, options", [
    ("rope", ModelShape(d_model=48, n_heads=3, tie_embeddings=False), {"base": 500.0, "rotary_fraction": 0.5}),
    ("alibi", ModelShape(d_model=48, n_heads=6, norm_bias=False), {}),  # slopes for 6 heads: not a power of two
    ("learned", ModelShape(d_model=48, n_heads=3, mlp_ratio=2.5, tie_embeddings=False), {"max_length": 40}),
])
def test_other_shapes_map_exactly_too(name, shape, options):
    model = _random_model(shape, name, **options)
    hf = build(plan(model, _cfg(name)), model)
    tokens = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (hf(tokens).logits - model(tokens)).abs().max().item() < TOL


@pytest.mark.parametrize("name", ["sinusoidal", "none", "t5", "xpos", "kerple", "fire", "resonance"])
def test_another_encoding_is_refused_in_one_line_naming_those_that_export(name):
    model = _random_model(ModelShape(d_model=32, n_heads=2), name)
    with pytest.raises(PosexpError) as e:
        plan(model, _cfg(name))
    message = str(e.value)
    assert "\n" not in message and f"encoder={name}" in message
    assert all(ok in message for ok in EXPORTABLE)


@pytest.mark.parametrize("name, shape, options, says", [
    ("alibi", ModelShape(d_model=32, n_heads=2), {}, "model.norm_bias=false"),
    ("alibi", ModelShape(d_model=32, n_heads=2, norm_bias=False, mlp_ratio=2.0), {}, "model.mlp_ratio=4"),
    ("rope", ModelShape(d_model=32, n_heads=2), {"freq_schedule": "power"}, "exponential"),
    ("rope", ModelShape(d_model=32, n_heads=2, ssmax=True), {}, "model.ssmax"),
])
def test_an_option_without_an_exact_counterpart_is_refused_saying_what_to_train(name, shape, options, says):
    with pytest.raises(PosexpError) as e:
        plan(_random_model(shape, name, **options), _cfg(name))
    assert "\n" not in str(e.value) and says in str(e.value)


@pytest.mark.parametrize("name", EXPORTABLE)
def test_a_run_evaluated_at_randomized_positions_is_refused_as_a_transformers_model_reads_0_to_l(name):
    """Such a run's own eval reads sorted random positions (Ruoss et al. 2023): an export would not give its logits."""
    shape = ModelShape(d_model=32, n_heads=2, norm_bias=name != "alibi")
    with pytest.raises(PosexpError) as e:
        plan(_random_model(shape, name), _cfg(name, "randomized"))
    assert "\n" not in str(e.value) and "train.positions=randomized" in str(e.value)
    for evaluated_at_0_to_l in ("contiguous", "pose"):  # PoSE changes training only
        assert plan(_random_model(shape, name), _cfg(name, evaluated_at_0_to_l)).architecture


def test_a_model_without_norm_biases_keeps_earlier_runs_as_they_were():
    from posexp.config.identity import MODEL_KEYS_BEFORE

    with_bias, without = ModelShape(), ModelShape(norm_bias=False)
    assert MODEL_KEYS_BEFORE["norm_bias"] is True  # at the default the key stays out of the config hash
    model = GPT(without, create("alibi", without.d_model, without.n_heads))
    assert not any(name.endswith(("ln1.bias", "ln2.bias", "ln_f.bias")) for name in model.state_dict())
    assert model.num_params() == without.param_count(256) < with_bias.param_count(256)


def test_an_existing_folder_is_kept_unless_overwrite_and_nothing_is_left_half_written(runs, tmp_path, monkeypatch):
    import posexp.hf.export as export

    run_dir, done = runs["rope"]
    with pytest.raises(PosexpError, match="--overwrite"):
        export_run(run_dir, done.folder)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    with pytest.raises(PosexpError, match="not a model folder"):
        export_run(run_dir, tmp_path / "notes", overwrite=True)
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "check_logits", broken)
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / ".rope.4242.0badc0de.tmp").mkdir()  # an export killed while writing: cleared by the next
    with pytest.raises(PosexpError, match="no space left on the device") as err:
        export_run(run_dir, tmp_path / "new" / "rope")
    assert "\n" not in str(err.value) and "nothing of it was left there" in str(err.value)
    assert list((tmp_path / "new").iterdir()) == []  # no folder, no temporary one (nor the killed one's)
    with pytest.raises(PosexpError, match="no space left on the device"):
        export_run(run_dir, tmp_path / "made" / "for" / "rope")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new", "notes"]  # nor the parents it made


def test_a_full_disk_while_the_weights_are_written_is_one_line_and_leaves_nothing(runs, tmp_path):
    """This process's file-size limit (RLIMIT_FSIZE, its SIGXFSZ ignored) lowered for the export alone fails the
    weights' write as a full disk does, inside safetensors' own writer."""
    import resource
    import signal

    run_dir, _ = runs["rope"]
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    xfsz = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20000, hard))
    try:
        proc = invoke_main("export", str(run_dir), "full/rope", cwd=tmp_path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, xfsz)
    assert proc.exit_code != 0 and isinstance(proc.exception, SystemExit), repr(proc.exception)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "the export could not be written" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_posexp_export_on_the_command_line(runs, tmp_path):
    from typer.testing import CliRunner

    from posexp.cli.app import app

    run_dir, _ = runs["learned"]
    out = tmp_path / "gpt2"
    proc = invoke_main("export", str(run_dir), str(out), cwd=tmp_path)
    assert proc.exit_code == 0, proc.stderr
    assert "GPT-2" in proc.stdout and (out / "config.json").is_file()
    again = CliRunner().invoke(app, ["export", str(run_dir), str(out)])
    assert again.exit_code == 2 and again.output.strip().count("\n") == 0 and "--overwrite" in again.output
