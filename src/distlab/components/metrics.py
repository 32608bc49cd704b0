"""distlab's own metrics, as `task.metrics` names them (the `metric` registry).

A metric builder is called as `f(cfg, task)`: `cfg` is the task's config node, `task` the
`Task` being built (its `labels` say which kind; its `from_logits` is settled from the model
before the metric first runs, so read it inside the metric, not in the builder). It returns a
`Metric` (a per-example function, or a stateful `keras.metrics.Metric` with `prepare`) or a
bare `keras.metrics.Metric`. Which task has which metric, and which way each ranks, is
`distlab.records.metrics.BUILTIN_METRICS` (no TensorFlow; the config is checked against it).

Binary metrics threshold the probability at 0.5 (a logit model's outputs go through a
sigmoid first), as Keras' BinaryAccuracy, Precision and Recall do (`p > 0.5`).
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf
from omegaconf import DictConfig
from tensorflow.autograph.experimental import do_not_convert

from distlab.components.tasks import Metric, Task, aligned, probabilities
from distlab.errors import DistlabError
from distlab.records.metrics import BUILTIN_METRICS

THRESHOLD = 0.5  # binary: a probability above it predicts 1
AUC_THRESHOLDS = 1000  # keras.metrics.AUC's buckets (its default, 200, is coarser)


def _kind(task: Task) -> str:
    """The built-in task a Task's labels correspond to."""
    return {"classes": "classification", "values": "regression", "binary": "binary"}.get(
        task.labels, task.labels)


def _check(name: str, task: Task) -> None:
    tasks = BUILTIN_METRICS[name][1]
    if _kind(task) not in tasks:
        raise DistlabError(f"metric {name!r} is a metric of task={' or task='.join(tasks)}, not "
                           f"of a task with {task.labels!r} labels")


def accuracy(cfg: DictConfig, task: Task) -> Metric:
    """Classification: the top class is the label. Binary: the probability is above 0.5
    exactly when the label is 1."""
    _check("accuracy", task)
    if task.labels != "binary":
        return Metric("accuracy", keras.metrics.sparse_categorical_accuracy)
    prepare = probabilities(task, rank=1)

    @do_not_convert
    def binary_accuracy(y: tf.Tensor, p: tf.Tensor) -> tf.Tensor:
        y, p = prepare(y, p)
        return tf.cast(tf.equal(y, tf.cast(p > THRESHOLD, y.dtype)), tf.float32)

    return Metric("accuracy", binary_accuracy)


def auc(cfg: DictConfig, task: Task) -> Metric:
    """Area under the ROC curve (keras.metrics.AUC, 1000 thresholds)."""
    _check("auc", task)
    return Metric("auc", keras.metrics.AUC(num_thresholds=AUC_THRESHOLDS, name="auc"),
                  prepare=probabilities(task, rank=1))


def precision(cfg: DictConfig, task: Task) -> Metric:
    """Of the examples predicted 1 (probability > 0.5), the fraction labelled 1."""
    _check("precision", task)
    return Metric("precision", keras.metrics.Precision(thresholds=THRESHOLD, name="precision"),
                  prepare=probabilities(task, rank=1))


def recall(cfg: DictConfig, task: Task) -> Metric:
    """Of the examples labelled 1, the fraction predicted 1 (probability > 0.5)."""
    _check("recall", task)
    return Metric("recall", keras.metrics.Recall(thresholds=THRESHOLD, name="recall"),
                  prepare=probabilities(task, rank=1))


def f1(cfg: DictConfig, task: Task) -> Metric:
    """The harmonic mean of precision and recall at probability 0.5."""
    _check("f1", task)
    return Metric("f1", keras.metrics.F1Score(average="micro", threshold=THRESHOLD, name="f1"),
                  prepare=probabilities(task, rank=2))


def mae(cfg: DictConfig, task: Task) -> Metric:
    """Regression: the mean absolute error."""
    _check("mae", task)
    return Metric("mae", do_not_convert(
        lambda y, p: keras.losses.mean_absolute_error(*aligned(y, p))),
                  higher_is_better=False)


def rmse(cfg: DictConfig, task: Task) -> Metric:
    """Regression: the square root of the mean squared error."""
    _check("rmse", task)
    return Metric("rmse", do_not_convert(
        lambda y, p: keras.losses.mean_squared_error(*aligned(y, p))),
                  finalize=math.sqrt, higher_is_better=False)
