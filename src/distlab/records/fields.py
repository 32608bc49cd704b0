"""results.json's fields: `FIELDS`, the one list, each field with its type, the way it ranks
and its meaning (the README's and the documentation site's results.json tables are this list;
a test checks the README's both ways, another a real run's results.json against it).

A field's `direction`: "max" (larger is better), "min", "metric" (a figure of a task metric
or loss: the metric's own way, `distlab.records.ranking`), "best" (the way the metric
checkpoints/best follows goes) or None (a setting or a label: it does not rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Direction = Literal["max", "min", "metric", "best"] | None


@dataclass(frozen=True)
class Field:
    """One results.json field. `type`: its JSON value ("str", "int", "float", "bool",
    "object", "| null" when it may be null); `direction`: which way it ranks (see the module);
    `when`: the runs that write it (`WRITTEN_BY`); `objective`: `objective=` may name it;
    `trained`: an evaluation's `trained` repeats it from the training run."""

    name: str
    type: str
    direction: Direction
    doc: str
    when: str = "train"
    objective: bool = False
    trained: bool = False

    @property
    def pattern(self) -> bool:
        """A family of fields (`val_<metric>`), one per metric of the task."""
        return "<" in self.name


WRITTEN_BY = {"every": "every run, failed ones too", "failed": "failed runs",
              "done": "completed and interrupted runs", "completed": "completed runs",
              "train": "completed training runs", "evaluate": "evaluations",
              "optional": "when its option applies", "interrupted": "interrupted runs"}
F = Field
FIELDS: tuple[Field, ...] = (
    F("status", "str", None, "completed, pruned (a search's pruner stopped it: finished), "
      "interrupted or failed", "every"),
    F("error", "str", None, "a failed run's one-line error", "failed"),
    F("mode", "str", None, "train or evaluate", "every"),
    F("loop", "str", None, "the loop's name (keras_fit, custom, or a registered one)", "every",
      trained=True),
    F("strategy", "str", None, "the tf.distribute strategy's class name", "every",
      trained=True),
    F("dataset", "str", None, "the dataset's name", "every"),
    F("num_replicas", "int", None, "replicas in sync (across every worker)", "done",
      trained=True),
    F("batch_size_per_replica", "int", None, "examples per replica per step", "every",
      trained=True),
    F("global_batch_size", "int", None, "examples per step, over every replica", "done",
      trained=True),
    F("grad_accum_steps", "int", None, "micro-batches per optimizer update", "done",
      trained=True),
    F("effective_batch_size", "int", None, "examples per optimizer update", "done",
      trained=True),
    F("precision", "str", None, "the dtype policy the model was built with", "done",
      trained=True),
    F("learning_rate", "float | null", None, "the base learning rate after batch-size "
      "scaling (null in an evaluation)", "done", trained=True),
    F("steps_per_epoch", "int | null", None, "training steps per epoch (null in an "
      "evaluation)", "done", trained=True),
    F("epochs_completed", "int", "max", "epochs trained so far (an evaluation: the "
      "checkpoint's)", "done", objective=True, trained=True),
    F("objective", "str | null", None, "the name of the field a sweeper gets (its value: "
      "`objective_value`): `objective=`, else the task's first validation metric (never a "
      "test_ field); null with dataset.validation=null and no `objective=`", "done"),
    F("objective_direction", "str | null", None, "maximize or minimize: how the objective "
      "ranks (null: no objective)", "done"),
    F("objective_value", "float | null", None, "the value of that field in this results.json "
      "(null: no objective, or its figure is null)", "done"),
    F("validation", "str | null", None, "where the validation figures come from: a tfds split "
      "or slice, `<fraction> of <train split>` held out, `DataSplits.validation`, or null "
      "(none)", "done"),
    F("num_validation", "int | null", None, "examples in the validation split (null: none)",
      "done"),
    F("val_loss", "float | null", "min", "the final model's mean per-example loss over the "
      "validation split (null: no validation split)", "completed", objective=True),
    F("val_<metric>", "float | null", "metric", "each task metric over the validation split "
      "(val_accuracy; val_mae, val_rmse; val_auc...)", "completed", objective=True),
    F("test_loss", "float | null", "min", "the final model's mean per-example loss over the "
      "test split's real examples: reported, never used to choose", "completed"),
    F("test_<metric>", "float | null", "metric", "each task metric over the test split "
      "(test_accuracy; test_mae, test_rmse; test_auc...)", "completed"),
    F("best_test_<figure>", "float | null", "metric", "trainer.best_checkpoint.test: "
      "checkpoints/best's test_loss and test metrics", "optional"),
    F("train_examples_per_sec", "float | null", "max", "steady-state training throughput, "
      "warm-up left out (null in an evaluation)", "completed", objective=True),
    F("train_examples_per_sec_std", "float | null", "min", "its spread across epochs or step "
      "windows"),
    F("train_examples_per_sec_per_replica", "float | null", "max",
      "train_examples_per_sec / num_replicas"),
    F("train_examples_per_sec_overall", "float | null", "max", "the plain mean over every "
      "epoch this process trained, warm-up included"),
    F("throughput_samples", "int", None, "how many epochs or windows the spread is over"),
    F("throughput_basis", "str", None, "epochs or step windows: what the samples are"),
    F("warmup_s", "float | null", "min", "training time of the warm-up left out"),
    F("warmup_cost_s", "float | null", "min", "what the warm-up cost beyond steady-state "
      "speed"),
    F("time_to_first_step_s", "float | null", "min", "from the job's start to its first "
      "training step", objective=True),
    F("target", "str", None, "trainer.target as `<metric> >= <value>` (or <=)", "optional"),
    F("epochs_to_target", "int | null", "min", "the epoch that first reached the target "
      "(null: not reached)", "optional", objective=True),
    F("time_to_target_s", "float | null", "min", "seconds from the process start (a sweep "
      "job, or distlab.train: its own start) to reaching the target, in this process; the "
      "same zero as wall_time_s", "optional", objective=True),
    F("best_metric", "str", None, "the metric checkpoints/best follows", "optional"),
    F("best_value", "float | null", "best", "its best value", "optional", objective=True),
    F("best_epoch", "int | null", None, "the epoch of checkpoints/best", "optional"),
    F("best_checkpoint", "str | null", None, "checkpoints/best's prefix", "optional"),
    F("stopped_early", "object", None, "{epoch, reason}: training ended early after that "
      "epoch (1-based, as history.csv; a callback's hooks count from 0); reason: target, "
      "early_stopping, callback (a callback set model.stop_training) or pruned", "optional"),
    F("pruned", "object", None, "{epoch, metric, value}: the search's pruner stopped this "
      "trial after that epoch, whose validation figure (metric, the objective) was value",
      "optional"),
    F("checkpoint", "str | null", None, "the latest checkpoint's prefix (an evaluation: the "
      "one evaluated)", "done"),
    F("steps_in_epoch", "int", None, "an interrupted run's steps into its next epoch",
      "optional"),
    F("interrupted_stage", "str", None, "the stage a signal cut short: set-up, training, "
      "final evaluation, export, best-checkpoint test, finish (writing results.json, closing "
      "the tracker's run) or evaluation", "interrupted"),
    F("saved_model", "str", None, "saved_model, when trainer.export is true", "optional"),
    F("export_max_abs_diff", "float | null", "min", "the reloaded SavedModel's largest "
      "difference from the trained model on raw test inputs", "optional"),
    F("trained", "object | null", None, "an evaluation: the training run's fields marked "
      "trained", "evaluate"),
    F("wall_time_s", "float", "min", "the job's wall time, from the process start (a sweep "
      "job, or distlab.train: its own start)", "every", objective=True),
)
del F
BY_NAME = {f.name: f for f in FIELDS}
OBJECTIVES = tuple(f.name for f in FIELDS if f.objective and not f.pattern)
TRAINED = tuple(f.name for f in FIELDS if f.trained)
# what every completed training run writes, whatever its options
COMPLETED = tuple(f.name for f in FIELDS if f.when in ("every", "done", "completed", "train")
                  and not f.pattern)
# the families' prefixes, longest first (best_test_loss is best_test_<figure>, not test_)
_FAMILIES = tuple(sorted(((f.name.split("<")[0], f) for f in FIELDS if f.pattern),
                         key=lambda p: -len(p[0])))


def field_of(name: str) -> Field | None:
    """The field `name` is (`val_auc`: `val_<metric>`), or None: not a results.json field."""
    if name in BY_NAME:
        return BY_NAME[name]
    return next((f for prefix, f in _FAMILIES if name.startswith(prefix) and name != prefix),
                None)


def is_field(name: str) -> bool:
    """Whether `name` is a results.json field (`val_<metric>`, `test_<metric>`: any such name)."""
    return field_of(name) is not None


_TYPES: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "float": (int, float),
                                       "bool": (bool,), "object": (dict,)}


def fits(field: Field, value: Any) -> bool:
    """Whether `value` (as read back from results.json) has `field`'s declared type."""
    kinds = [k.strip() for k in field.type.split("|")]
    if value is None:
        return "null" in kinds
    if isinstance(value, bool) and "bool" not in kinds:
        return False
    return any(isinstance(value, _TYPES[k]) for k in kinds if k != "null")
