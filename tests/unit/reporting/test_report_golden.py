"""``posexp report``'s outputs, byte for byte, against golden files: every table kind (perplexity, pivot,
context extension, task, curve section) through every format (rich at 80 and 160 columns, markdown, csv,
json, latex) and the files a report writes (report.md, summary.md, summary.csv, the lead table's csv/tex).

The runs are built here, deterministically, in a temporary folder; paths are written relative to it. After a
deliberate change of the output, regenerate with ``POSEXP_REGEN_GOLDEN=1 pytest tests/unit/reporting/test_report_golden.py``
and read the diff before committing it.
"""

from __future__ import annotations

import difflib
import hashlib
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

GOLDEN = Path(__file__).parent / "golden" / "report"
REGEN = os.environ.get("POSEXP_REGEN_GOLDEN") == "1"
FORMATS = ("rich80", "rich160", "markdown", "csv", "json", "latex")
TEXT_FILES = (".md", ".csv", ".tex", ".json")


def _ppl_rows(ppls: dict[int, float | None], train_len: int, scaling: str | None = None,
              protocol: str = "nonoverlap") -> list[dict]:
    return [{"length": n, "multiple": n / train_len, "protocol": protocol, "scaling": scaling,
             "scaling_factor": None if scaling is None else max(1.0, n / train_len),
             "applicable": p is not None, "ppl": p, "loss": None if p is None else math.log(p), "loss_se": 0.01,
             "ppl_low": None if p is None else p * 0.98, "ppl_high": None if p is None else p * 1.02,
             "tokens": 65536, "windows": 65536 // n, "tokens_per_s": 40000.0, "peak_mem_mb": 210.0}
            for n, p in ppls.items()]


def _write_run(folder: Path, rows: list[dict], overrides: list[str], encoder: str, seed: int = 0,
               train_len: int = 128, base: float | None = 10000.0, extra: dict | None = None,
               config: dict | None = None) -> Path:
    run = {"label": " ".join(overrides) or "default", "overrides": overrides, "encoder": encoder, "base": base,
           "train_len": train_len, "seed": seed,
           "config": {"encoder": {"name": encoder}, "base": base, "train_len": train_len, "seed": seed,
                      **(config or {})},
           "config_hash": hashlib.sha256(folder.as_posix().encode()).hexdigest()[:16], "corpus": "stdlib", "corpus_fingerprint": "fp-stdlib",
           "eval_settings": {"tokens": 65536, "protocol": "nonoverlap"},
           "versions": {"posexp": "0.1.0", "torch": "2.13.0", "python": "3.11.7"}, "git_commit": None,
           "status": "completed", "params": 821504,
           "train": {"steps": 1000, "tokens": 4096000, "final_loss": 1.23, "wall_s": 120.0}, **(extra or {})}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps({"run": run, "rows": rows}))
    return folder


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


def longer_finetunes(root: Path) -> Path:
    """A parent trained at 128 and its fine-tunes to 512, the parent evaluated again on another token budget since:
    its rows at 256 and 512 scored other tokens than the fine-tunes'."""
    top = root / "ext512"
    lengths = (128, 256, 512, 1024)
    parent_rows = _ppl_rows(dict(zip(lengths, (3.0, 4.5, 9.0, 20.0))), 128)
    for row in parent_rows:
        if row["length"] >= 256:
            row.update(tokens=131072, eval_tokens=131072)
    parent = _write_run(top / "parent", parent_rows, ["encoder=rope"], "rope")
    for name, scaling, ppls in (("ft_direct", None, (3.2, 3.1, 3.0, 6.0)), ("ft_yarn", "yarn", (3.1, 3.0, 2.9, 3.4))):
        rows = [{**r, "multiple": r["length"] / 512} for r in _ppl_rows(dict(zip(lengths, ppls)), 512)]
        _write_run(top / name, rows, ["encoder=rope", f"finetune={name}"], "rope", train_len=512,
                   extra={"parent": str(parent.resolve()), "parent_train_len": 128, "scaling": scaling,
                          "finetune": {"steps": 150}})
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


def pretrained_sweep(root: Path) -> Path:
    """``posexp eval -m hf:tiny eval.scaling=none,yarn`` and the same with ``task=passkey``: a folder per scaling
    and task, one model throughout."""
    sweep = root / "hf"
    record = {"name": "tiny", "revision": "abc123", "weights_sha256": None, "parameters": 1000}
    ppls = {"none": (3.0, 4.4, 9.1), "yarn": (3.0, 3.3, 3.9)}
    accs = {"none": (1.0, 0.5, 0.0), "yarn": (1.0, 0.9, 0.6)}
    job = 0
    for scaling in ("none", "yarn"):
        overrides = ["hf.model=tiny", f"eval.scaling={scaling}"]
        rows = _ppl_rows(dict(zip((128, 256, 512), ppls[scaling])), 128, None if scaling == "none" else "yarn")
        _write_run(sweep / str(job), rows, overrides, "hf:tiny", extra={"pretrained": record},
                   config={"hf": {"model": "tiny"}})
        job += 1
    for scaling in ("none", "yarn"):
        overrides = ["hf.model=tiny", "task=passkey", f"eval.scaling={scaling}"]
        rows = [{"metric": "accuracy", "task": "passkey", "length": n, "multiple": n / 128, "depth": d,
                 "protocol": "teacher_forced", "scaling": None if scaling == "none" else "yarn",
                 "scaling_factor": None, "applicable": True, "exact_match": a, "exact_match_low": 0.0,
                 "exact_match_high": 1.0, "token_accuracy": a, "examples": 20, "examples_asked": 20, "eval_seed": 0}
                for n, a in zip((128, 256, 512), accs[scaling]) for d in (0.0, 1.0)]
        _write_run(sweep / str(job), rows, overrides, "hf:tiny",
                   extra={"pretrained": record, "task": {"name": "passkey", "options": {}, "zero_shot": True}},
                   config={"hf": {"model": "tiny"}, "task": {"name": "passkey"}})
        job += 1
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


def _no_figure(*args, **kwargs) -> None:
    return None


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
