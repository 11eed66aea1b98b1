"""``posexp list``: what a user can choose, read from ``configs/`` and the encoder registry.

The command's work, as :mod:`posexp.commands.check` is ``posexp check``'s; its command line (``--config-dir``, whose
encoders the command imports first) is :mod:`posexp.cli.app`'s. Torch is imported only for the encoder table; the
model sizes' parameter counts come from their shapes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from posexp.config.schema import ModelConfig, config_dir

# the plain groups, each a table of name and description, in the order posexp list prints them
GROUP_TABLES = (("data", "data sets  (posexp train data=NAME)"),
                ("tokenizer", "tokenizers  (posexp train tokenizer=NAME)"),
                ("task", "tasks  (posexp train task=NAME; lm = language modelling on data)"),
                ("logger", "experiment trackers  (posexp train logger=NAME or logger=[NAME,NAME])"),
                ("experiment", "experiments  (posexp train experiment=NAME)"))
MODEL_COLUMNS = ("name", "d_model", "layers", "heads", "FFN", "params", "with byte vocab", "what it is")
NUMBERS = ("d_model", "layers", "heads", "FFN", "params")  # right-aligned
# A full stop that ends a sentence: not the one of "et al.", "e.g.", "i.e." or an ellipsis; outside brackets and
# quotes (:func:`_first_outside`), so "(He et al. 2021, Eq. 4)" does not end one.
SENTENCE_END = re.compile(r"(?<!\bal)(?<!\be\.g)(?<!\bi\.e)(?<!\.)\.(?=\s|$)")
CLAUSE_END = re.compile(r": ")
# A first sentence longer than this is shortened to its first clause (up to ": ").
LONG_SENTENCE = 160
# Narrower consoles get the model sizes' descriptions under their table, not in a squeezed column.
WIDE = 120


def yaml_description(path: Path) -> str:
    """A config's ``description`` key, else the first sentence of its header comment: the comment lines
    before the first usage example (``#   posexp train ...``) or blank line, Hydra directives left out."""
    loaded: Any = OmegaConf.load(path)
    desc = loaded.get("description")
    if desc:
        return str(desc)
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#") or line.startswith("#  ") or not line[1:].strip():
            break
        if "@package" not in line:
            header.append(line[1:].strip())
    text = " ".join(header)
    end = _first_outside(SENTENCE_END, text)
    sentence = text[:end.end()] if end else text
    clause = _first_outside(CLAUSE_END, sentence, 30)  # a long sentence up to its first clause: never cut mid-word
    return sentence[:clause.start()] if len(sentence) > LONG_SENTENCE and clause else sentence


def task_description(path: Path) -> str:
    """What a task's yaml says the task is (:func:`yaml_description`); for one that says nothing of it in its header
    (a plugin's, listing its options), the ``task.description`` it sets, else its class's ``description``."""
    from posexp.errors import PosexpError
    from posexp.registry import MODULE_KEY
    from posexp.tasks import task_class

    said = yaml_description(path)
    if said:
        return said
    task: Any = OmegaConf.select(OmegaConf.load(path), "task", default=None, throw_on_resolution_failure=False)
    if not isinstance(task, DictConfig) or task.get("name") is None:
        return ""
    if task.get("description"):
        return str(task.description)
    try:
        return task_class({"name": task.name, MODULE_KEY: task.get(MODULE_KEY)}).description
    except PosexpError:  # an unknown task, or a module that cannot be imported: nothing to say it is
        return ""


def logger_description(path: Path) -> str:
    """What a tracker's yaml says it is (:func:`yaml_description`); for one that says nothing of it in its header
    (a plugin's, naming its module), its class's ``description``."""
    from posexp.errors import PosexpError
    from posexp.registry import MODULE_KEY
    from posexp.tracking import tracker_options

    said = yaml_description(path)
    if said:
        return said
    options: Any = OmegaConf.load(path)
    module = options.get(MODULE_KEY) if isinstance(options, DictConfig) else None
    try:
        return tracker_options(path.stem, {MODULE_KEY: module} if module else None)[0].description
    except PosexpError:  # an unknown tracker, or a module that cannot be imported: nothing to say it is
        return ""


def _first_outside(pattern: re.Pattern, text: str, start: int = 0) -> Optional[re.Match]:
    """The first match of ``pattern`` in ``text`` from ``start`` that lies outside every bracket and quote (a title
    quoted in a citation has its own colons and full stops), or None."""
    for match in pattern.finditer(text, start):
        before = text[:match.start()]
        if before.count("(") == before.count(")") and before.count('"') % 2 == 0:
            return match
    return None


def _yamls(group: str, dirs: Sequence[Path] = ()) -> Dict[str, Path]:
    """``name -> yaml`` of a config group, in the user's folders ``dirs`` and ``configs/``, by name: posexp's own
    where both have a name, as Hydra reads it first (the user's is said to be shadowed,
    :func:`posexp.cli.hydra_flags.shadowed_components`)."""
    found = {p.stem: p for folder in (*dirs, config_dir()) for p in (folder / group).glob("*.yaml")}
    return dict(sorted(found.items()))


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], caption: Optional[str] = None) -> Table:
    table = Table(title=title, caption=caption)
    for column in columns:
        table.add_column(column, style="cyan" if column == "name" else None, no_wrap=column == "name",
                         justify="right" if column in NUMBERS else "left")
    for row in rows:
        table.add_row(*row)
    return table


def encoder_table(user_dirs: Sequence[Path] = ()) -> Table:
    """The encoders: built-ins, installed plugins, and those of the user's config folders ``user_dirs``."""
    from posexp.encoders import broken, option_names, origin, registry

    reg, unusable, yamls = registry(), broken(), _yamls("encoder", user_dirs)
    rows = []
    for name in sorted(set(reg) | set(yamls) | set(unusable)):
        cls, path = reg.get(name), yamls.get(name)
        if name in unusable:  # why, one line each, under the table
            rows.append((name, "[bold red]broken[/]: cannot be used (why: below the table)", "—",
                         str(path) if path else "plugin"))
        elif cls is None:
            rows.append((name, yaml_description(path) if path else "", "—", str(path)))
        else:
            where = origin(name) + (f"; config {path}" if path and path.parent.parent != config_dir() else "")
            rows.append((name, cls.description or (yaml_description(path) if path else ""),
                         ", ".join(option_names(name)) or "—", where))
    declared = {name: getattr(cls, "context_parallel", None) for name, cls in reg.items() if name not in unusable}
    return _table("encoders  (posexp train encoder=NAME)", ("name", "what it is", "options", "from"), rows,
                  context_parallel_note(declared))


def context_parallel_note(declared: Dict[str, Any]) -> str:
    """Which encodings a shard of the sequence computes alone (``train.context_parallel``), from each encoder class's
    declaration: true, false, or a property (when every layer's encoding does)."""
    mixed = ", ".join(sorted(n for n, d in declared.items() if isinstance(d, property)))
    alone = ", ".join(sorted(n for n, d in declared.items() if not (d or isinstance(d, property))))
    return ("context parallel (train.context_parallel): a shard of the sequence computes each encoding alone from "
            "absolute positions" + (f", except {alone}, which need the whole sequence" if alone else "")
            + (f"; {mixed}: when every layer's encoding does" if mixed else "") + " (posexp check ENCODER verifies it)")


def model_table(described: bool = True, dirs: Sequence[Path] = ()) -> Table:
    """The model sizes (posexp's and those of the user's config folders ``dirs``) with their parameter counts,
    computed from each shape (no torch needed); their descriptions in a last column when ``described``."""
    rows = []
    for name, path in _yamls("model", dirs).items():
        raw: Any = OmegaConf.load(path)
        raw.pop("defaults", None)
        m: Any = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), raw))
        rows.append((name, str(m.d_model), str(m.n_layers), str(m.n_heads), str(int(m.mlp_ratio * m.d_model)),
                     f"{m.param_count() / 1e6:.1f}M", f"{m.param_count(256) / 1e6:.2f}M", yaml_description(path)))
    width = len(MODEL_COLUMNS) if described else -1
    return _table("model sizes  (posexp train model=NAME)", MODEL_COLUMNS[:width], [row[:width] for row in rows],
                  "params: the blocks and final norm; an encoding's own parameters come on top")


def print_choices(console: Console, dirs: Sequence[Path] = ()) -> None:
    """Every table of ``posexp list``, the choices of the user's config folders ``dirs`` among them (their encoders
    imported)."""
    from posexp.encoders import broken

    console.print(encoder_table(dirs))
    for name, reason in broken().items():
        console.print(f"[bold red]broken[/] {escape(name)}: {escape(reason)}", soft_wrap=True, highlight=False)
    wide = console.width >= WIDE
    console.print(model_table(described=wide, dirs=dirs))
    if not wide:  # what each size is, one line each, wrapped at word boundaries
        notes = Table.grid(padding=(0, 2))
        notes.add_column(style="cyan", no_wrap=True)
        notes.add_column()
        for name, path in _yamls("model", dirs).items():
            notes.add_row(name, yaml_description(path))
        console.print(notes)
    for group, title in GROUP_TABLES:
        describe = {"task": task_description, "logger": logger_description}.get(group, yaml_description)
        console.print(_table(title, ("name", "what it is"), [(n, describe(p)) for n, p in _yamls(group, dirs).items()]))
