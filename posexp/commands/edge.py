"""The edge of every command: the raw config (Hydra's composition, or a run folder's ``.hydra/config.yaml``)
becomes the typed :class:`~posexp.config.schema.Config` here, once; everything below takes the typed one.

Also where a run folder's hash is read back (:func:`folder_run_hash`) for ``posexp eval``, ``posexp resume`` and
``posexp finetune``: one hash rule, so a folder that recorded another hash format is refused here, in one line.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from posexp.config.identity import HASH_FORMAT, RunHash, run_hash
from posexp.config.schema import Config
from posexp.errors import PosexpError
from posexp.runs.atomic import atomic_write_text
from posexp.runs.layout import CHECKPOINT_DIR, HYDRA_CONFIG, RESULTS_JSON

HF_PREFIX = "hf:"  # hf:NAME on a command line names a transformers model (posexp eval hf:MODEL, posexp search)
C = TypeVar("C")  # Config, a subclass of it, or another app's schema (PretrainedConfig)
META_FILE, RESUME_FILE = "meta.json", "resume.json"  # checkpoint/ files that record the hash (training/checkpoint)


def override_text(key: str, value: object) -> str:
    """``key=value`` as a Hydra override, quoted where the value has characters Hydra's grammar reserves
    (a folder path with spaces or brackets)."""
    text = str(value)
    # Hydra's grammar takes letters outside ASCII (a folder named "é") only inside quotes
    if all(c.isascii() and (c.isalnum() or c in "/._-:+@~") for c in text):
        return f"{key}={text}"
    return f"{key}='{text.replace(chr(92), chr(92) * 2).replace(chr(39), chr(92) + chr(39))}'"


def typed(cfg: DictConfig, schema: type[C] = Config) -> C:  # type: ignore[assignment]
    """The config as the :class:`Config` dataclass (its groups as their dataclasses), interpolations resolved,
    ``encoder``, ``task`` and ``logger`` as plain mappings of their options (their own schemas checked them at compose time;
    :func:`posexp.tasks.build_task` checks a task's again, for a saved config).
    ``schema``: :class:`Config`, a subclass that adds a command's own group (``posexp analyze``), or another app's
    schema (``posexp eval hf:MODEL``'s, which has no encoder).

    Raises:
        PosexpError: a key the schema does not know, or a value of the wrong type (a saved config edited by hand).
    """
    try:
        on_schema = OmegaConf.merge(OmegaConf.structured(schema), cfg)
        spec = OmegaConf.to_object(on_schema)
        encoder = OmegaConf.to_container(on_schema.encoder, resolve=True) if "encoder" in on_schema else None
        run_schema = issubclass(schema, Config)  # Config, or a command's subclass of it (posexp analyze's)
        task = OmegaConf.to_container(on_schema.task, resolve=True) if run_schema else None
        logger = OmegaConf.to_container(on_schema.logger, resolve=True) if run_schema else None
    except OmegaConfBaseException as e:
        raise PosexpError(f"the config does not fit posexp's config schema ({str(e).splitlines()[0]})") from None
    assert isinstance(spec, schema)
    if isinstance(encoder, dict):
        spec.encoder = encoder  # type: ignore[attr-defined]
    if isinstance(task, dict):
        spec.task = task  # type: ignore[attr-defined]
    if isinstance(logger, dict):
        spec.logger = logger  # type: ignore[attr-defined]
    return spec


def launch_folder() -> Path:
    """The folder posexp was started in: Hydra's record of it inside a job (with ``hydra.job.chdir=true`` the job
    runs in its run folder), else the working folder. Read here so that nothing below the commands asks Hydra."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            return Path(HydraConfig.get().runtime.cwd)
    except (ImportError, ValueError):
        pass
    return Path(os.getcwd())


def read_saved_config(run_dir: str | os.PathLike) -> DictConfig:
    """A run's ``.hydra/config.yaml`` as written by Hydra, or a :class:`PosexpError` naming the file.

    Shared by ``posexp resume``, ``posexp eval`` and ``posexp finetune``, so a damaged file gets the same
    one-line message from each instead of a YAML traceback.
    """
    path = Path(run_dir) / HYDRA_CONFIG
    try:
        loaded = OmegaConf.load(path)
    except yaml.YAMLError as e:
        raise PosexpError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
    except (OSError, UnicodeDecodeError, ValueError, OmegaConfBaseException) as e:
        raise PosexpError(f"{path}: cannot be read ({str(e).splitlines()[0]})") from None
    if not isinstance(loaded, DictConfig):
        raise PosexpError(f"{path}: not a config (expected a mapping of groups and keys)")
    return loaded


def record_encoder(run_dir: Path, encoder: dict) -> None:
    """Write into a new run's ``.hydra/config.yaml``, which Hydra saved before the job started, the encoder
    options the edge recorded since (:func:`posexp.commands.train.check_config`: a mix's layers' revisions and
    options from the run), so that the folder's config hashes and builds as the run trained. A folder without one
    (``hydra.output_subdir=null``), or whose encoder is already so, is left as it is."""
    if not (Path(run_dir) / HYDRA_CONFIG).is_file():
        return
    raw = read_saved_config(run_dir)
    saved = OmegaConf.to_container(raw.encoder, resolve=True)
    added = {k: v for k, v in encoder.items() if not isinstance(saved, dict) or saved.get(k) != v}
    if added:
        for key, value in added.items():
            raw.encoder[key] = value
        atomic_write_text(Path(run_dir) / HYDRA_CONFIG, OmegaConf.to_yaml(raw))


@dataclass
class SavedConfig:
    """A run folder's config: ``raw`` as written (a plugin encoder's source record is checked against its
    ``encoder`` node), ``spec`` typed."""

    raw: DictConfig
    spec: Config


def load_saved(run_dir: Path) -> SavedConfig:
    """The run's ``.hydra/config.yaml`` typed (keys added since it was written get their defaults).

    Raises:
        PosexpError: the file is missing, damaged, or does not fit the schema.
    """
    raw = read_saved_config(run_dir)
    try:
        return SavedConfig(raw, typed(raw))
    except PosexpError as e:
        raise PosexpError(f"{run_dir / HYDRA_CONFIG}: {e}; was it edited?") from None


def recorded_hash_format(run_dir: Path) -> int:
    """The hash format a run folder recorded: results.json's ``run.hash_format``, else the checkpoint's; 1 for
    a folder that recorded a hash without its format (written by a posexp before formats were recorded); the
    current format for a folder that recorded no hash yet."""
    for path, record in ((run_dir / RESULTS_JSON, "run"), (run_dir / CHECKPOINT_DIR / META_FILE, None),
                         (run_dir / CHECKPOINT_DIR / RESUME_FILE, None)):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        node = data.get(record) if record and isinstance(data, dict) else data
        if isinstance(node, dict) and node.get("config_hash") is not None:
            return int(node.get("hash_format", 1))
    return HASH_FORMAT


def folder_run_hash(run_dir: Path, saved: SavedConfig) -> RunHash:
    """The run's hash, by the one rule (:func:`~posexp.config.identity.run_hash` of the typed config), once the
    folder is known to have recorded its hash by that rule too.

    Raises:
        PosexpError: the folder records another hash format (:func:`recorded_hash_format`): an older posexp's,
            whose rule this one no longer has, or a newer one's; never taken for an edited run.
    """
    recorded = recorded_hash_format(run_dir)
    if recorded < HASH_FORMAT:
        raise PosexpError(f"{run_dir} was written by an older posexp (hash format {recorded}; this one reads format "
                          f"{HASH_FORMAT} only): train it again with this posexp, or use the older one for it")
    if recorded > HASH_FORMAT:  # this posexp cannot compute that hash, so cannot check the folder
        raise PosexpError(f"{run_dir} was written by a newer posexp (hash format {recorded}; this one reads format "
                          f"{HASH_FORMAT} only): use that posexp (or a newer one) for this run")
    return run_hash(saved.spec)
