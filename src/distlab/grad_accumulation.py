"""Gradient accumulation (`trainer.grad_accum_steps`) that holds under a tf.distribute strategy.

Keras 3's `gradient_accumulation_steps` averages k micro-batch gradients and updates every
k steps, exactly, on one device. Under MirroredStrategy it fails: it picks "accumulate" or
"update" with a `tf.cond` in replica context, and both branches call `merge_call`, which
TensorFlow forbids inside control flow ("merge_call called while defining a new graph or
a tf.function"), in `fit` and in a custom loop alike (docs/keras-distribute-bugs.md).

Correction, only inside a strategy's replica context (otherwise Keras' own path runs), for
the Keras versions of `distlab.keras_fixes` and while Keras' `_backend_apply_gradients`
is the one checked:
- every micro-step sums the gradients across replicas, so every replica's copy of an
  accumulator holds the same value and a checkpoint taken mid-accumulation is complete;
- the accumulate/update choice runs in cross-replica context (a `merge_call`), as Keras'
  LossScaleOptimizer makes its finite-gradient choice;
- the update runs Keras' own update step in each replica on
  (local gradient + accumulator / replicas) / k, which the update's all-reduce sums to the
  mean of the k micro-batch gradients; then the accumulators are zeroed.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras.src.optimizers.base_optimizer import BaseOptimizer

from distlab.errors import DistlabError
from distlab.keras_fixes import CHECKED_VERSIONS, source_digest

# first 16 hex digits of sha256(source) of the method replaced here, in Keras 3.15.1
ORIGINAL_SHA256 = "48d6e24d58039241"


def corrected() -> bool:
    """Whether the correction applies to this Keras (version and method unchanged)."""
    return (keras.__version__.startswith(CHECKED_VERSIONS)
            and source_digest(BaseOptimizer._backend_apply_gradients) == ORIGINAL_SHA256)


class _StrategySafeAccumulation:
    """Mixed into the optimizer's own class (see `accumulate`)."""

    def _backend_apply_gradients(self, grads, trainable_variables):
        context = tf.distribute.get_replica_context()
        if not tf.distribute.has_strategy() or context is None:
            return super()._backend_apply_gradients(grads, trainable_variables)
        steps, replicas = self.gradient_accumulation_steps, context.num_replicas_in_sync
        accumulators = [self._accumulated_gradients[self._get_variable_index(v)].value
                        for v in trainable_variables]
        local = list(grads)
        summed = context.all_reduce(tf.distribute.ReduceOp.SUM, local)

        def update(local, variables):  # in each replica: Keras' update of the mean gradient
            mean = [(g + a / replicas) / steps for g, a in zip(local, accumulators, strict=True)]
            mean = self._clip_gradients(mean)
            self._apply_weight_decay(variables)
            self._backend_update_step(mean, variables, self.learning_rate)

        def choose(distribution, local, summed, variables):  # cross-replica context
            def apply_update():
                distribution.extended.call_for_each_replica(update, args=(local, variables))
                for a in accumulators:
                    distribution.extended.update(a, lambda v: v.assign(tf.zeros_like(v)),
                                                 group=False)
                return tf.constant(True)

            def add():
                for a, g in zip(accumulators, summed, strict=True):
                    distribution.extended.update(a, lambda v, g: v.assign_add(g), args=(g,),
                                                 group=False)
                return tf.constant(False)

            return tf.cond((self._iterations + 1) % steps == 0, apply_update, add)

        context.merge_call(choose, args=(local, summed, list(trainable_variables)))


def accumulate(optimizer: keras.optimizers.Optimizer, steps: int,
               distributed: bool) -> keras.optimizers.Optimizer:
    """`optimizer` (not built yet), updating every `steps` batches with their mean gradient;
    `distributed`: it will run under a strategy (not the default one)."""
    if optimizer.built:
        raise DistlabError("trainer.grad_accum_steps needs an optimizer that is not built yet; "
                           "the optimizer builder must not call optimizer.build")
    if getattr(optimizer, "use_ema", False):
        raise DistlabError("trainer.grad_accum_steps does not support an optimizer with "
                           "use_ema=True; set one of them off")
    if distributed and not corrected():
        raise DistlabError(
            f"trainer.grad_accum_steps={steps} fails under a tf.distribute strategy in Keras "
            f"{keras.__version__} (merge_call inside a tf.cond), which distlab corrects only "
            "for the Keras versions it was checked with. Use strategy=default")
    optimizer.gradient_accumulation_steps = steps
    if distributed:
        cls = type(optimizer)
        optimizer.__class__ = type(cls.__name__, (_StrategySafeAccumulation, cls), {})
    return optimizer
