"""`loop=custom`: a hand-written tf.distribute training loop.

Each replica computes the per-example loss, weights it by the row weights of
`distlab.data.pipeline.distribute` and divides by its rows times the replica count
(`tf.nn.compute_average_loss`); the optimizer all-reduces (sums) the gradients. So
the update is the mean over the global batch's real rows, as in single-device training
(a short last batch included), and nothing divides by the replica count a second time.
`loop.steps_per_loop` steps run inside one `tf.function` (a `tf.range` loop with a tensor
count, as orbit does); the last, shorter loop of an epoch reuses the same trace.
"""

from __future__ import annotations

import time

import keras
import numpy as np
import tensorflow as tf

from distlab.training.loops.base import Loop


class CustomLoop(Loop):
    def __init__(self, exp) -> None:
        super().__init__(exp)
        if exp.cfg.loop.jit_compile:  # XLA per replica step; strategy.run stays outside it
            self._train_step = tf.function(self._train_step, jit_compile=True)
        self._train_n = tf.function(self._train_n_steps)
        self._totals = np.zeros(self.num_stats)  # the current epoch's running sums

    def running_sums(self) -> np.ndarray:
        return self._totals.copy()

    # ---- replica function: returns [sum of per-example loss, metric sums..., count]
    def _train_step(self, features, labels, weights):
        model, exp = self.exp.model, self.exp
        with tf.GradientTape() as tape:
            predictions = model(features, training=True)
            per_example_loss = self.loss_fn(labels, predictions)
            # sum(w * loss) / (rows * replicas): the mean over the global batch's real rows
            loss = tf.nn.compute_average_loss(per_example_loss, sample_weight=weights)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            loss = exp.optimizer.scale_loss(loss)  # mixed_float16: LossScaleOptimizer's scale
        grads = tape.gradient(loss, model.trainable_variables)
        exp.optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return self._batch_stats(labels, predictions, per_example_loss, weights)

    # ---- cross-replica function
    def _train_n_steps(self, iterator, n):
        totals = tf.zeros([self.num_stats], tf.float64)
        for _ in tf.range(n):
            totals += self._reduce(self.exp.strategy.run(self._train_step, args=next(iterator)))
        return totals

    # ---- the loop
    def train(self, initial_epoch: int, skip_steps: int = 0) -> None:
        exp, trainer = self.exp, self.exp.cfg.trainer
        steps, per_call = exp.data.steps_per_epoch, exp.cfg.loop.steps_per_loop
        iterator = iter(self._distribute(
            exp.data.train_epochs(initial_epoch, trainer.epochs, skip_steps)))
        verbose = exp.cfg.loop.verbose
        for epoch in range(initial_epoch, trainer.epochs):
            done = skip_steps if epoch == initial_epoch else 0
            first = done
            if verbose:
                print(f"Epoch {epoch + 1}/{trainer.epochs}", flush=True)
            names = ["loss", *exp.task.metric_names]
            bar = keras.utils.Progbar(steps, verbose=verbose,
                                      stateful_metrics=[*names, "examples/sec"])
            start = time.time()
            self.controller.epoch_begin(epoch, done)
            resumed = self.resumed_sums(done)  # the steps before a mid-epoch resume
            self._totals = resumed.copy()
            while done < steps:
                n = min(per_call, steps - done)
                chunk = self._train_n(iterator, tf.constant(n, tf.int64)).numpy()
                self._totals += chunk
                done += n
                self.controller.step_end(epoch, done, float(chunk[0]))
                examples = self._totals[-1] - resumed[-1]  # this process's own
                bar.update(done, [*self.means(self._totals).items(),
                                  ("examples/sec", examples / (time.time() - start))])
            train_seconds = time.time() - start
            metrics = self.with_validation(epoch, self.means(self._totals))
            self._totals = np.zeros(self.num_stats)
            self.controller.epoch_end(epoch, metrics, time.time() - start, train_seconds,
                                      steps_run=done - first)
            if self.controller.finished:  # target reached (with stop), or early stopping
                break
