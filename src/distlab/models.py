"""Keras models from the `model` group. Build them inside `strategy.scope()`."""

from __future__ import annotations

import keras
from omegaconf import DictConfig

from distlab.registry import Registry

MODELS: Registry = Registry("model")


@MODELS.register("cnn")
def cnn(cfg: DictConfig, input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
    """[Conv-ReLU-MaxPool] x len(conv_filters), Flatten, [Dense-ReLU] x len(dense_units), Dense."""
    reg = keras.regularizers.L2(cfg.l2) if cfg.l2 else None
    layers: list[keras.layers.Layer] = [keras.Input(shape=input_shape)]
    for filters in cfg.conv_filters:
        layers += [keras.layers.Conv2D(filters, cfg.kernel_size, activation="relu",
                                       kernel_regularizer=reg), keras.layers.MaxPooling2D()]
    layers.append(keras.layers.Flatten())
    for units in cfg.dense_units:
        layers.append(keras.layers.Dense(units, activation="relu", kernel_regularizer=reg))
    layers.append(keras.layers.Dense(num_classes, activation=cfg.output_activation,
                                     kernel_regularizer=reg))
    return keras.Sequential(layers, name="cnn")


def build(cfg: DictConfig, input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
    return MODELS.get(cfg.name)(cfg, input_shape, num_classes)


def from_logits(cfg: DictConfig) -> bool:
    """Whether the model's outputs are logits (the loss must then use from_logits=True)."""
    return cfg.output_activation is None
