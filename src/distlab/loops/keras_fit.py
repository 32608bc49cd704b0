"""`loop=keras_fit`: model.compile + model.fit inside the strategy scope."""

from __future__ import annotations

import time

import keras

from distlab.loops.base import Loop


class _EpochCallback(keras.callbacks.Callback):
    """Feeds the shared Controller; runs before TensorBoard so it sees examples_per_sec."""

    def __init__(self, loop: KerasFitLoop, skip_steps: int = 0) -> None:
        super().__init__()
        self.loop, self.skip_steps = loop, skip_steps
        self._epoch_start = self._train_end = 0.0
        self._in_epoch, self._epoch, self._steps = False, 0, 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start, self._train_end, self._in_epoch = time.time(), 0.0, True
        self._epoch, self._steps = epoch, 0

    def on_train_batch_end(self, batch, logs=None):
        self._steps = batch + 1
        loss = float((logs or {}).get("loss", 0.0))
        self.loop.controller.step_end(self._epoch, self.skip_steps + self._steps, loss)

    def on_test_begin(self, logs=None):  # validation inside fit: the training part ended
        if self._in_epoch and not self._train_end:
            self._train_end = time.time()

    def on_epoch_end(self, epoch, logs=None):
        now = time.time()
        train_end = self._train_end or now
        self._in_epoch = False
        row = self.loop.controller.epoch_end(epoch, dict(logs or {}), now - self._epoch_start,
                                             train_end - self._epoch_start, self._steps)
        if logs is not None:  # TensorBoard (next in the list) logs these too
            logs["learning_rate"] = row["learning_rate"]
            logs["examples_per_sec"] = row["examples_per_sec"]


class KerasFitLoop(Loop):
    writes_scalars = False

    def __init__(self, exp) -> None:
        super().__init__(exp)
        cfg = exp.cfg
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
        exp, trainer = self.exp, self.exp.cfg.trainer
        validate = trainer.validate_every > 0
        exp.model.fit(
            exp.data.train_epochs(first, end, skip_steps),
            epochs=end,
            initial_epoch=first,
            steps_per_epoch=steps,
            validation_data=exp.data.test if validate else None,
            validation_freq=trainer.validate_every if validate else 1,
            callbacks=[
                _EpochCallback(self, skip_steps),
                keras.callbacks.TensorBoard(log_dir=str(exp.run_dir.logs), write_graph=False),
            ],
            verbose=exp.cfg.loop.verbose,
            shuffle=False,  # the stream is already shuffled per epoch (see distlab.data)
        )

    def evaluate(self) -> dict[str, float]:
        out = self.exp.model.evaluate(self.exp.data.test, return_dict=True,
                                      verbose=self.exp.cfg.loop.verbose)
        return {"test_loss": float(out["loss"]), "test_accuracy": float(out["accuracy"])}
