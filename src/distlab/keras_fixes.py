"""Narrow, version-guarded corrections of Keras internals (see docs/keras-distribute-bugs.md).

`TensorFlowTrainer._maybe_symbolic_build` (Keras 3, TF backend) reduces the first batch
of a distributed dataset with `strategy.reduce("MEAN", batch, axis=None)` only to learn
its shapes and dtypes. That fails when the replicas' slices differ in length (a short
last batch split evenly: 44 rows on one replica, 43 on another) and under
MultiWorkerMirroredStrategy, whose reduce does not map over a nested structure
(keras#20585). The correction takes the first local replica's value instead; nothing
else changes. `apply()` patches only the Keras versions it was checked against, and
only when the method is still the one it corrects; tests/test_keras_fixes.py fails
loudly when an upgrade changes either.
"""

from __future__ import annotations

import hashlib
import inspect
import logging

import keras
import tensorflow as tf
from keras.src import tree
from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

log = logging.getLogger(__name__)

CHECKED_VERSIONS = ("3.15.",)  # Keras versions whose trainer this was verified against
# sha256 of the original method's source, so a changed method is never patched blindly
ORIGINAL_SHA256 = "92a504f5eba9b29f"  # first 16 hex digits of Keras 3.15.1's method


def source_digest(function) -> str:
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]


def _maybe_symbolic_build(self, iterator=None, data_batch=None):
    """Keras' method, except that a distributed first batch gives its first local
    replica's value (for shapes and dtypes) instead of a cross-replica MEAN."""
    if self._distribute_strategy is None:
        return
    strategy = self.distribute_strategy

    def first_local(value):
        if isinstance(value, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(value)[0]
        return value

    if iterator is not None:
        for _, _, it in iterator:
            data_batch = tree.map_structure(first_local, next(it))
            break
    with self.distribute_strategy.scope():
        self._symbolic_build(data_batch=data_batch)


_ORIGINAL = TensorFlowTrainer._maybe_symbolic_build


def needed() -> bool:
    """Whether this Keras is one the correction was checked against, unchanged."""
    return (keras.__version__.startswith(CHECKED_VERSIONS)
            and source_digest(_ORIGINAL) == ORIGINAL_SHA256)


def apply() -> bool:
    """Install the correction if this Keras needs it; return whether it is installed."""
    if TensorFlowTrainer._maybe_symbolic_build is _maybe_symbolic_build:
        return True
    if not needed():
        log.warning("Keras %s: not correcting TensorFlowTrainer._maybe_symbolic_build (checked "
                    "for %s only); fit on a short first batch over several replicas may fail",
                    keras.__version__, ", ".join(v + "x" for v in CHECKED_VERSIONS))
        return False
    TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build
    return True
