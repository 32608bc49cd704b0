"""Two Keras model builders, each called as `f(cfg, input_shape, outputs)`.

`small_convnet` is registered under a name with a schema (`model=small_convnet`, its keys
checked before TensorFlow starts); `tabular_mlp` is not registered at all: a config names
it by import path, `name: tabular_project.models:tabular_mlp`, and reads its keys with
`cfg.get` (unchecked). Keras is imported inside the builders, so importing this module to
register the names stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from omegaconf import DictConfig

import distlab

if TYPE_CHECKING:
    import keras


@dataclass
class SmallConvNetConfig:
    """`model=small_convnet`: the keys its YAML may set (checked, defaults filled in)."""

    filters: list[int] = field(default_factory=lambda: [16, 32])  # a 3x3 conv per entry
    dense_units: list[int] = field(default_factory=lambda: [64])  # hidden Dense layers
    dropout: float = 0.0  # before the hidden Dense layers
    output_activation: str | None = None  # null: logits; softmax: probabilities


@distlab.register("model", "small_convnet", schema=SmallConvNetConfig)
def small_convnet(cfg: DictConfig, input_shape: tuple[int, ...], outputs: int) -> keras.Model:
    """[Conv3x3-ReLU] x len(filters), MaxPool 2x2, Flatten, (Dropout), [Dense-ReLU]..., Dense."""
    import keras

    layers: list = [keras.Input(shape=input_shape)]
    layers += [keras.layers.Conv2D(f, 3, padding="same", activation="relu")
               for f in cfg.filters]
    layers += [keras.layers.MaxPooling2D(), keras.layers.Flatten()]
    if cfg.dropout:
        layers.append(keras.layers.Dropout(cfg.dropout))
    layers += [keras.layers.Dense(units, activation="relu") for units in cfg.dense_units]
    layers.append(keras.layers.Dense(outputs, activation=cfg.output_activation))
    return keras.Sequential(layers, name="small_convnet")


def tabular_mlp(cfg: DictConfig, input_shape: tuple[int, ...], outputs: int) -> keras.Model:
    """A residual MLP for feature vectors: Dense(width)-ReLU, then `blocks` residual
    blocks x + Dense(Dense-ReLU(x)), then a linear Dense(outputs) (regression values)."""
    import keras

    width, blocks = int(cfg.get("width", 64)), int(cfg.get("blocks", 2))
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Dense(width, activation="relu")(keras.layers.Flatten()(inputs))
    for _ in range(blocks):
        h = keras.layers.Dense(width, activation="relu")(x)
        x = keras.layers.Add()([x, keras.layers.Dense(width)(h)])
    out = keras.layers.Dense(outputs, activation=cfg.get("output_activation"))(x)
    return keras.Model(inputs, out, name="tabular_mlp")
