"""The Loop interface: how training steps run. The Controller runs the epochs of every loop.

A loop is `train_steps(iterator, n) -> EpochSums` (run the next n training steps of the
distributed stream, return their summed batch stats) plus `state()` (its own checkpointed
objects). The default `train_steps` runs n of the loop's `train_step(features, labels,
weights)` inside one `tf.function` (a `tf.range` loop with a tensor count, as orbit does);
a step returns `self.batch_stats(...)` and is built from the pieces every step needs:
`compute_loss` (the row-weighted mean loss plus the model's own losses, scaled for the
optimizer), `gradients` (unscaled) and `apply_gradients`, so a loop that uses them cannot
drop a regularisation penalty or the mixed_float16 loss scale. A loop may override
`train_steps` (a whole block: `keras_fit` runs Keras' compiled train function there).

Evaluation is shared: every loop measures validation and test figures with the same
distributed step (mean per-example loss and task metrics over the whole split; padding rows
weigh 0, so the figures do not depend on the replica count). A task's stateful Keras metrics
(`training.metrics`) are updated in the same steps: `batch_stats` updates the training set,
evaluation its own set, and their states follow the sums (`training.epoch_sums`).

distlab's own pieces of a step that call no code of a user's (`gradients`, the loss scale,
the checks run while tracing) are traced as written (`do_not_convert`: no Python control
flow on tensors there); autograph still converts `train_step` and what it calls of a
user's (the task's loss and metrics, the optimizer's `apply_gradients`), so a user's code
may branch on tensors.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import keras
import tensorflow as tf
from tensorflow.autograph.experimental import do_not_convert

from distlab.data.stream import distribute, is_default
from distlab.errors import DistlabError
from distlab.training.epoch_sums import EpochSums
from distlab.training.experiment import Experiment

SUM = tf.distribute.ReduceOp.SUM
log = logging.getLogger("distlab")


class LoopError(DistlabError):
    """A loop that breaks the Loop contract (a user's own loop, usually)."""


class Loop:
    """A training loop (registered in `distlab.registry.LOOPS`): subclass it and implement
    `train_step`."""

    def __init__(self, exp: Experiment) -> None:
        self.exp = exp
        self.loss_fn = exp.task.loss
        own = getattr(exp.model, "optimizer", None)
        if own is not None and own is not exp.optimizer and exp.cfg.mode == "train":
            # a builder that compiled its model
            log.warning("model.name=%r: the builder compiled its model (optimizer %s); distlab "
                        "trains it with the run's optimizer (%s) and the task's loss and "
                        "metrics, in either loop: return the model uncompiled",
                        exp.cfg.model.name, type(own).__name__, type(exp.optimizer).__name__)
        exp.model.optimizer = exp.optimizer  # as compile sets it: callbacks read it
        cls = type(self)
        if cls.train_step is Loop.train_step and cls.train_steps is Loop.train_steps:
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

    # ---- the pieces of a step (loop=custom's step is these four calls)
    def compute_loss(self, labels, predictions, weights) -> tuple[tf.Tensor, tf.Tensor]:
        """`(loss, per_example_loss)` on this replica's rows. `per_example_loss`: the task's
        loss of each row (for `batch_stats`). `loss`, what to differentiate: its mean over
        the global batch's real rows (`tf.nn.compute_average_loss` with the row weights, so
        summing the replicas' gradients gives the one-device mean), plus the model's own
        losses (`model.losses`: L2 penalties, activity regularisers; divided over the
        replicas), times the optimizer's loss scale (mixed_float16's LossScaleOptimizer).
        Differentiate it with `self.gradients(tape, loss)`."""
        _steps.loss_computed = True
        model, optimizer = self.exp.model, self.exp.optimizer
        per_example_loss = self.loss_fn(labels, predictions)
        # sum(w * loss) / (rows * replicas): the mean over the global batch's real rows
        loss = tf.nn.compute_average_loss(per_example_loss, sample_weight=weights)
        if model.losses:
            loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
        return optimizer.scale_loss(loss), per_example_loss

    @do_not_convert
    def gradients(self, tape: tf.GradientTape, loss: tf.Tensor) -> list[tf.Tensor | None]:
        """The gradient of `compute_loss`'s loss for each trainable variable of the model,
        with the loss scale taken out: this replica's share of the true gradient, to clip
        or inspect before `apply_gradients` (None for a variable the loss does not reach)."""
        if not (tf.is_tensor(loss) and loss.shape.rank == 0):
            raise LoopError(f"{self._name}: {type(self).__name__} passed gradients() "
                            f"{_described(loss)}; pass the scalar loss, the first value of "
                            "self.compute_loss(...)")
        grads = tape.gradient(loss, self.exp.model.trainable_variables)
        scale = self._loss_scale()
        if scale is None:
            return grads
        return [None if g is None else g / tf.cast(scale, g.dtype) for g in grads]

    def apply_gradients(self, grads) -> None:
        """Update the model's trainable variables with `gradients`' result (or values like
        it) through the run's optimizer: the loss scale's finite check and update, gradient
        accumulation and `optimizer.clipnorm` as configured; the optimizer sums the
        replicas' gradients."""
        variables = self.exp.model.trainable_variables
        scale = self._loss_scale()
        if scale is not None:  # the optimizer unscales again (a power of 2: exact)
            grads = [None if g is None else g * tf.cast(scale, g.dtype) for g in grads]
        self.exp.optimizer.apply_gradients(zip(grads, variables, strict=True))

    @do_not_convert
    def _loss_scale(self) -> tf.Tensor | None:
        """The factor compute_loss multiplied the loss by, or None (no loss scaling)."""
        optimizer = self.exp.optimizer
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            return optimizer.scale_loss(tf.constant(1.0))
        return getattr(optimizer, "loss_scale_factor", None)

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
        of its steps) to the end of the run, for `train_steps`."""
        data, end = self.exp.data, self.exp.cfg.trainer.epochs
        if self._gathers_in_step:
            return iter(data.train_row_epochs(initial_epoch, end, skip_steps))
        return iter(self.distribute(data.train_epochs(initial_epoch, end, skip_steps)))

    @property
    def _gathers_in_step(self) -> bool:
        """Whether each step takes its batch's row numbers from the stream and gathers the
        rows from memory itself (the same batches; see `distlab.data.stream`): with the
        train split in memory, under the default strategy, and only where the steps run in
        `Loop.train_steps` on `Loop.train_iterator`'s stream of `Loop.distribute`'s batches
        (a loop that overrides any of them is given tf.data's batches, through its own
        methods)."""
        cls = type(self)
        return (cls.train_steps is Loop.train_steps and cls.distribute is Loop.distribute
                and cls.train_iterator is Loop.train_iterator
                and self.exp.data.rows_in_memory and is_default(self.exp.strategy))

    def train_steps(self, iterator, n: int) -> EpochSums:
        """Run the next `n` training steps of `iterator`; their summed batch stats (the
        stateful metrics' state is read by the Controller, from `exp.metrics.train`)."""
        return EpochSums(self.exp.sums, self._train_n(iterator, tf.constant(n, tf.int64)))

    # ---- evaluation
    def evaluate(self, split: str = "test") -> dict[str, float | None]:
        """{"loss", <metric>...} over a whole split ("validation" or "test") under the
        current strategy: exact means over its real examples, whatever the replica count."""
        dataset = {"test": self.exp.data.test, "validation": self.exp.data.validation}[split]
        stateful = self.exp.metrics.eval
        stateful.reset()
        sums = EpochSums(self.exp.sums, self._eval_all(self.distribute(dataset)),
                         stateful.read())
        return sums.means(prefix={"test": "test_", "validation": "val_"}[split])

    # ---- distributed pieces shared by the loops
    def distribute(self, dataset: tf.data.Dataset):
        """Per replica (features, labels, weights); see `distlab.data.stream.distribute`."""
        return distribute(self.exp.strategy, dataset)

    def batch_stats(self, labels, predictions, per_example_loss, weights) -> tf.Tensor:
        """Per replica, over its real rows (weight > 0): [sum of per-example loss, sum of each
        per-example metric..., number of examples], in float64 so sums do not depend on the
        split; the task's stateful metrics (training set) are updated on the same rows."""
        return self.exp.sums.batch_stats(labels, predictions, per_example_loss, weights,
                                         self.exp.metrics.train)

    @property
    def num_stats(self) -> int:
        """Length of a batch-stats vector."""
        return self.exp.sums.num_stats

    @property
    def _name(self) -> str:
        return f"loop.name={self.exp.cfg.loop.name!r}"

    def _checked_step(self, features, labels, weights):
        """train_step, its result checked while it is traced (one line, not TF's error)."""
        _steps.loss_computed = False
        stats = self.train_step(features, labels, weights)
        self._warn_unless_loss_computed()
        if not (tf.is_tensor(stats) and stats.dtype == tf.float64
                and stats.shape.as_list() == [self.num_stats]):
            got = (f"a {stats.dtype.name} tensor of shape {stats.shape.as_list()}"
                   if tf.is_tensor(stats) else type(stats).__name__)
            raise LoopError(
                f"{self._name}: {type(self).__name__}.train_step returned {got}; it must return "
                "self.batch_stats(labels, predictions, per_example_loss, weights), a float64 "
                f"vector of {self.num_stats} sums")
        return stats

    @do_not_convert
    def _warn_unless_loss_computed(self) -> None:
        """A step that computed its loss without compute_loss, where that drops something:
        one warning (while the step is traced)."""
        if _steps.loss_computed or getattr(self, "_warned", False):
            return
        model, dropped = self.exp.model, []
        if model.losses:
            dropped.append(f"the model's {len(model.losses)} regularisation loss(es) "
                           "(model.losses)")
        if self._loss_scale() is not None:
            dropped.append("the optimizer's loss scale (precision=mixed_float16)")
        if dropped:
            self._warned = True
            log.warning("%s: %s.train_step does not call self.compute_loss, which adds %s; "
                        "unless the step applies them itself, its updates leave them out "
                        "(see distlab.Loop.compute_loss, gradients, apply_gradients)",
                        self._name, type(self).__name__, " and ".join(dropped))

    def _train_n_steps(self, iterator, n):
        totals = tf.zeros([self.num_stats], tf.float64)
        gather = self._gathers_in_step
        for _ in tf.range(n):
            batch = next(iterator)
            if gather:  # (a Python branch: decided while tracing)
                batch = self.exp.data.gathered(batch)
            totals += self._reduce(self.exp.strategy.run(self._checked_step, args=batch))
        return totals

    def _test_step(self, features, labels, weights):
        predictions = self.exp.model(features, training=False)
        return self.exp.sums.batch_stats(labels, predictions,
                                         self.loss_fn(labels, predictions), weights,
                                         self.exp.metrics.eval)

    @do_not_convert
    def _reduce(self, per_replica) -> tf.Tensor:
        return self.exp.strategy.reduce(SUM, per_replica, axis=None)

    def _eval_dataset(self, dist_dataset):
        totals = tf.zeros([self.num_stats], tf.float64)
        for batch in dist_dataset:
            totals += self._reduce(self.exp.strategy.run(self._test_step, args=batch))
        return totals


_steps = threading.local()  # per replica thread, while a step is traced: compute_loss called


def _described(value: Any) -> str:
    if tf.is_tensor(value):
        return f"a tensor of shape {value.shape.as_list()}"
    return f"a {type(value).__name__}"
