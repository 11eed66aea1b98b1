"""What a run trains on, whichever it is: the corpus of ``data`` (``task=lm``) or a generated task.

The recipe of ``posexp train`` and ``posexp eval`` reads the vocabulary, the fingerprint that names the
training data (the sweep cache keys on it, results.json records it) and the provenance from here, and
never asks which of the two it has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from posexp.config.schema import Config, eval_lengths
from posexp.data.tokens import Corpus
from posexp.tasks import Task, build_task, task_class, task_code, task_fingerprint


def reads_data(task_cfg: Mapping[str, Any]) -> bool:
    """Whether the task of a ``task`` config reads ``data`` (its filler: passkey, babilong), as its class says
    (``uses_data``); the others generate everything."""
    return task_class(task_cfg).uses_data


@dataclass
class TrainingSource:
    """A corpus or a task, with what the commands need of either."""

    vocab_size: int
    fingerprint: str
    corpus: Optional[Corpus] = None
    task: Optional[Task] = None

    @classmethod
    def of_corpus(cls, corpus: Corpus) -> "TrainingSource":
        return cls(corpus.vocab_size, corpus.fingerprint, corpus=corpus)

    @classmethod
    def of_task(cls, cfg: Config, corpus: Optional[Corpus] = None) -> "TrainingSource":
        """The task of ``cfg.task`` (passkey's filler from ``corpus``), checked against the run's lengths.

        Raises:
            ConfigError: a length too short for one instance, or more than the task (or its filler) can build.
        """
        task = build_task(cfg.task, corpus.train if corpus is not None else None,
                          corpus.val if corpus is not None else None)
        check_task_lengths(task, int(cfg.train_len), eval_lengths(cfg))
        if corpus is not None and task.uses_data:
            task.check_filler(task.size_for(int(cfg.train_len)), "train")
            task.check_filler(task.size_for(max(eval_lengths(cfg))), "val")
        data = corpus.fingerprint if corpus is not None and task.uses_data else None
        return cls(task.vocab_size, task_fingerprint(task, data), task=task, corpus=corpus)

    def sources(self) -> dict:
        """What results.json records of the code of a task of the user's: ``task_source``
        (:func:`posexp.registry.code_record`), as a plugin encoder's ``encoder_source``; {} for posexp's own."""
        record = task_code(type(self.task)) if self.task is not None else None
        return {"task_source": record} if record is not None else {}

    def info(self) -> dict:
        """What results.json records of the training data."""
        if self.task is None:
            return self.corpus.info()
        task = self.task
        out = {"corpus": f"generated: task {task.name}", "corpus_fingerprint": self.fingerprint,
               "tokenizer": "task", "vocab_size": self.vocab_size}
        if self.corpus is not None and task.uses_data:
            out.update(corpus=f"task {task.name}, filler from {self.corpus.name}", tokenizer=self.corpus.tokenizer,
                       data_fingerprint=self.corpus.fingerprint, corpus_source=self.corpus.source)
        out["task"] = {"name": task.name, "options": task.options(), "min_size": task.min_size,
                       "citation": task.citation, "generator_version": task.generator_version(),
                       "fingerprint": self.fingerprint}
        return {**out, **self.sources()}

    def describe(self) -> str:
        """For the line a run starts with."""
        if self.task is None:
            c = self.corpus
            return f"data {c.name} ({c.train.size:,} train / {c.val.size:,} val tokens)"
        options = ", ".join(f"{k} {v}" for k, v in self.task.options().items())
        filler = f", filler from {self.corpus.name}" if self.corpus is not None and self.task.uses_data else ""
        return f"task {self.task.name}{f' ({options})' if options else ''}, vocab {self.vocab_size}{filler}"


def check_task_lengths(task: Task, train_len: int, lengths: list[int]) -> None:
    """``train_len`` and every eval length hold one instance of ``task.min_size``, and no more than the task builds.

    Raises:
        ConfigError: naming ``train_len`` or ``eval.lengths``.
    """
    task.check_length(train_len, "train_len")
    for length in lengths:
        task.check_length(length, "eval.lengths")

