"""Keras models from the `model` group. Build them inside `strategy.scope()`.

Every builder takes `(cfg, input_shape, outputs)`: `outputs` is the number of output units
(classes for classification, targets for regression). Outputs are logits / raw values unless
`cfg.output_activation` names an activation (e.g. softmax). A builder that declares them
also gets `input_spec` (the model's inputs per example: a named tf.TensorSpec, or a tuple or
dict of them; `keras_inputs` makes the matching `keras.Input`s) and `train_inputs` (the
training split's inputs, batched, to `adapt` preprocessing layers on). distlab's own
builders take one numeric input tensor.

`dataset.preprocess.standardize` puts Keras `Normalization` layers, adapted on the training
split, in front of the built model (`build_for`): their mean and variance are weights of
the model, so checkpoints, the multi-worker broadcast and the SavedModel hold them.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf
from omegaconf import DictConfig, OmegaConf

from distlab.config.checks import check
from distlab.config.schema import RESNET_DEPTH
from distlab.errors import ConfigError
from distlab.registry import MODELS  # lists the builders below by import path

if TYPE_CHECKING:
    from distlab.data.stream import Data


def _l2(cfg: DictConfig) -> keras.regularizers.Regularizer | None:
    return keras.regularizers.L2(cfg.l2) if cfg.l2 else None


def _one_input(cfg: DictConfig, input_shape: Any, input_spec: Any = None) -> tuple:
    """The shape of distlab's builders' one numeric input; a tuple or dict of inputs, or
    strings, are refused in one line (a model builder of one's own takes them)."""
    several = isinstance(input_shape, dict) or (
        isinstance(input_shape, tuple | list) and any(isinstance(d, tuple | list | dict)
                                                      for d in input_shape))
    string = input_spec is not None and any(s.dtype == tf.string
                                            for s in tf.nest.flatten(input_spec))
    if several or string:
        from distlab.data.structure import describe_inputs

        what = describe_inputs(input_spec) if input_spec is not None else str(input_shape)
        raise ConfigError(
            f"model.name={cfg.name} takes one numeric input tensor; this dataset's inputs are "
            f"{what}: register a model builder of your own that declares input_spec (and "
            "train_inputs, to adapt preprocessing layers); see the guide 'Inputs and "
            "preprocessing' (docs/guides/inputs.md)")
    return tuple(input_shape)


def cnn(cfg: DictConfig, input_shape: tuple[int, ...], outputs: int,
        input_spec: Any = None) -> keras.Model:
    """[Conv-ReLU-MaxPool] x len(conv_filters), Flatten, [Dense-ReLU] x len(dense_units), Dense."""
    input_shape = _one_input(cfg, input_shape, input_spec)
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


def mlp(cfg: DictConfig, input_shape: tuple[int, ...], outputs: int,
        input_spec: Any = None) -> keras.Model:
    """Flatten, then per `hidden_units` entry Dense-[BN]-activation-[Dropout], then Dense.

    With `batch_norm` the hidden Dense is linear and BatchNormalization sits between it and
    the activation (Ioffe & Szegedy's placement); `dropout` > 0 adds Dropout after the
    activation. `l2` regularises every kernel.
    """
    input_shape = _one_input(cfg, input_shape, input_spec)
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


def resnet(cfg: DictConfig, input_shape: tuple[int, ...], outputs: int,
           input_spec: Any = None) -> keras.Model:
    """CIFAR ResNet v1 (He et al. 2016, section 4.2) of depth 6n+2.

    Conv3x3(16)-BN-ReLU, then 3 stages of n basic blocks (two Conv3x3-BN, ReLU after the
    add) with 16/32/64 filters, the first block of stages 2 and 3 striding by 2; global
    average pooling; Dense(outputs). Where the shape changes the shortcut is a projection,
    Conv1x1(stride 2)-BN (the paper's option B; identity elsewhere). Convolutions are
    bias-free (BN follows) with He-normal init; `l2` regularises every kernel.
    `sync_batch_norm` makes BN use the global batch's statistics across replicas.
    """
    input_shape = _one_input(cfg, input_shape, input_spec)
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
                       outputs: int, input_spec: Any = None) -> keras.Model:
    """`keras.applications.<architecture>` with random weights (never downloads) and a
    Dense(outputs) top; `kwargs` are passed through (e.g. alpha for MobileNet)."""
    input_shape = _one_input(cfg, input_shape, input_spec)
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


def build(cfg: DictConfig, input_shape: Any, outputs: int, **optional: Any) -> keras.Model:
    """The model `cfg.name` names (registered, or an import path); call inside the scope.
    `optional` (`input_spec`, `train_inputs`) reach a builder that declares them.

    Under a mixed dtype policy (`precision`) its outputs are float32: distlab's builders
    give their last layer a float32 dtype; any other model whose outputs are not float32
    gets a float32 cast layer after them (Keras' mixed-precision guide)."""
    model = MODELS.build(cfg.name, cfg, input_shape, outputs, **optional)
    if not isinstance(model, keras.Model):
        raise ConfigError(f"model.name={cfg.name!r} returned {type(model).__name__}; a model "
                          "builder returns a keras.Model")
    return float32_outputs(model)


def build_for(cfg: DictConfig, data: Data, outputs: int | None = None) -> keras.Model:
    """The model for `data` with `outputs` units (default: the data's classes or values per
    example; task=binary: 1): the builder gets its input shape (and `input_spec` and
    `train_inputs` if it declares them); with `dataset.preprocess.standardize`, Normalization
    layers adapted on the training split come first, and `train_inputs` are standardized."""
    layers = standardization(data)
    train_inputs = data.train_inputs()
    if layers:
        train_inputs = map_inputs(train_inputs, data.input_spec,
                                  lambda x: standardize(x, layers, data.input_spec))
    model = build(cfg, data.input_shape, outputs or data.outputs, input_spec=data.input_spec,
                  train_inputs=train_inputs)
    if not layers:
        return model
    inputs = keras_inputs(data.input_spec)
    outputs = model(standardize(inputs, layers, data.input_spec))
    return keras.Model(inputs, outputs, name=f"standardized_{model.name}")


def keras_inputs(input_spec: Any) -> Any:
    """A `keras.Input` for each input of `input_spec` (a tf.TensorSpec, or a tuple or dict
    of them), named, shaped and typed as it is, in the same structure."""
    return tf.nest.map_structure(
        lambda s: keras.Input(shape=tuple(s.shape), dtype=s.dtype.name, name=s.name),
        input_spec)


def standardization(data: Data) -> dict[str, keras.layers.Normalization]:
    """{input name: a Normalization layer adapted on that input over the training split}
    for the inputs `dataset.preprocess.standardize` names: per feature (the last axis; a
    scalar input: one mean and variance). Same data, same order: the same statistics."""
    from distlab.data.structure import input_names

    layers: dict[str, keras.layers.Normalization] = {}
    names = input_names(data.input_spec)
    for name, spec in zip(names, tf.nest.flatten(data.input_spec), strict=True):
        if name not in data.standardize:
            continue
        index = names.index(name)
        layer = keras.layers.Normalization(axis=-1 if spec.shape.rank else None,
                                           dtype="float32", name=f"standardize_{_safe(name)}")
        layer.adapt(map_inputs(data.train_inputs(), data.input_spec,
                               lambda x, i=index: tf.nest.flatten(x)[i]))
        layers[name] = layer
    return layers


def map_inputs(ds: tf.data.Dataset, input_spec: Any, fn: Callable[[Any], Any]) -> tf.data.Dataset:
    """`ds.map(fn)` over a dataset of inputs structured as `input_spec`, `fn` taking the
    whole structure (tf.data's map passes a tuple's items as separate arguments)."""
    if type(input_spec) is tuple:
        return ds.map(lambda *x: fn(x))
    return ds.map(fn)


def standardize(inputs: Any, layers: dict[str, keras.layers.Layer], input_spec: Any) -> Any:
    """`inputs` with each input that has a layer in `layers` passed through it."""
    from distlab.data.structure import input_names

    flat = [layers[name](x) if name in layers else x for name, x in
            zip(input_names(input_spec), tf.nest.flatten(inputs), strict=True)]
    return tf.nest.pack_sequence_as(inputs, flat)


def refresh_adapted(model: keras.Model) -> None:
    """After a restore: adapted Normalization layers use the weights just restored (Keras
    keeps a constant copy of them from `adapt`, refreshed only by `finalize_state`)."""
    for layer in model._flatten_layers(include_self=False):  # nested models' layers too
        if isinstance(layer, keras.layers.Normalization) and layer.input_mean is None \
                and layer.built:
            layer.finalize_state()


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in name)


def float32_outputs(model: keras.Model) -> keras.Model:
    """`model`, or (mixed precision, lower-precision outputs) `model` then a float32 cast."""
    outputs = getattr(model, "outputs", None)
    if not outputs or all(keras.backend.standardize_dtype(o.dtype) == "float32"
                          for o in outputs):
        return model  # float32 already, or a subclassed model (its losses cast to float32)
    cast = [keras.layers.Activation("linear", dtype="float32", name=f"float32_output_{i}")(o)
            for i, o in enumerate(outputs)]
    try:  # the inputs in the model's own structure (a nested dict stays nested)
        inputs = model.input
    except AttributeError:  # a Sequential, never called as a layer: its list of inputs
        inputs = model.inputs
    return keras.Model(inputs, cast[0] if len(cast) == 1 else cast, name=model.name)
