"""Loops a user writes, as a plug-in module (`imports=[user_loops]`): step methods only.

`clip_per_replica` clips each replica's own gradient before the all-reduce (the Controller
gives it history, checkpoints, resume, the NaN guard, early stopping and TensorBoard);
`counting` adds an item of its own to the checkpoint (`state()`): the examples it trained
on, written to $USER_LOOP_OUT/seen-<worker index> after every block when that is set;
`vector_block` is a block written before `EpochSums` (deprecated, still works). The model
`step_counting` has its own Keras `train_step`, which loop=keras_fit runs (it counts its
steps in a variable the checkpoint holds).
"""

from __future__ import annotations

import os
from pathlib import Path

import keras
import tensorflow as tf

import distlab
from distlab.training.loops import CustomLoop

CLIP_NORM = 0.05


@distlab.register("loop", "clip_per_replica")
class ClipPerReplica(distlab.Loop):
    def train_step(self, features, labels, weights):
        with tf.GradientTape() as tape:
            predictions = self.exp.model(features, training=True)
            loss, per_example_loss = self.compute_loss(labels, predictions, weights)
        grads = self.gradients(tape, loss)
        norm = tf.linalg.global_norm(grads)  # this replica's gradient only
        if norm > CLIP_NORM:  # a Python `if` on a tensor: autograph still converts a user's step
            grads, _ = tf.clip_by_global_norm(grads, CLIP_NORM, use_norm=norm)
        self.apply_gradients(grads)
        return self.batch_stats(labels, predictions, per_example_loss, weights)


@distlab.register("loop", "counting")
class Counting(CustomLoop):
    def __init__(self, exp) -> None:
        super().__init__(exp)
        with exp.strategy.scope():
            self.seen = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="seen")

    def state(self) -> dict:
        return {"examples_seen": self.seen}

    def train_steps(self, iterator, n):
        sums = super().train_steps(iterator, n)
        self.seen.assign_add(sums.count)  # the block's real examples, summed over replicas
        if out := os.environ.get("USER_LOOP_OUT"):
            Path(out, f"seen-{self.exp.worker.index}").write_text(repr(float(self.seen.numpy())))
        return sums


@distlab.register("loop", "vector_block")
class VectorBlock(CustomLoop):
    """train_steps as written before EpochSums: it indexes the block's sums and returns the
    batch-stats vector (both deprecated, both still work)."""

    def train_steps(self, iterator, n):
        sums = super().train_steps(iterator, n)
        assert sums[-1] > 0  # the block's real examples
        return sums.stats.copy()


class StepCounting(keras.Model):
    """A model with its own train_step (Keras' own, counting the steps it runs)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.steps_taken = keras.Variable(0, dtype="int64", trainable=False, name="steps_taken")

    def train_step(self, data):
        self.steps_taken.assign_add(1)
        return super().train_step(data)


@distlab.register("model", "step_counting")
def step_counting(cfg, input_shape, outputs):
    inputs = keras.Input(input_shape)
    hidden = keras.layers.Dense(16, activation="relu")(keras.layers.Flatten()(inputs))
    return StepCounting(inputs, keras.layers.Dense(outputs)(hidden))


@distlab.register("loop", "own_loss")
class OwnLoss(distlab.Loop):
    """Its loss without compute_loss: no model.losses, no loss scale (it is warned)."""

    def train_step(self, features, labels, weights):
        with tf.GradientTape() as tape:
            predictions = self.exp.model(features, training=True)
            per_example_loss = self.loss_fn(labels, predictions)
            loss = tf.nn.compute_average_loss(per_example_loss, sample_weight=weights)
        self.apply_gradients(self.gradients(tape, loss))
        return self.batch_stats(labels, predictions, per_example_loss, weights)


# ---- loops that break the contract: each is refused in one line naming what to fix
@distlab.register("loop", "gradients_of_a_pair")
class GradientsOfAPair(distlab.Loop):
    def train_step(self, features, labels, weights):
        with tf.GradientTape() as tape:
            predictions = self.exp.model(features, training=True)
            both = self.compute_loss(labels, predictions, weights)
        self.apply_gradients(self.gradients(tape, both))  # should be both[0]
        return self.batch_stats(labels, predictions, both[1], weights)


@distlab.register("loop", "no_step")
class NoStep(distlab.Loop):
    pass


class _Returns(CustomLoop):
    value: object = None

    def train_step(self, features, labels, weights):
        super().train_step(features, labels, weights)
        return self.value(labels) if callable(self.value) else self.value


@distlab.register("loop", "returns_dict")
class ReturnsDict(_Returns):
    value = staticmethod(lambda labels: {"loss": tf.constant(0.0)})


@distlab.register("loop", "returns_float32")
class ReturnsFloat32(_Returns):
    value = staticmethod(lambda labels: tf.zeros([3], tf.float32))


@distlab.register("loop", "returns_none")
class ReturnsNone(_Returns):
    pass


class _State(CustomLoop):
    def state(self):
        return self.items()


@distlab.register("loop", "state_list")
class StateList(_State):
    def items(self):
        return [tf.Variable(0)]


@distlab.register("loop", "state_save_counter")
class StateSaveCounter(_State):
    def items(self):
        return {"save_counter": tf.Variable(0)}


@distlab.register("loop", "state_not_trackable")
class StateNotTrackable(_State):
    def items(self):
        return {"counter": 3}


@distlab.register("loop", "not_a_loop")
def not_a_loop(exp):
    return 42
