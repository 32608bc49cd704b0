"""The model zoo: mlp, resnet (CIFAR v1), keras_applications; shapes, training, one-line errors."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import compose_once
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from distlab.components import models
from distlab.config import validate
from distlab.errors import ConfigError


@pytest.fixture(autouse=True)
def _seeded():
    keras.utils.set_random_seed(0)


def _cfg(group_option: str, *overrides: str):
    return compose_once([f"model={group_option}", *overrides]).model


def _batch(shape: tuple[int, ...], n: int = 16, classes: int = 10):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, *shape)).astype("float32"), rng.integers(0, classes, n)


def _fit_steps(model: keras.Model, x, y, steps: int, lr: float = 1e-2,
               loss: str | keras.losses.Loss | None = None) -> list[float]:
    """A few eager steps: tracing and optimising a graph takes longer than the steps
    themselves on CPU (MobileNetV2: ~35 s graph vs ~7 s eager on 2 cores)."""
    loss = loss or keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.Adam(lr), loss=loss, run_eagerly=True)
    return [float(model.train_on_batch(x, y)) for _ in range(steps)]


def _one_line_error(match: str, fn, *args) -> str:
    with pytest.raises(ConfigError) as e:
        fn(*args)
    msg = str(e.value)
    assert match in msg and "\n" not in msg, msg
    return msg


# ------------------------------------------------------------------------------ mlp


def _mlp_classifier() -> keras.Model:
    cfg = _cfg("mlp", "model.hidden_units=[32,16]", "model.batch_norm=true",
               "model.dropout=0.1", "model.l2=1e-4")
    return models.build(cfg, (8,), 5)


def _mlp_regressor() -> keras.Model:
    cfg = _cfg("mlp", "model.hidden_units=[16]", "model.activation=tanh")
    return models.build(cfg, (4, 2), 3)  # multi-dimensional inputs are flattened


def _regression_batch() -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(1).normal(size=(16, 4, 2)).astype("float32")
    return x, x.reshape(16, -1)[:, :3] * 2.0


def test_mlp_classifies():
    model = _mlp_classifier()
    assert model.output_shape == (None, 5)
    kinds = [type(layer).__name__ for layer in model.layers]
    assert kinds == ["Flatten"] + ["Dense", "BatchNormalization", "Activation", "Dropout"] * 2 + [
        "Dense"]
    assert len(model.losses) == 3  # one L2 term per kernel


@pytest.mark.slow
def test_mlp_classifier_learns():
    x, y = _batch((8,), classes=5)
    losses = _fit_steps(_mlp_classifier(), x, y, 6)
    assert losses[-1] < losses[0]


def test_mlp_regression_outputs_and_softmax():
    model = _mlp_regressor()
    assert model.output_shape == (None, 3) and model.layers[1].activation.__name__ == "tanh"
    x, _ = _regression_batch()
    probs = models.build(_cfg("mlp", "model.output_activation=softmax"), (4,), 3)(x[:2, :, 0])
    np.testing.assert_allclose(np.sum(probs, axis=-1), 1.0, rtol=1e-5)


@pytest.mark.slow
def test_mlp_regressor_learns():
    x, targets = _regression_batch()
    losses = _fit_steps(_mlp_regressor(), x, targets, 6, loss="mse")
    assert losses[-1] < losses[0]


def test_mlp_unknown_activation_is_one_line():
    _one_line_error("model.activation='relux'", models.build,
                    _cfg("mlp", "model.activation=relux"), (8,), 2)


def test_cnn_is_unchanged():
    model = models.build(_cfg("mnist_cnn"), (28, 28, 1), 10)
    assert model.name == "cnn" and model.output_shape == (None, 10)
    assert model.count_params() == 347_146  # Conv32-MaxPool-Flatten-Dense64-Dense10


# ------------------------------------------------------------------------------ resnet


def test_resnet20_is_the_papers_network():
    """(Training every zoo model in both loops on 2 replicas: tests/test_model_zoo_runs.py.)"""
    model = models.build(_cfg("resnet"), (32, 32, 3), 10)
    assert model.name == "resnet20" and model.output_shape == (None, 10)
    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    projections = [c for c in convs if c.kernel_size == (1, 1)]
    assert len(convs) - len(projections) + 1 == 20  # 19 3x3 convs + the Dense: depth 20
    assert [(p.filters, p.strides) for p in projections] == [(32, (2, 2)), (64, (2, 2))]
    assert model.get_layer(index=-2).output.shape == (None, 64)  # pooled 8x8x64
    assert 0.26e6 < model.count_params() < 0.28e6  # the paper's 0.27M
    assert len(model.losses) == len(convs) + 1  # L2 on every kernel


def test_resnet_other_depths_and_inputs():
    model = models.build(_cfg("resnet", "model.depth=8", "model.output_activation=softmax"),
                         (28, 28, 1), 7)
    assert model.name == "resnet8" and model.output_shape == (None, 7)
    np.testing.assert_allclose(np.sum(model(np.zeros((2, 28, 28, 1))), axis=-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("depth", [21, 2, 0, -4])
def test_resnet_bad_depth_is_one_line(depth):
    cfg = OmegaConf.merge(_cfg("resnet"), {"depth": depth})
    built = _one_line_error(f"model.depth={depth}", models.build, cfg, (32, 32, 3), 10)
    # one rule: the builder (called directly) and the config check refuse alike
    assert _one_line_error(f"model.depth={depth}", validate,
                           compose_once(["model=resnet", f"model.depth={depth}"])) == built


def test_sync_batch_norm_uses_the_global_batch():
    """Two replicas, inputs 4 apart: synchronised BN normalises with the global mean."""
    strategy = tf.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice())
    means = {}
    for sync in (False, True):
        with strategy.scope():
            bn = keras.layers.BatchNormalization(synchronized=sync, momentum=0.0)
            bn.build((None, 2))

        @tf.function
        def step(bn=bn):
            def replica_fn():
                replica = tf.distribute.get_replica_context().replica_id_in_sync_group
                x = tf.random.stateless_normal((8, 2), seed=[1, 2]) + 4.0 * tf.cast(
                    replica, tf.float32)
                return tf.reduce_mean(bn(x, training=True))

            return strategy.run(replica_fn)

        means[sync] = [float(v) for v in strategy.experimental_local_results(step())]
        moving = [v.numpy() for v in bn.moving_mean.value.values]
        if sync:  # (local BN lets each replica keep its own moving statistics)
            np.testing.assert_allclose(moving[0], moving[1], rtol=1e-6)
    np.testing.assert_allclose(means[False], 0.0, atol=1e-5)
    assert means[True][0] < -0.5 < 0.5 < means[True][1]


# ------------------------------------------------------------------- keras_applications


def test_keras_applications_unknown_architecture_is_one_line():
    msg = _one_line_error("model.architecture=MobileNetV9", models.build,
                          _cfg("keras_applications", "model.architecture=MobileNetV9"),
                          (32, 32, 3), 10)
    assert "MobileNetV2" in msg


def test_keras_applications_too_small_input_is_one_line():
    msg = _one_line_error("model.architecture=MobileNetV2", models.build,
                          _cfg("keras_applications"), (28, 28, 1), 10)
    assert "(28, 28, 1)" in msg and "32x32" in msg


@pytest.mark.parametrize("kwarg,key", [("+model.kwargs.bogus=1", "model.kwargs"),
                                       ("+model.kwargs.weights=imagenet", "model.kwargs")])
def test_keras_applications_bad_kwargs_are_one_line(kwarg, key):
    msg = _one_line_error(key, models.build, _cfg("keras_applications", kwarg), (32, 32, 3), 10)
    name = kwarg.removeprefix("+model.kwargs.").split("=")[0]
    assert name in msg, msg  # the offending kwarg itself (was: either name)


# ------------------------------------------------------------------------------ config


@pytest.mark.parametrize("option,name", [("mlp", "mlp"), ("resnet", "resnet"),
                                         ("keras_applications", "keras_applications")])
def test_model_options_compose_and_refuse_unknown_keys(option, name):
    cfg = compose_once([f"model={option}"])
    validate(cfg)
    assert cfg.model.name == name and cfg.model.output_activation is None
    assert name in models.MODELS
    with pytest.raises(ConfigCompositionException):
        compose_once([f"model={option}", "model.foo=1"])


def test_model_defaults():
    assert OmegaConf.to_container(compose_once(["model=mlp"]).model) == {
        "name": "mlp", "hidden_units": [128, 64], "activation": "relu", "batch_norm": False,
        "dropout": 0.0, "output_activation": None, "l2": 0.0}
    assert OmegaConf.to_container(compose_once(["model=resnet"]).model) == {
        "name": "resnet", "depth": 20, "l2": 1e-4, "sync_batch_norm": False,
        "output_activation": None}
    assert OmegaConf.to_container(compose_once(["model=keras_applications"]).model) == {
        "name": "keras_applications", "architecture": "MobileNetV2", "kwargs": {},
        "output_activation": None}


@pytest.mark.parametrize("overrides,key", [
    (["model=mlp", "model.dropout=1.0"], "model.dropout"),
    (["model=mlp", "model.hidden_units=[16,0]"], "model.hidden_units"),
    (["model=resnet", "model.depth=21"], "model.depth"),
])
def test_model_values_are_validated(overrides, key):
    _one_line_error(key, validate, compose_once(overrides))
