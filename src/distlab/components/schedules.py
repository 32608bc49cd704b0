"""Learning-rate schedules, stepped by optimizer iterations but configured in epochs.

One schedule object is handed to the optimizer, so `loop=keras_fit` and `loop=custom`
see the same learning rate at every optimizer step.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from omegaconf import DictConfig

from distlab.registry import SCHEDULES  # lists the builders here by import path


@keras.saving.register_keras_serializable("distlab")
class EpochStepDecay(keras.optimizers.schedules.LearningRateSchedule):
    """`base * factors[i]` where i counts the boundaries (in epochs) already reached.

    Unlike PiecewiseConstantDecay (`step <= boundary`), the new value starts exactly at
    the first step of the boundary epoch, like Keras' LearningRateScheduler per epoch.
    """

    def __init__(self, base: float, boundaries: list[int], factors: list[float],
                 steps_per_epoch: int) -> None:
        self.base, self.boundaries = float(base), [int(b) for b in boundaries]
        self.factors, self.steps_per_epoch = [float(f) for f in factors], int(steps_per_epoch)

    def __call__(self, step):
        epoch = tf.cast(step, tf.int64) // self.steps_per_epoch
        index = tf.reduce_sum(tf.cast(epoch >= tf.constant(self.boundaries, tf.int64), tf.int32))
        return self.base * tf.gather(tf.constant(self.factors, tf.float32), index)

    def get_config(self) -> dict:
        return dict(base=self.base, boundaries=self.boundaries, factors=self.factors,
                    steps_per_epoch=self.steps_per_epoch)


@keras.saving.register_keras_serializable("distlab")
class LinearWarmup(keras.optimizers.schedules.LearningRateSchedule):
    """Scales `schedule` linearly from 1/warmup_steps to 1 over the first warmup_steps steps."""

    def __init__(self, schedule, warmup_steps: int) -> None:
        self.schedule, self.warmup_steps = schedule, int(warmup_steps)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        ramp = tf.minimum(1.0, (step + 1.0) / float(self.warmup_steps))
        return ramp * tf.cast(self.schedule(step), tf.float32)

    def get_config(self) -> dict:
        return dict(schedule=keras.saving.serialize_keras_object(self.schedule),
                    warmup_steps=self.warmup_steps)

    @classmethod
    def from_config(cls, config: dict) -> LinearWarmup:
        config = dict(config, schedule=keras.saving.deserialize_keras_object(config["schedule"]))
        return cls(**config)


@keras.saving.register_keras_serializable("distlab")
class Constant(keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, base: float) -> None:
        self.base = float(base)

    def __call__(self, step):
        return tf.constant(self.base, tf.float32)

    def get_config(self) -> dict:
        return dict(base=self.base)


def constant(cfg: DictConfig, base: float, steps_per_epoch: int, epochs: int):
    return Constant(base)


def step_decay(cfg: DictConfig, base: float, steps_per_epoch: int, epochs: int):
    return EpochStepDecay(base, list(cfg.boundaries), list(cfg.factors), steps_per_epoch)


def cosine(cfg: DictConfig, base: float, steps_per_epoch: int, epochs: int):
    decay_epochs = cfg.decay_epochs if cfg.decay_epochs is not None else epochs
    return keras.optimizers.schedules.CosineDecay(
        base, decay_steps=max(1, round(decay_epochs * steps_per_epoch)), alpha=cfg.alpha
    )


def exponential(cfg: DictConfig, base: float, steps_per_epoch: int, epochs: int):
    return keras.optimizers.schedules.ExponentialDecay(
        base, decay_steps=max(1, round(cfg.decay_epochs * steps_per_epoch)),
        decay_rate=cfg.decay_rate, staircase=cfg.staircase,
    )


def build(cfg: DictConfig, base: float, steps_per_epoch: int, epochs: int):
    """The schedule named by `cfg.name`, with `cfg.warmup_epochs` of linear warmup."""
    schedule = SCHEDULES.build(cfg.name, cfg, base, steps_per_epoch, epochs)
    warmup_steps = round(cfg.warmup_epochs * steps_per_epoch)
    return LinearWarmup(schedule, warmup_steps) if warmup_steps > 0 else schedule
