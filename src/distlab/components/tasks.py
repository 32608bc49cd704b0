"""The `task` group: the loss and the metrics, one definition used by both loops.

A task gives a per-example loss and per-example metrics. `loop=keras_fit` compiles them
(weighted by distlab's row weights); `loop=custom` and evaluation sum them over real rows
across replicas in float64. A metric's reported value is `finalize(mean over examples)`
(e.g. RMSE is the square root of the mean squared error).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import keras
import tensorflow as tf
from omegaconf import DictConfig

from distlab.errors import DistlabError

PerExample = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]  # (y_true, y_pred) -> [batch]


@dataclass
class Metric:
    """A metric reported as `finalize(mean of per_example over the examples)`;
    `higher_is_better` tells sweeps (best job, Optuna's default) which way to rank it."""

    name: str
    per_example: PerExample
    finalize: Callable[[float], float] = float
    higher_is_better: bool = True


@dataclass
class Task:
    """What a model is trained and scored on.

    `loss(y_true, y_pred)` returns the per-example loss. `from_logits=None` means "as the
    model outputs": distlab sets it from the model's last activation before training.
    `labels`: "classes", "values" or "any": what the dataset's labels must be.
    """

    loss: PerExample
    metrics: list[Metric] = field(default_factory=list)
    from_logits: bool | None = None
    labels: str = "any"

    @property
    def metric_names(self) -> list[str]:
        return [m.name for m in self.metrics]


def classification(cfg: DictConfig) -> Task:
    """Sparse categorical cross-entropy; accuracy and, with `top_k`, top-k accuracy."""
    task = Task(loss=lambda y, p: keras.losses.sparse_categorical_crossentropy(
        y, p, from_logits=bool(task.from_logits)), from_logits=cfg.get("from_logits"),
        labels="classes")
    task.metrics.append(Metric("accuracy", keras.metrics.sparse_categorical_accuracy))
    if cfg.get("top_k"):
        k = int(cfg.top_k)
        task.metrics.append(Metric(f"top{k}_accuracy", lambda y, p: (
            keras.metrics.sparse_top_k_categorical_accuracy(y, p, k=k))))
    return task


def regression(cfg: DictConfig) -> Task:
    """Mean squared error; MAE and RMSE. Labels of shape [batch] or [batch, outputs]."""
    def squared(y, p):
        return keras.losses.mean_squared_error(*_aligned(y, p))

    def absolute(y, p):
        return keras.losses.mean_absolute_error(*_aligned(y, p))

    return Task(loss=squared, metrics=[
        Metric("mae", absolute, higher_is_better=False),
        Metric("rmse", squared, finalize=math.sqrt, higher_is_better=False)],
                from_logits=False, labels="values")


def _aligned(y: tf.Tensor, p: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
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


def check_labels(task: Task, name: str, dataset: str, classes: bool) -> None:
    """Refuse a task whose labels the dataset does not have, in one line."""
    if task.labels == "classes" and not classes:
        raise DistlabError(f"task={name} needs class labels, but dataset {dataset}'s labels are "
                           "values (float, or no num_classes): use task=regression")
    if task.labels == "values" and classes:
        raise DistlabError(f"task={name} needs value labels, but dataset {dataset}'s labels are "
                           "classes: use task=classification")


def build(cfg: DictConfig) -> Task:
    """The task `cfg.name` names (its `from_logits` may still be None: see `settle`)."""
    from distlab.registry import TASKS

    task = TASKS.get(cfg.name)(cfg)
    if not isinstance(task, Task):
        raise DistlabError(f"task.name={cfg.name!r} returned {type(task).__name__}; a task "
                           "builder returns distlab.components.tasks.Task(loss=..., metrics=[...])")
    return task


def settle(task: Task, model: keras.Model) -> None:
    """`from_logits=None`: as the model outputs (softmax/sigmoid last layer, else logits)."""
    if task.from_logits is None:
        task.from_logits = not outputs_probabilities(model)
