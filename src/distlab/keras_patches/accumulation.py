"""Gradients across replicas: accumulation (`trainer.grad_accum_steps`) and clipping
(`optimizer.clipnorm`) that hold under a tf.distribute strategy, and the last, partial
accumulation at the end of training.

Keras 3's `gradient_accumulation_steps` averages k micro-batch gradients and updates every
k steps, exactly, on one device. Under MirroredStrategy it fails: it picks "accumulate" or
"update" with a `tf.cond` in replica context, and both branches call `merge_call`, which
TensorFlow forbids inside control flow ("merge_call called while defining a new graph or
a tf.function"), in `fit` and in a custom loop alike. And Keras clips (clipnorm,
global_clipnorm, clipvalue) each replica's own gradient before the cross-replica sum, so
a clipped run depends on the replica count (docs/keras-distribute-bugs.md §4, §6).

Correction, only inside a strategy's replica context (otherwise Keras' own path runs), for
the Keras versions of `distlab.keras_patches.fixes` and while Keras' `_backend_apply_gradients`
and `_backend_update_step` are the ones checked:
- the gradients are summed across replicas first; clipping, weight decay and the update
  step then run on that global gradient (the update skips Keras' own all-reduce, so a
  step still all-reduces once);
- with accumulation every micro-step adds the summed gradient to the accumulators, so every
  replica's copy holds the same value and a checkpoint taken mid-accumulation is complete;
  the accumulate/update choice runs in cross-replica context (a `merge_call`), as Keras'
  LossScaleOptimizer makes its finite-gradient choice; the update clips the mean of the k
  micro-batch gradients, then the accumulators are zeroed.

`apply_leftover` ends a run whose micro-batches do not fill the last cycle: one update with
the mean gradient of the m < k micro-batches left over (clipped, weight decay), after which
the optimizer starts a fresh cycle.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import keras
import tensorflow as tf
from keras.src.backend.tensorflow.optimizer import TFOptimizer
from keras.src.optimizers.base_optimizer import BaseOptimizer

from distlab.errors import DistlabError
from distlab.keras_patches.fixes import CHECKED_VERSIONS, source_digest

log = logging.getLogger(__name__)
SUM = tf.distribute.ReduceOp.SUM
# first 16 hex digits of sha256(source) in Keras 3.15.1: `_backend_apply_gradients` is
# replaced here, `_backend_update_step` reproduced without its all-reduce (`_update`)
ORIGINAL_SHA256 = {
    "_backend_apply_gradients": (BaseOptimizer._backend_apply_gradients, "48d6e24d58039241"),
    "_backend_update_step": (TFOptimizer._backend_update_step, "00bd759c099a6b72"),
}


def corrected() -> bool:
    """Whether the correction applies to this Keras (version and methods unchanged)."""
    return (keras.__version__.startswith(CHECKED_VERSIONS)
            and all(source_digest(fn) == digest for fn, digest in ORIGINAL_SHA256.values()))


def clips(optimizer: keras.optimizers.Optimizer) -> bool:
    """Whether `optimizer` clips its gradients (clipnorm, global_clipnorm or clipvalue)."""
    return any((getattr(optimizer, name, None) or 0) > 0
               for name in ("clipnorm", "global_clipnorm", "clipvalue"))


def _update(optimizer: BaseOptimizer, grads: list, variables: list) -> None:
    """Keras' update of `variables` with `grads` that are already summed over replicas
    (replica context): clipping, weight decay, then `_backend_update_step` less its
    all-reduce."""
    grads = optimizer._clip_gradients(grads)
    optimizer._apply_weight_decay(variables)
    pairs = list(zip(grads, [v.value if isinstance(v, keras.Variable) else v
                             for v in variables], strict=True))
    tf.__internal__.distribute.interim.maybe_merge_call(
        optimizer._distributed_tf_update_step, optimizer._distribution_strategy, pairs,
        optimizer.learning_rate)


class _ReplicaSafeGradients:
    """Mixed into the optimizer's own class (see `accumulate`, `clip_globally`)."""

    def _backend_apply_gradients(self, grads, trainable_variables):
        context = tf.distribute.get_replica_context()
        steps = self.gradient_accumulation_steps
        if (not tf.distribute.has_strategy() or context is None
                or (not steps and context.num_replicas_in_sync == 1)):
            return super()._backend_apply_gradients(grads, trainable_variables)
        variables = list(trainable_variables)
        summed = context.all_reduce(SUM, list(grads))
        if not steps:  # clipping only: clip the global gradient
            _update(self, summed, variables)
            return None
        accumulators = [self._accumulated_gradients[self._get_variable_index(v)].value
                        for v in variables]

        def update(summed, variables):  # in each replica: the mean of the k micro-batches
            _update(self, [(g + a) / steps for g, a in zip(summed, accumulators, strict=True)],
                    variables)

        def choose(distribution, summed, variables):  # cross-replica context
            def apply_update():
                distribution.extended.call_for_each_replica(update, args=(summed, variables))
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

        context.merge_call(choose, args=(summed, variables))
        return None


def _install(optimizer: keras.optimizers.Optimizer) -> None:
    cls = type(optimizer)
    if not issubclass(cls, _ReplicaSafeGradients):
        optimizer.__class__ = type(cls.__name__, (_ReplicaSafeGradients, cls), {})


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
        _install(optimizer)
    return optimizer


def clip_globally(optimizer: keras.optimizers.Optimizer,
                  distributed: bool) -> keras.optimizers.Optimizer:
    """`optimizer`, clipping the gradient summed over replicas rather than each replica's
    own (Keras' behaviour); a no-op without clipping or without a strategy."""
    if not (distributed and clips(optimizer)):
        return optimizer
    why = (f"Keras {keras.__version__} differs from the one checked" if not corrected() else
           "the optimizer uses EMA" if getattr(optimizer, "use_ema", False) else None)
    if why:
        log.warning("optimizer clipping is applied to each replica's own gradient, not to "
                    "their sum (%s), so results depend on the replica count "
                    "(docs/keras-distribute-bugs.md)", why)
        return optimizer
    _install(optimizer)
    return optimizer


def check_steps(steps: int, epochs: int, steps_per_epoch: int) -> None:
    """Refuse an accumulation that no run of `epochs` x `steps_per_epoch` batches fills."""
    total = epochs * steps_per_epoch
    if steps > total:
        raise DistlabError(
            f"trainer.grad_accum_steps={steps} is more than the run's {total} training steps "
            f"(trainer.epochs={epochs} x {steps_per_epoch} steps per epoch), so not one update "
            f"would be complete; use trainer.grad_accum_steps <= {total}")


def _base(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """The optimizer that accumulates (a LossScaleOptimizer's inner one)."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def pending(optimizer: keras.optimizers.Optimizer) -> int:
    """Micro-batches accumulated since the last update (0 without accumulation)."""
    base = _base(optimizer)
    steps = base.gradient_accumulation_steps or 0
    return int(base._iterations.numpy()) % steps if steps > 1 else 0


def apply_leftover(optimizer: keras.optimizers.Optimizer, strategy: tf.distribute.Strategy,
                   save: Callable[[], str]) -> bool:
    """End of training: apply the m micro-batches left over
    in the accumulators (fewer than trainer.grad_accum_steps) as one update with their mean
    gradient, as the update of the last micro-batch's step would (its learning rate; clipped,
    weight decay; their gradients were unscaled and checked finite by a LossScaleOptimizer
    when added), then start a fresh cycle and checkpoint again (`save()`). Return whether it
    updated (nothing left over: no-op, so a rerun of a finished run changes nothing)."""
    m = pending(optimizer)
    if not m:
        return False
    base = _base(optimizer)
    steps, done = base.gradient_accumulation_steps, int(base._iterations.numpy())
    variables = list(base._trainable_variables)
    accumulators = [base._accumulated_gradients[base._get_variable_index(v)] for v in variables]

    def last_update():  # replica context; the accumulators hold global sums
        _update(base, [a.value / m for a in accumulators], variables)

    with strategy.scope():
        base._iterations.assign(done - 1)  # the learning rate (and Adam's step) of that step
        tf.function(lambda: strategy.run(last_update), autograph=False)()
        for a in accumulators:
            a.assign(tf.zeros_like(a.value))
        base._iterations.assign(done - m + steps)  # the next micro-batch opens a new cycle
    path = save()
    log.info("trainer.grad_accum_steps=%d: the last %d micro-batch(es) made one more update "
             "with the mean of their gradients (%s)", steps, m, path)
    return True
