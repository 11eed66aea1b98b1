"""The context-extension table: a parent run, the parent under each evaluation-time scaling it was evaluated
with, and its fine-tunes (``posexp finetune``), side by side at the same lengths.

``posexp report PARENT FT...`` gives it with no extra flag: when the runs given are fine-tunes and the run
they started from (the parent may also be found from the fine-tunes' record of it), this is the table the
question asks for. A fine-tune trains at a longer length by design, so the table never calls the pair "not
comparable" for that; it does say so when the parent's weights changed since (:func:`parent_changed`), or when
the rows were measured on different corpora or token budgets.

Each line carries a short label (``rope@128``, ``+yarn×4 (eval)``, ``+yarn ft→512, 200 steps``) and its difference
to the parent at every length; the table renders as text, markdown, csv, json and LaTeX from one structure.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from posexp.errors import PosexpError
from posexp.reporting.formatting import MISSING, fmt_signed, fmt_value
from posexp.reporting.runs import Run, read_run, measured_on, measured_text, parent_changed, shown_settings
from posexp.reporting.table import Report
from posexp.reporting.tables import Column, Section, Table, TableCell
from posexp.reporting.views import MAIN_PROTOCOL
from posexp.runs.row import factor_text, fixed_factor


@dataclass
class ExtensionLine:
    """One line of the table: a run (or the parent under an evaluation-time scaling) and its perplexities.

    Attributes:
        label: ``rope@128``, ``+yarn (eval)``, ``+yarn ft→512, 200 steps``.
        kind: ``parent``, ``eval`` (the parent scaled at evaluation) or ``finetune``.
        run: the run folder the numbers come from.
        ppl: length -> perplexity (None: not applicable or not finite).
        low, high: length -> its 95% interval.
        scaling, scaling_factor: the evaluation-time scaling (``eval`` lines) or the fine-tune's.
        steps: a fine-tune's training steps.
        train_len: the length the line's model trained at.
        parent_changed: why the parent's weights are no longer those the fine-tune started from (no difference
            to the parent is given then), or None.
    """

    label: str
    kind: str
    run: Path
    ppl: dict[int, Optional[float]] = field(default_factory=dict)
    low: dict[int, Optional[float]] = field(default_factory=dict)
    high: dict[int, Optional[float]] = field(default_factory=dict)
    scaling: Optional[str] = None
    scaling_factor: Optional[float] = None
    steps: Optional[int] = None
    train_len: Optional[int] = None
    settings: Optional[dict] = None
    parent_changed: Optional[str] = None
    measured: dict[int, dict] = field(default_factory=dict)  # length -> the row (what it was measured on)

    def alike(self, parent: "ExtensionLine", length: int) -> bool:
        """Whether the line's row at ``length`` scored the same tokens as the parent's (:func:`measured_on`)."""
        mine, theirs = self.measured.get(length), parent.measured.get(length)
        return mine is None or theirs is None or measured_on(mine) == measured_on(theirs)

    def difference(self, parent: "ExtensionLine", length: int) -> Optional[float]:
        """ppl − the parent's ppl at ``length`` (None where either is missing, the parent changed since, or the
        two rows were measured on different tokens)."""
        mine, theirs = self.ppl.get(length), parent.ppl.get(length)
        if mine is None or theirs is None or self.parent_changed or not self.alike(parent, length):
            return None
        return mine - theirs


@dataclass
class ExtensionTable:
    """The parent first, then its evaluation-time scalings, then the fine-tunes; ``lengths`` ascending."""

    lines: list[ExtensionLine]
    lengths: list[int]
    parent_train_len: Optional[int]
    warnings: list[str] = field(default_factory=list)

    @property
    def parent(self) -> ExtensionLine:
        return self.lines[0]


def extension_runs(runs: list[Run]) -> Optional[tuple[Run, list[Run]]]:
    """(parent, fine-tunes) when ``runs`` are one parent's fine-tunes with or without the parent itself; else None.

    Raises:
        PosexpError: the fine-tunes' parent is neither given nor readable where they recorded it.
    """
    finetunes = [r for r in runs if isinstance(r.info.get("parent"), str)]
    if not finetunes:
        return None
    parents = {str(Path(r.info["parent"]).resolve()) for r in finetunes}
    others = [r for r in runs if r not in finetunes]
    if len(parents) != 1 or len(others) > 1:
        return None  # fine-tunes of several parents, or other runs beside them: an ordinary report
    (parent_dir,) = parents
    if others:
        if str(others[0].path.resolve()) != parent_dir:
            return None
        return others[0], finetunes
    try:
        return read_run(parent_dir), finetunes
    except PosexpError as e:
        raise PosexpError(f"the fine-tunes' parent {parent_dir} cannot be read ({e}); pass it as well, or "
                          "report the fine-tunes with --by") from None


def _fill(line: ExtensionLine, rows: list[dict]) -> ExtensionLine:
    for row in rows:
        n = int(row["length"])
        ppl = row.get("ppl") if row.get("applicable", True) else None
        finite = isinstance(ppl, (int, float)) and math.isfinite(ppl)
        line.ppl[n] = float(ppl) if finite else None
        line.low[n], line.high[n] = row.get("ppl_low"), row.get("ppl_high")
        line.measured[n] = row
    line.settings = shown_settings(Run(line.run, {}, rows, None), rows)
    return line


def _plain(run: Run, scaling: Optional[str] = None) -> list[dict]:
    """The run's perplexity rows of the plain protocol under ``scaling``, without a window."""
    return Report(protocol=MAIN_PROTOCOL, scaling=scaling).shown(run)


def _variant(row: dict, train_len: int) -> tuple[Optional[str], Optional[float]]:
    """What tells apart two evaluations of the parent under one scaling: a position remapping's options and a fixed
    factor (:func:`~posexp.runs.row.fixed_factor`)."""
    return row.get("scaling_options"), fixed_factor(row, train_len)


def _finetune_label(run: Run) -> str:
    ft = run.info.get("finetune") or {}
    scaling = run.info.get("scaling") or "none"
    name = "direct" if scaling == "none" else f"+{scaling}"
    if ft.get("dropped_encoder"):  # DroPE (Gelberg et al. 2025): the parent's encoding dropped
        name = f"DroPE (-{ft['dropped_encoder']})"
    elif ((run.info.get("train") or {}).get("positions") or {}).get("scheme") == "pose":
        name = f"PoSE{'' if scaling == 'none' else f' +{scaling}'}"
    steps, target = ft.get("steps"), run.train_len
    text = f"{name} ft→{target}" if target else f"{name} ft"
    return f"{text}, {steps} steps" if isinstance(steps, int) else text


def build_extension_table(parent: Run, finetunes: list[Run]) -> ExtensionTable:
    """The table of a parent and its fine-tunes (see the module docstring)."""
    train_len = parent.train_len or 0
    encoder = str(parent.info.get("encoder") or "?")
    lines = [_fill(ExtensionLine(f"{encoder}@{train_len}", "parent", parent.path, train_len=train_len),
                   _plain(parent))]
    scalings = list(dict.fromkeys(r.get("scaling") for r in parent.rows if r.get("scaling") is not None))
    for scaling in scalings:
        rows = _plain(parent, scaling)
        # a line per setting the parent was evaluated with: its options (string offset=20 local=4) and fixed factor
        variants = list(dict.fromkeys(_variant(r, train_len) for r in rows))
        for variant in variants:
            picked = [r for r in rows if _variant(r, train_len) == variant]
            options, fixed = variant
            text = ("" if fixed is None else factor_text(scaling, fixed)) + (
                f" {options}" if options and len({v[0] for v in variants}) > 1 else "")
            lines.append(_fill(ExtensionLine(f"+{scaling}{text} (eval)", "eval", parent.path, scaling=scaling,
                                             scaling_factor=fixed, train_len=train_len), picked))
    warnings: list[str] = []
    for run in finetunes:
        label = _finetune_label(run)
        if sum(_finetune_label(r) == label for r in finetunes) > 1:
            label += f" (seed {run.info.get('seed')})"
        line = ExtensionLine(label, "finetune", run.path, scaling=run.info.get("scaling"),
                             scaling_factor=run.info.get("scaling_factor"),
                             steps=(run.info.get("finetune") or {}).get("steps"), train_len=run.train_len)
        line.parent_changed = parent_changed(run, parent.path)
        lines.append(_fill(line, _plain(run)))
        if line.parent_changed:
            warnings.append(f"{label} ({run.path}): {line.parent_changed}; its difference to the parent is left out "
                            "(it would not be the fine-tune's)")
    lengths = sorted({n for line in lines for n in line.ppl})
    budgets = {json.dumps((line.settings or {}).get("tokens")) for line in lines if line.settings}
    if len(budgets) > 1:
        warnings.append("the lines were measured on different token budgets (eval.tokens): "
                        + "; ".join(f"{line.label}: {(line.settings or {}).get('tokens')}" for line in lines)
                        + "; evaluate them again with one eval.tokens")
    # a not-applicable row scored no tokens: there is no number to difference, not one measured on other tokens
    unlike = [(line, [n for n in lengths if line.ppl.get(n) is not None and lines[0].ppl.get(n) is not None
                      and not line.alike(lines[0], n)]) for line in lines[1:]]
    for line, at in ((line, at) for line, at in unlike if at):
        warnings.append(f"{line.label}: no difference to the parent at {', '.join(map(str, at))}: measured on other "
                        f"tokens ({measured_text(line.measured[at[0]])} vs the parent's "
                        f"{measured_text(lines[0].measured[at[0]])}); only rows measured alike are differenced")
    corpora = {r.info.get("corpus_fingerprint") for r in (parent, *finetunes)} - {None}
    if len(corpora) > 1:
        warnings.append(f"the runs were evaluated on different corpora ({', '.join(sorted(corpora))})")
    return ExtensionTable(lines, lengths, train_len, warnings)


# -- rendering -----------------------------------------------------------------------------------------

def _cell(table: ExtensionTable, line: ExtensionLine, n: int) -> str:
    if n not in line.ppl:
        return MISSING
    diff = line.difference(table.parent, n) if line is not table.parent else None
    return fmt_value(line.ppl[n]) + (f" ({fmt_signed(diff)})" if diff is not None else "")


def caption(table: ExtensionTable) -> str:
    return (f"Perplexity by context length (tokens) of the parent (trained at {table.parent_train_len} tokens), the "
            "parent under each evaluation-time scaling, and its fine-tunes; in brackets the difference to the "
            "parent at the same length (lower is better); — = not evaluated, n/a = not applicable.")


def _records(table: ExtensionTable) -> list[list[Any]]:
    records: list[list[Any]] = [["label", "kind", "run_dir", "train_len", "scaling", "steps", "length", "ppl",
                                 "ppl_low", "ppl_high", "diff_vs_parent"]]
    for line in table.lines:
        for n in table.lengths:
            if n in line.ppl:
                diff = line.difference(table.parent, n) if line is not table.parent else 0.0
                records.append([line.label, line.kind, str(line.run), line.train_len, line.scaling or "",
                                line.steps or "", n, line.ppl[n], line.low.get(n), line.high.get(n), diff])
    return records


def as_table(table: ExtensionTable) -> Table:
    """The table as a :class:`~posexp.reporting.tables.Table`: a section per kind of line (parent, evaluation-time
    scalings, fine-tunes); perplexity, and beside it (in brackets) the difference to the parent."""
    sections: list[Section] = []
    for i, line in enumerate(table.lines):
        if not i or line.kind != table.lines[i - 1].kind:
            sections.append(Section([]))
        sections[-1].rows.append([TableCell(line.label), *(TableCell(_cell(table, line, n)) for n in table.lengths)])
    document = {"table": "context extension", "parent_train_len": table.parent_train_len, "lengths": table.lengths,
                "lines": [{"label": line.label, "kind": line.kind, "run_dir": str(line.run),
                           "train_len": line.train_len, "scaling": line.scaling,
                           "scaling_factor": line.scaling_factor, "steps": line.steps, "settings": line.settings,
                           "ppl": {str(n): line.ppl.get(n) for n in table.lengths},
                           "diff_vs_parent": {str(n): (line.difference(table.parent, n) if line is not table.parent
                                                       else 0.0) for n in table.lengths if n in line.ppl}}
                          for line in table.lines],
                "warnings": table.warnings}
    return Table("context extension — perplexity by length (Δ vs the parent)",
                 [Column("run", label=True), *(Column(str(n)) for n in table.lengths)], sections, caption(table),
                 warnings=table.warnings, csv=_records(table), json=document)
