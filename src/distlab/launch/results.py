"""results.json: its fields, the objective a sweeper gets, and which way each figure ranks.

`FIELDS` is the one list of results.json's fields (the README's results table documents each
one; a test checks both ways). No TensorFlow.

One rule for every place that ranks a figure: the monitors (target, early stopping, best
checkpoint), results.json's `objective_direction`, the sweep summary's best job and the
Optuna sweeper's study direction. Losses go down; a task metric goes the way its
`higher_is_better` says; times (`*_s`) and `epochs_to_target` go down; `best_value` goes
the way its metric does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from distlab.errors import ConfigError


@dataclass(frozen=True)
class Field:
    """One results.json field. `when`: the runs that write it (`WRITTEN_BY`); `objective`:
    `objective=` may name it;
    `trained`: an evaluation's `trained` repeats it from the training run."""

    name: str
    doc: str
    when: str = "train"
    objective: bool = False
    trained: bool = False


WRITTEN_BY = {"every": "every run, failed ones too", "failed": "failed runs",
              "done": "completed and interrupted runs", "completed": "completed runs",
              "train": "completed training runs", "evaluate": "evaluations",
              "optional": "when its option applies", "interrupted": "interrupted runs"}
FIELDS: tuple[Field, ...] = (
    Field("status", "completed, interrupted or failed", "every"),
    Field("error", "a failed run's one-line error", "failed"),
    Field("mode", "train or evaluate", "every"),
    Field("loop", "the loop's name (keras_fit, custom, or a registered one)", "every",
          trained=True),
    Field("strategy", "the tf.distribute strategy's class name", "every", trained=True),
    Field("dataset", "the dataset's name", "every"),
    Field("num_replicas", "replicas in sync (across every worker)", "done", trained=True),
    Field("batch_size_per_replica", "examples per replica per step", "every", trained=True),
    Field("global_batch_size", "examples per step, over every replica", "done", trained=True),
    Field("grad_accum_steps", "micro-batches per optimizer update", "done", trained=True),
    Field("effective_batch_size", "examples per optimizer update", "done", trained=True),
    Field("precision", "the dtype policy the model was built with", "done", trained=True),
    Field("learning_rate", "the base learning rate after batch-size scaling (null in an "
          "evaluation)", "done", trained=True),
    Field("steps_per_epoch", "training steps per epoch (null in an evaluation)", "done",
          trained=True),
    Field("epochs_completed", "epochs trained so far (an evaluation: the checkpoint's)", "done",
          objective=True, trained=True),
    Field("objective", "the name of the field a sweeper gets (its value: "
          "`objective_value`): `objective=`, else the task's first validation metric (never a "
          "test_ field); null with dataset.validation=null and no `objective=`", "done"),
    Field("objective_direction", "maximize or minimize: how the objective ranks (null: no "
          "objective)", "done"),
    Field("objective_value", "the value of that field in this results.json (null: no "
          "objective, or its figure is null)", "done"),
    Field("validation", "where the validation figures come from: a tfds split or slice, "
          "`<fraction> of <train split>` held out, `DataSplits.validation`, or null (none)",
          "done"),
    Field("num_validation", "examples in the validation split (null: none)", "done"),
    Field("val_loss", "the final model's mean per-example loss over the validation split "
          "(null: no validation split)", "completed", objective=True),
    Field("val_<metric>", "each task metric over the validation split (val_accuracy; val_mae, "
          "val_rmse; val_auc...)", "completed", objective=True),
    Field("test_loss", "the final model's mean per-example loss over the test split's real "
          "examples: reported, never used to choose", "completed"),
    Field("test_<metric>", "each task metric over the test split (test_accuracy; test_mae, "
          "test_rmse; test_auc...)", "completed"),
    Field("best_test_<figure>", "trainer.best_checkpoint.test: checkpoints/best's test_loss "
          "and test metrics", "optional"),
    Field("train_examples_per_sec", "steady-state training throughput, warm-up left out "
          "(null in an evaluation)", "completed", objective=True),
    Field("train_examples_per_sec_std", "its spread across epochs or step windows"),
    Field("train_examples_per_sec_per_replica", "train_examples_per_sec / num_replicas"),
    Field("train_examples_per_sec_overall", "the plain mean over every epoch this process "
          "trained, warm-up included"),
    Field("throughput_samples", "how many epochs or windows the spread is over"),
    Field("throughput_basis", "epochs or step windows: what the samples are"),
    Field("warmup_s", "training time of the warm-up left out"),
    Field("warmup_cost_s", "what the warm-up cost beyond steady-state speed"),
    Field("time_to_first_step_s", "from the job's start to its first training step",
          objective=True),
    Field("target", "trainer.target as `<metric> >= <value>` (or <=)", "optional"),
    Field("epochs_to_target", "the epoch that first reached the target (null: not reached)",
          "optional", objective=True),
    Field("time_to_target_s", "seconds from the process start (a sweep job, or "
          "distlab.train: its own start) to reaching the target, in this process; the same "
          "zero as wall_time_s", "optional", objective=True),
    Field("best_metric", "the metric checkpoints/best follows", "optional"),
    Field("best_value", "its best value", "optional", objective=True),
    Field("best_epoch", "the epoch of checkpoints/best", "optional"),
    Field("best_checkpoint", "checkpoints/best's prefix", "optional"),
    Field("stopped_early", "{epoch, reason}: training ended early after that epoch (1-based, "
          "as history.csv; a callback's hooks count from 0); reason: target, early_stopping, "
          "or callback (a callback set model.stop_training)", "optional"),
    Field("checkpoint", "the latest checkpoint's prefix (an evaluation: the one evaluated)",
          "done"),
    Field("steps_in_epoch", "an interrupted run's steps into its next epoch", "optional"),
    Field("interrupted_stage", "the stage a signal cut short: set-up, training, final "
          "evaluation, export, best-checkpoint test, finish (writing results.json, closing the "
          "tracker's run) or evaluation", "interrupted"),
    Field("saved_model", "saved_model, when trainer.export is true", "optional"),
    Field("export_max_abs_diff", "the reloaded SavedModel's largest difference from the "
          "trained model on raw test inputs", "optional"),
    Field("trained", "an evaluation: the training run's fields marked trained", "evaluate"),
    Field("wall_time_s", "the job's wall time, from the process start (a sweep job, or "
          "distlab.train: its own start)", "every", objective=True),
)
BY_NAME = {f.name: f for f in FIELDS}
OBJECTIVES = tuple(f.name for f in FIELDS if f.objective and "<" not in f.name)
TRAINED = tuple(f.name for f in FIELDS if f.trained)
# what every completed training run writes, whatever its options
COMPLETED = tuple(f.name for f in FIELDS if f.when in ("every", "done", "completed", "train")
                  and "<" not in f.name)


def is_field(name: str) -> bool:
    """Whether `name` is a results.json field (`val_<metric>`, `test_<metric>`: any such name)."""
    return name in BY_NAME or name.startswith(("val_", "test_", "best_test_"))


def failed_results(cfg: DictConfig, error: str, started: float) -> dict[str, Any]:
    """A failed job's results.json: the fields its config knows, and the error."""
    return {
        "status": "failed",
        "error": error,
        "mode": cfg.get("mode"),
        "loop": cfg.get("loop", {}).get("name"),
        "strategy": cfg.get("strategy", {}).get("name"),
        "dataset": cfg.get("dataset", {}).get("name"),
        "batch_size_per_replica": cfg.get("dataset", {}).get("batch_size_per_replica"),
        "wall_time_s": time.time() - started,
    }


def objective_value(results: dict[str, Any], objective: str | None) -> float | None:
    """The number a sweeper gets from a job's results."""
    field = objective or results.get("objective")
    value = results.get(field) if field else None
    return float(value) if value is not None else None


def with_objective_value(results: dict[str, Any]) -> dict[str, Any]:
    """`results` with `objective_value` (the value of the field `objective` names) after
    `objective_direction`."""
    out: dict[str, Any] = {}
    for key, value in results.items():
        if key != "objective_value":
            out[key] = value
        if key == "objective_direction":
            out["objective_value"] = None
    field = results.get("objective")
    value = results.get(field) if field else None
    out["objective_value"] = value if finite(value) else None
    return out


def objective_fields(name: str | None, higher: Mapping[str, bool],
                     best_maximizes: bool | None = None,
                     validation: bool = True) -> dict[str, str | None]:
    """results.json's `objective` (`name`, else the task's first validation metric; null
    without a validation split) and `objective_direction` (`maximizes`: task metrics their
    own way, times and epochs to target down, `best_value` as its metric). `higher`: metric
    name -> higher_is_better."""
    field = objective_field(name, list(higher), validation)
    if field is None:
        return {"objective": None, "objective_direction": None}
    maximize = maximizes(field, higher, best_maximizes)
    return {"objective": field, "objective_direction": "maximize" if maximize else "minimize"}


def top_k_name(k: int) -> str:
    """The name of the classification task's top-k accuracy metric."""
    return f"top{k}_accuracy"


# distlab's own metrics, as task.metrics names them (built by distlab.components.metrics):
# name -> (higher_is_better, the built-in tasks that have it)
BUILTIN_METRICS: dict[str, tuple[bool, tuple[str, ...]]] = {
    "accuracy": (True, ("classification", "binary")),
    "auc": (True, ("binary",)),
    "precision": (True, ("binary",)),
    "recall": (True, ("binary",)),
    "f1": (True, ("binary",)),
    "mae": (False, ("regression",)),
    "rmse": (False, ("regression",)),
}
BUILTIN_TASKS = ("classification", "regression", "binary")


def builtin_task_metrics(task: DictConfig) -> dict[str, bool] | None:
    """{metric name: higher_is_better} of distlab's own tasks with distlab's own metrics,
    known without building them (None for a user task, or a user metric in task.metrics).
    tests/test_config_refusals_and_directions.py checks it against `distlab.components.tasks`."""
    name = task.get("name")
    if name not in BUILTIN_TASKS:
        return None
    names = list(task.get("metrics") or [])
    if any(n not in BUILTIN_METRICS for n in names):
        return None
    known = {n: BUILTIN_METRICS[n][0] for n in names}
    top_k = task.get("top_k") if name == "classification" else None
    return {**known, **({top_k_name(int(top_k)): True} if top_k else {})}


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


SPLIT_PREFIXES = ("val_", "best_test_", "test_")


def metric_direction(metric: str, mode: str, higher: Mapping[str, bool]) -> str:
    """"max" or "min" for a figure (`val_`, `test_` prefixes allowed): `mode` unless auto;
    then losses go down and task metrics (`higher`: name -> higher_is_better) their way."""
    if mode != "auto":
        return mode
    base = metric
    for prefix in SPLIT_PREFIXES:
        base = base.removeprefix(prefix)
    return "max" if higher.get(base, base != "loss") else "min"


def maximizes(field: str, higher: Mapping[str, bool], best_maximizes: bool | None) -> bool:
    """Whether a larger value of results.json's `field` is better."""
    for prefix in SPLIT_PREFIXES:
        base = field.removeprefix(prefix)
        if base != field and (base in higher or base == "loss"):
            return metric_direction(base, "auto", higher) == "max"
    if field == "best_value" and best_maximizes is not None:
        return best_maximizes
    if field == "epochs_to_target":
        return False
    return not (field.endswith("_s") or "loss" in field or "error" in field)


def objective_field(name: str | None, metric_names: list[str],
                    validation: bool = True) -> str | None:
    """The field sweepers get: `objective`, else the task's first validation metric, else
    val_loss; without a validation split (dataset.validation=null) and no `objective`, none
    (never a test_ field: the test split only reports)."""
    if name or not validation:
        return name or None
    return f"val_{metric_names[0]}" if metric_names else "val_loss"


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


WATCHED = ("target", "early_stopping", "best_checkpoint")


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
    from distlab.launch.run_dir import figure_columns

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
