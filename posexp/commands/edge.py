"""The edge of every command: the raw config (Hydra's composition, or a run folder's ``.hydra/config.yaml``)
becomes the typed :class:`~posexp.config.schema.Config` here, once; everything below takes the typed one.

Also where a run folder says which hash format it recorded (:func:`folder_run_hash`), so that ``posexp eval``,
``posexp resume`` and ``posexp finetune`` check an old folder against its own records.
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
from posexp.config.legacy import format1_hash
from posexp.config.schema import Config
from posexp.errors import PosexpError
from posexp.runs.layout import CHECKPOINT_DIR, HYDRA_CONFIG, RESULTS_JSON

C = TypeVar("C", bound=Config)
META_FILE, RESUME_FILE = "meta.json", "resume.json"  # checkpoint/ files that record the hash (training/checkpoint)


def typed(cfg: DictConfig, schema: type[C] = Config) -> C:  # type: ignore[assignment]
    """The config as the :class:`Config` dataclass (its groups as their dataclasses), interpolations resolved,
    ``encoder`` as a plain mapping of its options (the encoder's own schema checked them at compose time).
    ``schema``: :class:`Config` or a subclass that adds a command's own group (``posexp analyze``).

    Raises:
        PosexpError: a key the schema does not know, or a value of the wrong type (a saved config edited by hand).
    """
    try:
        on_schema = OmegaConf.merge(OmegaConf.structured(schema), cfg)
        spec = OmegaConf.to_object(on_schema)
        encoder = OmegaConf.to_container(on_schema.encoder, resolve=True)
    except OmegaConfBaseException as e:
        raise PosexpError(f"the config does not fit posexp's config schema ({str(e).splitlines()[0]})") from None
    assert isinstance(spec, schema) and isinstance(encoder, dict)
    spec.encoder = encoder
    return spec


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
    encoder = loaded.get("encoder")
    if isinstance(encoder, DictConfig) and "lr_mult" not in encoder:
        # written before encoder.lr_mult existed: the encoder trained at train.lr (t5's default is now 10)
        encoder.lr_mult = 1.0
    return loaded


@dataclass
class SavedConfig:
    """A run folder's config: ``raw`` as written (hash format 1 hashed it so), ``spec`` typed."""

    raw: DictConfig
    spec: Config

    @property
    def written(self) -> dict:
        return OmegaConf.to_container(self.raw, resolve=True)  # type: ignore[return-value]


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
    a folder that recorded a hash without its format (written before formats were recorded); the current
    format for a folder that recorded no hash yet."""
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
    """The run's hash in the format its folder recorded (:func:`recorded_hash_format`): format 1 over the
    config as written, the current format over the typed config.

    Raises:
        PosexpError: the folder records a hash format newer than this posexp's (it was written by a newer one).
    """
    recorded = recorded_hash_format(run_dir)
    if recorded > HASH_FORMAT:  # not an edit: this posexp cannot compute that hash, so cannot check the folder
        raise PosexpError(f"{run_dir} was written by a newer posexp (hash format {recorded}; this one knows formats "
                          f"1 to {HASH_FORMAT}): use that posexp (or a newer one) for this run")
    if recorded == 1:
        return RunHash(format1_hash(saved.written), 1)
    return run_hash(saved.spec)
