"""``posexp report``'s outputs, byte for byte, against golden files: every table kind (perplexity, pivot,
context extension, task, curve section) through every format (rich at 80 and 160 columns, markdown, csv,
json, latex) and the files a report writes (report.md, summary.md, summary.csv, the lead table's csv/tex).

The runs are built here, deterministically, in a temporary folder; paths are written relative to it. After a
deliberate change of the output, regenerate with ``POSEXP_REGEN_GOLDEN=1 pytest tests/unit/reporting/test_report_golden.py``
and read the diff before committing it.
"""

from __future__ import annotations

import difflib
import io
import json
import math
import os
from pathlib import Path

import pytest
from rich.console import Console

from posexp.reporting.options import ReportOptions
from posexp.reporting.summary import report_main
from posexp.runs.curve import CurveWriter
from helpers import no_figure as _no_figure
from helpers.runs import longer_finetunes, pretrained_sweep
from helpers.runs import ppl_rows as _ppl_rows
from helpers.runs import write_run as _write_run

GOLDEN = Path(__file__).parent / "golden" / "report"
REGEN = os.environ.get("POSEXP_REGEN_GOLDEN") == "1"
FORMATS = ("rich80", "rich160", "markdown", "csv", "json", "latex")
TEXT_FILES = (".md", ".csv", ".tex", ".json")


def lm_sweep(root: Path) -> Path:
    """Three encodings × two seeds, one of them (learned) not applicable past its table; a group key whose
    values hold LaTeX's and markdown's special characters."""
    sweep = root / "lm"
    curves = {"rope": [3.41, 3.0, 3.52, 6.83, 14.2], "alibi": [3.5, 3.1, 3.05, 3.2, 3.44],
              "learned": [3.6, 3.2, 3.9, None, None]}
    job = 0
    for encoder, ppls in curves.items():
        for seed in (0, 1):
            values = {n: None if p is None else round(p * (1 + 0.013 * seed) + 0.01 * job, 4)
                      for n, p in zip((64, 128, 256, 512, 1024), ppls)}
            note = "a&b_c%" if encoder == "rope" else "x#y$z\\w"
            _write_run(sweep / str(job), _ppl_rows(values, 128), [f"encoder={encoder}", f"seed={seed}"], encoder,
                       seed=seed, config={"data": {"note": note}})
            job += 1
    return sweep


def task_sweep(root: Path) -> Path:
    sweep = root / "task"
    job = 0
    for encoder, accs in {"rope": [1.0, 0.95, 0.4, 0.05], "alibi": [1.0, 0.97, 0.9, 0.7]}.items():
        for seed in (0, 1):
            rows = [{"metric": "accuracy", "task": "copy", "length": n, "multiple": n / 64, "depth": None,
                     "protocol": "teacher_forced", "scaling": None, "scaling_factor": None, "applicable": True,
                     "exact_match": round(a - 0.02 * seed, 3), "exact_match_low": max(0.0, a - 0.1),
                     "exact_match_high": min(1.0, a + 0.05), "token_accuracy": min(1.0, a + 0.03),
                     "examples": 200} for n, a in zip((32, 64, 128, 256), accs)]
            overrides = ["task=copy", f"encoder={encoder}", f"seed={seed}"]
            run = {"label": " ".join(overrides), "overrides": overrides, "encoder": encoder, "train_len": 64,
                   "seed": seed, "status": "completed", "task": {"name": "copy", "options": {}},
                   "config": {"encoder": {"name": encoder}, "seed": seed, "train_len": 64, "task": {"name": "copy"}}}
            folder = sweep / str(job)
            folder.mkdir(parents=True)
            (folder / "results.json").write_text(json.dumps({"run": run, "rows": rows}))
            job += 1
    return sweep


def extension_runs(root: Path) -> Path:
    """A parent (with a YaRN evaluation) and two fine-tunes of it."""
    top = root / "ext"
    lengths = (128, 256, 512)
    parent_rows = _ppl_rows(dict(zip(lengths, (3.0, 4.5, 9.0))), 128)
    parent_rows += _ppl_rows(dict(zip(lengths, (3.0, 3.4, 4.1))), 128, scaling="yarn")
    parent = _write_run(top / "parent", parent_rows, ["encoder=rope"], "rope")
    for name, scaling, ppls in (("ft_direct", None, (3.1, 3.3, 3.9)), ("ft_yarn", "yarn", (3.05, 3.2, 3.5))):
        _write_run(top / name, _ppl_rows(dict(zip(lengths, ppls)), 128), ["encoder=rope"], "rope",
                   extra={"parent": str(parent.resolve()), "scaling": scaling, "finetune": {"steps": 200}})
    return top


def curve_sweep(root: Path) -> Path:
    sweep = root / "curve"
    for job, (encoder, ppl_at) in enumerate((("rope", {100: (6.0, 6.3), 200: (5.0, 6.0), 300: (4.5, 9.0)}),
                                             ("alibi", {100: (6.2, 6.1), 200: (5.4, 5.3), 300: (5.0, 4.9)}))):
        folder = _write_run(sweep / str(job), _ppl_rows({128: ppl_at[300][0]}, 128), [f"encoder={encoder}"],
                            encoder)
        writer = CurveWriter(folder, "perplexity")
        for step, ppls in ppl_at.items():
            writer.write([{"step": step, "length": 128 * m, "multiple": m, "ppl": p, "loss": math.log(p),
                           "tokens": 4096, "eval_s": 0.5} for m, p in zip((1, 4), ppls)])
    return sweep


def window_sweep(root: Path) -> Path:
    """Two seeds, each with plain rows and rows under an attention window of 128 tokens (``eval.window``)."""
    sweep = root / "window"
    for seed in (0, 1):
        rows = _ppl_rows({128: 3.0 + 0.02 * seed, 256: 3.6 + seed * 0.05, 512: 7.5 + 0.1 * seed}, 128)
        windowed = _ppl_rows({128: 3.0 + 0.02 * seed, 256: 3.2 + seed * 0.04, 512: 3.3 + 0.03 * seed}, 128)
        rows += [{**r, "window": 128, "sinks": 4} for r in windowed]
        _write_run(sweep / str(seed), rows, ["encoder=rope", f"seed={seed}"], "rope", seed=seed)
    return sweep


def depth_sweep(root: Path) -> Path:
    """passkey runs with rows at three depths per length (the mean over depths is the cell)."""
    sweep = root / "depth"
    for job, (encoder, accs) in enumerate({"rope": [1.0, 0.9, 0.3], "alibi": [1.0, 1.0, 0.85]}.items()):
        rows = [{"metric": "accuracy", "task": "passkey", "length": n, "multiple": n / 64, "depth": d,
                 "protocol": "teacher_forced", "scaling": None, "scaling_factor": None, "applicable": True,
                 "exact_match": round(max(0.0, a - 0.1 * abs(d - 0.5)), 3), "exact_match_low": max(0.0, a - 0.2),
                 "exact_match_high": 1.0, "token_accuracy": a, "examples": 50}
                for n, a in zip((64, 128, 256), accs) for d in (0.0, 0.5, 1.0)]
        overrides = ["task=passkey", f"encoder={encoder}"]
        run = {"label": " ".join(overrides), "overrides": overrides, "encoder": encoder, "train_len": 64,
               "seed": 0, "status": "completed", "task": {"name": "passkey", "options": {}},
               "config": {"encoder": {"name": encoder}, "seed": 0, "train_len": 64, "task": {"name": "passkey"}}}
        folder = sweep / str(job)
        folder.mkdir(parents=True)
        (folder / "results.json").write_text(json.dumps({"run": run, "rows": rows}))
    return sweep


# name -> (the folders' builders, the report's options)
CASES = {
    "lm_default": (("lm",), {}),
    "lm_by_metrics": (("lm",), {"by": "encoder", "metrics": "ratio@4x,ppl@2x,maxlen@20%,auc@8x", "sort": "-auc@8x"}),
    "lm_by_note_margin": (("lm",), {"by": "data.note", "margin": "5%"}),
    "lm_pivot": (("lm",), {"by": "data.note", "cols": "seed"}),
    "lm_where": (("lm",), {"where": "encoder!=learned", "metrics": "ratio,gain"}),
    "task_default": (("task",), {}),
    "task_by": (("task",), {"by": "encoder", "metrics": "acc@2x,tok@4x,maxlen@rel80,efflen@85"}),
    "mixed": (("lm", "task"), {"by": "encoder"}),
    "extension": (("ext",), {}),
    "curve": (("curve",), {}),
    "lm_baseline": (("lm",), {"by": "encoder", "baseline": "encoder=alibi", "metrics": "ratio,maxlen@50%,slope@4x"}),
    "ext_cols_scaling": (("ext",), {"cols": "scaling"}),
    "ext_view_yarn": (("ext",), {"view": "scaling=yarn"}),
    "window_cols": (("window",), {"cols": "window"}),
    "window_view": (("window",), {"view": "window=128"}),
    "task_depths": (("depth",), {"metrics": "acc@2x,efflen@85"}),
    "ext_longer": (("ext512",), {}),
    "ext_longer_by": (("ext512",), {"by": "scaling", "metrics": "ratio,ratio@4x"}),
    "hf_cols_scaling": (("hf",), {"cols": "scaling"}),
    "hf_by_model_cols_scaling": (("hf",), {"by": "hf.model", "cols": "scaling"}),
}
BUILDERS = {"lm": lm_sweep, "task": task_sweep, "ext": extension_runs, "curve": curve_sweep, "window": window_sweep,
            "depth": depth_sweep, "hf": pretrained_sweep, "ext512": longer_finetunes}


def _render(root: Path, case: str, fmt: str) -> dict[str, str]:
    folders, opts = CASES[case]
    out = Path("out") / case / fmt
    buf, err = io.StringIO(), io.StringIO()
    width = 160 if fmt == "rich160" else 80
    console = Console(file=buf, width=width, color_system=None, force_terminal=False, legacy_windows=False)
    err_console = Console(file=err, width=width, color_system=None, force_terminal=False, legacy_windows=False)
    options = ReportOptions(fmt=fmt if not fmt.startswith("rich") else "rich", **opts)
    report_main([Path(f) for f in folders], out=out, options=options, console=console, err_console=err_console)
    texts = {"stdout": buf.getvalue(), "stderr": err.getvalue()}
    if fmt == "markdown":  # the files are the same whatever the format printed
        for file in sorted(out.iterdir()):
            if file.suffix in TEXT_FILES:
                texts[file.name] = file.read_text()
    return texts


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden")
    for build in BUILDERS.values():
        build(root)
    return root


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", list(CASES))
def test_report_output_is_the_golden_one(runs_root, case, fmt, monkeypatch):
    """Figures are not compared (and not drawn, to keep this fast): the text is."""
    import posexp.plots.accuracy
    import posexp.plots.curve
    import posexp.plots.perplexity

    for module in (posexp.plots.perplexity, posexp.plots.accuracy, posexp.plots.curve):
        for name in dir(module):
            if name.startswith("plot_"):
                monkeypatch.setattr(module, name, _no_figure)
    monkeypatch.chdir(runs_root)
    texts = _render(runs_root, case, fmt)
    folder = GOLDEN / case / fmt
    if REGEN:
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        for name, text in texts.items():
            (folder / name).write_text(text)
    expected = {f.name: f.read_text() for f in folder.iterdir()}
    assert sorted(texts) == sorted(expected)
    for name, text in texts.items():
        diff = "".join(difflib.unified_diff(expected[name].splitlines(True), text.splitlines(True), "golden", "now"))
        assert not diff, f"{case}/{fmt}/{name} differs:\n{diff}"
