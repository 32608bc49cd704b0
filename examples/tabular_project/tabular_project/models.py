"""Keras model builders, each called as `f(cfg, input_shape, outputs)` (and, if declared,
with `input_spec` and `train_inputs`).

`small_convnet` is registered under a name with a schema (`model=small_convnet`, its keys
checked before TensorFlow starts); `tabular_mlp` is not registered at all: a config names
it by import path, `name: tabular_project.models:tabular_mlp`, and reads its keys with
`cfg.get` (unchecked). Keras is imported inside the builders, so importing this module to
register the names stays fast. `two_inputs` takes a dict of named inputs, one of them
strings, and adapts a StringLookup on the training split.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from omegaconf import DictConfig

import distlab

if TYPE_CHECKING:
    import keras
    import tensorflow as tf


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


@dataclass
class TwoInputsConfig:
    """`model=two_inputs`: the keys its YAML may set."""

    category: str = "size"  # the string input, looked up and embedded
    embedding_dim: int = 3
    width: int = 32  # one Dense-ReLU layer over [numeric inputs, embedding]
    output_activation: str | None = None  # null: a logit; sigmoid: a probability


@distlab.register("model", "two_inputs", schema=TwoInputsConfig)
def two_inputs(cfg: DictConfig, input_shape: dict, outputs: int, *, input_spec: dict,
               train_inputs: tf.data.Dataset) -> keras.Model:
    """A dict of inputs: the string input `category` through a StringLookup adapted on the
    training split (validation held out) and an Embedding; every other input as it comes
    (numbers, standardised by `dataset.preprocess.standardize`); concatenated, Dense-ReLU,
    Dense(outputs). The lookup's vocabulary is saved in checkpoints and the SavedModel,
    which serves the raw strings."""
    import keras

    if cfg.category not in input_spec:
        raise distlab.DistlabError(f"model.category={cfg.category!r} is not an input of this "
                                   f"dataset; its inputs: {', '.join(sorted(input_spec))}")
    lookup = keras.layers.StringLookup(name=f"{cfg.category}_lookup")
    lookup.adapt(train_inputs.map(lambda x: x[cfg.category]))  # the training split only
    inputs = distlab.keras_inputs(input_spec)  # {"measurements": ..., "size": ...}
    embedded = keras.layers.Embedding(lookup.vocabulary_size(), cfg.embedding_dim,
                                      name=f"{cfg.category}_embedding")(
        lookup(inputs[cfg.category]))
    numeric = [inputs[k] for k in sorted(inputs) if k != cfg.category]
    x = keras.layers.Concatenate()([*numeric, embedded])
    x = keras.layers.Dense(cfg.width, activation="relu")(x)
    out = keras.layers.Dense(outputs, activation=cfg.output_activation)(x)
    return keras.Model(inputs, out, name="two_inputs")


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
