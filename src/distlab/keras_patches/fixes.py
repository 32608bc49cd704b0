"""Narrow, version-guarded corrections of Keras internals (docs/keras-distribute-bugs.md).

All three are in `keras/src/backend/tensorflow/trainer.py` (Keras 3, TF backend):

1. `TensorFlowTrainer._maybe_symbolic_build` reduces the first distributed batch with
   `strategy.reduce("MEAN", batch, axis=None)` only to learn shapes and dtypes. That fails
   when replicas' slices differ in length (a short batch split evenly) and under
   MultiWorkerMirroredStrategy (keras#20585). Correction: the first local replica's value.
2. `reduce_per_replica` reduces the scalar logs of a multi-worker step with
   `strategy.reduce("MEAN", v, axis=0)`: "Invalid reduction dimension 0 for input with 0
   dimensions" (keras#20585). Correction: `axis=None` for scalars under multi-worker.
3. `TensorFlowTrainer._make_function` with `steps_per_execution > 1` nests the one-step
   `tf.function` in the multi-step one; a collective all-reduce's instance key, captured at
   call time, then lands in a `tf.cond` branch that is never fed (keras#19246). Correction:
   with several replicas, the one-step function is traced inline into the multi-step
   `tf.function` (still one graph).

`apply()` installs them only on the Keras versions they were checked against and only
while the corrected functions are unchanged (a digest of their source);
tests/test_keras_fixes.py fails loudly when an upgrade changes either, and shows each bug
still reproduces without its correction.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import logging
from collections.abc import Iterator

import keras
import tensorflow as tf
from keras.src import tree
from keras.src.backend.tensorflow import trainer as trainer_module
from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

log = logging.getLogger(__name__)

CHECKED_VERSIONS = ("3.15.",)  # Keras versions whose trainer these were verified against
_ORIGINALS = {
    "_maybe_symbolic_build": TensorFlowTrainer._maybe_symbolic_build,
    "reduce_per_replica": trainer_module.reduce_per_replica,
    "_make_function": TensorFlowTrainer._make_function,
}
# first 16 hex digits of sha256(source) in Keras 3.15.1: a changed function is never patched
ORIGINAL_SHA256 = {
    "_maybe_symbolic_build": "92a504f5eba9b29f",
    "reduce_per_replica": "2e7d54b1e6edc29a",
    "_make_function": "bb33b7a0da3d2740",
}


def source_digest(function) -> str:
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]


def changed() -> list[str]:
    """The corrected Keras functions that differ from the ones checked (empty: none)."""
    if not keras.__version__.startswith(CHECKED_VERSIONS):
        return [f"Keras {keras.__version__}"]
    return [name for name, fn in _ORIGINALS.items()
            if source_digest(fn) != ORIGINAL_SHA256[name]]


# ---- 1. the symbolic build takes the first local replica's batch
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


# ---- 2. multi-worker logs: scalars reduce over axis=None
def reduce_per_replica(values, strategy, reduction):
    """Keras' function, except that under multi-worker collectives a "mean" of a scalar
    reduces with axis=None (axis=0 is invalid for a scalar)."""
    multi_worker = trainer_module._collective_all_reduce_multi_worker(strategy)
    if not (multi_worker and reduction in ("auto", "mean")):
        return _ORIGINALS["reduce_per_replica"](values, strategy, reduction)

    def mean(value):
        first = (value.values[0] if isinstance(value, tf.distribute.DistributedValues)
                 else value)
        return strategy.reduce("MEAN", value, axis=None if first.shape.rank == 0 else 0)

    return tree.map_structure(mean, values)


# ---- 3. steps_per_execution > 1 with replicas: the one-step function is traced inline
def _make_function(self, step_function):
    """Keras' method; with several replicas and steps_per_execution > 1, its one-step
    function is not wrapped in a tf.function of its own (keras#19246)."""
    if (self.steps_per_execution > 1 and not self.run_eagerly
            and self.distribute_strategy.num_replicas_in_sync > 1):
        with _one_step_inline():
            return _ORIGINALS["_make_function"](self, step_function)
    return _ORIGINALS["_make_function"](self, step_function)


class _TensorFlowWithInlineStep:
    """`tf` as Keras' trainer module sees it while building step functions: TensorFlow's
    own, except that `tf.function(one_step_on_data, ...)` returns the Python function."""

    def __getattr__(self, name: str):
        return getattr(tf, name)

    @staticmethod
    def function(fn=None, *args, **kwargs):
        if getattr(fn, "__name__", "") == "one_step_on_data":
            return fn
        return tf.function(fn, *args, **kwargs)


@contextlib.contextmanager
def _one_step_inline() -> Iterator[None]:
    trainer_module.tf = _TensorFlowWithInlineStep()
    try:
        yield
    finally:
        trainer_module.tf = tf


def apply() -> bool:
    """Install the corrections if this Keras needs them; return whether they are in place."""
    if TensorFlowTrainer._make_function is _make_function:
        return True
    if differ := changed():
        log.warning("Keras corrections not applied (%s differ from what was checked); fit with "
                    "several replicas or workers may fail (docs/keras-distribute-bugs.md)",
                    ", ".join(differ))
        return False
    TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build
    trainer_module.reduce_per_replica = reduce_per_replica
    TensorFlowTrainer._make_function = _make_function
    return True
