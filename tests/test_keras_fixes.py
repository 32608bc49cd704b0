"""The version-guarded Keras correction: still needed on this Keras, and still correct.

If a Keras upgrade changes TensorFlowTrainer._maybe_symbolic_build, the first test fails:
re-check the bug (docs/keras-distribute-bugs.md) and update or drop distlab.keras_fixes.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

from distlab import keras_fixes
from distlab.data import distribute


def test_this_keras_is_the_one_the_correction_was_checked_against():
    assert keras_fixes.needed(), (
        f"Keras {keras.__version__} changed TensorFlowTrainer._maybe_symbolic_build "
        f"(digest {keras_fixes.source_digest(keras_fixes._ORIGINAL)}): re-check the bug")


def _fit_on_a_short_first_batch(strategy) -> None:
    """3 rows over 2 replicas: slices of 2 and 1 rows, as distlab.data.distribute makes."""
    x = np.random.default_rng(0).random((3, 4)).astype("float32")
    y = np.array([0, 1, 0])
    dataset = distribute(strategy, tf.data.Dataset.from_tensor_slices((x, y)).batch(3))
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True))
    model.fit(dataset, epochs=1, steps_per_epoch=1, verbose=0)


@pytest.mark.slow
def test_the_upstream_bug_is_still_there_and_the_correction_avoids_it(monkeypatch):
    strategy = tf.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice())
    monkeypatch.setattr(TensorFlowTrainer, "_maybe_symbolic_build", keras_fixes._ORIGINAL)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        _fit_on_a_short_first_batch(strategy)  # Keras' MEAN over slices of 2 and 1 rows
    monkeypatch.undo()
    assert keras_fixes.apply()
    _fit_on_a_short_first_batch(strategy)
