"""`loop=custom`: a hand-written tf.distribute training step.

Each replica computes the per-example loss, weights it by the row weights of
`distlab.data.pipeline.distribute` and divides by its rows times the replica count
(`tf.nn.compute_average_loss`); the optimizer all-reduces (sums) the gradients. So the
update is the mean over the global batch's real rows, as in single-device training (a short
last batch included), and nothing divides by the replica count a second time.
`loop.steps_per_loop` steps run inside one `tf.function` (see `loops.base.Loop`); the
last, shorter block of an epoch reuses the same trace.
"""

from __future__ import annotations

import tensorflow as tf

from distlab.training.loops.base import Loop


class CustomLoop(Loop):
    def train_step(self, features, labels, weights):
        model, optimizer = self.exp.model, self.exp.optimizer
        with tf.GradientTape() as tape:
            predictions = model(features, training=True)
            per_example_loss = self.loss_fn(labels, predictions)
            # sum(w * loss) / (rows * replicas): the mean over the global batch's real rows
            loss = tf.nn.compute_average_loss(per_example_loss, sample_weight=weights)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            loss = optimizer.scale_loss(loss)  # mixed_float16: LossScaleOptimizer's scale
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return self.batch_stats(labels, predictions, per_example_loss, weights)
