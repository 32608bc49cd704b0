"""What an evaluation (`mode=evaluate`) checks against the checkpoint's training run before
it scores: the same preprocessing, the same split keys (a run dir from before fingerprints)
or the same rows (`distlab.data.fingerprint`), and the precision and label smoothing it was
trained with; and how the checkpoint was trained (`trained` in the evaluation's
results.json)."""

from __future__ import annotations

import logging
from typing import Any

from omegaconf import DictConfig, OmegaConf

from distlab.config.checks import flatten
from distlab.config.reruns import effective
from distlab.data import fingerprint
from distlab.errors import DistlabError, override
from distlab.records.fields import TRAINED
from distlab.training.checkpoints import find_checkpoint, run_dir_of
from distlab.training.experiment import Experiment

log = logging.getLogger("distlab")


# what decides which rows of a dataset are trained on, and which validate
SPLIT_KEYS = ("train_split", "validation", "validation_seed")
# keys a run dir without a record of its rows is not held to: where the data is read from,
# and which features are the input and the label, leave the rows where they are
NOT_DECIDING = ("name", "data_dir", "features")


def check_evaluation_splits(cfg: DictConfig) -> None:
    """Refuse, in one line, before the data loads: an evaluation whose dataset preprocessing
    differs from the checkpoint's training run (its inputs would not be the model's). A run
    dir from before the rows' fingerprints (`check_evaluation_rows`, which compares the rows
    themselves) is held to its split keys and every dataset key that may decide its rows
    (e.g. dataset.validation=0.1 against a run trained with null, on all of train;
    dataset.split_seed): its val_ figures would be on other rows, perhaps trained on."""
    try:
        prefix = find_checkpoint(cfg.ckpt_path)
    except DistlabError:
        return  # the restore says why, in its own words
    run_dir = run_dir_of(prefix)
    started = run_dir.started_config() or {}
    check_preprocess(cfg, started.get("dataset"))
    trained = started.get("dataset")
    if not trained or trained.get("name") != cfg.dataset.name:
        return  # no config to compare with, or another dataset: none of its rows trained on
    if fingerprint.recorded(run_dir.splits_json) is not None:
        return  # its rows are compared once they load
    trained = {"validation": None, **trained}  # a run from before dataset.validation: none
    keys = [k for k in SPLIT_KEYS if k in trained and trained[k] != cfg.dataset.get(k)]
    before = fingerprint.row_keys(trained)
    after = fingerprint.row_keys(OmegaConf.to_container(cfg.dataset, resolve=True))
    keys += [k for k in (k.removeprefix("dataset.") for k in sorted(before))
             if f"dataset.{k}" in after and before[f"dataset.{k}"] != after[f"dataset.{k}"]
             and k not in keys and k.split(".", 1)[0] not in NOT_DECIDING]
    values = {**before, **{f"dataset.{k}": v for k, v in trained.items()}}
    differ = [override(f"dataset.{k}", values[f"dataset.{k}"]) for k in keys]
    if differ:
        raise DistlabError(
            f"ckpt_path={cfg.ckpt_path} was trained with {' '.join(differ)}, and this "
            f"evaluation's splits differ: its val_ and test_ figures would be on other rows "
            f"(perhaps ones it trained on). Add {' '.join(differ)} to evaluate on its splits")


def check_preprocess(cfg: DictConfig, trained: dict[str, Any] | None) -> None:
    """Refuse, in one line, an evaluation whose dataset.preprocess differs from the training
    run's: the model would score inputs prepared otherwise than those it learnt from."""
    if not trained or trained.get("preprocess") is None:
        return  # a run from before dataset.preprocess
    before = flatten(trained["preprocess"])
    after = flatten(OmegaConf.to_container(cfg.dataset.preprocess, resolve=True))
    keys = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    if not keys:
        return
    given = " ".join(override(f"dataset.preprocess.{k}", before.get(k)) for k in keys)
    now = " ".join(override(f"dataset.preprocess.{k}", after.get(k)) for k in keys)
    raise DistlabError(
        f"ckpt_path={cfg.ckpt_path} was trained with {given}, and this evaluation has {now}: "
        f"the model would score inputs prepared otherwise than those it was trained on. Add "
        f"{given} to evaluate with its preprocessing")


def check_evaluation_rows(exp: Experiment) -> None:
    """Refuse, in one line naming the dataset keys that differ, an evaluation whose train,
    validation or test split holds other rows than the checkpoint's training run recorded
    (`distlab.data.fingerprint`); a run dir without that record was checked by its keys."""
    try:
        prefix = find_checkpoint(exp.cfg.ckpt_path)
    except DistlabError:
        return  # (another worker's disk, or the restore says why)
    run_dir = run_dir_of(prefix)
    trained = fingerprint.recorded(run_dir.splits_json)
    started = run_dir.started_config() or {}
    if trained is None or (started.get("dataset") or {}).get("name") != exp.cfg.dataset.name:
        return
    fingerprint.check(exp.cfg.ckpt_path, started, trained,
                      fingerprint.of_splits(exp.cfg.dataset, exp.data.splits),
                      OmegaConf.to_container(exp.cfg.dataset, resolve=True))


def trained_with(prefix: str) -> dict[str, Any] | None:
    """How the checkpoint was trained, from its run dir's results.json (None if not there).
    In an evaluation's results.json the top-level batch fields are the evaluation's own."""
    trained = run_dir_of(prefix).read_results()
    return {k: trained.get(k) for k in TRAINED} if trained else None


# keys an evaluation may set otherwise, at the cost of other figures: its precision (their
# rounding), the loss's label smoothing (test_loss is another loss; accuracy is unchanged)
FIGURE_KEYS = {"precision": "moves its figures by that precision's rounding",
               "task.label_smoothing": "makes its loss figures those of another loss"}


def warn_if_figures_differ(exp: Experiment, prefix: str) -> None:
    """An evaluation with another value of a FIGURE_KEYS key than the checkpoint was trained
    with does not reproduce its figures: say so, with the override that does."""
    started = run_dir_of(prefix).started_config()
    if not started:
        return
    trained = effective(started)
    for key, why in FIGURE_KEYS.items():
        now = OmegaConf.select(exp.cfg, key, default=None)
        if key in trained and now is not None and trained[key] != now:
            log.warning("%s was trained with %s=%s and is evaluated with %s=%s, which %s; add "
                        "%s to reproduce the training run's figures", prefix, key, trained[key],
                        key, now, why, override(key, trained[key]))
