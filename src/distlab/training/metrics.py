"""A task's stateful Keras metrics (AUC, Precision, ...) under a strategy: exact over the real
rows of every replica and worker, and across a mid-epoch resume.

Each stateful `Metric` of the task is cloned (`from_config(get_config())`, so a metric object
made at import time, outside any scope, works) into three sets:
- `train` and `eval`, made in the strategy's scope: Keras gives their variables one copy per
  replica, summed when read in cross-replica context (aggregation "sum", through the
  collective across workers). Every replica updates them on its rows with sample weight 1
  for a real row and 0 for a padding row (distlab's row weights, n_k*R/n on a short batch,
  would weigh rows unevenly). Training and evaluation are separate sets, so a validation
  pass never clobbers the epoch's running training state.
- a scratch set of plain variables, outside the scope, on which the metrics are checked;
- a reader set, float64 copies outside the scope, that turns a state into figures: the
  counts are exact in float32, and their ratios (precision = 16/23) are computed in float64
  (a metric that cannot be made in float64 is read in its own dtype).

A set's state is one float64 vector (every variable, flattened, in order). Only metrics whose
variables are all sums, zero after `reset_state()`, are accepted, so states add up: the
training state is the second part of an epoch's `training.epoch_sums.EpochSums` (after the
batch stats; `means()` reads both), a mid-epoch checkpoint saves it, and a resumed epoch adds
the restored state to the state of its own steps (base + current, then `result()` on the
reader copy).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from distlab.components.tasks import Metric, Task
from distlab.errors import DistlabError, described

log = logging.getLogger("distlab")
Sample = Callable[[], tuple[tf.Tensor, tf.Tensor]]  # one row: (labels, predictions)


class MetricSet:
    """One clone of each stateful metric (`train`, `eval` or the scratch set)."""

    def __init__(self, metrics: list[Metric], objects: list[keras.metrics.Metric]) -> None:
        self.metrics, self.objects = metrics, objects

    def update(self, labels: tf.Tensor, predictions: tf.Tensor, weights: tf.Tensor) -> None:
        """Per replica: add its rows, real ones (weight > 0) with weight 1, padding with 0."""
        for metric, obj in zip(self.metrics, self.objects, strict=True):
            y_true, y_pred = metric.inputs(labels, predictions)
            obj.update_state(y_true, y_pred, sample_weight=tf.cast(weights > 0, obj.dtype))

    def reset(self) -> None:
        for obj in self.objects:
            obj.reset_state()

    def read(self) -> np.ndarray:
        """The state, summed over replicas (and workers: every worker reads), as float64."""
        values = [np.asarray(v.numpy(), np.float64).ravel()
                  for obj in self.objects for v in obj.variables]
        return np.concatenate(values) if values else np.zeros(0)

    @property
    def variables(self) -> list:
        return [v for obj in self.objects for v in obj.variables]


class RealRows(keras.metrics.Metric):
    """A stateful task metric as `model.compile` takes it (loop=keras_fit): `inner`, updated
    with the metric's `prepare`d inputs and weight 1 for a real row, 0 for padding."""

    def __init__(self, metric: Metric, inner: keras.metrics.Metric) -> None:
        super().__init__(name=metric.name, dtype=inner.dtype)
        self._metric = metric
        self.inner = inner  # tracked: this metric's variables are inner's

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true, y_pred = self._metric.inputs(y_true, y_pred)
        if sample_weight is not None:
            sample_weight = tf.cast(sample_weight > 0, self.inner.dtype)
        return self.inner.update_state(y_true, y_pred, sample_weight=sample_weight)

    def result(self):
        return self.inner.result()

    def reset_state(self):
        self.inner.reset_state()


class StatefulMetrics:
    """The task's stateful metrics for one run (none: every part is empty, size 0)."""

    def __init__(self, task: Task, strategy: tf.distribute.Strategy,
                 sample: Sample | None = None) -> None:
        """Call outside the strategy's scope. `sample()`: one row of labels and predictions,
        to build a metric that creates its variables on its first update (F1Score)."""
        self.metrics = [m for m in task.metrics if m.stateful]
        scratch = [_clone(m, sample) for m in self.metrics]
        for metric, obj in zip(self.metrics, scratch, strict=True):
            _check_additive(metric, obj)
            if sample is not None:
                _check_fits(metric, obj, sample)
        with strategy.scope():
            self.train = MetricSet(self.metrics, [_clone(m, sample) for m in self.metrics])
            self.eval = MetricSet(self.metrics, [_clone(m, sample) for m in self.metrics])
        self.scratch = MetricSet(self.metrics, scratch)
        self.reader = MetricSet(self.metrics, [_float64_clone(m, obj, sample) for m, obj
                                               in zip(self.metrics, scratch, strict=True)])
        self.size = sum(math.prod(v.shape) for v in self.scratch.variables)
        self._warned: set[str] = set()  # undefined figures warned about (once per run)

    def results(self, state: np.ndarray, prefix: str | None = None) -> list[float | None]:
        """Each metric's `finalize(result())` for a state (a set's `read()`, or a sum of them);
        None where the figure is undefined on these rows (`undefined`). `prefix` ("", "val_",
        "test_"): the figures are a split's, reported; an undefined one is warned about once
        per run, by name (None: running figures, not warned about)."""
        if len(state) != self.size:
            raise ValueError(f"a state of {len(state)} values for metrics of {self.size}")
        figures, offset = [], 0
        for metric, obj in zip(self.metrics, self.reader.objects, strict=True):
            for v in obj.variables:
                n = math.prod(v.shape)
                v.assign(np.reshape(state[offset:offset + n], v.shape).astype(v.dtype))
                offset += n
            why = undefined(obj)
            if why is None:
                figures.append(float(metric.finalize(float(obj.result()))))
                continue
            figures.append(None)
            if prefix is not None:
                self._warn_undefined(prefix, metric.name, why)
        return figures

    def _warn_undefined(self, prefix: str, name: str, why: str) -> None:
        figure = f"{prefix}{name}"
        if figure in self._warned:
            return
        self._warned.add(figure)
        split = SPLITS.get(prefix, "training")
        log.warning("%s is undefined: the %s rows have %s. It is null in results.json and "
                    "empty in history.csv (this warning is given once), and nothing selects "
                    "on it (target, early stopping, best checkpoint, callbacks' logs)",
                    figure, split, why)


SPLITS = {"val_": "validation", "test_": "test", "best_test_": "test"}


def undefined(metric: keras.metrics.Metric) -> str | None:
    """Why a Keras metric's current value is undefined (Keras reports 0 for it), or None:
    AUC with one class only (no positive or no negative rows), precision with no predicted
    positives, recall with no positive labels, F-score with neither."""
    def total(name: str) -> float:
        return float(np.sum(np.asarray(getattr(metric, name).numpy(), np.float64)))

    if isinstance(metric, keras.metrics.AUC):
        # at the lowest threshold every row is counted once: positives tp+fn, negatives fp+tn
        first = {name: float(np.asarray(getattr(metric, name).numpy(), np.float64)
                             .reshape(metric.num_thresholds, -1)[0].sum())
                 for name in AUC_COUNTS}
        positives = first["true_positives"] + first["false_negatives"]
        negatives = first["false_positives"] + first["true_negatives"]
        if positives == 0 or negatives == 0:
            return (f"only {'negative' if positives == 0 else 'positive'} labels (AUC needs "
                    "both classes)")
        return None
    if isinstance(metric, keras.metrics.Precision):
        if total("true_positives") + total("false_positives") == 0:
            return "no predicted positives (precision has no denominator)"
    elif isinstance(metric, keras.metrics.Recall):
        if total("true_positives") + total("false_negatives") == 0:
            return "no positive labels (recall has no denominator)"
    elif isinstance(metric, keras.metrics.FBetaScore):
        if getattr(metric, "true_positives", None) is not None and (
                total("true_positives") + total("false_positives")
                + total("false_negatives")) == 0:
            return "no positive labels and no predicted positives (F-score has no denominator)"
    return None


AUC_COUNTS = ("true_positives", "false_negatives", "false_positives", "true_negatives")


def _clone(metric: Metric, sample: Sample | None) -> keras.metrics.Metric:
    """A fresh copy of `metric`'s Keras metric, made in the current scope, with its variables
    (built on one zero-weight row if it makes them lazily), reset."""
    original = metric.per_example
    try:
        clone = type(original).from_config(original.get_config())
    except Exception as e:  # noqa: BLE001 - a user's metric: one line naming it
        raise DistlabError(
            f"task metric {metric.name!r}: cannot copy its {type(original).__name__} into the "
            f"strategy's scope with {type(original).__name__}.from_config(get_config()) "
            f"({described(e)}); give the class a get_config() that returns its __init__ "
            "arguments") from None
    if not clone.variables and sample is not None:  # e.g. F1Score: made on the first update
        labels, predictions = metric.inputs(*sample())
        clone.update_state(labels, predictions,
                           sample_weight=tf.zeros(tf.shape(labels)[:1], clone.dtype))
    if not clone.variables:
        raise DistlabError(f"task metric {metric.name!r} ({type(original).__name__}) has no "
                           "state variables (add_variable in its __init__)")
    clone.reset_state()
    return clone


def _float64_clone(metric: Metric, scratch: keras.metrics.Metric,
                   sample: Sample | None) -> keras.metrics.Metric:
    """A copy of `metric` whose variables are float64 (made with Keras' floatx at float64),
    so that `result()` divides float64 counts; `scratch` (its own dtype) if that fails or
    gives other variables."""
    previous = keras.backend.floatx()
    keras.backend.set_floatx("float64")
    try:
        clone = _clone(metric, sample)
        clone.result()
    except Exception:  # noqa: BLE001 - any metric: read in its own dtype instead
        return scratch
    finally:
        keras.backend.set_floatx(previous)
    if [tuple(v.shape) for v in clone.variables] != [tuple(v.shape) for v in scratch.variables]:
        return scratch
    return clone


def _check_fits(metric: Metric, obj: keras.metrics.Metric, sample: Sample) -> None:
    """Refuse, in one line naming it, a metric that cannot take this task's labels and model
    outputs (a 10-class model's outputs fed to AUC, say), before the first step."""
    one = sample()
    try:
        for rows in (2, 3):  # one row broadcasts against anything; 2 and 3 rows do not
            labels, predictions = metric.inputs(*tf.nest.map_structure(
                lambda t, n=rows: tf.repeat(t, n, axis=0), one))
            obj.update_state(labels, predictions,
                             sample_weight=tf.zeros(tf.shape(labels)[:1], obj.dtype))
        obj.result()
    except Exception as e:  # noqa: BLE001 - a user's metric: one line naming it
        raise DistlabError(
            f"task metric {metric.name!r} ({type(metric.per_example).__name__}) cannot take "
            f"this task's labels and model outputs: {described(e)}. Use a metric made for "
            "them, or give Metric(name, metric, prepare=fn) to map (y_true, y_pred)") from None
    obj.reset_state()


def _check_additive(metric: Metric, obj: keras.metrics.Metric) -> None:
    """Refuse, in one line, a metric whose state distlab cannot sum over replicas, workers and
    a resumed epoch: a variable that is not sum-aggregated, a reset that is not zero, or a
    result that is not one number."""
    kind = type(metric.per_example).__name__
    for v in obj.variables:
        aggregation = getattr(v, "aggregation", "sum")
        if aggregation != "sum":
            raise DistlabError(
                f"task metric {metric.name!r} ({kind}): its variable {v.name!r} is aggregated "
                f"by {aggregation!r}; distlab adds a metric's state over replicas, workers and "
                "a resumed epoch, so every variable must be a sum (add_variable's default "
                "aggregation='sum')")
        if np.any(np.asarray(v.numpy()) != 0):
            raise DistlabError(
                f"task metric {metric.name!r} ({kind}): its variable {v.name!r} is not zero "
                "after reset_state(); distlab adds a metric's state over replicas, workers "
                "and a resumed epoch, so a reset state must be all zeros")
    try:
        result = np.asarray(obj.result())
    except Exception as e:  # noqa: BLE001 - a user's metric: one line naming it
        raise DistlabError(f"task metric {metric.name!r} ({kind}): result() fails on an empty "
                           f"state ({described(e)})") from None
    if result.size != 1:
        raise DistlabError(
            f"task metric {metric.name!r} ({kind}) gives a result of shape "
            f"{list(result.shape)}; a task metric is one number (e.g. "
            "F1Score(average='macro'))")
