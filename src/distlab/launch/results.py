"""Which figures a run can watch and rank, and which way each one ranks. No TensorFlow.

One rule for every place that ranks a figure: the monitors (target, early stopping, best
checkpoint), results.json's `objective_direction`, the sweep summary's best job and the
Optuna sweeper's study direction. Losses go down; a task metric goes the way its
`higher_is_better` says; times (`*_s`) and `epochs_to_target` go down; `best_value` goes
the way its metric does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from distlab.errors import ConfigError


def top_k_name(k: int) -> str:
    """The name of the classification task's top-k accuracy metric."""
    return f"top{k}_accuracy"


def builtin_task_metrics(task: DictConfig) -> dict[str, bool] | None:
    """{metric name: higher_is_better} of distlab's own tasks, known without building them
    (None for a user task). tests/test_objective.py checks it against `distlab.components.tasks`."""
    name = task.get("name")
    if name == "classification":
        top_k = task.get("top_k")
        return {"accuracy": True, **({top_k_name(int(top_k)): True} if top_k else {})}
    if name == "regression":
        return {"mae": False, "rmse": False}
    return None


def metric_direction(metric: str, mode: str, higher: Mapping[str, bool]) -> str:
    """"max" or "min" for a history column (`val_` prefix allowed): `mode` unless auto;
    then losses go down and task metrics (`higher`: name -> higher_is_better) their way."""
    if mode != "auto":
        return mode
    base = metric.removeprefix("val_")
    return "max" if higher.get(base, base != "loss") else "min"


def maximizes(field: str, higher: Mapping[str, bool], best_maximizes: bool | None) -> bool:
    """Whether a larger value of results.json's `field` is better."""
    if field.startswith("test_") and (field[5:] in higher or field == "test_loss"):
        return metric_direction(field[5:], "auto", higher) == "max"
    if field == "best_value" and best_maximizes is not None:
        return best_maximizes
    if field == "epochs_to_target":
        return False
    return not (field.endswith("_s") or "loss" in field or "error" in field)


def objective_field(name: str | None, metric_names: list[str]) -> str:
    """The field sweepers get: `objective`, else the task's first metric, else test_loss."""
    return name or (f"test_{metric_names[0]}" if metric_names else "test_loss")


def best_metric(trainer: DictConfig) -> tuple[str | None, str]:
    """(metric, mode) that checkpoints/best follows: best_checkpoint's, else early stopping's."""
    best = trainer.best_checkpoint
    if best.metric is not None:
        return best.metric, best.mode
    return trainer.early_stopping.metric, trainer.early_stopping.mode


def direction(cfg: DictConfig, higher: Mapping[str, bool]) -> str:
    """"maximize" or "minimize": how to rank this config's objective (`higher`: the task's
    metrics' higher_is_better)."""
    field = objective_field(cfg.get("objective"), list(higher))
    metric, mode = best_metric(cfg.trainer)
    best = metric_direction(metric, mode, higher) == "max" if metric else None
    return "maximize" if maximizes(field, higher, best) else "minimize"


def task_metrics(cfg: DictConfig) -> dict[str, bool]:
    """{metric name: higher_is_better} of the configured task; a user task is built for it
    (its modules imported), which imports TensorFlow."""
    known = builtin_task_metrics(cfg.task)
    if known is not None:
        return known
    from distlab import plugins
    from distlab.components import tasks

    plugins.check(cfg)
    return {m.name: m.higher_is_better for m in tasks.build(cfg.task).metrics}


WATCHED = ("target", "early_stopping", "best_checkpoint")


def check_watched(trainer: DictConfig, metric_names: list[str]) -> None:
    """Refuse, in one line, a monitor metric that no epoch of this run would measure."""
    from distlab.launch.run_dir import history_columns

    figures = [c for c in history_columns(metric_names)
               if c not in ("epoch", "learning_rate", "seconds", "examples_per_sec")]
    for key in WATCHED:
        metric = OmegaConf.select(trainer, f"{key}.metric", default=None)
        if metric is None:
            continue
        where = f"trainer.{key}.metric"
        if metric not in figures:
            raise ConfigError(f"{where}={metric!r} is not a per-epoch metric of this task; use "
                              f"one of {', '.join(figures)}")
        if not metric.startswith("val_"):
            continue
        every = trainer.validate_every
        if not every:
            raise ConfigError(f"{where}={metric} is measured only on epochs that validate, and "
                              "trainer.validate_every=0: set trainer.validate_every=1 (or N), "
                              "or use a train metric")
        if every > trainer.epochs:
            raise ConfigError(
                f"{where}={metric} would never be measured: trainer.validate_every={every} "
                f"exceeds trainer.epochs={trainer.epochs}. Set trainer.validate_every <= "
                f"{trainer.epochs}, or use a train metric")


def finite(value: Any) -> bool:
    """A real number that is neither NaN nor infinite."""
    return isinstance(value, int | float) and math.isfinite(value)
