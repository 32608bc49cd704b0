"""`precision=mixed_float16`'s LossScaleOptimizer, with a finite check over all replicas.

Keras 3's `LossScaleOptimizer` (TF backend) skips a step whose gradients are not finite,
but under a strategy it asks only the first replica (its comment assumes all-reduced
gradients; both `fit` and a custom loop hand it each replica's own). An overflow on any
other replica then reaches the weights. Here `check_finite` (its public hook) agrees
across replicas: a step is finite only if it is finite on every replica.
"""

from __future__ import annotations

import keras
import tensorflow as tf


class LossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    def check_finite(self, grads):
        finite = super().check_finite(grads)
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return finite
        not_finite = tf.cast(tf.logical_not(finite), tf.float32)
        return context.all_reduce(tf.distribute.ReduceOp.SUM, not_finite) == 0
