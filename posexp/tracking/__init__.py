"""Experiment trackers: TensorBoard, MLflow and Weights & Biases (``logger=...``), several at once.

A run reports to the trackers its config names (``configs/logger/``): the resolved config as
hyperparameters, the training curve at every logging step, every evaluation row, and its figures and
results.json as artifacts. The tracked runs are recorded in the run folder (``trackers.json``), so
``posexp eval`` and ``posexp resume`` append to the same ones.

Each library is an optional extra (``pip install 'posexp[tensorboard]'``, ``[mlflow]``, ``[wandb]``,
``[trackers]`` for all three) and is imported only by a run that uses it: with ``logger=none`` this
package costs nothing but its own standard-library imports. A tracker that fails while a run trains is
left out with a warning; the run's own files are what posexp guarantees.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from posexp.errors import ConfigError, PosexpError
from posexp.registry import MODULE_KEY, code_record, did_you_mean, import_roots
from posexp.runs.layout import is_sweep_dir
from posexp.tracking.tracker import (CALLS, TRACKERS, RunIdentity, Tracker, artifacts, curve_values, eval_points,
                                     option_names, options_schema, read_records, records_problem, unimplemented,
                                     write_records)

log = logging.getLogger("posexp.tracking")
TRACKER_SOURCE = "tracker_source"  # a tracker of the user's module: its code's record in trackers.json (code_record)

def chosen(logger_cfg: Optional[Mapping[str, Any]]) -> list[str]:
    """The trackers a ``logger`` config names (tracker name -> its options; a null one is not chosen, as in the
    configs of runs written before each tracker owned its options), sorted by name."""
    return sorted(name for name, options in (logger_cfg or {}).items() if options is not None)


def missing_library(cls: type[Tracker], name: str) -> Optional[str]:
    """What tracker ``name`` (its class ``cls``) lacks here (``needs the wandb package, which is not installed: pip
    install ...``), or None. Looks the library up without importing it."""
    needs = cls.needs_module
    if needs and importlib.util.find_spec(needs) is None:
        return f"needs the {needs} package, which is not installed: pip install 'posexp[{name}]'"
    return None


def tracker_options(name: str, options: Optional[Mapping[str, Any]]) -> tuple[type[Tracker], dict[str, Any]]:
    """The class of tracker ``name`` and its ``logger.NAME`` options, checked against its :meth:`Tracker.start`.

    Raises:
        ConfigError: an unknown tracker, or on ``logger.NAME.KEY`` a key it does not take.
    """
    given = dict(options or {})
    module = given.pop(MODULE_KEY, None)
    cls = _tracker_class(name, module)
    allowed = option_names(cls)
    for key in given:
        if key not in allowed:
            raise ConfigError(f"logger.{name}.{key}", option_refusal(name, key, module))
    return cls, given


def option_refusal(name: str, key: str, module: Optional[str] = None) -> str:
    """Why ``logger.NAME.KEY`` is refused: tracker ``name`` (of the user's ``module``, if given) takes no such
    option; naming its options (one line, after ``logger.NAME.KEY: ``)."""
    allowed = option_names(_tracker_class(name, module))
    return (f"not an option of logger {name!r}; {did_you_mean(key, allowed, f'logger.{name}.')}its options are: "
            f"{', '.join(allowed) or 'none'}")


def check_loggers(logger_cfg: Optional[Mapping[str, Any]]) -> None:
    """Everything about the ``logger`` config that can be checked before a run starts.

    Raises:
        ConfigError: a tracker whose package is not installed (naming the extra to install), one that leaves a call
            unimplemented, or a bad option.
    """
    for name in chosen(logger_cfg):
        assert logger_cfg is not None
        cls, options = tracker_options(name, logger_cfg[name])
        problem = missing_library(cls, name)
        if problem is not None:
            raise ConfigError("logger", f"{name} {problem}")
        missing = unimplemented(cls)
        if missing:  # a run would drop the tracker at its first such call, with a bare NotImplementedError
            raise ConfigError("logger", f"{name}: {cls.__qualname__} does not implement {', '.join(missing)}; a "
                                        f"tracker implements each call of Tracker (posexp/tracking/tracker.py): "
                                        f"{', '.join(CALLS)}")
        cls.check(**options)


def _tracker_class(name: str, module: Optional[str] = None, roots: Sequence[str] = ()) -> type[Tracker]:
    """The tracker class registered as ``name`` (:data:`~posexp.tracking.tracker.TRACKERS`), or by the user's
    ``module`` (``logger.NAME.module``), imported from the working folder, else from ``roots``.

    Raises:
        ConfigError: for ``logger``: no tracker has that name (never a default one in its place).
    """
    if module:
        return TRACKERS.from_module(name, str(module), roots)
    return TRACKERS.lookup(name, also=("none",))


class Trackers:
    """The trackers of one run, called together; each failure leaves that tracker out with a warning.

    Args:
        trackers: the open trackers.
        run_dir: where ``trackers.json`` records them.
        warn: how a tracker's failure is told to the user.
    """

    def __init__(self, trackers: list[Tracker], run_dir: Optional[Path] = None,
                 warn: Optional[Callable[[str], None]] = None):
        self.trackers, self.run_dir = list(trackers), run_dir
        self.warn = warn or log.warning

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def _each(self, what: str, call: Callable[[Tracker], None]) -> None:
        for tracker in list(self.trackers):
            try:
                call(tracker)
            except Exception as e:  # a tracker's failure must not lose the run; its files are the record
                self.trackers.remove(tracker)
                self.warn(f"logger={tracker.name}: {what} failed ({type(e).__name__}: {e}); the run goes on "
                          "without it")
                with contextlib.suppress(Exception):  # mark its tracked run failed, if the tracker still can
                    tracker.finish("failed")

    def where(self) -> list[str]:
        """Where each tracked run is, one line per tracker."""
        lines = []
        self._each("saying where it is", lambda t: lines.append(t.where()))
        return lines

    def log_train(self, step: int, loss: float, lr: float, tokens_per_s: float) -> None:
        values = {"loss": loss, "lr": lr, "tokens_per_s": tokens_per_s}
        self._each("logging the training curve", lambda t: t.log_train(step, values))

    def log_curve(self, step: int, rows: list[dict]) -> None:
        """One point of the extrapolation curve (``eval.during_training``; curve.csv's rows of ``step``)."""
        values = curve_values(rows)
        if values:
            self._each("logging the extrapolation curve", lambda t: t.log_curve(step, values))

    def log_results(self, rows: list[dict], run_dir: Path) -> None:
        """Every row given (a train's, or the rows a ``posexp eval`` measured), then the run's artifacts."""
        points = eval_points(rows)
        self._each("logging the evaluation", lambda t: t.log_eval(points, rows))
        files = artifacts(run_dir)
        self._each("storing the results and figures", lambda t: t.log_artifacts(files))

    def finish(self, status: str) -> None:
        """Close every tracked run (``completed``, ``failed`` or ``interrupted``) and record where they are."""
        self._save()
        self._each("closing the run", lambda t: t.finish(status))

    def _save(self) -> None:
        if self.run_dir is None or not self.trackers:
            return
        records = read_records(self.run_dir)
        for t in self.trackers:
            try:
                records[t.name] = t.record()
                if not TRACKERS.own(type(t)):  # the module to import it from again (posexp eval, resume), and where
                    records[t.name].setdefault(MODULE_KEY, type(t).__module__)
                    records[t.name].setdefault(TRACKER_SOURCE, code_record(type(t)))
            except Exception as e:
                self.warn(f"logger={t.name}: could not record its run id ({type(e).__name__}: {e})")
        write_records(self.run_dir, records)


NO_TRACKERS = Trackers([])


def _identity(run_dir: Path, name: str, config: dict, resume_step: Optional[int]) -> RunIdentity:
    sweep = run_dir.resolve().parent
    if not is_sweep_dir(sweep):
        return RunIdentity(run_dir, name, config=config, resume_step=resume_step)
    try:
        group = os.path.relpath(sweep, Path.cwd().resolve() / "outputs")
    except ValueError:  # another drive (Windows)
        group = str(sweep)
    if group.startswith(".."):
        group = str(sweep)
    return RunIdentity(run_dir, name, group=group, sweep_dir=sweep, config=config, resume_step=resume_step)


def start(logger_cfg, run_dir: Path, name: str, config: dict, resume_step: Optional[int] = None,
          warn: Optional[Callable[[str], None]] = None) -> Trackers:
    """Open the trackers ``logger_cfg`` names for the run in ``run_dir`` (``posexp train``, ``posexp resume``).

    A run that recorded tracked runs (``trackers.json``: a resumed one) reopens them; a tracker not recorded
    there starts a new tracked run, which logs the config.

    Args:
        name: the run's label in the trackers.
        config: the resolved config, logged as hyperparameters.
        resume_step: the checkpoint step a resumed training continues from.

    Raises:
        PosexpError: a tracker that cannot start (its library missing, its store unreachable); nothing was
            trained yet.
    """
    names = chosen(logger_cfg)
    if not names:
        return NO_TRACKERS
    check_loggers(logger_cfg)
    run = _identity(run_dir, name, config, resume_step)
    records = read_records(run_dir)
    problem = records_problem(run_dir)
    if problem and warn is not None:
        warn(f"{problem}: the trackers start new tracked runs instead of continuing the recorded ones")
    opened: list[Tracker] = []
    try:
        for n in names:
            cls, options = tracker_options(n, logger_cfg[n])
            opened.append(cls.reopen(records[n], run) if n in records else cls.start(run, **options))
    except Exception as e:
        for t in opened:
            t.finish("failed")
        if isinstance(e, PosexpError):
            raise
        raise PosexpError(f"logger={n}: could not start ({type(e).__name__}: {str(e).strip().splitlines()[0]})") \
            from None
    trackers = Trackers(opened, run_dir, warn)
    trackers._save()
    return trackers


def reopen(run_dir: Path, warn: Callable[[str], None]) -> Trackers:
    """The tracked runs recorded in ``run_dir`` (``posexp eval`` appends its rows to them); a tracker whose
    library is missing here, or that cannot be reached, is left out with a warning."""
    records = read_records(run_dir)
    problem = records_problem(run_dir)
    if problem:
        warn(f"{problem}: no tracked run of it is updated")
    opened: list[Tracker] = []
    run = _identity(run_dir, run_dir.name, {}, None)
    for n in sorted(records):
        # a tracker of the user's module, recorded by Trackers._save: from the working folder, else from where the run
        # found it
        module, source = records[n].get(MODULE_KEY), records[n].get(TRACKER_SOURCE)
        try:
            cls = _tracker_class(n, module, import_roots(source) if isinstance(source, dict) else ())
        except ConfigError as e:
            warn(f"{run_dir}: its {n} run is not updated ({e})")
            continue
        problem = missing_library(cls, n)
        if problem is not None:
            warn(f"{run_dir}: its {n} run is not updated: logger={n} {problem}")
            continue
        try:
            opened.append(cls.reopen(records[n], run))
        except Exception as e:
            warn(f"{run_dir}: its {n} run is not updated ({type(e).__name__}: {str(e).strip().splitlines()[0]})")
    return Trackers(opened, run_dir, warn)
