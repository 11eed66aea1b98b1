"""``posexp eval RUN eval.scaling=REMAPPING`` on a trained run: the rows of each remapping's options kept apart and
recorded, and a wrong option said in one line naming its key (the remappings themselves: tests/unit/encoders/
test_remapping.py)."""

from __future__ import annotations

import pytest

from posexp.encoders.remapping import Remapping


def test_posexp_eval_keeps_rows_of_different_options_apart_and_records_them(trained, tmp_path):
    import json
    import shutil

    from helpers import invoke

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    lengths = "eval.lengths=[64,256]"
    for extra in ((), ("eval.string_offset=12",), ("eval.string_offset=12", "eval.string_local=4")):
        result = invoke("eval", str(run), "eval.scaling=string", lengths, "eval.tokens=512", *extra)
        assert result.exit_code == 0, result.output
    rows = [r for r in json.loads((run / "results.json").read_text())["rows"] if r.get("scaling") == "string"]
    train_len = json.loads((run / "results.json").read_text())["run"]["train_len"]
    default, offset = (Remapping.of("string", o, train_len, 64).text for o in ({}, {"string_offset": 12}))
    assert sorted({r["scaling_options"] for r in rows}) == sorted({default, offset, "offset=12 local=4"})
    assert len(rows) == 6 and all(r["applicable"] and r["scaling_factor"] is None for r in rows)


@pytest.mark.parametrize("args,line", [
    (("eval.scaling=self_extend", "eval.dca_chunk=8"),
     "eval.dca_chunk: only applies with eval.scaling=dca (scaling is self_extend); drop it or set eval.scaling=dca"),
    (("eval.scaling=string", "eval.string_offset=10", "eval.string_local=20"),
     "eval.string_local: must be smaller than eval.string_offset (got 20)"),
    (("eval.scaling=dca", "eval.scaling_factor=2"), "eval.scaling_factor: dca has no factor"),
    (("eval.scaling=ms_poe", "eval.window=8"), "eval.window: ms_poe remaps positions over the whole causal past"),
    (("eval.scaling=selfextend",), "eval.scaling: unknown scaling 'selfextend'; choose one of: none, linear, ntk, "
                                   "dynamic_ntk, yarn, llama3, longrope, rerope, self_extend, string, dca, ms_poe"),
])
def test_a_wrong_option_is_one_line_naming_the_key(trained, args, line):
    from helpers import invoke

    result = invoke("eval", str(trained), *args)
    assert result.exit_code == 2, result.output
    errors = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(errors) == 1 and line in errors[0], result.output
