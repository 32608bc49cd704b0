"""The package's dataset and model, registered when distlab starts (no TensorFlow state at
import: Keras objects are made inside the builders)."""

from __future__ import annotations

from dataclasses import dataclass

import keras
import numpy as np
from omegaconf import DictConfig

import distlab
from distlab.config import DatasetConfig


@dataclass
class MoonsConfig(DatasetConfig):
    """`dataset=moons`: distlab's common dataset keys plus the data's own."""

    examples: int = 1024  # train and test examples each
    noise: float = 0.15  # standard deviation of the Gaussian noise on each coordinate


@distlab.register("dataset", "moons", schema=MoonsConfig)
def moons(cfg: DictConfig) -> distlab.DataSplits:
    """Two interleaving half circles in 2-D, label = which one: made with NumPy, no download."""
    rng = np.random.default_rng(0)

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, 2, n)
        angle = rng.uniform(0, np.pi, n)
        x = np.stack([np.cos(angle) + y, np.sin(angle) * (1 - 2 * y) + 0.5 * y], axis=1)
        x += rng.normal(0, cfg.noise, x.shape)
        return x.astype(np.float32), y.astype(np.int64)

    return distlab.DataSplits(train=split(cfg.examples), test=split(cfg.examples),
                              num_classes=2)


@distlab.register("model", "moons_mlp")
def moons_mlp(cfg: DictConfig, input_shape: tuple, outputs: int) -> keras.Model:
    """Dense-ReLU layers of `model.width` units, `model.depth` of them; logits out."""
    layers = [keras.layers.Dense(cfg.width, activation="relu") for _ in range(cfg.depth)]
    return keras.Sequential([keras.Input(input_shape), *layers, keras.layers.Dense(outputs)])
