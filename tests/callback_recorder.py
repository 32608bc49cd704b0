"""A Keras callback that records every hook call, as JSON lines (tests/test_callbacks.py)."""

from __future__ import annotations

import json
import os

import keras

import distlab


class Recorder(keras.callbacks.Callback):
    """Appends [hook, index, {logs}, pid] per call to `path` (and the model's optimizer's
    learning rate at each epoch's end to `path`.lr); with `stop_epoch` (0-based) it sets
    model.stop_training at that epoch's end, or after its step `stop_step` (1-based)."""

    def __init__(self, path: str, stop_epoch: int | None = None,
                 stop_step: int | None = None) -> None:
        super().__init__()
        self.path, self.stop_epoch, self.stop_step = path, stop_epoch, stop_step
        self.epoch = None

    def _record(self, hook: str, index: int | None = None, logs: dict | None = None) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps([hook, index, logs, os.getpid()]) + "\n")

    def on_train_begin(self, logs=None):
        assert self.model is not None and self.params["steps"] > 0
        self._record("train_begin", None, logs)

    def on_train_end(self, logs=None):
        self._record("train_end", None, logs)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self._record("epoch_begin", epoch, logs)

    def on_epoch_end(self, epoch, logs=None):
        self._record("epoch_end", epoch, logs)
        # as the TensorFlow tutorial's PrintLR: the model's optimizer, in either loop
        with open(f"{self.path}.lr", "a") as f:
            f.write(f"{float(self.model.optimizer.learning_rate.numpy())}\n")
        if epoch == self.stop_epoch and self.stop_step is None:
            self.model.stop_training = True

    def on_train_batch_begin(self, batch, logs=None):
        self._record("batch_begin", batch, logs)

    def on_train_batch_end(self, batch, logs=None):
        self._record("batch_end", batch, logs)
        if self.epoch == self.stop_epoch and batch + 1 == self.stop_step:
            self.model.stop_training = True

    # never called by distlab (README "Callbacks"): recorded if they were
    def on_test_begin(self, logs=None):
        self._record("test_begin", None, logs)

    def on_test_batch_end(self, batch, logs=None):
        self._record("test_batch_end", batch, logs)

    def on_test_end(self, logs=None):
        self._record("test_end", None, logs)

    def on_predict_begin(self, logs=None):
        self._record("predict_begin", None, logs)


class NotACallback:
    """Not a keras.callbacks.Callback."""


class Raises(keras.callbacks.Callback):
    def __init__(self) -> None:
        raise ValueError("no notification service configured")


class Exits(keras.callbacks.Callback):
    def __init__(self) -> None:
        raise SystemExit(4)  # it ended a whole sweep


@distlab.register("callback", "recorder")  # callbacks.<key>.name=recorder
def recorder(cfg) -> Recorder:
    return Recorder(**cfg)


class Backup(keras.callbacks.BackupAndRestore):
    """A subclass of a callback distlab refuses."""


@distlab.register("callback", "odd")  # a builder that returns no callback
def odd(cfg) -> None:
    return None


@distlab.register("model", "compiled_mlp")  # model.name=compiled_mlp
def compiled_mlp(cfg, input_shape, outputs):
    """A builder that compiles its model with an optimizer of its own (as tutorial code
    does), which distlab replaces by the run's in both loops."""
    model = keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                              keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(outputs)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.5), loss="mse")
    return model
