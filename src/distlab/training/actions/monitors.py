"""What the Controller watches at each epoch end: the time-to-accuracy target, early
stopping and the best checkpoint.

Their state is a few variables saved in every checkpoint, so a resumed run carries on
counting (patience, best value, whether the target was reached) exactly where it stopped.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import tensorflow as tf
from omegaconf import DictConfig

from distlab.components.tasks import Task
from distlab.config.figures import check_watched
from distlab.records.ranking import metric_direction

log = logging.getLogger("distlab")
STOP_REASONS = ("", "target", "early_stopping", "callback", "pruned")  # append only: checkpointed


def direction(metric: str, mode: str, task: Task) -> str:
    """"max" or "min": `mode` unless auto; then losses go down, task metrics their way."""
    return metric_direction(metric, mode, {m.name: m.higher_is_better for m in task.metrics})


@dataclass
class Rule:
    metric: str
    maximize: bool

    def value(self, metrics: dict[str, Any]) -> float | None:
        value = metrics.get(self.metric)
        return None if value is None or not math.isfinite(value) else float(value)

    def beats(self, value: float, best: float, delta: float = 0.0) -> bool:
        if math.isnan(best):
            return True
        return value > best + delta if self.maximize else value < best - delta


class Monitors:
    """Target, early stopping and best checkpoint for one run (see trainer.* in the config)."""

    def __init__(self, trainer: DictConfig, task: Task, validation: bool = True) -> None:
        """`validation`: whether the run has a validation split (val_* figures)."""
        check_watched(trainer, task.metric_names, validation)  # a user task's: known now

        def rule(node: DictConfig, metric: str | None) -> Rule | None:
            if metric is None:
                return None
            return Rule(metric, direction(metric, node.mode, task) == "max")

        self.target = rule(trainer.target, trainer.target.metric)
        self.target_value = trainer.target.value
        self.stop_at_target = bool(trainer.target.stop)
        stopping = trainer.early_stopping
        self.stopping = rule(stopping, stopping.metric)
        self.patience, self.min_delta = stopping.patience, stopping.min_delta
        best = trainer.best_checkpoint
        self.best = (rule(best, best.metric) if best.metric is not None
                     else rule(stopping, stopping.metric))
        self.reached_at: float | None = None  # time the target was reached, in this process

        def var(value: Any, dtype: tf.DType, name: str) -> tf.Variable:
            return tf.Variable(value, dtype=dtype, trainable=False, name=name)

        nan = float("nan")
        self.state = {
            "target_epoch": var(0, tf.int64, "target_epoch"),  # 0: not reached
            "best_value": var(nan, tf.float64, "best_value"),
            "best_epoch": var(0, tf.int64, "best_epoch"),
            "stopping_best": var(nan, tf.float64, "stopping_best"),
            "stopping_wait": var(0, tf.int64, "stopping_wait"),
            "stopped_epoch": var(0, tf.int64, "stopped_epoch"),  # 0: not stopped early
            "stop_reason": var(0, tf.int64, "stop_reason"),  # an index into STOP_REASONS
        }

    def _get(self, key: str) -> Any:
        return self.state[key].numpy().item()

    @property
    def stop_reason(self) -> str:
        """Why training ended early ("" when it did not)."""
        return STOP_REASONS[self._get("stop_reason")] if self.stopped else ""

    @property
    def stopped(self) -> bool:
        """Whether training ended early (at the target, or by early stopping)."""
        return self._get("stopped_epoch") > 0

    def epoch_end(self, epoch: int, metrics: dict[str, Any]) -> bool:
        """Update the state after epoch `epoch` (1-based); True if the best checkpoint must
        be saved now. Sets `stopped` when training must end after this epoch."""
        save_best = False
        if self.target and not self._get("target_epoch"):
            value = self.target.value(metrics)
            if value is not None and (value >= self.target_value if self.target.maximize
                                      else value <= self.target_value):
                self.state["target_epoch"].assign(epoch)
                self.reached_at = time.time()
                log.info("target %s %s %s reached at epoch %d (%.4f)", self.target.metric,
                         ">=" if self.target.maximize else "<=", self.target_value, epoch, value)
                if self.stop_at_target:
                    self.stop(epoch, "target")
        if self.best and (value := self.best.value(metrics)) is not None:
            if self.best.beats(value, self._get("best_value")):
                self.state["best_value"].assign(value)
                self.state["best_epoch"].assign(epoch)
                save_best = True
        if self.stopping and (value := self.stopping.value(metrics)) is not None:
            if self.stopping.beats(value, self._get("stopping_best"), self.min_delta):
                self.state["stopping_best"].assign(value)
                self.state["stopping_wait"].assign(0)
            else:
                self.state["stopping_wait"].assign_add(1)
                if self._get("stopping_wait") >= self.patience and not self.stopped:
                    log.info("early stopping at epoch %d: %s did not improve by more than %g "
                             "for %d epoch(s)", epoch, self.stopping.metric, self.min_delta,
                             self.patience)
                    self.stop(epoch, "early_stopping")
        return save_best

    def stop(self, epoch: int, reason: str) -> None:
        """End training after epoch `epoch` (1-based) for `reason` (one of STOP_REASONS)."""
        self.state["stopped_epoch"].assign(epoch)
        self.state["stop_reason"].assign(STOP_REASONS.index(reason))

    def results(self, started: float, best_checkpoint: str | None = None) -> dict[str, Any]:
        """results.json fields: time_to_target_s (from `started`, when reached in this
        process), epochs_to_target, best_* (`best_checkpoint`: its prefix), stopped_early."""
        out: dict[str, Any] = {}
        if self.target:
            reached = self._get("target_epoch")
            out.update(target=f"{self.target.metric} {'>=' if self.target.maximize else '<='} "
                              f"{self.target_value}",
                       epochs_to_target=reached or None,
                       time_to_target_s=(self.reached_at - started) if self.reached_at
                       else None)
        if self.best:
            epoch = self._get("best_epoch")
            out.update(best_metric=self.best.metric,
                       best_value=self._get("best_value") if epoch else None,
                       best_epoch=epoch or None,
                       best_checkpoint=best_checkpoint if epoch else None)
        if self.stopped:
            out["stopped_early"] = {"epoch": self._get("stopped_epoch"),
                                    "reason": STOP_REASONS[self._get("stop_reason")]}
        return out
