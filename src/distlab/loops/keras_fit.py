"""`loop=keras_fit`: model.compile + model.fit inside the strategy scope."""

from __future__ import annotations

import time

import keras

from distlab.errors import DistlabError
from distlab.loops.base import Loop


class _EpochCallback(keras.callbacks.Callback):
    """Feeds the shared Controller and adds the validation figures (measured by the loops'
    shared evaluation) to the logs; runs before TensorBoard, which then writes them all."""

    def __init__(self, loop: KerasFitLoop, skip_steps: int = 0) -> None:
        super().__init__()
        self.loop, self.skip_steps = loop, skip_steps
        self._epoch_start, self._epoch, self._steps = 0.0, 0, 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start, self._epoch, self._steps = time.time(), epoch, 0

    def on_train_batch_end(self, batch, logs=None):
        self._steps = batch + 1
        loss = float((logs or {}).get("loss", 0.0))
        self.loop.controller.step_end(self._epoch, self.skip_steps + self._steps, loss)

    def on_epoch_end(self, epoch, logs=None):
        logs = logs if logs is not None else {}
        train_end = time.time()
        if self.loop.validate_now(epoch):
            test = self.loop.evaluate()
            logs.update(val_loss=test["test_loss"], val_accuracy=test["test_accuracy"])
        row = self.loop.controller.epoch_end(epoch, dict(logs), time.time() - self._epoch_start,
                                             train_end - self._epoch_start, self._steps)
        # TensorBoard (next in the callback list) writes these too
        logs.update(learning_rate=row["learning_rate"], examples_per_sec=row["examples_per_sec"])


class KerasFitLoop(Loop):
    writes_scalars = False

    def __init__(self, exp) -> None:
        super().__init__(exp)
        cfg = exp.cfg
        if cfg.loop.steps_per_execution > 1 and exp.strategy.num_replicas_in_sync > 1:
            raise DistlabError(
                f"loop.steps_per_execution={cfg.loop.steps_per_execution} fails with "
                f"{exp.strategy.num_replicas_in_sync} replicas in Keras 3 (keras#19246: 'You "
                "must feed a value for placeholder tensor'). Use loop.steps_per_execution=1, "
                "or loop=custom with loop.steps_per_loop for the same effect"
            )
        with exp.strategy.scope():
            exp.model.compile(
                optimizer=exp.optimizer,
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=exp.from_logits),
                metrics=["accuracy"],
                steps_per_execution=cfg.loop.steps_per_execution,
                jit_compile=cfg.loop.jit_compile,
            )

    def train(self, initial_epoch: int, skip_steps: int = 0) -> None:
        epochs, steps = self.exp.cfg.trainer.epochs, self.exp.data.steps_per_epoch
        if skip_steps:  # resumed mid-epoch: finish that epoch first, in a fit of its own
            self._fit(initial_epoch, initial_epoch + 1, steps - skip_steps, skip_steps)
            initial_epoch += 1
        if initial_epoch < epochs:
            self._fit(initial_epoch, epochs, steps)

    def _fit(self, first: int, end: int, steps: int, skip_steps: int = 0) -> None:
        exp = self.exp
        exp.model.fit(
            exp.data.train_epochs(first, end, skip_steps),
            epochs=end,
            initial_epoch=first,
            steps_per_epoch=steps,
            callbacks=[
                _EpochCallback(self, skip_steps),
                keras.callbacks.TensorBoard(log_dir=str(exp.run_dir.logs), write_graph=False),
            ],
            verbose=exp.cfg.loop.verbose,
            shuffle=False,  # the stream is already shuffled per epoch (see distlab.data)
        )
