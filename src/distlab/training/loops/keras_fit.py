"""`loop=keras_fit`: model.compile + model.fit inside the strategy scope.

fit gets the same per-replica rows and weights as the custom loop (`distlab.data.pipeline.
distribute`): the compiled loss weighs the rows so a short batch averages over its real
examples, and the history's loss and task metrics are Keras metrics over the real rows
only (summed in float64, like the custom loop's); a task's stateful Keras metrics are
compiled as their training set (`training.metrics.RealRows`: weight 1 per real row). fit
runs its own epochs, so this loop overrides `Loop.run`: a Keras callback calls the
Controller's epoch and step hooks (the adapter), and the Controller adds a resumed epoch's
first steps, from the checkpoint, to those metrics' totals and states, so its row covers the
whole epoch. Every epoch runs exactly
`steps_per_epoch` steps whatever `loop.steps_per_execution` is: when the block size does not
divide the epoch, each epoch is a fit of its own over exactly its own batches, so Keras'
last block of the epoch stops where the data does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import keras
import numpy as np
import tensorflow as tf

from distlab.errors import DistlabError
from distlab.keras_patches import fixes as keras_fixes
from distlab.training.loops.base import Loop
from distlab.training.metrics import RealRows

if TYPE_CHECKING:
    from distlab.training.controller import Controller


class RealExamplesMean(keras.metrics.MeanMetricWrapper):
    """The mean of `fn` over real rows: a sample weight > 0 counts 1, padding (0) counts 0.
    Its `total` and `count` are the sums `Loop.batch_stats` makes."""

    def update_state(self, y_true, y_pred, sample_weight=None):
        if sample_weight is not None:
            sample_weight = tf.cast(sample_weight > 0, self.dtype)
        return super().update_state(y_true, y_pred, sample_weight=sample_weight)


def _per_example(metric):
    """A per-example metric's function of (y_true, y_pred), its `prepare` applied."""
    return lambda y, p: metric.per_example(*metric.inputs(y, p))


class _EpochCallback(keras.callbacks.Callback):
    """The adapter: fit's epoch and batch hooks call the Controller's (NaN guard, preemption,
    validation, history row, scalars, monitors, checkpoints, the user's callbacks and the
    progress bar). fit draws nothing itself (verbose=0)."""

    def __init__(self, controller: Controller, steps: int, skip_steps: int = 0) -> None:
        super().__init__()
        self.controller, self.steps, self.skip_steps = controller, steps, skip_steps
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self.controller.epoch_begin(epoch, self.skip_steps)

    def on_train_batch_begin(self, batch, logs=None):
        self.controller.step_begin(self._epoch, self.skip_steps + batch)

    def on_train_batch_end(self, batch, logs=None):
        steps = min(batch + 1, self.steps)  # a last block may run fewer steps
        loss = float((logs or {}).get("loss", 0.0))
        self.controller.step_end(self._epoch, self.skip_steps + steps, loss)

    def on_epoch_end(self, epoch, logs=None):
        if self.controller.epoch_end(epoch):  # target, early stopping, or a callback's stop
            self.model.stop_training = True
        self.skip_steps = 0


class KerasFitLoop(Loop):
    def __init__(self, exp) -> None:
        super().__init__(exp)
        cfg = exp.cfg
        replicas = exp.strategy.num_replicas_in_sync
        corrected = keras_fixes.apply()
        if not corrected and cfg.strategy.name == "multi_worker_mirrored":
            raise DistlabError(
                f"loop=keras_fit fails under strategy=multi_worker_mirrored in Keras "
                f"{keras.__version__} (keras#20585), which distlab corrects only for the Keras "
                "versions it was checked with. Use loop=custom")
        if not corrected and replicas > 1 and cfg.loop.steps_per_execution > 1:
            raise DistlabError(
                f"loop.steps_per_execution={cfg.loop.steps_per_execution} fails with "
                f"{replicas} replicas in Keras {keras.__version__} (keras#19246), which distlab "
                "corrects only for the Keras versions it was checked with. Use "
                "loop.steps_per_execution=1, or loop=custom with loop.steps_per_loop")
        task = exp.task
        with exp.strategy.scope():
            # float64 sums, as Loop._batch_stats: a resumed epoch adds up to the same figures
            self._metrics = [RealExamplesMean(task.loss, name="example_loss", dtype="float64"),
                             *(RealExamplesMean(_per_example(m), name=m.name, dtype="float64")
                               for m in task.metrics if not m.stateful)]
            stateful = exp.metrics.train
            exp.model.compile(
                optimizer=exp.optimizer,
                loss=task.loss,  # per example; Keras weighs and averages it
                weighted_metrics=[*self._metrics[1:], *map(RealRows, stateful.metrics,
                                                           stateful.objects), self._metrics[0]],
                steps_per_execution=cfg.loop.steps_per_execution,
                jit_compile=cfg.loop.jit_compile,
            )
        # The compiled metrics are distlab's sums (not serializable, and not the user's): a
        # model saved whole (a callback's ModelCheckpoint to .keras) carries no compile config,
        # as in loop=custom, which does not compile (`Model.get_compile_config` then is {})
        del exp.model._compile_config

    def running_sums(self) -> np.ndarray:
        """The sums of the steps this fit epoch ran: the compiled metrics' totals (the fit
        resets them each epoch), read across replicas (and workers: every worker reads).
        The stateful metrics' state: the Controller reads `exp.metrics.train`."""
        loss = self._metrics[0]
        fit = [loss.total, *(m.total for m in self._metrics[1:]), loss.count]
        return np.array([float(v.numpy()) for v in fit])

    def run(self, controller: Controller, initial_epoch: int, skip_steps: int = 0) -> None:
        epochs, steps = self.exp.cfg.trainer.epochs, self.exp.data.steps_per_epoch
        block = self.exp.cfg.loop.steps_per_execution
        if skip_steps:  # resumed mid-epoch: finish that epoch first, in a fit of its own
            self._fit(controller, initial_epoch, initial_epoch + 1, skip_steps)
            initial_epoch += 1
            if controller.finished:
                return
        if block > 1 and steps % block:  # blocks straddle epochs: one fit per epoch
            for epoch in range(initial_epoch, epochs):
                if controller.finished:
                    break
                self._fit(controller, epoch, epoch + 1)
        elif initial_epoch < epochs and not controller.finished:
            self._fit(controller, initial_epoch, epochs)

    def _fit(self, controller: Controller, first: int, end: int, skip_steps: int = 0) -> None:
        """fit epochs [first, end) on exactly their batches (`first` minus `skip_steps`)."""
        exp = self.exp
        steps = exp.data.steps_per_epoch
        exp.model.fit(
            self.distribute(exp.data.train_epochs(first, end, skip_steps)),
            epochs=end,
            initial_epoch=first,
            steps_per_epoch=steps - skip_steps if end == first + 1 else steps,
            callbacks=[_EpochCallback(controller, steps - skip_steps, skip_steps)],
            verbose=0,  # the Controller draws the progress bar, as for every loop
            shuffle=False,  # the stream is already shuffled per epoch (see distlab.data)
        )
