"""The shipped tasks as the tests build them (passkey's and babilong's text a fixed filler), and a reference
solver per task written from its description, not from posexp's generator: a test checks the answer an instance
marks against what the solver reads from the instance's tokens."""

from __future__ import annotations

import re

import numpy as np

from posexp.config.schema import config_dir
from posexp.tasks import PAD, TASKS, Task
from posexp.tasks.passkey import Passkey

SHIPPED = sorted(p.stem for p in (config_dir() / "task").glob("*.yaml") if p.stem != "lm")
FILLER = np.frombuffer(b"The grass is green. The sky is blue. 0123 456 789 " * 40, dtype=np.uint8).astype(np.int64)


def make(name: str, **options) -> Task:
    if name == "passkey":
        return Passkey(FILLER[:1500], FILLER[500:], **options)
    if name == "babilong":
        return TASKS[name](FILLER[:1500], FILLER[500:], **options)
    return TASKS[name](**options)


def unpadded(row: np.ndarray) -> np.ndarray:
    """An instance without its padding."""
    start = 0
    while start < row.size and row[start] == PAD:
        start += 1
    return row[start:]


# RULER's tasks and key-value retrieval: markers 1 (NEEDLE / VAR / QUERY) and 2 (QUERY) never stand for a key,
# value, variable or word, so a solver finds the statements and the question by them.


def solve_niah(seq: list[int]) -> list[int]:
    """Needles ``1 k v``, then one ``2 k`` asking for every value of ``k`` in the order they appear (1 for single
    and multikey), or ``2 k v`` once per key (multiquery)."""
    q = seq.index(2)
    needles = [(seq[i + 1], seq[i + 2]) for i in range(q) if seq[i] == 1]
    values = lambda key: [v for k, v in needles if k == key]  # noqa: E731
    question = seq[q:]
    if question.count(2) > 1:  # multiquery: every key asked once
        asked = question[1::3]
        assert sorted(asked) == sorted(k for k, _ in needles) and len(set(asked)) == len(asked)
        return [values(k)[0] for k in asked]
    key = question[1]
    assert values(key), "the key asked is in no needle"
    return values(key) if len(question) > 3 else values(key)[:1]


def solve_vartrack(seq: list[int]) -> list[int]:
    """Statements ``1 x rhs``; ``2 v`` asks for every variable that holds ``v``, in the order they are assigned."""
    q = seq.index(2)
    assigned = {seq[i + 1]: seq[i + 2] for i in range(q) if seq[i] == 1}
    order = [seq[i + 1] for i in range(q) if seq[i] == 1]
    assert len(order) == len(assigned)  # each variable assigned once

    def holds(x: int) -> int:
        while x in assigned:
            x = assigned[x]
        return x

    value = seq[q + 1]
    return [x for x in order if holds(x) == value]


def solve_top_words(seq: list[int]) -> list[int]:
    """Words, then ``1`` and the k most frequent words (as many as answer tokens) in the order they first appear."""
    q = seq.index(1)
    words, k = seq[:q], len(seq) - q - 1
    counts: dict[int, int] = {}
    for w in words:
        counts[w] = counts.get(w, 0) + 1
    ranked = sorted(counts.values(), reverse=True) + [0]
    assert ranked[k - 1] > ranked[k], "the top k is not clear"
    top = {w for w, c in counts.items() if c >= ranked[k - 1]}
    return sorted(top, key=words.index)


def solve_kv_retrieval(seq: list[int]) -> list[int]:
    """Pairs ``k k v v``, then ``1 k k`` and the value of that key."""
    q = seq.index(1)
    assert q % 4 == 0
    table = {tuple(seq[i:i + 2]): seq[i + 2:i + 4] for i in range(0, q, 4)}
    assert len(table) == q // 4  # distinct keys
    return table[tuple(seq[q + 1:q + 3])]


# bAbI's facts as babilong writes them into the text
FACT = re.compile(rb"(Mary|John|Sandra|Daniel) (went to|picked up|dropped) the (\w+)\.\n")


def solve_babilong(text: bytes) -> list[int]:
    """The answer bytes bAbI's rules give for the facts and question in ``text`` (the reference)."""
    body, _, question = text.rpartition(b"\nQ: ")
    where: dict[bytes, bytes] = {}
    holder: dict[bytes, bytes] = {}
    last_place: dict[bytes, bytes] = {}
    for who, verb, what in FACT.findall(body):
        if verb == b"went to":
            where[who] = what
        elif verb == b"picked up":
            holder[what] = who
        else:
            last_place[what] = where[who]
            del holder[what]
    if m := re.match(rb"Where is the (\w+)\? A: ", question):
        obj = m.group(1)
        return list(where[holder[obj]] if obj in holder else last_place[obj])
    if m := re.match(rb"Where is (\w+)\? A: ", question):
        return list(where[m.group(1)])
    m = re.match(rb"How many objects is (\w+) carrying\? A: ", question)
    assert m, question
    return list([b"none", b"one", b"two", b"three"][sum(h == m.group(1) for h in holder.values())])
