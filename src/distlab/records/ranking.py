"""The one rule for which way a figure ranks, for every place that ranks one: the monitors
(target, early stopping, best checkpoint), the callbacks' `mode: auto`, results.json's
`objective_direction`, the sweep summary's best job and the Optuna sweeper's study.

`maximizes(name, higher, best)` decides. A results.json field ranks the way `FIELDS` declares
(times and `epochs_to_target` down, throughput up, its spread down); a figure of the task (a
history.csv column such as `loss`, `accuracy`, `val_auc`, or a `test_`/`best_test_` field)
ranks its metric's way: losses down, a task metric as its `higher_is_better` says (`higher`,
else distlab's own metrics'; one neither knows, by its name: loss or error down, else up);
`best_value` ranks as the metric checkpoints/best follows (`best`). The others are wrappers
that name it for their callers.
"""

from __future__ import annotations

from collections.abc import Mapping

from omegaconf import DictConfig, OmegaConf

from distlab.records.fields import field_of
from distlab.records.metrics import BUILTIN_METRICS

SPLIT_PREFIXES = ("val_", "best_test_", "test_")
_BUILTIN = {name: higher for name, (higher, _) in BUILTIN_METRICS.items()}


def figure_maximizes(figure: str, higher: Mapping[str, bool] = {}) -> bool:  # noqa: B006
    """Whether a larger value of a figure of the task is better: `loss` (any split) down,
    a metric its `higher_is_better` (`higher`, else distlab's own); a metric no task
    describes here (an old sweep's user metric) down if its name says loss or error, else up."""
    base = figure
    for prefix in SPLIT_PREFIXES:
        base = base.removeprefix(prefix)
    if base == "loss":
        return False
    if base in higher or base in _BUILTIN:
        return higher.get(base, _BUILTIN.get(base))
    return not ("loss" in base or "error" in base)


def maximizes(name: str, higher: Mapping[str, bool] = {},  # noqa: B006
              best: bool | None = None) -> bool:
    """Whether a larger value of `name` (a results.json field or a figure of the task) is
    better. `higher`: the task's metric name -> higher_is_better; `best`: whether the metric
    checkpoints/best follows maximizes (None: none followed; then `best_value` counts up).
    A field that does not rank (a setting or a label) is a ValueError."""
    field = field_of(name)
    if field is None or field.direction == "metric":
        return figure_maximizes(name, higher)
    if field.direction == "best":
        return True if best is None else best
    if field.direction is None:
        raise ValueError(f"results.json's {name} does not rank (it is a setting or a label)")
    return field.direction == "max"


def metric_direction(metric: str, mode: str, higher: Mapping[str, bool]) -> str:
    """"max" or "min" for a watched figure: `mode` unless auto, else `maximizes`'."""
    if mode != "auto":
        return mode
    return "max" if maximizes(metric, higher) else "min"


def objective_field(name: str | None, metric_names: list[str],
                    validation: bool = True) -> str | None:
    """The field sweepers get: `objective`, else the task's first validation metric, else
    val_loss; without a validation split (dataset.validation=null) and no `objective`, none
    (never a test_ field: the test split only reports)."""
    if name or not validation:
        return name or None
    return f"val_{metric_names[0]}" if metric_names else "val_loss"


def objective_fields(name: str | None, higher: Mapping[str, bool],
                     best_maximizes: bool | None = None,
                     validation: bool = True) -> dict[str, str | None]:
    """results.json's `objective` (`name`, else the task's first validation metric; null
    without a validation split) and `objective_direction` (`maximizes`). `higher`: metric
    name -> higher_is_better."""
    field = objective_field(name, list(higher), validation)
    if field is None:
        return {"objective": None, "objective_direction": None}
    maximize = maximizes(field, higher, best_maximizes)
    return {"objective": field, "objective_direction": "maximize" if maximize else "minimize"}


def best_metric(trainer: DictConfig) -> tuple[str | None, str]:
    """(metric, mode) that checkpoints/best follows: best_checkpoint's, else early stopping's."""
    best = trainer.best_checkpoint
    if best.metric is not None:
        return best.metric, best.mode
    return trainer.early_stopping.metric, trainer.early_stopping.mode


def has_validation(cfg: DictConfig) -> bool:
    """Whether this config's runs validate (dataset.validation is not null)."""
    return OmegaConf.select(cfg, "dataset.validation", default="auto") is not None


def direction(cfg: DictConfig, higher: Mapping[str, bool]) -> str | None:
    """"maximize" or "minimize": how to rank this config's objective, the field its jobs
    write as theirs (`objective_field`); None when they write none (no `objective` and no
    validation split). `higher`: the task's metrics' higher_is_better."""
    field = objective_field(cfg.get("objective"), list(higher), has_validation(cfg))
    if field is None:
        return None
    metric, mode = best_metric(cfg.trainer)
    best = metric_direction(metric, mode, higher) == "max" if metric else None
    return "maximize" if maximizes(field, higher, best) else "minimize"
