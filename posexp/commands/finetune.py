"""``posexp finetune RUN_DIR [overrides]``: extend a finished run's context by fine-tuning it at a longer length.

The recipe of context extension as it is used in practice: a model trained at ``L`` is trained briefly
at ``L' > L`` with its positions interpolated (position interpolation, Chen et al. 2023; NTK-aware
scaling, bloc97 2023; YaRN, Peng et al. 2023; Llama 3.1's frequency bands) or not at all (direct
fine-tuning, ``scaling=none``, the papers' baseline).

The command's own config (``configs/finetune.yaml``, :class:`~posexp.config.schema.FinetuneAppConfig`) says
what a fine-tune may choose: the new ``train_len``, the ``scaling`` and its factor, the ``train``
recipe (``configs/train/finetune.yaml``), ``eval``, the seed and where to compute. Everything that
shapes the weights (encoder, model, tokenizer, corpus) is the parent's. :func:`child_config` turns
the two into the new run's ordinary :class:`~posexp.config.schema.Config`, whose ``finetune`` node records
the lineage (parent folder, config hash, SHA-256 of its weights, scaling, factor); from there the
run is a normal ``posexp train`` run (:func:`posexp.commands.train.train_run`): checkpoints,
``posexp resume``, the sweep cache, ``posexp eval`` and reports work unchanged.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional, Sequence

from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from posexp.commands.edge import folder_run_hash, load_saved, override_text
from posexp.config.identity import config_dict
from posexp.config.schema import Config, DataConfig
from posexp.errors import ConfigError, PosexpError, require
from posexp.runs.atomic import atomic_write_text
from posexp.runs.layout import CHECKPOINT, HYDRA_CONFIG, RESULTS_JSON, read_results

CONFIG_NAME = "finetune"
# set by posexp finetune --allow-changed-encoder: fine-tune a plugin encoder's run although its source changed
ALLOW_KEY = "allow_changed_encoder"
log = logging.getLogger("posexp.finetune")
# what the parent fixes: the trained weights have its encoder, shape and vocabulary
PARENT_KEYS = ("encoder", "model", "tokenizer", "base")
# what the fine-tune sets; the rest of the new run's config is the parent's
CHILD_KEYS = ("train", "eval", "seed", "device", "precision", "compile", "cache", "cache_dir", "objective")
# the keys of data.* that say which corpus (not where it is cached or how it is described)
CORPUS_KEYS = tuple(k for k in DataConfig.__dataclass_fields__ if k not in ("description", "cache_dir"))
# a Hydra flag followed by its value (posexp finetune --cfg job RUN_DIR ...)
_FLAGS_WITH_VALUE = ("--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                     "--config-dir", "-cd", "--experimental-rerun")
DEFAULT_MULTIPLE = 4  # train_len unset: the parent's times this
# DroPE (Gelberg et al. 2025, "Extending the Context of Pretrained LLMs by Dropping Their Positional Embeddings"):
# a RoPE run's rotary embedding dropped (encoder=none) and the model recalibrated briefly at its own length
DROPE_OVERRIDE, DROPE_RECIPE, DROPE_PARENTS = "encoder=none", "drope", ("rope",)


def parent_argument(args: Sequence[str]) -> list[str]:
    """The command line with its run folder (the first argument that is not a flag nor ``KEY=VALUE``) turned
    into the ``parent=`` override of the Hydra app; keys the parent fixes are refused.

    Raises:
        PosexpError: no run folder, or an override of the encoder, model, tokenizer or base.
    """
    from posexp.commands.plugin_source import ALLOW_FLAG

    # --allow-changed-encoder as an override, so that a launcher's worker processes see it too
    args = [f"{ALLOW_KEY}=true" if a == ALLOW_FLAG else a for a in args]
    out, parent, skip = [], None, False
    for arg in args:
        if skip or arg.startswith("-"):
            skip = arg in _FLAGS_WITH_VALUE
            out.append(arg)
            continue
        key = arg.split("=", 1)[0].lstrip("+~")
        # a folder whatever its name (`parent`, `parent_rope`, `a=b`): only KEY=VALUE with the key parent is the
        # override itself
        if "=" not in arg or (Path(arg).is_dir() and key != "parent"):
            if parent is not None:
                raise PosexpError(f"posexp finetune takes one run folder; got {parent} and {arg} "
                                  "(fine-tune each with its own command)")
            parent = arg
            # in the folder's place: Hydra reads overrides as one run of arguments, so one appended after
            # a flag and its value (--cfg job) would be refused as unrecognized
            out.append(override_text("parent", Path(parent).expanduser().resolve()))
            continue
        if arg == DROPE_OVERRIDE:  # DroPE: the one encoder change a fine-tune makes (checked against the parent)
            out.append("drope=true")
            continue
        if key.split(".")[0] in PARENT_KEYS:
            raise ConfigError(key, f"{arg}: a fine-tune keeps the parent's {', '.join(PARENT_KEYS)} (its weights "
                                   f"have their shape; only {DROPE_OVERRIDE} drops a RoPE parent's, DroPE); to "
                                   f"train another, use posexp train {arg}")
        out.append(arg)
    if "drope=true" in out and not any(a.split("=", 1)[0].lstrip("+~") == "train" for a in out):
        out.append(f"train={DROPE_RECIPE}")  # the paper's recalibration recipe (configs/train/drope.yaml)
    if parent is None and not any(a.split("=", 1)[0].lstrip("+~") == "parent" for a in out) and not _help_only(args):
        raise PosexpError("give the run folder to fine-tune first, e.g. posexp finetune outputs/2026-11-22/10-00-00 "
                          "train_len=512 scaling=linear")
    return out


def _help_only(args: Sequence[str]) -> bool:
    return any(a in ("--help", "-h", "--hydra-help", "--info", "-i", "--shell-completion", "-sc") for a in args)


# -- the parent ------------------------------------------------------------------------------------

def check_parent(parent: Path) -> dict:
    """A finished run with weights, trained from scratch.

    Returns:
        Its ``results.json``.

    Raises:
        PosexpError: what the folder is instead, and what to do.
    """
    if not parent.is_dir():
        raise PosexpError(f"{parent}: no such run folder; give a finished run's folder (the run dir posexp train "
                          "printed)")
    if not (parent / HYDRA_CONFIG).is_file() or not (parent / RESULTS_JSON).is_file():
        raise PosexpError(f"{parent}: not a finished run (no {HYDRA_CONFIG} or {RESULTS_JSON}); posexp finetune "
                          "starts from a run posexp train finished")
    results = read_results(parent)
    status = results["run"].get("status")
    if status not in ("completed", None) or not results["rows"]:
        raise PosexpError(f"{parent}: not a finished run ({RESULTS_JSON} has status {status}); finish it first "
                          f"with posexp resume {parent}, or fine-tune another run")
    if not (parent / CHECKPOINT).is_file():
        from posexp.commands.pretrained import pretrained_refusal

        refusal = pretrained_refusal(parent, "finetune")  # a pretrained model's run: its weights are elsewhere
        if refusal is not None:
            raise PosexpError(refusal)
        raise PosexpError(f"{parent}: has no weights ({CHECKPOINT} is missing); retrain it with posexp train")
    return results


def _weights_sha256(parent: Path) -> str:
    """The SHA-256 of the parent's weights: the one its checkpoint recorded, checked against the file."""
    from posexp.training.checkpoint import META_FILE, sha256_file

    digest = sha256_file(parent / CHECKPOINT)
    try:
        recorded = json.loads((parent / CHECKPOINT).with_name(META_FILE).read_text(encoding="utf-8")).get("sha256")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        recorded = None
    if isinstance(recorded, str) and recorded != digest:
        raise PosexpError(f"{parent / CHECKPOINT}: truncated or corrupt (its SHA-256 is not the one recorded when "
                          "it was written); retrain the parent with posexp train")
    return digest


def parent_changed(lineage) -> Optional[str]:
    """Why a fine-tune's parent folder no longer holds the run it started from (``lineage``: its
    :class:`~posexp.config.schema.FinetuneConfig`): its weights replaced by another run's, changed, or gone; None
    when their SHA-256 is the one recorded."""
    from posexp.training.checkpoint import sha256_file

    weights = Path(str(lineage.parent)) / CHECKPOINT
    try:
        now = sha256_file(weights)
    except OSError:
        return f"its parent's weights {weights} are gone"
    recorded = str(lineage.parent_weights_sha256)
    if now != recorded:
        return (f"its parent {lineage.parent} was overwritten or changed since the fine-tune (weights SHA-256 "
                f"{recorded[:12]} then, {now[:12]} now)")
    return None


def _check_corpus(requested, parent_data: dict, parent: Path) -> None:
    """``data=...`` given to a fine-tune must name the parent's corpus."""
    if requested is None:
        return
    asked = OmegaConf.to_container(requested, resolve=True) if isinstance(requested, DictConfig) else requested
    if not isinstance(asked, dict):
        raise ConfigError("data", f"choose a data set by name (data=stdlib), got {asked!r}")
    differ = [k for k in CORPUS_KEYS if asked.get(k) != parent_data.get(k)]
    if differ:
        raise ConfigError("data", f"the parent {parent} trained on {parent_data.get('name')} "
                                  f"({', '.join(f'data.{k}={parent_data.get(k)}' for k in differ)}), not "
                                  f"{asked.get('name')}; a fine-tune continues on its parent's corpus: drop data=...")


# -- the new run's config ----------------------------------------------------------------------------

def child_config(app: DictConfig, overridden: Optional[set[str]] = None) -> DictConfig:
    """The new run's config: the parent's encoder, model, tokenizer and corpus, the fine-tune's training and
    evaluation, and the lineage in ``finetune``. ``overridden``: the keys the command line set (None: the running
    Hydra job's); ``eval.tokens`` not among them is the parent's.

    Raises:
        PosexpError: the parent is not a finished run trained from scratch, or its weights are damaged.
        ConfigError: another corpus than the parent's was requested.
    """
    from posexp.commands.plugin_source import check_plugin_sources
    from posexp.encoders import recorded_revisions, revision_gap

    parent = Path(str(app.parent)).resolve()
    results = check_parent(parent)
    saved = load_saved(parent)
    identity = folder_run_hash(parent, saved)  # one hash rule: a parent recorded in another format is refused
    check_plugin_sources(parent, saved.raw, results, bool(app.get(ALLOW_KEY)),
                         lambda m: log.warning("%s", m))
    if saved.spec.finetune is not None:
        raise PosexpError(f"{parent}: is itself a fine-tune (of {saved.spec.finetune.parent}); fine-tune a run "
                          "trained from scratch")
    resolved = config_dict(saved.spec)
    _check_corpus(app.get("data"), resolved["data"], parent)
    mine: dict = OmegaConf.to_container(app, resolve=True)  # type: ignore[assignment]
    parent_len = int(resolved["train_len"])
    # PoSE (Zhu et al. 2024) extends the context without long windows, and DroPE recalibrates at the original
    # length (Gelberg et al. 2025): both train at the parent's length
    pose = mine["train"].get("positions") == "pose"
    new_len = int(mine["train_len"]) if mine.get("train_len") is not None else (
        parent_len if pose or mine.get("drope") else DEFAULT_MULTIPLE * parent_len)
    factor = mine.get("scaling_factor")
    if factor is None:  # s = L'/L (Chen et al. 2023, §2.3); dynamic NTK's own factor a defaults to 1
        # with PoSE the length extended to is its target (the authors' rope_scaling_factor = target / original)
        reach = _pose_target(mine, new_len) if pose else new_len
        factor = 1.0 if mine["scaling"] in ("none", "dynamic_ntk") else reach / parent_len
    # the parent's encoder, model, tokenizer, corpus, and any group a later posexp adds (a task, a logger)
    child = {k: v for k, v in resolved.items() if k not in (*CHILD_KEYS, "train_len", "finetune")}
    child.update({k: mine[k] for k in CHILD_KEYS}, train_len=new_len)
    if "eval.tokens" not in (_overridden() if overridden is None else overridden):  # measured on the parent's budget, so that the two compare
        child["eval"]["tokens"] = resolved["eval"]["tokens"]
    if mine.get("logger") is not None:  # trackers chosen for the fine-tune, else the parent's
        child["logger"] = mine["logger"]
    child["finetune"] = {"parent": str(parent), "parent_config_hash": str(results["run"].get("config_hash")
                                                                           or identity.value),
                         "parent_weights_sha256": _weights_sha256(parent), "parent_train_len": parent_len,
                         "parent_corpus_fingerprint": results["run"].get("corpus_fingerprint"),
                         "scaling": str(mine["scaling"]), "scaling_factor": float(factor),
                         **_longrope_lineage(mine)}
    if mine.get("drope"):
        child["encoder"] = _dropped_encoder(resolved["encoder"], str(mine["scaling"]), parent)
        child["finetune"]["dropped_encoder"] = str(resolved["encoder"]["name"])
    elif revision_gap(child["encoder"]) is not None:  # a parent of an earlier revision: the fine-tune trains with this
        child["encoder"] = recorded_revisions(child["encoder"])
    from posexp.commands.validation import register_configs

    register_configs()
    merged = OmegaConf.merge(OmegaConf.structured(Config), child)
    assert isinstance(merged, DictConfig)
    return merged


def _longrope_lineage(mine: dict) -> dict:
    """The lineage's LongRoPE factors and ``n^`` (``longrope_file``'s, or as given); ``longrope_start`` only when
    set, so a fine-tune without it keeps the hash it had (posexp/config/identity.py)."""
    from types import SimpleNamespace

    from posexp.encoders.scaling import check_longrope_start
    from posexp.runs.longrope import longrope_settings

    for key in ("longrope_start", "longrope_file"):
        require(not mine.get(key) or mine["scaling"] == "longrope", key,
                f"only applies with scaling=longrope (scaling is {mine['scaling']}); drop it or set scaling=longrope")
    check_longrope_start(mine.get("longrope_start") or 0, "longrope_start")
    factors, start = longrope_settings(SimpleNamespace(**{k: mine.get(k) for k in
                                                          ("longrope_file", "longrope_factors", "longrope_start")}),
                                       prefix="")
    return {"longrope_factors": factors, **({"longrope_start": start} if start else {})}


def _dropped_encoder(parent_encoder: dict, scaling: str, parent: Path) -> dict:
    """The encoder of a DroPE fine-tune: none (NoPE), in place of the RoPE parent's rotary embedding.

    DroPE (Gelberg et al. 2025, §4) removes every positional embedding of a model pretrained with RoPE and
    continues training without them ("recalibration"); no frequency is scaled, so no scaling applies.

    Raises:
        ConfigError: the parent's encoding is not RoPE, or a scaling was asked for.
    """
    name = str(parent_encoder.get("name"))
    if name not in DROPE_PARENTS:
        raise ConfigError("encoder", f"{DROPE_OVERRIDE} (DroPE) drops a RoPE parent's rotary embedding; the parent "
                                     f"{parent} has encoder {name!r}, which a fine-tune keeps: to train another, "
                                     f"use posexp train {DROPE_OVERRIDE}")
    if scaling != "none":
        raise ConfigError("scaling", f"{scaling!r} scales rotary frequencies, and a DroPE fine-tune ({DROPE_OVERRIDE}) "
                                     "has none left: use scaling=none")
    return {"name": "none", "lr_mult": parent_encoder.get("lr_mult", 1.0)}


def _pose_target(mine: dict, train_len: int) -> int:
    """``train.pose_target_len`` of a fine-tune, else its longest evaluation length (as the run will read it)."""
    if mine["train"].get("pose_target_len") is not None:
        return int(mine["train"]["pose_target_len"])
    e = mine["eval"]
    return max(int(n) for n in e["lengths"]) if e.get("lengths") else max(int(m) for m in e["multiples"]) * train_len


def overridden_keys(overrides) -> set[str]:
    """The keys a job's overrides (``hydra.overrides.task``) set."""
    return {str(o).lstrip("+~").partition("=")[0] for o in overrides}


def _overridden() -> set[str]:
    """The keys the user set on the command line of this job (empty outside a Hydra job)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return set()
    return overridden_keys(HydraConfig.get().overrides.task)


def refuse_own_parent(parent: Path, target: Path, key: str) -> None:
    """A fine-tune writes a new run: its folder ``target`` (set by ``key``) may not be its parent's, lie inside it
    or hold it, where claiming it (with ``--overwrite``) would delete the weights it starts from.

    Raises:
        PosexpError: naming the folder, the parent and the key that chooses another; nothing is deleted.
    """
    parent, target = parent.resolve(), target.resolve()
    if target == parent or parent in target.parents or target in parent.parents:
        where = "is" if target == parent else "lies inside" if parent in target.parents else "holds"
        raise PosexpError(f"{key}={target}: {where} the parent run {parent}, whose weights the fine-tune starts "
                          f"from; choose another {key} (nothing was deleted)")


def check_finetune(app: DictConfig, overridden: Optional[set[str]] = None) -> Config:
    """Everything about a fine-tune that can be checked before it runs (every sweep job is checked first).
    ``overridden``: the keys its command line set, where no Hydra job runs yet (the folder's claim checks it).

    Returns:
        The new run's config, typed.
    """
    from posexp.commands.train import check_config

    return check_config(child_config(app, overridden))


def finetune_run(spec: Config, run_dir: Path, overrides: list[str], console: Optional[Console] = None) -> dict:
    """One fine-tune of a checked config: the new run's config is written as the run folder's
    ``.hydra/config.yaml`` (so that ``posexp resume``, ``posexp eval`` and reports read it as any run's), then it
    trains as a run does."""
    from posexp.commands.train import train_run

    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / HYDRA_CONFIG, OmegaConf.to_yaml(config_dict(spec)))
    return train_run(spec, run_dir, overrides, console)
