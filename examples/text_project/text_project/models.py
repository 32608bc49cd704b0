"""`bag_of_ngrams`: TextVectorization adapted on the training split, an Embedding, an average.

The builder declares `input_spec` and `train_inputs`, so distlab passes it the spec of one
example's input (here a scalar string, named `inputs`) and a `tf.data.Dataset` of the
training split's inputs (validation held out, no labels) to adapt the vocabulary on. The
vocabulary is part of the model: it is saved in every checkpoint and in the SavedModel,
which therefore serves raw strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from omegaconf import DictConfig

import distlab

if TYPE_CHECKING:
    import keras
    import tensorflow as tf


@dataclass
class BagOfNgramsConfig:
    """`model=bag_of_ngrams`: the keys its YAML may set."""

    max_tokens: int = 2000  # vocabulary size (words and n-grams), padding and OOV included
    ngrams: int = 2  # words and word pairs ("not good") when 2
    embedding_dim: int = 16
    hidden_units: int = 32  # one ReLU layer after the average; 0: none
    dropout: float = 0.0


@distlab.register("model", "bag_of_ngrams", schema=BagOfNgramsConfig)
def bag_of_ngrams(cfg: DictConfig, input_shape: tuple, outputs: int, *,
                  input_spec: tf.TensorSpec, train_inputs: tf.data.Dataset) -> keras.Model:
    """Strings -> token ids (lower-cased, punctuation stripped, n-grams) -> Embedding ->
    average over the tokens (padding masked) -> [Dense-ReLU] -> Dense(outputs) logits."""
    import keras

    words = keras.layers.TextVectorization(max_tokens=cfg.max_tokens, ngrams=cfg.ngrams,
                                           name="words")
    words.adapt(train_inputs)  # the training split only
    inputs = distlab.keras_inputs(input_spec)
    x = keras.layers.Embedding(words.vocabulary_size(), cfg.embedding_dim, mask_zero=True)(
        words(inputs))
    x = keras.layers.GlobalAveragePooling1D()(x)
    if cfg.dropout:
        x = keras.layers.Dropout(cfg.dropout)(x)
    if cfg.hidden_units:
        x = keras.layers.Dense(cfg.hidden_units, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(outputs)(x), name="bag_of_ngrams")
