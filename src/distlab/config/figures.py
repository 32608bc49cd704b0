"""Checks on the figures a config names: the task's metrics (task.metrics), the objective,
and the metrics the monitors and callbacks watch. Each refusal is one line naming the key;
no TensorFlow (a user task's names are checked again once it is built)."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from distlab.errors import ConfigError
from distlab.records.metrics import BUILTIN_METRICS, BUILTIN_TASKS
from distlab.records.ranking import objective_field
from distlab.records.run_dir import figure_columns

WATCHED = ("target", "early_stopping", "best_checkpoint")


def check_task_metrics(task: DictConfig) -> None:
    """Refuse, in one line, a built-in metric in task.metrics that the task does not have, or
    a name listed twice (a user's registered names are checked once imported)."""
    name = task.get("name")
    if name not in BUILTIN_TASKS:
        return
    names = [str(n) for n in task.get("metrics") or []]
    own = [n for n, (_, tasks) in BUILTIN_METRICS.items() if name in tasks]
    for i, metric in enumerate(names):
        if names.index(metric) != i:
            raise ConfigError(f"task.metrics={names} lists {metric!r} twice")
        tasks = BUILTIN_METRICS.get(metric, (None, None))[1]
        if tasks is not None and name not in tasks:
            raise ConfigError(
                f"task.metrics[{i}]={metric!r} is not a metric of task={name} (it is one of "
                f"task={', task='.join(tasks)}); task={name}'s metrics: {', '.join(own)}")


def check_objective(objective: str | None, task: str, metric_names: list[str],
                    validation: bool = True) -> None:
    """Refuse, in one line, a `val_` objective that this task does not report, or any
    objective that needs a validation split when there is none."""
    fields = ["val_loss", *(f"val_{m}" for m in metric_names)]
    if objective and objective.startswith("val_") and objective not in fields:
        raise ConfigError(f"objective={objective} is not a result of task {task!r}; its "
                          f"validation results: {', '.join(fields)}")
    field = objective_field(objective, metric_names)
    if field.startswith("val_") and not validation and objective is not None:
        raise ConfigError(f"objective={field} needs a validation split, and "
                          "dataset.validation=null: set dataset.validation=auto (or 0.1, or a "
                          "split), or another objective")


def check_search_objective(objective: str | None, task: str, metric_names: list[str],
                           validation: bool = True) -> None:
    """Refuse, in one line, a search (Optuna) whose jobs would rank by no objective, or by
    one `check_objective` refuses: before any trial runs."""
    if objective and objective.startswith("test_"):
        raise refuse_test_split("objective", objective)
    check_objective(objective, task, metric_names, validation)
    if objective_field(objective, metric_names, validation) is None:
        raise ConfigError("a search ranks its trials by an objective, and with "
                          "dataset.validation=null and no objective= the jobs report none: set "
                          "dataset.validation=auto (or 0.1, or a split), or objective= a field "
                          "measured without one (e.g. objective=train_examples_per_sec)")


def refuse_test_split(where: str, metric: str) -> ConfigError:
    """The one line refusing to watch `metric`, a test_ figure, at `where`."""
    return ConfigError(f"{where}={metric} would choose on the test split, which only reports: "
                       f"watch val_{metric[5:]} (a validation split: dataset.validation)")


def check_figure(where: str, name: str, figures: list[str], what: str) -> None:
    """Refuse, in one line naming `where`, a watched `name` on the test split (which never
    chooses) or not among `figures` (a `what`)."""
    if name.startswith("test_"):
        raise refuse_test_split(where, name)
    if name not in figures:
        raise ConfigError(f"{where}={name!r} is not a {what}; use one of {', '.join(figures)}")


def needs_validation(where: str, name: str) -> ConfigError:
    """The one line for a watched `val_` figure in a run without a validation split."""
    return ConfigError(f"{where}={name} needs a validation split, and dataset.validation=null: "
                       "set dataset.validation=auto (or 0.1, or a split), or watch a train "
                       "metric")


def check_watched(trainer: DictConfig, metric_names: list[str],
                  validation: bool = True) -> None:
    """Refuse, in one line, a monitor metric that no epoch of this run would measure, or
    one on the test split (which never chooses)."""
    figures = figure_columns(metric_names)
    for key in WATCHED:
        metric = OmegaConf.select(trainer, f"{key}.metric", default=None)
        if metric is None:
            continue
        where = f"trainer.{key}.metric"
        check_figure(where, metric, figures, "per-epoch metric of this task")
        if not metric.startswith("val_"):
            continue
        if not validation:
            raise needs_validation(where, metric)
        check_validated(where, metric, trainer)


def check_validated(where: str, name: str, trainer: DictConfig) -> None:
    """Refuse, in one line, a watched `val_` figure that no epoch of the run measures
    (trainer.validate_every 0, or over trainer.epochs)."""
    every = trainer.validate_every
    if not every:
        raise ConfigError(f"{where}={name} is measured only on epochs that validate, and "
                          "trainer.validate_every=0: set trainer.validate_every=1 (or N), "
                          "or use a train metric")
    if every > trainer.epochs:
        raise ConfigError(
            f"{where}={name} would never be measured: trainer.validate_every={every} "
            f"exceeds trainer.epochs={trainer.epochs}. Set trainer.validate_every <= "
            f"{trainer.epochs}, or use a train metric")
