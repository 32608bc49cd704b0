"""A stateful metric for 10-class data, for `harness.py metric-cost`: Keras'
SparseCategoricalAccuracy kept as a stateful `keras.metrics.Metric` (its running total and
count), so it takes the stateful path (per-replica state, summed when read) instead of the
per-example sums distlab's own `accuracy` uses. Same figure, different machinery."""

from __future__ import annotations

import keras

import distlab


@distlab.register("metric", "stateful_accuracy")
def stateful_accuracy(cfg, task):
    return keras.metrics.SparseCategoricalAccuracy(name="stateful_accuracy")
