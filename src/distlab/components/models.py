"""Keras models from the `model` group. Build them inside `strategy.scope()`.

Every builder takes `(cfg, input_shape, outputs)`: `outputs` is the number of output units
(classes for classification, targets for regression). Outputs are logits / raw values unless
`cfg.output_activation` names an activation (e.g. softmax).
"""

from __future__ import annotations

import difflib
from typing import Any

import keras
from omegaconf import DictConfig, OmegaConf

from distlab.config.checks import check
from distlab.config.schema import RESNET_DEPTH
from distlab.errors import ConfigError
from distlab.registry import MODELS  # lists the builders below by import path


def _l2(cfg: DictConfig) -> keras.regularizers.Regularizer | None:
    return keras.regularizers.L2(cfg.l2) if cfg.l2 else None


def cnn(cfg: DictConfig, input_shape: tuple[int, ...], outputs: int) -> keras.Model:
    """[Conv-ReLU-MaxPool] x len(conv_filters), Flatten, [Dense-ReLU] x len(dense_units), Dense."""
    reg = keras.regularizers.L2(cfg.l2) if cfg.l2 else None
    layers: list[keras.layers.Layer] = [keras.Input(shape=input_shape)]
    for filters in cfg.conv_filters:
        layers += [keras.layers.Conv2D(filters, cfg.kernel_size, activation="relu",
                                       kernel_regularizer=reg), keras.layers.MaxPooling2D()]
    layers.append(keras.layers.Flatten())
    for units in cfg.dense_units:
        layers.append(keras.layers.Dense(units, activation="relu", kernel_regularizer=reg))
    layers.append(keras.layers.Dense(outputs, activation=cfg.output_activation,
                                     kernel_regularizer=reg, dtype="float32"))
    return keras.Sequential(layers, name="cnn")


def mlp(cfg: DictConfig, input_shape: tuple[int, ...], outputs: int) -> keras.Model:
    """Flatten, then per `hidden_units` entry Dense-[BN]-activation-[Dropout], then Dense.

    With `batch_norm` the hidden Dense is linear and BatchNormalization sits between it and
    the activation (Ioffe & Szegedy's placement); `dropout` > 0 adds Dropout after the
    activation. `l2` regularises every kernel.
    """
    activation = cfg.get("activation") or "relu"
    try:
        keras.activations.get(activation)
    except ValueError:
        raise ConfigError(f"model.activation={activation!r} is not a Keras activation") from None
    reg, dropout = _l2(cfg), cfg.get("dropout") or 0.0
    layers: list[keras.layers.Layer] = [keras.Input(shape=input_shape), keras.layers.Flatten()]
    for units in cfg.hidden_units:
        if cfg.get("batch_norm"):
            layers += [keras.layers.Dense(units, kernel_regularizer=reg),
                       keras.layers.BatchNormalization(), keras.layers.Activation(activation)]
        else:
            layers.append(keras.layers.Dense(units, activation=activation,
                                             kernel_regularizer=reg))
        if dropout > 0:
            layers.append(keras.layers.Dropout(dropout))
    layers.append(keras.layers.Dense(outputs, activation=cfg.output_activation,
                                     kernel_regularizer=reg, dtype="float32"))
    return keras.Sequential(layers, name="mlp")


def resnet(cfg: DictConfig, input_shape: tuple[int, ...], outputs: int) -> keras.Model:
    """CIFAR ResNet v1 (He et al. 2016, section 4.2) of depth 6n+2.

    Conv3x3(16)-BN-ReLU, then 3 stages of n basic blocks (two Conv3x3-BN, ReLU after the
    add) with 16/32/64 filters, the first block of stages 2 and 3 striding by 2; global
    average pooling; Dense(outputs). Where the shape changes the shortcut is a projection,
    Conv1x1(stride 2)-BN (the paper's option B; identity elsewhere). Convolutions are
    bias-free (BN follows) with He-normal init; `l2` regularises every kernel.
    `sync_batch_norm` makes BN use the global batch's statistics across replicas.
    """
    depth = cfg.depth
    check("model.depth", depth, RESNET_DEPTH)  # validate's rule, for a builder called directly
    blocks = (depth - 2) // 6
    reg = _l2(cfg)
    sync = bool(cfg.get("sync_batch_norm"))

    def conv(x: Any, filters: int, kernel: int, strides: int = 1) -> Any:
        x = keras.layers.Conv2D(filters, kernel, strides=strides, padding="same",
                                use_bias=False, kernel_initializer="he_normal",
                                kernel_regularizer=reg)(x)
        return keras.layers.BatchNormalization(synchronized=sync)(x)

    inputs = keras.Input(shape=input_shape)
    x = keras.layers.ReLU()(conv(inputs, 16, 3))
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(blocks):
            strides = 2 if stage > 0 and block == 0 else 1
            y = keras.layers.ReLU()(conv(x, filters, 3, strides))
            y = conv(y, filters, 3)
            shortcut = conv(x, filters, 1, strides) if strides != 1 else x
            x = keras.layers.ReLU()(keras.layers.Add()([shortcut, y]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    out = keras.layers.Dense(outputs, activation=cfg.output_activation,
                             kernel_regularizer=reg, dtype="float32")(x)
    return keras.Model(inputs, out, name=f"resnet{depth}")


# keys the builder sets itself, which model.kwargs may not override
_APPLICATION_OWN_KEYS = ("weights", "input_shape", "input_tensor", "include_top", "classes",
                         "classifier_activation")


def application_names() -> list[str]:
    """The architectures in keras.applications (ResNet50, MobileNetV2, ...)."""
    return sorted(n for n in dir(keras.applications)
                  if n[:1].isupper() and callable(getattr(keras.applications, n)))


def keras_applications(cfg: DictConfig, input_shape: tuple[int, ...],
                       outputs: int) -> keras.Model:
    """`keras.applications.<architecture>` with random weights (never downloads) and a
    Dense(outputs) top; `kwargs` are passed through (e.g. alpha for MobileNet)."""
    arch = cfg.architecture
    names = application_names()
    if arch not in names:
        close = difflib.get_close_matches(arch, names, n=4, cutoff=0.4)
        hint = f"close matches: {', '.join(close)}" if close else f"known: {', '.join(names)}"
        raise ConfigError(f"model.architecture={arch} is not in keras.applications; {hint}")
    kwargs = OmegaConf.to_container(cfg.kwargs) if cfg.get("kwargs") else {}
    if own := sorted(set(kwargs) & set(_APPLICATION_OWN_KEYS)):
        raise ConfigError(f"model.kwargs may not set {', '.join(own)}: distlab sets them "
                          "(weights=None, the data's input shape, classes=outputs, "
                          "classifier_activation=model.output_activation)")
    try:
        return getattr(keras.applications, arch)(
            weights=None, input_shape=tuple(input_shape), classes=outputs,
            classifier_activation=cfg.output_activation, **kwargs)
    except TypeError as e:  # an unknown keyword in kwargs
        raise ConfigError(f"model.kwargs={kwargs} do not fit model.architecture={arch}: "
                          f"{_one_line(e)}") from None
    except ValueError as e:
        msg = _one_line(e)
        if "input" in msg.lower():
            raise ConfigError(f"model.architecture={arch} cannot take the data's input shape "
                              f"{tuple(input_shape)}: {msg}") from None
        raise ConfigError(f"model.architecture={arch} with model.kwargs={kwargs}: "
                          f"{msg}") from None


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())


def build(cfg: DictConfig, input_shape: tuple[int, ...], outputs: int) -> keras.Model:
    """The model `cfg.name` names (registered, or an import path); call inside the scope.

    Under a mixed dtype policy (`precision`) its outputs are float32: distlab's builders
    give their last layer a float32 dtype; any other model whose outputs are not float32
    gets a float32 cast layer after them (Keras' mixed-precision guide)."""
    model = MODELS.get(cfg.name)(cfg, input_shape, outputs)
    return float32_outputs(model)


def float32_outputs(model: keras.Model) -> keras.Model:
    """`model`, or (mixed precision, lower-precision outputs) `model` then a float32 cast."""
    outputs = getattr(model, "outputs", None)
    if not outputs or all(keras.backend.standardize_dtype(o.dtype) == "float32"
                          for o in outputs):
        return model  # float32 already, or a subclassed model (its losses cast to float32)
    cast = [keras.layers.Activation("linear", dtype="float32", name=f"float32_output_{i}")(o)
            for i, o in enumerate(outputs)]
    return keras.Model(model.inputs, cast[0] if len(cast) == 1 else cast, name=model.name)
