"""Keras optimizers from the `optimizer` group, with the batch-size scaling rule."""

from __future__ import annotations

import math

import keras
from omegaconf import DictConfig

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


def build(cfg: DictConfig, learning_rate) -> keras.optimizers.Optimizer:
    """Call inside `strategy.scope()`; `learning_rate` is a float or a schedule."""
    return OPTIMIZERS.get(cfg.name)(cfg, learning_rate)
