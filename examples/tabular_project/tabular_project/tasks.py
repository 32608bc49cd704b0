"""A task of one's own: Huber-loss regression, reported as MAE, RMSE and a hit rate.

A task builder is called as `f(cfg)` with the `task` node and returns `distlab.Task`:
a per-example loss and per-example metrics, `(y_true, y_pred) -> [batch]`. distlab uses the
same functions in both loops (compiled into `fit`, summed over real rows in the custom
loop), so each reported figure is `finalize(mean over the test examples)` and comes out as
`test_<name>` in results.json and `<name>`/`val_<name>` in history.csv.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from omegaconf import DictConfig

import distlab

if TYPE_CHECKING:
    from distlab import Task


@dataclass
class HuberTaskConfig:
    """`task=huber_regression`: the keys its YAML may set."""

    delta: float = 1.0  # quadratic for |error| <= delta, linear beyond (label units)
    tolerance: float = 0.5  # within_tolerance: share of examples with |error| <= tolerance


@distlab.register("task", "huber_regression", schema=HuberTaskConfig)
def huber_regression(cfg: DictConfig) -> Task:
    """Huber loss; metrics mae, rmse (the square root of the mean squared error) and
    within_tolerance (the share of examples predicted within `tolerance`)."""
    import keras
    import tensorflow as tf

    from distlab import Metric, Task

    delta, tolerance = float(cfg.delta), float(cfg.tolerance)
    for key, value in (("delta", delta), ("tolerance", tolerance)):
        if not value > 0:
            raise distlab.DistlabError(f"task.{key}={value} is invalid: must be > 0")

    def aligned(y: tf.Tensor, p: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Float labels shaped like the predictions ([batch] labels, [batch, 1] output)."""
        y = tf.cast(y, p.dtype)
        return (tf.expand_dims(y, -1) if y.shape.rank == p.shape.rank - 1 else y), p

    def huber(y: tf.Tensor, p: tf.Tensor) -> tf.Tensor:
        return keras.losses.huber(*aligned(y, p), delta=delta)

    def absolute(y: tf.Tensor, p: tf.Tensor) -> tf.Tensor:
        y, p = aligned(y, p)
        return tf.reduce_mean(tf.abs(p - y), axis=-1)

    def squared(y: tf.Tensor, p: tf.Tensor) -> tf.Tensor:
        y, p = aligned(y, p)
        return tf.reduce_mean(tf.square(p - y), axis=-1)

    def within(y: tf.Tensor, p: tf.Tensor) -> tf.Tensor:
        y, p = aligned(y, p)
        return tf.cast(tf.reduce_max(tf.abs(p - y), axis=-1) <= tolerance, p.dtype)

    return Task(loss=huber, metrics=[Metric("mae", absolute, higher_is_better=False),
                                     Metric("rmse", squared, finalize=math.sqrt,
                                            higher_is_better=False),
                                     Metric("within_tolerance", within)],
                from_logits=False)
