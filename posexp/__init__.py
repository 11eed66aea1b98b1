"""posexp: train small causal LMs with one positional encoding each and measure how
their perplexity holds up at longer contexts than they were trained on.

How it is built
---------------
One direction of data, each stage handing a plain object to the next; each idea
has one home, and the subpackages name the layers, from the command line down::

    posexp train ARGS ─► cli/        the Typer app; what the user typed is checked before Hydra
                                     composes configs/ onto the schemas (config/), each job and its
                                     folder on the config Hydra composed
                      ─► commands/   the recipe (train, eval, resume, finetune, sweeps) and, beside
                                     it, validation.py: ranges, combinations, whether it fits in memory
                           ├─ data/        text ─► tokenizer ─► cached train/val token arrays ─► batches
                           ├─ tasks/       or task=copy|reverse|...: seeded instances with an answer mask
                           ├─ model/       the encoder (encoders/) inside a GPT: model/factory.py builds both
                           ├─ runtime/     device, precision, memory: one owner of each
                           ├─ training/    the loop, optimizer, resumable checkpoints, the sweep cache, torchrun
                           ├─ evaluation/  perplexity per length x protocol x scaling (accuracy for a task) ─► rows,
                           │               reading any model through the seam (model/interface.py)
                           ├─ hf/          a transformers model behind the seam (posexp eval hf:MODEL), and
                           │               a run exported as a transformers folder (posexp export)
                           ├─ runs/        the run folder: layout, lock, provenance, results.json, row format
                           └─ rendering/   what a run folder shows a person: results.md/.csv, figures
                           (train, eval and resume also report to tracking/: logger=tensorboard|mlflow|wandb)
    posexp report DIRS ─► reporting/   runs ─► groups, metrics, t-intervals ─► 5 formats, report.md
    posexp analyze     ─► analysis/    the geometry of an encoding's hooks, the attention of trained runs
                          plots/       every figure, in one house style

Who may import whom (``tests/unit/project/test_layout.py`` checks it, with no import cycle,
lazy imports included):

- ``config/`` (schemas, the rule of what shapes the weights and its hash) is a
  leaf; ``encoders/`` imports nothing of posexp but :mod:`posexp.errors`.
- ``model/``, ``runtime/``, ``data/``, ``tasks/``, ``training/`` and
  ``evaluation/`` sit below the commands and never import ``commands/``,
  ``reporting/`` or ``analysis/``; ``training/`` does not import
  ``evaluation/``, and ``tasks/`` is torch-free.
- ``runs/``'s layout and lock, ``plots/`` and ``reporting/`` are torch-free,
  so ``posexp report`` runs where no model can be built; ``reporting/`` reads
  run folders only through :mod:`posexp.runs.layout`.
- ``tracking/`` knows results rows and run folders, not the model or the data.
- ``commands/`` may import anything below it; only ``cli/`` imports
  ``analysis/``, and nothing below ``commands/`` imports ``cli/``.
- ``cli/`` imports what loads torch only inside the command that runs it, so
  ``posexp --help`` and ``posexp report`` start without torch.

Where the next one goes:

- An encoding: one file in ``posexp/encoders/`` (a ``PositionalEncoder``
  subclass with ``@register``, the hook contract in
  :mod:`posexp.encoders.contract`) and one yaml in ``configs/encoder/``.
- An experiment tracker: one file in ``posexp/tracking/`` (a ``Tracker``
  subclass with ``@TRACKERS.register``; its options are the keyword arguments
  of its ``start``) and one yaml in ``configs/logger/``.
- A task: one file in ``posexp/tasks/`` (a ``Task`` subclass with
  ``@TASKS.register``; its options are its ``__init__``'s keyword arguments)
  and one yaml in ``configs/task/``; ``tests/unit/tasks/test_tasks.py`` picks it up from
  the yaml and needs an independent solver for it.
- A transformers export: one file in ``posexp/hf/exporters/`` (an
  ``Exporter`` subclass with ``@EXPORTERS.register``) saying which encoder it
  takes and why it refuses a run.
  Encoders, tasks, trackers and exporters are found by name the same way
  (:mod:`posexp.registry`), from outside posexp too: an installed package's
  entry point (``posexp.tasks``, ``posexp.trackers``, ``posexp.exporters``),
  or for a task or tracker the ``module`` key of its yaml.
- A kind of evaluation: a module in ``posexp/evaluation/`` that returns rows
  for ``runs/`` to write, reading the model only through
  :class:`posexp.model.interface.EvaluableLM`; a row's ``"metric"`` (``"perplexity"``,
  ``"accuracy"``) says which tables it belongs in.
"""

__version__ = "0.1.0"

# The Python API, imported on first use so that ``import posexp`` stays light (no torch, no pandas):
# name -> the module that defines it.
_API = {
    "load_run": "posexp.commands.loading",  # one run: config, results, curve, the trained model
    "load_runs": "posexp.reporting.frame",  # many runs' result rows as one pandas DataFrame
    "find_runs": "posexp.runs.layout",  # the run folders under run or sweep folders
    "create": "posexp.encoders",  # an encoder for a model of one's own: create("rope", d_model=..., n_heads=...)
}
__all__ = list(_API)


def __getattr__(name: str):
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'posexp' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__"])
