"""The sweep cache: train a configuration once, evaluate it as often as you like.

With ``cache=true`` a run first looks for its *training key* in ``cache_dir``
(default ``outputs/cache``, relative to the folder posexp is started in). The key
hashes everything that shapes the trained weights, and nothing else:

- :func:`posexp.config.identity.weights_config`, the one rule of what shapes the weights: the
  resolved config without ``eval.*`` (evaluation never touches the weights), without
  the keys that only change how a run reports or saves itself (progress bar, logging
  and checkpoint cadence, thread count, token-cache folder) and without the cache and
  sweep keys themselves, but with the values that training derives from ``eval.*``
  (the position range of ``train.positions=randomized`` with ``train.max_position`` unset);
- the corpus fingerprint (the tokens themselves: another Python's standard library,
  or an edited ``data.path``, is another corpus);
- the posexp and torch versions;
- for an encoder from outside the package, the SHA-256 of its source file.

Every key a later version adds to the config is part of the key unless listed in
:data:`posexp.config.identity.NOT_WEIGHTS`: an unknown key costs a retraining, never a wrong reuse.

A hit loads the cached weights (checked against their SHA-256), copies the
training curve (``metrics.csv``) into the run folder, and the run continues as if
it had just trained: checkpoint, evaluation, results. ``results.json`` says where
the weights came from in ``run.cached_from``. A miss trains; when training
finishes (not diverged, not interrupted) the weights and the curve are published as
``cache_dir/<key>/``: written to a hidden folder first, then renamed into place, so
a reader sees a complete entry or none, and of two jobs that trained the same key
at once the first to finish wins.

An entry holds ``model.safetensors`` (a hard link to the run's checkpoint where the
file system allows, else a copy), ``metrics.csv`` and ``entry.json`` (the key, the
run that trained it, its training config and training summary). Deleting
``cache_dir`` or an entry is always safe.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import posexp
from posexp.config.identity import weights_config
from posexp.config.schema import Config, is_task
from posexp.errors import PosexpError
from posexp.runs.atomic import atomic_write_bytes, atomic_write_json, unwritable
from posexp.runs.layout import CHECKPOINT_DIR, METRICS_CSV, WEIGHTS_FILE

# the logger name train.log and users' logging filters have always seen, wherever the module lives
log = logging.getLogger("posexp.cache")

FORMAT = 1
ENTRY_FILE = "entry.json"
# an entry holds the run folder's weights and training curve under the run folder's names
def cache_key(cfg: Config, corpus_fingerprint: str) -> str:
    """16 hex digits of SHA-256 over the training config, the corpus fingerprint and the versions; for a plugin
    encoder also the SHA-256 of its source file and of its package's files, the helpers it imports (an edited
    encoder is another training), and likewise for a task of the user's. Built-in encoders'
    keys are as they were before plugins existed: posexp's version stands for their code."""
    import torch

    from posexp.encoders import plugin_sources
    from posexp.tasks import task_class, task_code

    key = {"format": FORMAT, "config": weights_config(cfg), "corpus": corpus_fingerprint,
           "posexp": posexp.__version__, "torch": torch.__version__}
    sources = plugin_sources(cfg.encoder)
    name = str(cfg.encoder["name"])
    if name in sources:  # a plugin encoder: the key it always had, and its package's files where it is in one
        key["encoder_source"] = sources[name]["sha256"]
        if sources[name].get("package_sha256"):
            key["encoder_package"] = sources[name]["package_sha256"]
    elif sources:  # a mix with plugin layers
        key["encoder_source"] = {layer: record["sha256"] for layer, record in sources.items()}
        key["encoder_package"] = {layer: record.get("package_sha256") for layer, record in sources.items()}
    task = task_code(task_class(cfg.task)) if is_task(cfg) else None
    if task is not None:  # a task of the user's: its generator's code makes the training data, as a corpus does
        key["task_source"], key["task_package"] = task["sha256"], task.get("package_sha256")
    blob = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_root(cfg: Config, start: Optional[Path] = None) -> Path:
    """``cache_dir`` as an absolute path; a relative one is taken from ``start``, the folder posexp was started in
    (the commands pass it, :func:`posexp.commands.edge.launch_folder`: with ``hydra.job.chdir=true`` a job runs
    in its run folder), else from the working folder."""
    root = Path(cfg.cache_dir or "outputs/cache").expanduser()
    if root.is_absolute():
        return root
    return Path(start if start is not None else os.getcwd()) / root


def unwritable_warning(cfg: Config, start: Optional[Path] = None) -> Optional[str]:
    """What to tell the user when ``cache_dir`` cannot be written (the run then reads the cache but stores
    nothing), or None when it can. ``start``: as for :func:`cache_root`."""
    root = cache_root(cfg, start)
    problem = unwritable(root)
    if problem is None:
        return None
    return (f"cache_dir {root} cannot be written ({problem}): this run's training will not be cached; "
            "set cache_dir to a writable folder")


@dataclass
class CacheEntry:
    """A finished training in the cache."""

    key: str
    path: Path
    entry: dict

    @property
    def source_run(self) -> str:
        return str(self.entry.get("run_dir", "unknown"))

    def message(self) -> str:
        return f"trained weights reused from cache {self.key} (run {self.source_run})"

    def restore(self, model, run_dir: Path, device) -> Any:
        """Load the cached weights into ``model`` and the training curve into ``run_dir``.

        Returns:
            The :class:`posexp.training.trainer.TrainResult` the original training returned.

        Raises:
            PosexpError: the cached weights are corrupt or do not fit ``model``.
        """
        from posexp.training.checkpoint import load_weights
        from posexp.training.trainer import TrainResult

        load_weights(model, self.path / WEIGHTS_FILE, config_hash=None, sha256=self.entry["sha256"],
                     hint=f"delete the cache entry {self.path} and run again to retrain it")
        model.to(device).eval()
        metrics = self.path / METRICS_CSV
        if metrics.is_file():
            atomic_write_bytes(Path(run_dir) / METRICS_CSV, metrics.read_bytes())
        saved = self.entry.get("train", {})
        names = {f.name for f in dataclasses.fields(TrainResult)}
        return TrainResult(**{k: v for k, v in saved.items() if k in names})

    def provenance(self) -> dict:
        """``run.cached_from`` in results.json."""
        return {"key": self.key, "run_dir": self.source_run, "entry": str(self.path),
                "created": self.entry.get("created")}


def _read_entry(path: Path, key: str) -> Optional[dict]:
    try:
        entry = json.loads((path / ENTRY_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != key or \
            not isinstance(entry.get("sha256"), str) or not (path / WEIGHTS_FILE).is_file():
        return None
    return entry


def _usable(path: Path, key: str) -> bool:
    from posexp.training.checkpoint import sha256_file

    entry = _read_entry(path, key)
    return entry is not None and sha256_file(path / WEIGHTS_FILE) == entry["sha256"]


def lookup(cfg: Config, corpus_fingerprint: str, start: Optional[Path] = None) -> Optional[CacheEntry]:
    """The cache entry of ``cfg``'s training key, or None (no entry, or one that cannot be used). ``start``: as
    for :func:`cache_root`."""
    key = cache_key(cfg, corpus_fingerprint)
    path = cache_root(cfg, start) / key
    if not path.exists():
        log.info("cache %s: no entry in %s; training", key, path.parent)
        return None
    entry = _read_entry(path, key)
    if entry is None:
        log.warning("cache %s: the entry %s is incomplete or unreadable; training again (it will be replaced)",
                    key, path)
        return None
    from posexp.training.checkpoint import sha256_file

    if sha256_file(path / WEIGHTS_FILE) != entry["sha256"]:
        log.warning("cache %s: the weights in %s are corrupt (SHA-256 differs from %s); training again "
                    "(the entry will be replaced)", key, path, ENTRY_FILE)
        return None
    return CacheEntry(key, path, entry)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)  # the run's file is only ever replaced by rename, so the cache's inode stays intact
    except OSError:
        shutil.copyfile(src, dst)


def store(cfg: Config, corpus_fingerprint: str, run_dir: Path, result,
          warn: Optional[Callable[[str], None]] = None, start: Optional[Path] = None) -> Optional[Path]:
    """Publish a finished training of ``run_dir`` as ``cache_dir/<key>/``; None if it could not be written.
    ``start``: as for :func:`cache_root`.

    Call only after training ended normally and the final checkpoint was written. A failure to write the cache
    (a full disk) does not fail the run: it is said through ``warn`` (the run's terminal and train.log), else logged.
    """
    from posexp.training.checkpoint import META_FILE, sha256_file

    key = cache_key(cfg, corpus_fingerprint)
    root = cache_root(cfg, start)
    final = root / key
    weights = Path(run_dir) / CHECKPOINT_DIR / WEIGHTS_FILE
    tmp = root / f".{key}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if final.exists() and _usable(final, key):
            return final  # another job with the same training config finished first
        tmp.mkdir()
        _link_or_copy(weights, tmp / WEIGHTS_FILE)
        try:
            sha = json.loads((weights.parent / META_FILE).read_text(encoding="utf-8"))["sha256"]
        except (OSError, ValueError, KeyError, TypeError):
            sha = sha256_file(tmp / WEIGHTS_FILE)
        if (Path(run_dir) / METRICS_CSV).is_file():
            shutil.copyfile(Path(run_dir) / METRICS_CSV, tmp / METRICS_CSV)
        import torch

        train = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
        atomic_write_json(tmp / ENTRY_FILE, {
            "format": FORMAT, "key": key, "run_dir": str(Path(run_dir).resolve()),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "sha256": sha, "corpus_fingerprint": corpus_fingerprint,
            "versions": {"posexp": posexp.__version__, "torch": torch.__version__},
            "threads": torch.get_num_threads(), "train": train, "config": weights_config(cfg)})
        if final.exists():  # unusable (checked above): move it aside, then replace it
            stale = root / f".{key}.stale.{secrets.token_hex(4)}.tmp"
            os.rename(final, stale)
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(tmp, final)  # atomic: readers see the whole entry or none
        except OSError:
            if not _usable(final, key):
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # lost the race to an equal entry
            return final
    except (OSError, PosexpError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        message = f"cache {key}: could not write {final} ({getattr(e, 'strerror', None) or e}); the run itself is " \
                  "complete, and the next run with the same training trains again"
        (warn or log.warning)(message)
        return None
    log.info("cache %s: trained weights stored in %s", key, final)
    return final
