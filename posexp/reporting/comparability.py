"""Which runs of a report cannot be compared with the others: another corpus, other evaluation settings or
another training length than the majority. Such runs are flagged and named, never averaged in silently."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, Optional, Sequence

from posexp.reporting.formatting import fmt_settings, short_id
from posexp.reporting.runs import base_train_len


def text_key(row: Any) -> Any:
    """What makes two runs' numbers one quantity: the same tokens (the corpus fingerprint), or, for rows compared per
    byte (their tokenizers differ), the same text (the text fingerprint)."""
    info = row.run.info
    return info.get("text_fingerprint") if row.per_byte else info.get("corpus_fingerprint")


def flag_outliers(rows: Sequence[Any], warnings: list[str],
                   train_len_varies: bool = False) -> tuple[Optional[int], tuple, Any]:
    """Flag runs whose corpus, eval settings or training length differ from the majority.

    Args:
        rows: the report's rows (:class:`~posexp.reporting.lm_report.ReportRow`); flags are appended to them.
        warnings: the report's warnings; one is appended per flagged run.
        train_len_varies: the training length is a compared variable (``--by train_len``): do not flag it.

    Returns:
        The majority training length, (corpus, fingerprint) and eval settings.
    """

    def majority(values: list[Any]) -> Any:
        # Compare through canonical JSON so dicts (eval settings) can be counted;
        # ties go to the value seen first, i.e. the first run.
        keys = [json.dumps(v, sort_keys=True, default=str) for v in values]
        top = Counter(keys).most_common(1)[0][0]
        return values[keys.index(top)], keys

    # the settings of the rows each run shows (ReportRow.settings), not what the run recorded when it trained:
    # a later posexp eval may have measured them otherwise
    infos = [{**row.run.info, "eval_settings": row.settings, "compared_text": text_key(row)} for row in rows]
    # A run that stopped before it read its data or evaluated has no fingerprint or eval settings:
    # unknown is not different (its status is flagged already), so it neither votes nor is flagged.
    unknown = [row.run.status != "completed" for row in rows]

    def majority_known(key: str) -> tuple[Any, list[str]]:
        values = [i.get(key) for i in infos]
        known = [v for v, u in zip(values, unknown) if not (u and v is None)] or values
        value, _ = majority(known)
        top = json.dumps(value, sort_keys=True, default=str)
        keys = [top if u and v is None else json.dumps(v, sort_keys=True, default=str)
                for v, u in zip(values, unknown)]
        return value, keys

    corpus_fp, fp_keys = majority_known("compared_text")
    corpus_name = next((i.get("corpus") for i in infos if i.get("compared_text") == corpus_fp), None)
    eval_settings, eval_keys = majority_known("eval_settings")
    # a fine-tune changes its training length by design: it is compared at its parent's
    train_len, len_keys = majority([base_train_len(row.run) for row in rows])

    checks = [
        (fp_keys, "different corpus", lambda i: f"corpus {i.get('corpus')} ({short_id(i.get('compared_text'))}) "
                                                f"vs {corpus_name} ({short_id(corpus_fp)}) for the others"),
        (eval_keys, "different eval settings", lambda i: f"eval settings {fmt_settings(i.get('eval_settings'))} "
                                                         f"vs {fmt_settings(eval_settings)} for the others"),
        (len_keys, "different train length", lambda i: f"trained at {i.get('parent_train_len') or i.get('train_len')} "
                                                       f"tokens vs {train_len} for the others"),
    ][:2 if train_len_varies else 3]
    for keys, flag, detail in checks:
        top = Counter(keys).most_common(1)[0][0]
        for row, key in zip(rows, keys):
            if key != top:
                row.flags += [flag] if flag not in row.flags else []  # a flag once, whichever check found it
                warnings.append(f"{row.label}: {flag}, {detail(row.run.info)}; not comparable with the other runs")
    return train_len, (corpus_name, corpus_fp), eval_settings
