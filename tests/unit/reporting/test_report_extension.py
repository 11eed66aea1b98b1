"""The context-extension table of ``posexp report PARENT FINETUNES``: what each line shows."""

from __future__ import annotations

from helpers.runs import ppl_rows, write_run

from posexp.reporting.extension import build_extension_table, extension_runs
from posexp.reporting.runs import read_run


def _remapped(ppls: dict[int, float | None], scaling: str, factor, options: str | None) -> list[dict]:
    return [{**r, "scaling_factor": factor, "scaling_options": options} for r in ppl_rows(ppls, 64, scaling)]


def test_each_setting_the_parent_was_evaluated_with_is_its_own_line(tmp_path):
    """A parent evaluated with string at its defaults, then again at 256 with another offset, and with yarn at the
    default per-length factor and at a fixed factor: each setting its own line, every cell its own row's number
    (the later evaluation's number shown on the default's line before)."""
    rows = ppl_rows({64: 7.0, 128: 8.0, 256: 9.0}, 64)
    rows += _remapped({64: 7.1, 128: 7.5, 256: 8.7}, "string", None, "offset=21 local=4")
    rows += _remapped({256: 8.4}, "string", None, "offset=64 local=4")
    rows += ppl_rows({64: 7.0, 128: 7.6, 256: 8.3}, 64, "yarn")
    rows += [{**r, "scaling_factor": 8.0} for r in ppl_rows({128: 9.9}, 64, "yarn")]
    rows += _remapped({128: 7.4, 256: 7.7}, "self_extend", 4.0, "window=16")
    rows += _remapped({64: 7.2, 128: 7.3, 256: 7.6}, "rerope", 32.0, None)
    parent = write_run(tmp_path / "parent", rows, ["encoder=rope"], "rope", train_len=64)
    ft = write_run(tmp_path / "ft", ppl_rows({256: 7.9}, 256), ["encoder=rope"], "rope", train_len=256,
                   extra={"parent": str(parent.resolve()), "scaling": "yarn", "finetune": {"steps": 20}})
    table = build_extension_table(*extension_runs([read_run(parent), read_run(ft)]))
    shown = {line.label: line.ppl for line in table.lines if line.kind == "eval"}
    assert shown == {"+string offset=21 local=4 (eval)": {64: 7.1, 128: 7.5, 256: 8.7},
                     "+string offset=64 local=4 (eval)": {256: 8.4},
                     "+yarn (eval)": {64: 7.0, 128: 7.6, 256: 8.3},
                     "+yarn ×8 (eval)": {128: 9.9},
                     "+self_extend group=4 (eval)": {128: 7.4, 256: 7.7},
                     "+rerope w=32 (eval)": {64: 7.2, 128: 7.3, 256: 7.6}}
    factors = {line.label: line.scaling_factor for line in table.lines if line.scaling == "yarn"}
    assert factors == {"+yarn (eval)": None, "+yarn ×8 (eval)": 8.0, "+yarn ft→256, 20 steps": None}


def test_a_setting_not_applicable_to_the_parent_is_not_said_to_be_measured_on_other_tokens(tmp_path):
    """ms_poe leaving every layer of a 2-layer parent as trained: its rows are n/a (no tokens scored), which is no
    reason to warn that they scored other tokens than the parent's."""
    rows = ppl_rows({64: 7.0, 128: 8.0}, 64)
    rows += [{**r, "tokens": 0, "windows": 0} for r in
             _remapped({64: None, 128: None}, "ms_poe", None, "min=1.2 max=1.8 skip_layers=2")]
    parent = write_run(tmp_path / "parent", rows, ["encoder=rope"], "rope", train_len=64)
    ft = write_run(tmp_path / "ft", ppl_rows({128: 7.9}, 128), ["encoder=rope"], "rope", train_len=128,
                   extra={"parent": str(parent.resolve()), "scaling": "yarn", "finetune": {"steps": 20}})
    table = build_extension_table(*extension_runs([read_run(parent), read_run(ft)]))
    assert [line.ppl for line in table.lines if line.kind == "eval"] == [{64: None, 128: None}]
    assert not table.warnings, table.warnings
