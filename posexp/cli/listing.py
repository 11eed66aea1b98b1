"""``posexp list``: what a user can choose, read from ``configs/`` (and the encoder registry).

Torch is imported only for the encoder table; the model sizes' parameter counts come from their shapes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional, Sequence

from omegaconf import OmegaConf
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from posexp.cli.completion import group_options
from posexp.cli.plugins import load_folder_plugins
from posexp.config.schema import ModelConfig, config_dir

# the plain groups, each a table of name and description, in the order posexp list prints them
GROUP_TABLES = (("data", "data sets  (posexp train data=NAME)"),
                ("tokenizer", "tokenizers  (posexp train tokenizer=NAME)"),
                ("task", "tasks  (posexp train task=NAME; lm = language modelling on data)"),
                ("logger", "experiment trackers  (posexp train logger=NAME or logger=[NAME,NAME])"),
                ("experiment", "experiments  (posexp train experiment=NAME)"))


# A full stop that ends a sentence: not the one of "et al.", "e.g." or "i.e.".
SENTENCE_END = re.compile(r"(?<!\bal)(?<!\be\.g)(?<!\bi\.e)\.(?=\s|$)")
# A first sentence longer than this is shortened to its first clause (up to ": ").
LONG_SENTENCE = 160


def yaml_description(path: Path) -> str:
    """A config's ``description`` key, else the first sentence of its header comment: the comment lines
    before the first usage example (``#   posexp train ...``) or blank line, Hydra directives left out."""
    loaded: Any = OmegaConf.load(path)
    desc = loaded.get("description")
    if desc:
        return str(desc)
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line[1:]
        if "@package" in text:
            continue
        if text.startswith("  ") or not text.strip():
            break
        header.append(text.strip())
    return first_sentence(" ".join(header))


def first_sentence(text: str) -> str:
    """``text`` up to its first full stop, and a long sentence up to its first clause: never cut mid-word."""
    end = SENTENCE_END.search(text)
    sentence = text[:end.end()] if end else text
    clause = sentence.find(": ", 30)
    return sentence[:clause] if len(sentence) > LONG_SENTENCE and clause > 0 else sentence


def encoder_table(user_dirs: Sequence[Path] = ()) -> Table:
    """The encoders: built-ins, installed plugins, and those of the user's config folders ``user_dirs``."""
    from posexp.encoders import broken, option_names, origin, registry

    reg, unusable = registry(), broken()
    yamls = {p.stem: p for folder in (config_dir(), *user_dirs) for p in sorted((folder / "encoder").glob("*.yaml"))}
    table = Table(title="encoders  (posexp train encoder=NAME)")
    table.add_column("name", style="cyan", no_wrap=True)
    table.add_column("what it is")
    table.add_column("options")
    table.add_column("from")
    for name in sorted(set(reg) | set(yamls) | set(unusable)):
        if name in unusable:  # why, one line each, under the table (broken_lines)
            table.add_row(name, "[bold red]broken[/]: cannot be used (why: below the table)", "—",
                          str(yamls[name]) if name in yamls else "plugin")
            continue
        cls = reg.get(name)
        desc = cls.description if cls is not None and cls.description else (
            yaml_description(yamls[name]) if name in yamls else "")
        opts = ", ".join(option_names(name)) if cls is not None else ""
        where = origin(name) if cls is not None else str(yamls[name])
        if cls is not None and name in yamls and yamls[name].parent.parent != config_dir():
            where += f"; config {yamls[name]}"
        table.add_row(name, desc, opts or "—", where)
    table.caption = context_parallel_note({name: shardable(reg.get(name)) for name in reg if name not in unusable})
    return table


def context_parallel_note(declared: dict[str, str]) -> str:
    """Which encodings a shard of the sequence computes alone (``train.context_parallel``), in one caption."""
    by = {word: ", ".join(sorted(n for n, d in declared.items() if d == word)) for word in ("no", "mix")}
    note = ("context parallel (train.context_parallel): a shard of the sequence computes each encoding alone from "
            "absolute positions")
    if by["no"]:
        note += f", except {by['no']}, which need the whole sequence"
    if by["mix"]:
        note += f"; {by['mix']}: when every layer's encoding does"
    return note + " (posexp check ENCODER verifies it)"


def shardable(cls: Optional[type]) -> str:
    """An encoder class's context-parallel declaration in a word: yes, no, or mix (when every layer's encoding is)."""
    declared = getattr(cls, "context_parallel", None)
    if isinstance(declared, property):
        return "mix"
    return "—" if cls is None else ("yes" if declared else "no")


# Narrower consoles get the model sizes' descriptions under their table, not in a squeezed column.
WIDE = 120


def model_table(described: bool = True) -> Table:
    """The model sizes with their parameter counts, computed from each shape (no torch needed); their
    descriptions in a last column when ``described`` (else :func:`model_notes` has them)."""
    table = Table(title="model sizes  (posexp train model=NAME)")
    columns = ("name", "d_model", "layers", "heads", "FFN", "params", "with byte vocab", "what it is")
    for column in columns if described else columns[:-1]:
        table.add_column(column, style="cyan" if column == "name" else None, no_wrap=column == "name",
                         justify="right" if column in ("d_model", "layers", "heads", "FFN", "params") else "left")
    for name in group_options("model"):
        path = config_dir() / "model" / f"{name}.yaml"
        raw: Any = OmegaConf.load(path)
        raw.pop("defaults", None)
        shape: Any = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), raw))
        cells = (name, str(shape.d_model), str(shape.n_layers), str(shape.n_heads),
                 str(int(shape.mlp_ratio * shape.d_model)), f"{shape.param_count() / 1e6:.1f}M",
                 f"{shape.param_count(256) / 1e6:.2f}M", yaml_description(path))
        table.add_row(*(cells if described else cells[:-1]))
    table.caption = "params: the blocks and final norm; an encoding's own parameters come on top"
    return table


def model_notes() -> Table:
    """What each model size is, one line each (wrapped at word boundaries): :func:`model_table`'s last column."""
    notes = Table.grid(padding=(0, 2))
    notes.add_column(style="cyan", no_wrap=True)
    notes.add_column()
    for name in group_options("model"):
        notes.add_row(name, yaml_description(config_dir() / "model" / f"{name}.yaml"))
    return notes


def group_table(group: str, title: str) -> Table:
    table = Table(title=title)
    table.add_column("name", style="cyan", no_wrap=True)
    table.add_column("what it is")
    for name in group_options(group):
        table.add_row(name, yaml_description(config_dir() / group / f"{name}.yaml"))
    return table


def print_choices(console: Console, dirs: Sequence[Path] = ()) -> None:
    """Every table of ``posexp list``, the encoders of the user's config folders ``dirs`` among them.

    Raises:
        PosexpError: one of their encoders cannot be imported.
    """
    load_folder_plugins(dirs)
    console.print(encoder_table(dirs))
    from posexp.encoders import broken

    for name, reason in broken().items():
        console.print(f"[bold red]broken[/] {escape(name)}: {escape(reason)}", soft_wrap=True, highlight=False)
    wide = console.width >= WIDE
    console.print(model_table(described=wide))
    if not wide:
        console.print(model_notes())
    for group, title in GROUP_TABLES:
        console.print(group_table(group, title))
