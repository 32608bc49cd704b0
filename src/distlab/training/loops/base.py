"""The Loop interface: how training steps run. The Controller drives the epochs.

A loop implements one replica's step, `train_step(features, labels, weights)`, returning
`self.batch_stats(...)`; `train_steps(iterator, n)` runs n of them inside one
`tf.function` (a `tf.range` loop with a tensor count, as orbit does) and returns the summed
stats, which the Controller turns into the epoch's figures. A loop may instead override
`train_steps` (a whole block), `state()` (its own checkpointed objects) or `run()` (a loop
that runs its own epochs, as `keras_fit` does through `model.fit`).

Evaluation is shared: every loop measures validation and test figures with the same
distributed step (mean per-example loss and task metrics over the whole split; padding rows
weigh 0, so the figures do not depend on the replica count). A task's stateful Keras metrics
(`training.metrics`) are updated in the same steps: `batch_stats` updates the training set,
evaluation its own set, and their states follow the sums (`means`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from distlab.data.pipeline import distribute
from distlab.errors import DistlabError
from distlab.training.checkpoints import stats_size, sums_size
from distlab.training.experiment import Experiment

if TYPE_CHECKING:
    from distlab.training.controller import Controller

SUM = tf.distribute.ReduceOp.SUM


class LoopError(DistlabError):
    """A loop that breaks the Loop contract (a user's own loop, usually)."""


class Loop:
    """A training loop (registered in `distlab.registry.LOOPS`): subclass it and implement
    `train_step`."""

    def __init__(self, exp: Experiment) -> None:
        self.exp = exp
        self.loss_fn = exp.task.loss
        cls = type(self)
        if (cls.train_step is Loop.train_step and cls.train_steps is Loop.train_steps
                and cls.run is Loop.run):
            raise LoopError(f"{self._name}: {cls.__name__} implements no train_step; a Loop "
                            "implements train_step(features, labels, weights) returning "
                            "self.batch_stats(labels, predictions, per_example_loss, weights)")
        if exp.cfg.loop.jit_compile:  # XLA per replica step; strategy.run stays outside it
            self.train_step = tf.function(self.train_step, jit_compile=True)
            self._test_step = tf.function(self._test_step, jit_compile=True)
        self._train_n = tf.function(self._train_n_steps)
        self._eval_all = tf.function(self._eval_dataset)

    # ---- what a loop implements
    def train_step(self, features, labels, weights) -> tf.Tensor:
        """One replica's training step on its rows; returns `self.batch_stats(...)`."""
        raise NotImplementedError(f"{type(self).__name__} implements no train_step")

    def state(self) -> dict[str, Any]:
        """The loop's own objects to checkpoint, by name (saved, resumed and broadcast to
        every worker with the rest: see `training.checkpoints`)."""
        return {}

    @property
    def steps_per_call(self) -> int:
        """Steps per `train_steps` call (loop.steps_per_loop / loop.steps_per_execution)."""
        loop = self.exp.cfg.loop
        return loop.get("steps_per_loop") or loop.get("steps_per_execution") or 1

    def train_iterator(self, initial_epoch: int, skip_steps: int = 0):
        """The distributed training stream from epoch `initial_epoch` (after `skip_steps`
        of its steps) to the end of the run."""
        data = self.exp.data
        return iter(self.distribute(
            data.train_epochs(initial_epoch, self.exp.cfg.trainer.epochs, skip_steps)))

    def train_steps(self, iterator, n: int) -> np.ndarray:
        """Run `n` training steps; their summed batch stats (loss, metrics..., count)."""
        return self._train_n(iterator, tf.constant(n, tf.int64)).numpy()

    def run(self, controller: Controller, initial_epoch: int, skip_steps: int) -> None:
        """Train the run's remaining epochs: the Controller's epoch loop calls train_steps."""
        controller.drive(initial_epoch, skip_steps)

    def running_sums(self) -> np.ndarray | None:
        """The current epoch's batch-stats sums, for a loop that keeps them itself (`run`
        overridden); None: the Controller sums what train_steps returns. (The stateful
        metrics' state is read by the Controller, from `exp.metrics.train`.)"""
        return None

    # ---- evaluation
    def evaluate(self, split: str = "test") -> dict[str, float | None]:
        """{"loss", <metric>...} over a whole split ("validation" or "test") under the
        current strategy: exact means over its real examples, whatever the replica count."""
        dataset = {"test": self.exp.data.test, "validation": self.exp.data.validation}[split]
        stateful = self.exp.metrics.eval
        stateful.reset()
        sums = self._eval_all(self.distribute(dataset)).numpy()
        return self.means(np.concatenate([sums, stateful.read()]),
                          prefix={"test": "test_", "validation": "val_"}[split])

    def means(self, sums, prefix: str | None = None) -> dict[str, float | None]:
        """{"loss", <metric>...} from the running sums: the summed batch stats (loss,
        per-example metrics..., count), then the stateful metrics' state. A figure undefined
        on these rows (AUC on one class...) is None; `prefix` ("" for an epoch's training
        figures, "val_", "test_"): reported figures, an undefined one warned about once."""
        stats, state = sums[:self.num_stats], sums[self.num_stats:]
        count = stats[-1]
        per_example = iter(stats[1:-1])
        stateful = iter(self.exp.metrics.results(np.asarray(state, np.float64), prefix))
        values = {"loss": float(stats[0] / count)}
        for metric in self.exp.task.metrics:
            values[metric.name] = (next(stateful) if metric.stateful
                                   else float(metric.finalize(next(per_example) / count)))
        return values

    # ---- distributed pieces shared by the loops
    def distribute(self, dataset: tf.data.Dataset):
        """Per replica (features, labels, weights); see `distlab.data.pipeline.distribute`."""
        return distribute(self.exp.strategy, dataset)

    def batch_stats(self, labels, predictions, per_example_loss, weights) -> tf.Tensor:
        """Per replica, over its real rows (weight > 0): [sum of per-example loss, sum of each
        per-example metric..., number of examples], in float64 so sums do not depend on the
        split; the task's stateful metrics (training set) are updated on the same rows."""
        return self._stats(labels, predictions, per_example_loss, weights,
                           self.exp.metrics.train)

    def _stats(self, labels, predictions, per_example_loss, weights, stateful) -> tf.Tensor:
        real = tf.cast(weights > 0, tf.float64)
        values = [per_example_loss] + [m.per_example(*m.inputs(labels, predictions))
                                       for m in self.exp.task.metrics if not m.stateful]
        sums = [tf.reduce_sum(real * tf.cast(v, tf.float64)) for v in values]
        stateful.update(labels, predictions, weights)
        return tf.stack([*sums, tf.reduce_sum(real)])

    @property
    def num_stats(self) -> int:
        """Length of a batch-stats vector."""
        return stats_size(self.exp.task)

    @property
    def num_sums(self) -> int:
        """Length of the running sums: the batch stats, then the stateful metrics' state."""
        return sums_size(self.exp)

    @property
    def _name(self) -> str:
        return f"loop.name={self.exp.cfg.loop.name!r}"

    def _checked_step(self, features, labels, weights):
        """train_step, its result checked while it is traced (one line, not TF's error)."""
        stats = self.train_step(features, labels, weights)
        if not (tf.is_tensor(stats) and stats.dtype == tf.float64
                and stats.shape.as_list() == [self.num_stats]):
            got = (f"a {stats.dtype.name} tensor of shape {stats.shape.as_list()}"
                   if tf.is_tensor(stats) else type(stats).__name__)
            raise LoopError(
                f"{self._name}: {type(self).__name__}.train_step returned {got}; it must return "
                "self.batch_stats(labels, predictions, per_example_loss, weights), a float64 "
                f"vector of {self.num_stats} sums")
        return stats

    def _train_n_steps(self, iterator, n):
        totals = tf.zeros([self.num_stats], tf.float64)
        for _ in tf.range(n):
            totals += self._reduce(self.exp.strategy.run(self._checked_step,
                                                         args=next(iterator)))
        return totals

    def _test_step(self, features, labels, weights):
        predictions = self.exp.model(features, training=False)
        return self._stats(labels, predictions, self.loss_fn(labels, predictions), weights,
                           self.exp.metrics.eval)

    def _reduce(self, per_replica) -> tf.Tensor:
        return self.exp.strategy.reduce(SUM, per_replica, axis=None)

    def _eval_dataset(self, dist_dataset):
        totals = tf.zeros([self.num_stats], tf.float64)
        for batch in dist_dataset:
            totals += self._reduce(self.exp.strategy.run(self._test_step, args=batch))
        return totals
