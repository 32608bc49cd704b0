"""Planted faults for `distlab verify` (`imports=[verify_faults]`): each dataset builder or
task breaks one invariant, as a user's code might.

- `overlapping`: its test split holds 12 rows of its train split;
- `nan_feature`: one test row has a NaN feature;
- `unseeded_shuffle`: its train rows are shuffled by an unseeded generator on every call;
- `clean_rows`: the same data, none of those faults (the others' baseline);
- task `mean_state`: classification whose stateful metric keeps a running mean of each
  batch's accuracy as its state, not a sum (so replicas' states do not add up).
"""

from __future__ import annotations

import keras
import numpy as np

import distlab

FEATURES, CLASSES = 8, 3


def rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Learnable float rows: the label is the largest of the first three features."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    return x, np.argmax(x[:, :CLASSES], axis=1).astype(np.int64)


@distlab.register("dataset", "clean_rows")
def clean_rows(cfg):
    return distlab.DataSplits(train=rows(256, 0), test=rows(64, 1), num_classes=CLASSES)


@distlab.register("dataset", "overlapping")
def overlapping(cfg):
    (x, y), (tx, ty) = rows(256, 0), rows(64, 1)
    tx[:12], ty[:12] = x[100:112], y[100:112]  # test rows copied from train
    return distlab.DataSplits(train=(x, y), test=(tx, ty), num_classes=CLASSES)


@distlab.register("dataset", "nan_feature")
def nan_feature(cfg):
    tx, ty = rows(64, 1)
    tx[5, 2] = np.nan
    return distlab.DataSplits(train=rows(256, 0), test=(tx, ty), num_classes=CLASSES)


@distlab.register("dataset", "unseeded_shuffle")
def unseeded_shuffle(cfg):
    x, y = rows(256, 0)
    order = np.random.default_rng().permutation(len(x))  # no seed: another order each call
    return distlab.DataSplits(train=(x[order], y[order]), test=rows(64, 1), num_classes=CLASSES)


class MeanStateAccuracy(keras.metrics.Metric):
    """Accuracy whose state is the running mean of the batches' accuracies (a mean, not a
    sum: the state of two replicas added is twice the accuracy)."""

    def __init__(self, name="mean_state_accuracy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.mean = self.add_variable(shape=(), initializer="zeros", name="mean")
        self.batches = self.add_variable(shape=(), initializer="zeros", name="batches")

    def update_state(self, y_true, y_pred, sample_weight=None):
        import tensorflow as tf

        hits = tf.cast(tf.equal(tf.cast(tf.reshape(y_true, [-1]), tf.int64),
                                tf.argmax(y_pred, axis=-1)), self.dtype)
        self.batches.assign_add(1.0)
        self.mean.assign_add((tf.reduce_mean(hits) - self.mean) / self.batches)

    def result(self):
        return self.mean


@distlab.register("task", "mean_state")
def mean_state(cfg):
    return distlab.Task(loss=lambda y, p: keras.losses.sparse_categorical_crossentropy(
        y, p, from_logits=True), metrics=[MeanStateAccuracy()], labels="classes")
