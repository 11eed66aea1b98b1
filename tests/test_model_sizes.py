"""The model group: the shapes researchers quote, and parameter counts that match the model actually built."""

from __future__ import annotations

import pytest
import torch
from rich.console import Console

from omegaconf import OmegaConf

from posexp.build import build_model
from posexp.config import ModelConfig, config_dir

MODELS = sorted(p.stem for p in (config_dir() / "model").glob("*.yaml"))


@pytest.mark.parametrize("name", MODELS)
def test_the_listed_parameter_count_is_the_built_models(compose, name):
    cfg = compose(f"model={name}", "encoder=none")  # NoPE: no parameters of the encoding's own
    with torch.device("meta"):  # the shape without the memory: press2022 has 201M parameters
        model = build_model(cfg, vocab_size=256)
    shape = OmegaConf.to_object(cfg.model)  # the ModelConfig `posexp list` computes from
    assert isinstance(shape, ModelConfig) and shape.param_count(256) == model.num_params()


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
    from posexp.listing import model_table

    console = Console(width=250, record=True)
    console.print(model_table())
    text = console.export_text()
    rows = {line.split("│")[1].strip(): line for line in text.splitlines() if line.count("│") > 3}
    assert set(MODELS) <= set(rows)
    assert "85.0M" in rows["gpt2_small"] and "201.4M" in rows["press2022"] and "0.4M" in rows["small"]
