"""The sums an epoch's training figures are made of, and their one layout.

A training step adds, over its real rows (weight > 0), in float64: the per-example loss, each
per-example task metric, and the count of real examples (`SumsLayout.batch_stats`, on the
device, summed over the replicas by the loop). A task's stateful Keras metrics
(`training.metrics`) keep their own state, a float64 vector that adds up the same way. An
`EpochSums` holds both parts: a loop's `train_steps` returns the block's batch stats, the
Controller adds the blocks of an epoch and the stateful metrics' state, a mid-epoch
checkpoint keeps `vector()` (the stats, then the state) and a resumed epoch adds it back
(`from_vector`); `means()` turns any of them into figures ({"loss", <metric>...}).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import tensorflow as tf

from distlab.components.tasks import Task
from distlab.training.metrics import MetricSet, StatefulMetrics


class SumsLayout:
    """Where each sum sits: the batch stats [loss, per-example metrics..., count] (one place
    per non-stateful task metric, in the task's order), then the stateful metrics' state."""

    def __init__(self, task: Task, metrics: StatefulMetrics) -> None:
        self.task, self.metrics = task, metrics
        self.per_example = [m for m in task.metrics if not m.stateful]
        self.num_stats = len(self.per_example) + 2  # the loss, ..., the count
        self.size = self.num_stats + metrics.size  # the checkpoint's vector

    def zeros(self) -> EpochSums:
        return EpochSums(self)

    def from_vector(self, vector: Any) -> EpochSums:
        """The sums a checkpoint's vector (`EpochSums.vector`) holds."""
        vector = np.asarray(vector, np.float64)
        if vector.shape != (self.size,):
            raise ValueError(f"a vector of {vector.shape} sums for a layout of {self.size}")
        return EpochSums(self, vector[:self.num_stats], vector[self.num_stats:])

    def batch_stats(self, labels, predictions, per_example_loss, weights,
                    stateful: MetricSet) -> tf.Tensor:
        """Per replica, over its real rows: the float64 vector [sum of per-example loss, sum of
        each per-example metric..., number of examples]; `stateful` (a set of the task's
        stateful metrics) is updated on the same rows."""
        real = tf.cast(weights > 0, tf.float64)
        values = [per_example_loss] + [m.per_example(*m.inputs(labels, predictions))
                                       for m in self.per_example]
        sums = [tf.reduce_sum(real * tf.cast(v, tf.float64)) for v in values]
        stateful.update(labels, predictions, weights)
        return tf.stack([*sums, tf.reduce_sum(real)])

    def means(self, sums: EpochSums, prefix: str | None = None) -> dict[str, float | None]:
        """{"loss", <metric>...}: each per-example figure `finalize(sum / count)`, each
        stateful one from its state. A figure undefined on these rows (AUC on one class...)
        is None; `prefix` ("" for an epoch's training figures, "val_", "test_"): reported
        figures, an undefined one warned about once (None: running figures)."""
        count = sums.stats[-1]
        per_example = iter(sums.stats[1:-1])
        stateful = iter(self.metrics.results(sums.state, prefix))
        values = {"loss": float(sums.stats[0] / count)}
        for metric in self.task.metrics:
            values[metric.name] = (next(stateful) if metric.stateful
                                   else float(metric.finalize(next(per_example) / count)))
        return values


class EpochSums:
    """Summed batch stats and stateful-metric state of some training steps (or of a split)."""

    def __init__(self, layout: SumsLayout, stats: Any = None, state: Any = None) -> None:
        """`stats`: the summed batch stats (`SumsLayout.batch_stats`); `state`: the stateful
        metrics' state (a `MetricSet.read()`); zeros where not given."""
        self.layout = layout
        self.stats = (np.zeros(layout.num_stats) if stats is None
                      else np.asarray(stats, np.float64).reshape(-1))
        self.state = (np.zeros(layout.metrics.size) if state is None
                      else np.asarray(state, np.float64).reshape(-1))
        if self.stats.shape != (layout.num_stats,) or self.state.shape != (layout.metrics.size,):
            raise ValueError(f"sums of {self.stats.size} stats and {self.state.size} state "
                             f"values for a layout of {layout.num_stats} and "
                             f"{layout.metrics.size}")

    def __add__(self, other: EpochSums) -> EpochSums:
        return EpochSums(self.layout, self.stats + other.stats, self.state + other.state)

    @property
    def loss(self) -> float:
        """The summed per-example loss (NaN or Inf once any step's loss was)."""
        return float(self.stats[0])

    @property
    def count(self) -> float:
        """The real examples summed over."""
        return float(self.stats[-1])

    def vector(self) -> np.ndarray:
        """What a mid-epoch checkpoint keeps: the stats, then the state (float64)."""
        return np.concatenate([self.stats, self.state])

    def means(self, prefix: str | None = None) -> dict[str, float | None]:
        """The figures these sums make (`SumsLayout.means`)."""
        return self.layout.means(self, prefix)

    def __getitem__(self, index):
        """The batch stats by position: deprecated (the layout is `SumsLayout`'s)."""
        warnings.warn("indexing a loop's train_steps result is deprecated: it is an EpochSums "
                      "(use .loss, .count, .stats or .means()); indexing goes in 0.3.0",
                      FutureWarning, stacklevel=2)
        return self.stats[index]

    def __repr__(self) -> str:
        return f"EpochSums(stats={self.stats.tolist()}, state={self.state.tolist()})"
