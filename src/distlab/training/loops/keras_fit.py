"""`loop=keras_fit`: model.compile inside the strategy scope, and Keras' compiled train function.

The model is compiled as for `model.fit` (the run's optimizer, the task's loss per example,
`loop.steps_per_execution`, `loop.jit_compile`), and `train_steps` runs its
`model.train_function` on blocks of the Controller's stream, as `fit` does inside its epoch
loop: a block of `steps_per_execution` steps is one call, so a user model's own
`train_step`, compile's loss scaling and distlab's Keras corrections
(`distlab.keras_patches`) all apply. The Controller runs the epochs (as for every loop);
a shorter block (an epoch's last when the block size does not divide it, or the first after
a mid-epoch resume) runs a train function made for that many steps, so every epoch takes
exactly its own batches.

The train function gets the same per-replica rows and weights as the custom loop
(`distlab.data.stream.distribute`): the compiled loss weighs the rows so a short batch
averages over its real examples, and the compiled metrics add the loss and task metrics
over the real rows only, in float64 (`RealExamplesMean`); after each block their totals
(summed over replicas and workers) are the block's `EpochSums`, and they are reset. A
task's stateful Keras metrics are compiled as their training set (`training.metrics.
RealRows`: weight 1 per real row), which the Controller reads and resets as for every loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import keras
import tensorflow as tf

from distlab.errors import DistlabError
from distlab.keras_patches import fixes as keras_fixes
from distlab.training.epoch_sums import EpochSums
from distlab.training.loops.base import Loop
from distlab.training.metrics import RealRows


class RealExamplesMean(keras.metrics.MeanMetricWrapper):
    """The mean of `fn` over real rows: a sample weight > 0 counts 1, padding (0) counts 0.
    Its `total` and `count` are the sums `Loop.batch_stats` makes."""

    def update_state(self, y_true, y_pred, sample_weight=None):
        if sample_weight is not None:
            sample_weight = tf.cast(sample_weight > 0, self.dtype)
        return super().update_state(y_true, y_pred, sample_weight=sample_weight)


def _per_example(metric):
    """A per-example metric's function of (y_true, y_pred), its `prepare` applied."""
    return lambda y, p: metric.per_example(*metric.inputs(y, p))


class KerasFitLoop(Loop):
    def __init__(self, exp) -> None:
        super().__init__(exp)
        cfg = exp.cfg
        replicas = exp.strategy.num_replicas_in_sync
        corrected = keras_fixes.apply()
        if not corrected and cfg.strategy.name == "multi_worker_mirrored":
            raise DistlabError(
                f"loop=keras_fit fails under strategy=multi_worker_mirrored in Keras "
                f"{keras.__version__} (keras#20585), which distlab corrects only for the Keras "
                "versions it was checked with. Use loop=custom")
        if not corrected and replicas > 1 and cfg.loop.steps_per_execution > 1:
            raise DistlabError(
                f"loop.steps_per_execution={cfg.loop.steps_per_execution} fails with "
                f"{replicas} replicas in Keras {keras.__version__} (keras#19246), which distlab "
                "corrects only for the Keras versions it was checked with. Use "
                "loop.steps_per_execution=1, or loop=custom with loop.steps_per_loop")
        task = exp.task
        with exp.strategy.scope():
            # float64 sums, as SumsLayout.batch_stats: a resumed epoch adds up to the same figures
            self._metrics = [RealExamplesMean(task.loss, name="example_loss", dtype="float64"),
                             *(RealExamplesMean(_per_example(m), name=m.name, dtype="float64")
                               for m in task.metrics if not m.stateful)]
            stateful = exp.metrics.train
            exp.model.compile(
                optimizer=exp.optimizer,
                loss=task.loss,  # per example; Keras weighs and averages it
                weighted_metrics=[*self._metrics[1:], *map(RealRows, stateful.metrics,
                                                           stateful.objects), self._metrics[0]],
                steps_per_execution=cfg.loop.steps_per_execution,
                jit_compile=cfg.loop.jit_compile,
            )
        # The compiled metrics are distlab's sums (not serializable, and not the user's): a
        # model saved whole (a callback's ModelCheckpoint to .keras) carries no compile config,
        # as in loop=custom, which does not compile (`Model.get_compile_config` then is {})
        del exp.model._compile_config
        # a block's sums: these totals, reset after each block (with Keras' own loss mean)
        fit, tracker = self._metrics, getattr(exp.model, "_loss_tracker", None)
        self._sum_variables = [fit[0].total, *(m.total for m in fit[1:]), fit[0].count]
        self._reset = [*fit, *([tracker] if tracker is not None else [])]
        self._take_sums = tf.function(self._read_and_reset)
        self._functions: dict[int, Callable] = {}  # train functions by block size

    def train_steps(self, iterator, n: int) -> EpochSums:
        """Run the next `n` steps of `iterator` through Keras' compiled train function (in
        blocks of at most `loop.steps_per_execution`); their summed batch stats."""
        done = 0
        while done < n:
            block = min(n - done, self.exp.model.steps_per_execution)
            self._train_function(block, iterator)(iterator)
            done += block
        return EpochSums(self.exp.sums, self._take_sums())

    def _train_function(self, steps: int, iterator) -> Callable:
        """Keras' train function for blocks of `steps` steps (made on first use)."""
        if steps in self._functions:
            return self._functions[steps]
        model = self.exp.model
        if not self._functions:  # as fit does first: build the metrics and loss in the scope
            model._maybe_symbolic_build(data_batch=_first_replica(iterator.element_spec))
        if steps == model.steps_per_execution:
            model.make_train_function()
            self._functions[steps] = model.train_function
            return model.train_function
        function, full = None, model.train_function
        with _steps_per_execution(model, steps):
            model.make_train_function(force=True)
            function = model.train_function
        model.train_function = full

        def run_block(data):  # traced (on its first call) and run with its own block size
            with _steps_per_execution(model, steps):
                return function(data)

        self._functions[steps] = run_block
        return run_block

    def _read_and_reset(self) -> tf.Tensor:
        """The block's sums (read in cross-replica context: summed over replicas and workers),
        then zeroed for the next block."""
        with self.exp.strategy.scope():
            values = [tf.cast(tf.convert_to_tensor(v), tf.float64) for v in self._sum_variables]
            with tf.control_dependencies(values):
                for metric in self._reset:
                    metric.reset_state()
            return tf.stack(values)


@contextlib.contextmanager
def _steps_per_execution(model: keras.Model, steps: int) -> Iterator[None]:
    """`model.steps_per_execution` set to `steps` (Keras reads it while tracing)."""
    full = model.steps_per_execution
    model.steps_per_execution = steps
    try:
        yield
    finally:
        model.steps_per_execution = full


def _first_replica(spec):
    """A distributed element spec as one replica's (what Keras' symbolic build needs: the
    shapes and dtypes of a batch)."""
    def first(value):
        specs = getattr(value, "_value_specs", None)  # a PerReplicaSpec
        return specs[0] if specs else value

    return tf.nest.map_structure(first, spec)
