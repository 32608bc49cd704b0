"""The `task` group: the loss and the metrics, one definition used by both loops.

A task gives a per-example loss and its metrics, of two kinds. A per-example `Metric`
(`per_example(y_true, y_pred)` -> one value per example) is summed over real rows across
replicas in float64 by both loops and evaluation; its reported value is `finalize(mean over
examples)` (e.g. RMSE is the square root of the mean squared error). A stateful
`keras.metrics.Metric` (AUC, Precision, F1Score, a user's subclass), bare or wrapped in a
`Metric`, is updated per replica on the real rows and read across replicas
(`distlab.training.metrics`). `task.metrics` names built-in or registered metrics
(`distlab.components.metrics`, the `metric` registry).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from omegaconf import DictConfig
from tensorflow.autograph.experimental import do_not_convert

from distlab.errors import DistlabError

PerExample = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]  # (y_true, y_pred) -> [batch]
Prepare = Callable[[tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor]]


@dataclass
class Metric:
    """A task metric. `per_example`: a function `(y_true, y_pred) -> [batch]`, reported as
    `finalize(mean over the examples)`; or a stateful `keras.metrics.Metric` object, reported
    as `finalize(result())` over the examples. `higher_is_better` tells the monitors and sweeps
    which way to rank it (None: True, or for a Keras metric its own direction: losses and
    errors such as `keras.metrics.BinaryCrossentropy` go down). `prepare(y_true, y_pred)`, if
    given, maps the labels and the model's outputs before the metric sees them."""

    name: str
    per_example: PerExample | keras.metrics.Metric
    finalize: Callable[[float], float] = float
    higher_is_better: bool | None = None
    prepare: Prepare | None = None

    def __post_init__(self) -> None:
        if self.higher_is_better is None:
            self.higher_is_better = (keras_direction(self.per_example) if self.stateful
                                     else True)

    @property
    def stateful(self) -> bool:
        """Whether this is a stateful keras.metrics.Metric (else a per-example function)."""
        return isinstance(self.per_example, keras.metrics.Metric)

    def inputs(self, y_true: tf.Tensor, y_pred: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """(y_true, y_pred) as the metric takes them (`prepare`d, if given)."""
        return (y_true, y_pred) if self.prepare is None else self.prepare(y_true, y_pred)


def keras_direction(metric: keras.metrics.Metric) -> bool:
    """Whether a larger value of a Keras metric is better: its `higher_is_better` attribute
    if it has one, else Keras' own direction (`_direction`: "down" for losses and errors),
    else True."""
    explicit = getattr(metric, "higher_is_better", None)
    if explicit is not None:
        return bool(explicit)
    return getattr(metric, "_direction", "up") != "down"


def as_metric(item: Any, where: str) -> Metric:
    """A task's metrics entry as a `Metric` (a bare keras.metrics.Metric keeps its name)."""
    if isinstance(item, Metric):
        per_example = item.per_example
        if not (isinstance(per_example, keras.metrics.Metric) or callable(per_example)):
            raise DistlabError(f"{where}: Metric {item.name!r} holds a "
                               f"{type(per_example).__name__}; give it a per-example function "
                               "(y_true, y_pred) -> [batch] or a keras.metrics.Metric")
        return item
    if isinstance(item, keras.metrics.Metric):
        return Metric(item.name, item)
    raise DistlabError(f"{where}: a task's metrics are distlab Metric(name, per_example) or "
                       f"keras.metrics.Metric objects, not {type(item).__name__}")


@dataclass
class Task:
    """What a model is trained and scored on.

    `loss(y_true, y_pred)` returns the per-example loss. `metrics`: `Metric`s and stateful
    `keras.metrics.Metric` objects (see `Metric`). `from_logits=None` means "as the model
    outputs": distlab sets it from the model's last activation before training.
    `labels`: "classes", "values", "binary" (0/1) or "any": what the dataset's labels must be.
    `outputs`: the units of the model's output (None: the dataset's classes or values).
    """

    loss: PerExample
    metrics: list[Metric] = field(default_factory=list)
    from_logits: bool | None = None
    labels: str = "any"
    outputs: int | None = None

    @property
    def metric_names(self) -> list[str]:
        return [m.name for m in self.metrics]


def configured_metrics(cfg: DictConfig, task: Task) -> list[Metric]:
    """The metrics `cfg.metrics` names (built-in, registered, or import paths), each built by
    the `metric` registry as `f(cfg, task)`; a registered name is the metric's name."""
    from distlab.registry import METRICS, is_import_path

    metrics = []
    for i, name in enumerate(cfg.get("metrics") or []):
        where = f"task.metrics[{i}]={name!r}"
        built = METRICS.build(name, cfg, task, key=where)
        metric = as_metric(built, where)
        if not is_import_path(name):
            metric.name = name
        metrics.append(metric)
    return metrics


def classification(cfg: DictConfig) -> Task:
    """Sparse categorical cross-entropy (with `label_smoothing`: Keras' categorical
    cross-entropy on one-hot labels, smoothed); `metrics` (default: accuracy) and, with
    `top_k`, top-k accuracy."""
    smoothing = float(cfg.get("label_smoothing") or 0.0)

    @do_not_convert  # (distlab's own graph code: traced as written, see Loop)
    def loss(y, p):
        if not smoothing:
            return keras.losses.sparse_categorical_crossentropy(
                y, p, from_logits=bool(task.from_logits))
        classes = keras.ops.shape(p)[-1]
        labels = keras.ops.one_hot(keras.ops.reshape(keras.ops.cast(y, "int32"), [-1]), classes,
                                   dtype=p.dtype)
        return keras.losses.categorical_crossentropy(
            labels, p, from_logits=bool(task.from_logits), label_smoothing=smoothing)

    task = Task(loss=loss, from_logits=cfg.get("from_logits"), labels="classes")
    task.metrics = configured_metrics(cfg, task)
    if cfg.get("top_k"):
        k = int(cfg.top_k)
        task.metrics.append(Metric(f"top{k}_accuracy", do_not_convert(lambda y, p: (
            keras.metrics.sparse_top_k_categorical_accuracy(y, p, k=k)))))
    return task


def regression(cfg: DictConfig) -> Task:
    """Mean squared error; `metrics` (default: MAE and RMSE). Labels of shape [batch] or
    [batch, outputs]."""
    @do_not_convert
    def squared(y, p):
        return keras.losses.mean_squared_error(*aligned(y, p))

    task = Task(loss=squared, from_logits=False, labels="values")
    task.metrics = configured_metrics(cfg, task)
    return task


def binary(cfg: DictConfig) -> Task:
    """Binary cross-entropy (with `label_smoothing`, Keras' smoothing towards 0.5) on 0/1 labels
    (ints or floats) and a model with one output unit (a logit, or a sigmoid probability);
    `metrics` (default: accuracy at probability 0.5, AUC, precision, recall)."""
    smoothing = float(cfg.get("label_smoothing") or 0.0)

    @do_not_convert
    def loss(y, p):
        return keras.losses.binary_crossentropy(*aligned(y, p), from_logits=bool(task.from_logits),
                                                label_smoothing=smoothing)

    task = Task(loss=loss, from_logits=cfg.get("from_logits"), labels="binary", outputs=1)
    task.metrics = configured_metrics(cfg, task)
    for metric in task.metrics:  # a bare Keras metric (AUC, BinaryCrossentropy...) of yours
        if metric.stateful and metric.prepare is None:
            metric.prepare = probabilities(task)
    return task


def probabilities(task: Task, rank: int = 2) -> Prepare:
    """prepare() for a metric under task=binary: float 0/1 labels and probabilities (a logit
    model's outputs through a sigmoid), both of shape [batch] (rank 1) or [batch, 1] (rank
    2), as Keras' binary metrics take them."""
    shape = [-1] if rank == 1 else [-1, 1]

    def prepare(y: tf.Tensor, p: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        p = tf.cast(p, tf.float32)
        if task.from_logits:
            p = tf.sigmoid(p)
        return tf.reshape(tf.cast(y, tf.float32), shape), tf.reshape(p, shape)

    return prepare


def aligned(y: tf.Tensor, p: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Float labels shaped like the predictions ([batch] labels for a [batch, 1] output)."""
    y = tf.cast(y, p.dtype)
    if y.shape.rank == p.shape.rank - 1:
        y = tf.expand_dims(y, -1)
    return y, p


def outputs_probabilities(model: keras.Model) -> bool:
    """Whether the model's last layer ends in softmax or sigmoid (else: logits)."""
    last = model.layers[-1] if model.layers else None
    while isinstance(last, keras.Model) and last.layers:  # a model wrapped in another
        last = last.layers[-1]
    activation = getattr(last, "activation", None)
    return activation in (keras.activations.softmax, keras.activations.sigmoid)


def check_labels(task: Task, name: str, dataset: str, classes: bool, outputs: int | None = None,
                 sample: Callable[[], np.ndarray] | None = None) -> None:
    """Refuse, in one line, a task whose labels the dataset does not have. `outputs`: the
    dataset's classes or values per example; `sample()`: some of its labels (task=binary on
    value labels checks that they are 0 or 1)."""
    if task.labels == "binary":
        _check_binary(name, dataset, classes, outputs, sample)
    if task.labels == "classes" and not classes:
        raise DistlabError(f"task={name} needs class labels, but dataset {dataset}'s labels are "
                           "values (float, or no num_classes): use task=regression")
    if task.labels == "values" and classes:
        raise DistlabError(f"task={name} needs value labels, but dataset {dataset}'s labels are "
                           "classes: use task=classification")


def _check_binary(name: str, dataset: str, classes: bool, outputs: int | None,
                  sample: Callable[[], np.ndarray] | None) -> None:
    if classes and outputs not in (None, 2):
        raise DistlabError(f"task={name} needs 0/1 labels, but dataset {dataset}'s labels are "
                           f"{outputs} classes: use task=classification")
    if classes:
        return
    if outputs not in (None, 1):
        raise DistlabError(f"task={name} needs one 0/1 label per example, but dataset "
                           f"{dataset}'s labels have {outputs} values: use task=regression")
    values = np.unique(sample()) if sample is not None else np.array([])
    other = values[~np.isin(values, (0, 1))]
    if other.size:
        raise DistlabError(f"task={name} needs 0/1 labels, but dataset {dataset}'s labels "
                           f"include {other[0]:g}: use task=regression for value labels")


def build(cfg: DictConfig) -> Task:
    """The task `cfg.name` names (its `from_logits` may still be None: see `settle`); its
    metrics as `Metric`s (a bare keras.metrics.Metric wrapped), their names checked."""
    from distlab.registry import TASKS

    task = TASKS.build(cfg.name, cfg)
    if not isinstance(task, Task):
        raise DistlabError(f"task.name={cfg.name!r} returned {type(task).__name__}; a task "
                           "builder returns distlab.Task(loss=..., metrics=[...])")
    where = f"task.name={cfg.name!r}"
    if isinstance(task.loss, keras.losses.Loss) and task.loss.reduction not in (None, "none"):
        raise DistlabError(
            f"{where}: its loss {type(task.loss).__name__} reduces each batch to one value "
            f"(reduction={task.loss.reduction!r}); a task's loss returns one value per "
            f"example, which distlab averages over the global batch: give it reduction=None")
    task.metrics = [as_metric(m, where) for m in task.metrics]
    names = task.metric_names
    for metric_name in names:
        if names.count(metric_name) > 1 or metric_name == "loss" or not metric_name:
            raise DistlabError(f"{where}: its metrics are named {', '.join(map(repr, names))}; "
                               "each needs its own name, other than 'loss' (the history's "
                               "columns and results.json's test_<name> fields)")
    return task


def settle(task: Task, model: keras.Model) -> None:
    """`from_logits=None`: as the model outputs (softmax/sigmoid last layer, else logits).
    A task with `outputs` (task=binary: 1) refuses a model with other outputs, in one line."""
    if task.from_logits is None:
        task.from_logits = not outputs_probabilities(model)
    shapes = [tuple(o.shape) for o in getattr(model, "outputs", None) or []]
    if task.outputs is not None and shapes and (len(shapes) > 1 or shapes[0][-1] != task.outputs):
        shown = ", ".join(str(s) for s in shapes)
        raise DistlabError(f"the task needs a model with one output of {task.outputs} unit(s) "
                           f"(task=binary: one logit or a sigmoid probability), but model "
                           f"{model.name!r} outputs {shown}")
