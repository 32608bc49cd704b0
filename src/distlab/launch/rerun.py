"""The rerun rules: whether a job may go into a run directory that holds an earlier run
(resume it, start afresh beside a kept attempt, or refuse in one line saying what
changed), and whether that run is already complete."""

from __future__ import annotations

import logging
from typing import Any

from omegaconf import DictConfig

from distlab.config import effective, training_diff
from distlab.records.run_dir import RunDir

log = logging.getLogger("distlab")


def already_completed(previous: dict[str, Any] | None, cfg: DictConfig) -> bool:
    """Whether the earlier run is finished: completed, or pruned by a search (never
    retrained: its trial is over)."""
    return bool(previous and cfg.mode == "train" and previous.get("mode") == "train"
                and previous.get("status") in ("completed", "pruned")
                and (previous.get("epochs_completed", 0) >= cfg.trainer.epochs
                     or bool(previous.get("stopped_early"))))


def stages_missing(previous: dict[str, Any] | None, cfg: DictConfig,
                   run_dir: RunDir) -> str | None:
    """What a completed run (`already_completed`) rerun with `trainer.export=true` or
    `trainer.best_checkpoint.test=true` lacks, having the checkpoint to make it from (None:
    nothing): the rerun completes its stages after training again (the final figures, the
    export, the best checkpoint's test) and trains nothing."""
    if not (already_completed(previous, cfg) and previous.get("status") == "completed"):
        return None
    missing = []
    if cfg.trainer.export and not previous.get("saved_model") and run_dir.has_checkpoints():
        missing.append("an export")
    if (cfg.trainer.best_checkpoint.test and previous.get("best_test_loss") is None
            and any(run_dir.best_checkpoints.glob("ckpt-*.index"))):
        missing.append("the test of its best checkpoint")
    return " and ".join(missing) or None


def rerun_refusal(run_dir: RunDir, config: dict[str, Any], mode: str = "train",
                  in_sweep: bool = False) -> str | None:
    """Why this run must not go into `run_dir` (which may hold an earlier run), or None.

    A training run whose earlier attempt has no checkpoint (it failed or was killed before
    its first one) may change the config: that attempt is moved to .distlab/attempts/<n>/.
    """
    started_with = run_dir.started_config()
    if started_with is None:
        return None
    if config.get("mode") == "evaluate":
        return (f"{run_dir.path} holds a training run; mode=evaluate would overwrite its "
                "results. Give the evaluation its own hydra.run.dir")
    changed = training_diff(started_with, config)
    if not changed:
        return None
    if mode == "train" and not run_dir.has_checkpoints():
        kept = run_dir.archive_attempt()  # nothing trained is on disk: start afresh
        log.info("%s held an attempt with another config and no checkpoint; it is kept in "
                 "%s and this run starts afresh", run_dir.path, kept)
        return None
    before, after = effective(started_with), effective(config)
    shown = ", ".join(f"{k} ({before.get(k, '<absent>')!r} -> {after.get(k, '<absent>')!r})"
                      for k in changed[:6])
    more = f" and {len(changed) - 6} more" if len(changed) > 6 else ""
    hint = ""
    if "schedule.decay_epochs" in changed and _get(started_with, "schedule.decay_epochs") is None \
            and _get(started_with, "schedule.name") == "cosine":
        decayed = before.get("schedule.decay_epochs")
        hint = (" (schedule=cosine with decay_epochs=null decays over trainer.epochs; "
                + (f"add schedule.decay_epochs={decayed} to train longer on the run's schedule, "
                   f"at its final learning rate, alpha={before.get('schedule.alpha')} x "
                   "learning_rate)" if before.get("schedule.alpha") else
                   "its learning rate has decayed to 0 (schedule.alpha=0), so more epochs would "
                   f"change nothing: train a new run with trainer.epochs="
                   f"{after.get('trainer.epochs')} in another hydra.run.dir)"))
    return (f"{run_dir.path} holds a run started with another config: {shown}{more}{hint}. "
            "Rerun with its values to resume it (trainer.epochs and reporting keys may "
            "differ), or choose a new "
            + ("hydra.sweep.dir (a sweep's job dir holds the job of its number)" if in_sweep
               else "hydra.run.dir"))


def _get(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return "<absent>"
        node = node[part]
    return node
