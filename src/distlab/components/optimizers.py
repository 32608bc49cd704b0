"""Keras optimizers from the `optimizer` group, with the batch-size scaling rule."""

from __future__ import annotations

import math
from collections.abc import Callable

import keras
import tensorflow as tf
from omegaconf import DictConfig

from distlab.keras_patches import accumulation as grad_accumulation
from distlab.keras_patches.loss_scaling import LossScaleOptimizer
from distlab.registry import OPTIMIZERS  # lists the builders here by import path


def scaled_learning_rate(learning_rate: float, lr_scaling: str, global_batch_size: int,
                         base_batch_size: int) -> float:
    """`learning_rate` x (global / base) for linear, its square root for sqrt, x1 for none."""
    ratio = global_batch_size / base_batch_size
    factor = {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[lr_scaling]
    return learning_rate * factor


def _common(cfg: DictConfig) -> dict:
    return {"clipnorm": cfg.clipnorm} if cfg.clipnorm is not None else {}


def adam(cfg: DictConfig, learning_rate) -> keras.optimizers.Optimizer:
    return keras.optimizers.Adam(learning_rate, beta_1=cfg.beta_1, beta_2=cfg.beta_2,
                                 epsilon=cfg.epsilon, amsgrad=cfg.amsgrad, **_common(cfg))


def sgd(cfg: DictConfig, learning_rate) -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(learning_rate, momentum=cfg.momentum, nesterov=cfg.nesterov,
                                **_common(cfg))


def rmsprop(cfg: DictConfig, learning_rate) -> keras.optimizers.Optimizer:
    return keras.optimizers.RMSprop(learning_rate, rho=cfg.rho, momentum=cfg.momentum,
                                    epsilon=cfg.epsilon, **_common(cfg))


def with_training_options(optimizer: keras.optimizers.Optimizer, grad_accum_steps: int,
                          loss_scaling: bool, distributed: bool,
                          epochs: int | None = None, steps_per_epoch: int | None = None,
                          ) -> keras.optimizers.Optimizer:
    """`optimizer` updating every `grad_accum_steps` batches with their mean gradient
    (distlab.keras_patches.accumulation), clipping the gradient summed over replicas, wrapped in a
    LossScaleOptimizer for float16. Given the run's `epochs` and `steps_per_epoch`, an
    accumulation longer than the whole run is refused."""
    if epochs is not None and steps_per_epoch is not None:
        grad_accumulation.check_steps(grad_accum_steps, epochs, steps_per_epoch)
    if grad_accum_steps > 1:
        optimizer = grad_accumulation.accumulate(optimizer, grad_accum_steps, distributed)
    optimizer = grad_accumulation.clip_globally(optimizer, distributed)
    if loss_scaling and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = LossScaleOptimizer(optimizer)
    return optimizer


def apply_leftover_gradients(optimizer: keras.optimizers.Optimizer,
                             strategy: tf.distribute.Strategy, save: Callable[[], str]) -> bool:
    """End of training: the micro-batches left in a partial accumulation make one last
    update, then `save()` checkpoints it (see `keras_patches.accumulation.apply_leftover`)."""
    return grad_accumulation.apply_leftover(optimizer, strategy, save)


def build(cfg: DictConfig, learning_rate) -> keras.optimizers.Optimizer:
    """Call inside `strategy.scope()`; `learning_rate` is a float or a schedule."""
    return OPTIMIZERS.build(cfg.name, cfg, learning_rate)
