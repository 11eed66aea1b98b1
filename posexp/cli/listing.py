"""``posexp list``: what a user can choose, read from ``configs/`` (and the encoder registry).

Torch is imported only for the encoder table; the model sizes' parameter counts come from their shapes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from posexp.config.schema import ModelConfig, config_dir

# the plain groups, each a table of name and description, in the order posexp list prints them
GROUP_TABLES = (("data", "data sets  (posexp train data=NAME)"),
                ("tokenizer", "tokenizers  (posexp train tokenizer=NAME)"),
                ("task", "tasks  (posexp train task=NAME; lm = language modelling on data)"),
                ("logger", "experiment trackers  (posexp train logger=NAME or logger=[NAME,NAME])"),
                ("experiment", "experiments  (posexp train experiment=NAME)"))


def options(group: str) -> list[str]:
    """The options of a config group: the yaml files in ``configs/GROUP/``."""
    folder = config_dir() / group
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def yaml_description(path: Path) -> str:
    """A config's ``description`` key, else its first comment line that is not a Hydra directive."""
    loaded: Any = OmegaConf.load(path)
    desc = loaded.get("description")
    if desc:
        return str(desc)
    for line in path.read_text().splitlines():
        if line.startswith("#") and "@package" not in line:
            return line.lstrip("# ").strip()
    return ""


def encoder_table() -> Table:
    from posexp.encoders import option_names, registry

    reg = registry()
    table = Table(title="encoders  (posexp train encoder=NAME)")
    table.add_column("name", style="cyan")
    table.add_column("what it is")
    table.add_column("options")
    for name in options("encoder"):
        cls = reg.get(name)
        desc = cls.description if cls is not None and cls.description else yaml_description(
            config_dir() / "encoder" / f"{name}.yaml")
        opts = ", ".join(option_names(name)) if cls is not None else ""
        table.add_row(name, desc, opts or "—")
    return table


def model_table() -> Table:
    """The model sizes with their parameter counts, computed from each shape (no torch needed)."""
    table = Table(title="model sizes  (posexp train model=NAME)")
    for column in ("name", "d_model", "layers", "heads", "FFN", "params", "with byte vocab", "what it is"):
        table.add_column(column, style="cyan" if column == "name" else None,
                         justify="right" if column in ("d_model", "layers", "heads", "FFN", "params") else "left")
    for name in options("model"):
        path = config_dir() / "model" / f"{name}.yaml"
        raw: Any = OmegaConf.load(path)
        raw.pop("defaults", None)
        shape: Any = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), raw))
        table.add_row(name, str(shape.d_model), str(shape.n_layers), str(shape.n_heads),
                      str(int(shape.mlp_ratio * shape.d_model)), f"{shape.param_count() / 1e6:.1f}M",
                      f"{shape.param_count(256) / 1e6:.2f}M", yaml_description(path))
    table.caption = "params: the blocks and final norm; an encoding's own parameters come on top"
    return table


def group_table(group: str, title: str) -> Table:
    table = Table(title=title)
    table.add_column("name", style="cyan")
    table.add_column("what it is")
    for name in options(group):
        table.add_row(name, yaml_description(config_dir() / group / f"{name}.yaml"))
    return table


def print_choices(console: Console) -> None:
    """Every table of ``posexp list``."""
    console.print(encoder_table())
    console.print(model_table())
    for group, title in GROUP_TABLES:
        console.print(group_table(group, title))
