"""``task=babilong``: reasoning in a haystack, bAbI-like facts hidden in ``data`` text.

Kuratov et al. 2024 ("BABILong: Testing the Limits of LLMs with Long Context Reasoning-in-a-Haystack", §2, and
the authors' ``NoiseInjectionDataset`` in booydar/babilong ``babilong/babilong_utils.py``): the facts of a bAbI
story (Weston et al. 2016) are inserted, in story order, between the sentences of unrelated background text, and
the story's question follows at the end. ``task.variant`` picks the bAbI task:

- ``qa1`` (single supporting fact): people move between places; "Where is Mary?" -- her last move.
- ``qa2`` (two supporting facts): people also pick up and drop objects; "Where is the milk?" -- where its holder
  is, or where it was dropped: the pick-up and a move.
- ``qa7`` (counting): "How many objects is John carrying?" -- none, one, two or three, from every pick-up and
  drop of his; each answer as likely (the story is made for an answer drawn first: four facts drawn at random
  answer "one" 87% of the time, a score a model that never reads them would get).

The stories are generated here (bAbI's own are a download) with bAbI's people, places and objects, every answer
determined by the facts (:func:`answer`); the background is the text of ``data`` (its byte tokens: the training
split for training, the validation split for evaluation), as BABILong's is PG-19. As in the authors' code, the
facts go at sorted random places between background sentences (here: lines, the text being code or prose),
anywhere in training; at a depth ``d`` (``eval.depths``) all of a story's facts lie within the band
``[d - 0.1, d + 0.1]`` of the background (the authors' ``task_start_pct`` / ``task_end_pct``, band width 0.2 as
they recommend), so accuracy by depth says where in the context a model reasons well. An instance of ``size``
background tokens at least is::

    background ... "Mary went to the kitchen.\\n" ... "John went to the garden.\\n" ...
    "\\nQ: Where is Mary? A: " "kitchen"

Each row's background fills what its facts leave, so every instance has exactly ``tokens_for(size)`` tokens. The
answer word is scored, as a byte string, by exact match.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from posexp.errors import ConfigError
from posexp.tasks.passkey import Passkey
from posexp.tasks.task import TASKS, Instances

PEOPLE = ("Mary", "John", "Sandra", "Daniel")
PLACES = ("bathroom", "bedroom", "garden", "hallway", "kitchen", "office")
OBJECTS = ("apple", "football", "milk")
COUNTS = ("none", "one", "two", "three")
VARIANTS = ("qa1", "qa2", "qa7")
COUNTING_VERSION = 2  # qa7's generator: version 1 answered "one" in 87% of stories
# the share of "one" in version 1's qa7 stories (_story's four facts, redrawn until someone handled an object, the
# subject any such person), summed exactly over the draws: what always saying "one" scored
COUNTING_V1_CHANCE = 22887 / 26329
FACTS = 4  # facts per story: short enough for the contexts small models train at
BAND = 0.2  # width of the depth band the facts lie in (the authors recommend task_end_pct - task_start_pct >= 0.2)
NEWLINE = 10
PROMPT = "\nQ: "
_LONGEST_QUESTION = "How many objects is Sandra carrying? A: "


def _fact(event: tuple) -> str:
    kind, who, what = event
    return {"move": f"{who} went to the {what}.\n", "get": f"{who} picked up the {what}.\n",
            "drop": f"{who} dropped the {what}.\n"}[kind]


def _story(variant: str, rng: np.random.Generator) -> list[tuple]:
    """``FACTS`` events ``(kind, person, place or object)`` that a bAbI world allows: a person picks up an object
    nobody holds, once they are somewhere; drops only what they hold."""
    where: dict[str, str] = {}
    held: dict[str, str] = {}  # object -> holder
    events: list[tuple] = []
    while len(events) < FACTS:
        who = PEOPLE[int(rng.integers(len(PEOPLE)))]
        events.append(_act(who, rng.random() if variant != "qa1" else 0.0, where, held, rng))
    return events


def _act(who: str, roll: float, where: dict[str, str], held: dict[str, str], rng: np.random.Generator) -> tuple:
    """The event of ``who`` at ``roll`` in [0, 1] (above 0.7: a drop, above 0.35: a pick-up, where the world allows
    it; else a move), done to the world ``where`` / ``held``."""
    free = [o for o in OBJECTS if o not in held]
    mine = [o for o, h in held.items() if h == who]
    if roll > 0.7 and mine:
        obj = mine[int(rng.integers(len(mine)))]
        del held[obj]
        return "drop", who, obj
    if roll > 0.35 and free and who in where:
        obj = free[int(rng.integers(len(free)))]
        held[obj] = who
        return "get", who, obj
    where[who] = PLACES[int(rng.integers(len(PLACES)))]
    return "move", who, where[who]


def _counting_story(count: int, rng: np.random.Generator) -> tuple[list[tuple], str]:
    """A qa7 story whose subject ends up holding ``count`` objects, and the subject: drawn for the answer, so every
    count is as likely (stories drawn as :func:`_story` draws them answer "one" 87% of the time in four facts, and
    "three" one in a thousand). The subject moves, picks up ``count`` objects (none: one, dropped again), in
    that order at random places among the ``FACTS``; the other facts are anyone's events as :func:`_story` draws
    them, the subject's only moves, so its count is its own pick-ups less its drops; asked, as bAbI's counting asks,
    about someone who handled objects."""
    subject = PEOPLE[int(rng.integers(len(PEOPLE)))]
    rolls = [0.0] + [0.5] * max(count, 1) + [1.0] * (count == 0)  # _act's rolls of a move, pick-ups, a drop
    mine, own = set(rng.choice(FACTS, size=len(rolls), replace=False).tolist()), iter(rolls)
    where: dict[str, str] = {}
    held: dict[str, str] = {}
    events = []
    for i in range(FACTS):
        if i in mine:
            events.append(_act(subject, next(own), where, held, rng))
            continue
        who = PEOPLE[int(rng.integers(len(PEOPLE)))]
        events.append(_act(who, rng.random() if who != subject else 0.0, where, held, rng))
    return events, subject


def answer(variant: str, events: list[tuple], subject: str) -> Optional[str]:
    """The answer the facts ``events`` (in story order) give to the question about ``subject``, or None when they
    do not determine one (bAbI asks only what its story answers).

    qa1: the subject's last place. qa2: the object's place: its holder's place while held, where it was dropped
    once dropped (the holder's place then). qa7: how many objects the subject holds.
    """
    where: dict[str, str] = {}
    held: dict[str, str] = {}
    dropped_at: dict[str, Optional[str]] = {}
    for kind, who, what in events:
        if kind == "move":
            where[who] = what
        elif kind == "get":
            held[what], dropped_at[what] = who, None
        else:
            del held[what]
            dropped_at[what] = where.get(who)
    if variant == "qa1":
        return where.get(subject)
    if variant == "qa2":
        if subject in held:
            return where.get(held[subject])
        return dropped_at.get(subject)
    if not any(who == subject and kind != "move" for kind, who, _ in events):
        return None  # bAbI's counting asks about someone who handled objects
    return COUNTS[sum(1 for h in held.values() if h == subject)]


def question(variant: str, subject: str) -> str:
    return {"qa1": f"Where is {subject}? A: ", "qa2": f"Where is the {subject}? A: ",
            "qa7": f"How many objects is {subject} carrying? A: "}[variant]


def _words(options: Mapping[str, Any]) -> tuple[str, ...]:
    """The answer words of the variant a task of recorded ``options`` asks."""
    return COUNTS if options.get("variant") == "qa7" else PLACES


def _subjects(variant: str) -> tuple[str, ...]:
    return OBJECTS if variant == "qa2" else PEOPLE


def _bytes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int64)


def fact_places(background: np.ndarray, count: int, band: tuple[float, float], rng: np.random.Generator) -> np.ndarray:
    """``count`` sorted places in ``background`` (0 .. its length) within ``band`` of it, at line starts where
    the band has any (BABILong inserts facts between sentences), else anywhere in the band."""
    size = background.size
    lo, hi = int(np.ceil(band[0] * size)), int(np.floor(band[1] * size))
    starts = np.flatnonzero(background[max(lo - 1, 0):max(hi, 0)] == NEWLINE) + max(lo - 1, 0) + 1
    starts = starts[(starts >= lo) & (starts <= hi)]
    choices = starts if starts.size else np.arange(lo, hi + 1)
    return np.sort(rng.choice(choices, size=count))  # with replacement, as the authors' gen.choice


def depth_band(depth: Optional[float]) -> tuple[float, float]:
    """The share of the background the facts lie in: all of it in training, ``depth +- BAND / 2`` (clipped)."""
    if depth is None:
        return 0.0, 1.0
    d = float(depth)
    return max(0.0, d - BAND / 2), min(1.0, d + BAND / 2)


@TASKS.register("babilong")
class Babilong(Passkey):
    """bAbI stories in ``data``'s text (module docstring). ``train`` / ``val``: the background's token splits."""

    citation = "Kuratov et al. 2024 (BABILong, reasoning in a haystack)"
    size_unit = "background tokens"

    def __init__(self, train: np.ndarray, val: np.ndarray, variant: Optional[str] = None,
                 min_size: Optional[int] = None):
        super().__init__(train, val, digits=1, min_size=min_size)
        self.variant = str(variant or "qa1")
        if self.variant not in VARIANTS:
            raise ConfigError("task.variant", f"unknown variant {self.variant!r} for task=babilong; choose one of: "
                                              f"{', '.join(VARIANTS)} (single supporting fact, two, counting)")

    @classmethod
    def answer_values(cls, options) -> Optional[int]:
        """The bytes an answer word of the variant is spelled with (places; counts for qa7)."""
        return len(set("".join(_words(options))))

    @classmethod
    def chance(cls, options: Mapping[str, Any], answer_tokens: float, size: Optional[int] = None,
               version: Optional[int] = None) -> Optional[float]:
        """A guess of the answer word: each variant's words are as likely, so 1/6 of places (qa1, qa2), 1/4 of counts
        (qa7), what a model that always says one word scores without reading a fact. A uniform guess of each answer
        byte, far below it (7^-3.5 for counts), would call such a model learned. qa7's instances of an older
        ``version`` were not balanced: always "one" scored :data:`COUNTING_V1_CHANCE` on them."""
        if options.get("variant") == "qa7" and isinstance(version, int) and version < COUNTING_VERSION:
            return COUNTING_V1_CHANCE
        return 1 / len(_words(options))

    def overhead(self) -> int:
        """Tokens of an instance besides its background, for the longest facts, question and answer."""
        longest_fact = max(len(_fact((k, p, w))) for k in ("move", "get", "drop") for p in PEOPLE
                           for w in PLACES + OBJECTS)
        return FACTS * longest_fact + len(PROMPT) + len(_LONGEST_QUESTION) + max(map(len, PLACES + COUNTS))

    def generate(self, size: int, count: int, rng: np.random.Generator, depth: Optional[float] = None,
                 split: str = "train", **options) -> Instances:
        total = self.tokens_for(size)
        self.check_filler(total, split)
        source = self.filler[split]
        tokens = np.empty((count, total), dtype=np.int64)
        answers = np.zeros(tokens.shape, dtype=bool)
        for i in range(count):
            events, subject, said = self._asked(rng)
            facts = [_bytes(_fact(e)) for e in events]
            tail = [_bytes(PROMPT + question(self.variant, subject)), _bytes(said)]
            room = total - sum(f.size for f in facts) - sum(t.size for t in tail)
            start = int(rng.integers(0, source.size - room + 1))
            background = source[start:start + room].astype(np.int64)
            at = fact_places(background, len(facts), depth_band(depth), rng)
            pieces, last = [], 0
            for place, fact in zip(at.tolist(), facts):
                pieces += [background[last:place], fact]
                last = place
            tokens[i] = np.concatenate([*pieces, background[last:], *tail])
            answers[i, total - tail[1].size:] = True
        return Instances(tokens, answers)

    def generator_version(self) -> int:
        """qa7's instances are version 2: each count as likely (:func:`_counting_story`); qa1's and qa2's unchanged."""
        return COUNTING_VERSION if self.variant == "qa7" else super().generator_version()

    def _asked(self, rng: np.random.Generator) -> tuple[list[tuple], str, str]:
        """A story, a subject its facts answer about, and the answer; redrawn until the story answers one (qa7: the
        answer drawn first, uniformly, and a story made for it)."""
        if self.variant == "qa7":
            events, subject = _counting_story(int(rng.integers(len(COUNTS))), rng)
            return events, subject, str(answer(self.variant, events, subject))
        while True:
            events = _story(self.variant, rng)
            subjects = [s for s in _subjects(self.variant) if answer(self.variant, events, s) is not None]
            if subjects:
                subject = subjects[int(rng.integers(len(subjects)))]
                return events, subject, str(answer(self.variant, events, subject))
