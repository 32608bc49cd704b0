"""The `model` group's keys, one schema per model of distlab's zoo."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from distlab.config.schema.rules import (
    ENTRIES_POSITIVE,
    FRACTION,
    NON_NEGATIVE,
    OUTPUT_ACTIVATION,
    POSITIVE,
    RESNET_DEPTH,
    checked,
)


@dataclass
class CnnModelConfig:
    """The cnn builder; the defaults are the MNIST tutorial's Conv32-MaxPool-Dense64."""

    name: str = MISSING  # registry name of the builder
    conv_filters: list[int] = checked([32], ENTRIES_POSITIVE)  # one Conv-ReLU-MaxPool each
    kernel_size: int = checked(3, POSITIVE)  # of every Conv2D (square)
    dense_units: list[int] = checked([64], ENTRIES_POSITIVE)  # one Dense-ReLU each
    # null: logits (or raw regression values); softmax: probabilities; sigmoid: task=binary's
    output_activation: str | None = checked(None, OUTPUT_ACTIVATION)
    l2: float = checked(0.0, NON_NEGATIVE)  # L2 weight decay on every kernel


@dataclass
class MlpModelConfig:
    name: str = MISSING
    hidden_units: list[int] = checked([128, 64], ENTRIES_POSITIVE)  # of each hidden Dense
    activation: str = "relu"  # of the hidden layers (a Keras activation name)
    batch_norm: bool = False  # BatchNormalization between each hidden Dense and its activation
    dropout: float = checked(0.0, FRACTION)  # Dropout rate after each hidden layer; 0: none
    output_activation: str | None = checked(None, OUTPUT_ACTIVATION)
    l2: float = checked(0.0, NON_NEGATIVE)


@dataclass
class ResNetModelConfig:
    name: str = MISSING
    depth: int = checked(20, RESNET_DEPTH)  # 6n+2: 20, 32, 44, 56, 110
    l2: float = checked(1e-4, NON_NEGATIVE)  # the paper's weight decay, on every kernel
    sync_batch_norm: bool = False  # BatchNormalization over the global batch (all replicas)
    output_activation: str | None = checked(None, OUTPUT_ACTIVATION)


@dataclass
class KerasApplicationsModelConfig:
    name: str = MISSING
    # a keras.applications name: ResNet50, MobileNetV2, EfficientNetB0, ...
    architecture: str = "MobileNetV2"
    # passed to the constructor, e.g. {alpha: 0.35} or {include_preprocessing: false}
    kwargs: dict[str, Any] = field(default_factory=dict)
    output_activation: str | None = checked(None, OUTPUT_ACTIVATION)
