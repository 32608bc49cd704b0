"""`loop=custom`: a hand-written tf.distribute training step.

Each replica computes the per-example loss, weights it by the row weights of
`distlab.data.stream.distribute` and divides by its rows times the replica count
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
        with tf.GradientTape() as tape:
            predictions = self.exp.model(features, training=True)
            loss, per_example_loss = self.compute_loss(labels, predictions, weights)
        self.apply_gradients(self.gradients(tape, loss))
        return self.batch_stats(labels, predictions, per_example_loss, weights)
