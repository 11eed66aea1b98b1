"""The model group: the shapes researchers quote, and parameter counts that match the model actually built."""

from __future__ import annotations

import pytest
import torch
from rich.console import Console


from posexp.model.factory import build_model
from posexp.config.schema import ModelConfig, config_dir
from posexp.commands.edge import typed

MODELS = sorted(p.stem for p in (config_dir() / "model").glob("*.yaml"))


@pytest.mark.parametrize("name", MODELS)
def test_the_listed_parameter_count_is_the_built_models(compose, name):
    cfg = typed(compose(f"model={name}", "encoder=none"))  # NoPE: no parameters of the encoding's own
    with torch.device("meta"):  # the shape without the memory: press2022 has 201M parameters
        model = build_model(cfg, vocab_size=256)
    assert isinstance(cfg.model, ModelConfig) and cfg.model.param_count(256) == model.num_params()


@pytest.mark.parametrize("name,d_model,layers,heads,ffn", [
    ("small", 128, 2, 4, 512),  # the default, unchanged
    ("base", 512, 8, 8, 2048),
    ("gpt2_small", 768, 12, 12, 3072),  # Radford et al. 2019
    ("press2022", 1024, 16, 8, 4096),  # Press et al. 2022 / fairseq transformer_lm_wiki103
])
def test_each_size_has_the_shape_it_is_named_after(compose, name, d_model, layers, heads, ffn):
    m = compose(f"model={name}").model
    assert (m.d_model, m.n_layers, m.n_heads, int(m.mlp_ratio * m.d_model)) == (d_model, layers, heads, ffn)


def test_the_default_model_is_still_small(compose):
    assert compose().model == compose("model=small").model


def test_posexp_list_shows_each_size_with_its_parameter_count():
    from posexp.commands.listing import model_table

    console = Console(width=250, record=True)
    console.print(model_table())
    text = console.export_text()
    rows = {line.split("│")[1].strip(): line for line in text.splitlines() if line.count("│") > 3}
    assert set(MODELS) <= set(rows)
    assert "85.0M" in rows["gpt2_small"] and "201.4M" in rows["press2022"] and "0.4M" in rows["small"]


@pytest.mark.parametrize("tie", [True, False])
def test_an_untied_output_layer_is_its_own_parameter_and_counted(compose, tie):
    cfg = typed(compose("task=copy", f"model.tie_embeddings={str(tie).lower()}", "encoder=none"))
    model = build_model(cfg, vocab_size=18)
    assert (model.lm_head.weight is model.wte.weight) == tie
    assert (model.lm_head.weight.data_ptr() == model.wte.weight.data_ptr()) == tie
    assert cfg.model.param_count(18) == model.num_params()


def test_init_pytorch_keeps_the_layers_defaults_and_gpt2_draws_n_0_002(compose):
    """GPT-2 (Radford et al. 2019): N(0, 0.02). pytorch: nn.Embedding N(0, 1), nn.Linear U(+-1/sqrt(fan_in))."""
    gpt2 = build_model(typed(compose("encoder=none", "model.tie_embeddings=false")), vocab_size=256)
    torch_init = build_model(typed(compose("encoder=none", "model.init=pytorch", "model.tie_embeddings=false")),
                             vocab_size=256)
    assert abs(gpt2.wte.weight.std().item() - 0.02) < 0.002
    assert abs(gpt2.lm_head.weight.std().item() - 0.02) < 0.002
    assert abs(torch_init.wte.weight.std().item() - 1.0) < 0.05
    fc = torch_init.blocks[0].mlp.fc.weight  # fan_in d_model = 128
    assert fc.abs().max().item() <= 128 ** -0.5 and abs(fc.std().item() - (3 * 128) ** -0.5) < 0.005
    assert abs(gpt2.blocks[0].mlp.fc.weight.std().item() - 0.02) < 0.002


def test_an_unknown_init_is_one_line_naming_the_key_and_the_choices(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from helpers import TINY_RUN
    from posexp.cli.app import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["train", *TINY_RUN, "model.init=xavier", "hydra.run.dir=run"])
    out = result.output.strip()
    assert result.exit_code == 2 and len(out.splitlines()) == 1, out
    assert "model.init" in out and "gpt2" in out and "pytorch" in out and "xavier" in out
    assert not (tmp_path / "run").exists()
