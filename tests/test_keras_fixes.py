"""The version-guarded Keras corrections: still needed on this Keras, and still correct.

If a Keras upgrade changes a corrected function, the first test fails: re-check the bugs
(docs/keras-distribute-bugs.md; the standalone reproductions in tests/repro/) and update
or drop distlab.keras_patches.fixes.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import keras
import numpy as np
import processes
import pytest
import tensorflow as tf
from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

from distlab.data.stream import distribute
from distlab.keras_patches import fixes as keras_fixes

REPRO = Path(__file__).parent / "repro"


def test_this_keras_is_the_one_the_corrections_were_checked_against():
    digests = {name: keras_fixes.source_digest(fn) for name, fn in keras_fixes._ORIGINALS.items()}
    assert not keras_fixes.changed(), (
        f"Keras {keras.__version__} changed {keras_fixes.changed()} (digests {digests}): "
        "re-check the bugs and update distlab.keras_patches.fixes")


def _fit_on_a_short_first_batch(strategy) -> None:
    """3 rows over 2 replicas: slices of 2 and 1 rows, as distlab.data.stream.distribute makes."""
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
    monkeypatch.setattr(TensorFlowTrainer, "_maybe_symbolic_build",
                        keras_fixes._ORIGINALS["_maybe_symbolic_build"])
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        _fit_on_a_short_first_batch(strategy)  # Keras' MEAN over slices of 2 and 1 rows
    monkeypatch.undo()
    assert keras_fixes.apply()
    _fit_on_a_short_first_batch(strategy)


def _repro(name: str, *args: str) -> subprocess.CompletedProcess:
    return processes.run(REPRO / name, *args, timeout=240)


@pytest.mark.slow
@pytest.mark.parametrize("script", ["keras_19246.py", pytest.param(
    "keras_20585.py", marks=pytest.mark.multiprocess)])
def test_standalone_reproduction_fails_without_and_trains_with_the_correction(script):
    plain = _repro(script)
    assert plain.returncode == 0 and "BUG" in plain.stdout, plain.stdout + plain.stderr[-2000:]
    fixed = _repro(script, "--fixed")
    assert fixed.returncode == 0 and "FIXED" in fixed.stdout, fixed.stdout + fixed.stderr[-2000:]
