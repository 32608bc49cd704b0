"""What both loops share: the built experiment and the per-epoch controller.

A loop (the Trainer) owns the step functions; the Controller owns everything that
happens between epochs (history row, TensorBoard scalars, checkpoint cadence, the
one-line epoch summary), so both loops produce the same run directory.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from omegaconf import DictConfig

from distlab.components.tasks import Task
from distlab.data.pipeline import Data, distribute
from distlab.distribute.cluster import Task as Worker
from distlab.distribute.preemption import Interrupted, StopRequest
from distlab.errors import DistlabError
from distlab.launch.run_dir import RunDir, history_columns
from distlab.training.monitors import Monitors
from distlab.training.throughput import Interval, steady_state

log = logging.getLogger("distlab")
SUM = tf.distribute.ReduceOp.SUM


@dataclass
class Experiment:
    """The built pieces of one run (the Task, plus where it writes)."""

    cfg: DictConfig
    strategy: tf.distribute.Strategy
    data: Data
    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    schedule: Any  # keras LearningRateSchedule, shared by both loops
    task: Task  # the loss and metrics (the `task` group)
    run_dir: RunDir
    checkpoint: tf.train.Checkpoint
    manager: tf.train.CheckpointManager
    epoch: tf.Variable  # epochs completed, saved in every checkpoint
    step_in_epoch: tf.Variable  # steps done in epoch `epoch` (non-zero after a preemption)
    # the running sums of those steps (Loop._batch_stats' layout: loss, metrics..., count;
    # float64), so a run resumed mid-epoch records the whole epoch
    epoch_sums: tf.Variable
    monitors: Monitors  # target, early stopping, best checkpoint (state in the checkpoint)
    best_manager: tf.train.CheckpointManager | None = None  # checkpoints/best/
    started: float = field(default_factory=time.time)
    origin: float = field(default_factory=time.time)  # time-to-target's zero: process start
    stop: StopRequest = field(default_factory=StopRequest)
    worker: Worker = field(default_factory=Worker)  # this process in a multi-worker cluster
    preemption: Any = None  # PreemptionCheckpointHandler across workers, else None
    # what every checkpoint holds, by name: `checkpoint` is tf.train.Checkpoint(**state), and a
    # multi-worker resume broadcasts these from the chief (multi_worker.restore_from_chief)
    state: dict[str, Any] = field(default_factory=dict)

    def learning_rate_at_epoch(self, epoch: int) -> float:
        """The learning rate of the first step of `epoch` (0-based)."""
        return float(self.schedule(epoch * self.data.steps_per_epoch))


def stats_size(task: Task) -> int:
    """Length of `Loop._batch_stats`' vector (and of Experiment.epoch_sums): the loss sum,
    one sum per task metric, the count of real examples."""
    return len(task.metrics) + 2


class NonFiniteLoss(DistlabError):
    """Training produced a NaN or Inf loss."""


def save_checkpoint(exp: Experiment, epochs_done: int, steps_in_epoch: int,
                    sums: np.ndarray | None = None) -> str:
    """ckpt-<training step>, holding `exp.state`: model, optimizer, the epoch and step-in-epoch
    counters and, mid-epoch, the epoch's running `sums` (the step counts batches:
    micro-batches under trainer.grad_accum_steps)."""
    exp.epoch.assign(epochs_done)
    exp.step_in_epoch.assign(steps_in_epoch)
    if steps_in_epoch and sums is not None:
        exp.epoch_sums.assign(sums)
    else:  # an epoch boundary (or a loop that keeps no sums)
        exp.epoch_sums.assign(tf.zeros_like(exp.epoch_sums))
    step = epochs_done * exp.data.steps_per_epoch + steps_in_epoch
    return exp.manager.save(checkpoint_number=step)


class Controller:
    """Per-epoch bookkeeping shared by `keras_fit` and `custom`."""

    def __init__(self, exp: Experiment,
                 sums: Callable[[], np.ndarray | None] | None = None) -> None:
        """`sums()`: the loop's running sums of the current epoch (resumed steps included),
        saved in a mid-epoch checkpoint."""
        self.exp = exp
        self.sums = sums
        self.epochs: list[dict[str, Any]] = []
        self.intervals: list[Interval] = []  # timed training steps, for steady_state
        self.first_step_at: float | None = None
        self._position = (0, 0)  # (epochs done, steps into the next) at the last boundary
        self._mark = (0.0, 0)  # (time, steps into the epoch) at the last step boundary
        self.columns = history_columns(exp.task.metric_names)
        logs = exp.run_dir.logs  # the tags keras.callbacks.TensorBoard uses, for both loops
        self._writers = {"train": tf.summary.create_file_writer(str(logs / "train")),
                         "validation": tf.summary.create_file_writer(str(logs / "validation"))}
        self._profile = list(exp.cfg.trainer.profile_steps or [])  # [first, last], 1-based
        self._profiling = False
        # run-wide steps done before this process trains: built after the resume
        self._resumed_at = (int(exp.epoch.numpy()) * exp.data.steps_per_epoch
                            + int(exp.step_in_epoch.numpy()))

    @property
    def finished(self) -> bool:
        """Whether training ended early (target reached with stop, or early stopping)."""
        return self.exp.monitors.stopped

    def epoch_begin(self, epoch: int, steps_done: int = 0) -> None:
        """Before the first step the loop runs in epoch `epoch` (after `steps_done` steps)."""
        self._mark = (time.time(), steps_done)
        self._profile_at(epoch * self.exp.data.steps_per_epoch + steps_done)

    def step_end(self, epoch: int, steps_done: int, loss: float) -> None:
        """After a step (or a loop of steps): timing, NaN guard, preemption, profiler."""
        now = time.time()
        if self.first_step_at is None:
            self.first_step_at = now
            log.info("time to first step: %.1f s", self.first_step_at - self.exp.started)
        started, before = self._mark
        self.intervals.append(Interval(epoch, steps_done - before, self._examples(steps_done)
                                       - self._examples(before), now - started))
        self._mark = (now, steps_done)
        self._profile_at(epoch * self.exp.data.steps_per_epoch + steps_done)
        if not math.isfinite(loss):
            latest = self.exp.manager.latest_checkpoint or "none yet"
            raise NonFiniteLoss(
                f"non-finite loss ({loss}) at epoch {epoch + 1}, step {steps_done}: training "
                f"stopped; the last good checkpoint ({latest}) is kept. Lower "
                "optimizer.learning_rate or set optimizer.clipnorm"
            )
        if steps_done < self.exp.data.steps_per_epoch:  # else epoch_end stops, after its row
            self.stop_if_asked(epoch, steps_done)

    def _examples(self, steps: int) -> float:
        """Training examples in the first `steps` steps of an epoch."""
        data = self.exp.data
        return min(steps * data.global_batch_size, data.examples_per_epoch)

    def _profile_at(self, steps_done: int) -> None:
        """Start the TF profiler before step `first`, stop it after step `last` (run-wide
        1-based step numbers; at the granularity of a loop's block of steps)."""
        if not self._profile:
            return
        first, last = self._profile
        loop = self.exp.cfg.loop  # the next call runs steps steps_done + 1 .. + block
        block = loop.get("steps_per_execution") or loop.get("steps_per_loop") or 1
        if not self._profiling and first <= steps_done + block and steps_done < last:
            tf.profiler.experimental.start(str(self.exp.run_dir.logs / "train"))
            self._profiling = True
            log.info("profiling steps %d-%d into %s", steps_done + 1, last,
                     self.exp.run_dir.logs / "train")
        elif self._profiling and steps_done >= last:
            self.close()

    def close(self) -> None:
        """End of training (or a stop): a running profiler trace is written out."""
        if self._profiling:
            tf.profiler.experimental.stop()
            self._profiling, self._profile = False, []
        elif self._profile and self._profile[1] <= self._resumed_at:
            log.info("trainer.profile_steps=%s: those steps ran before this process resumed "
                     "the run (at step %d); no trace written now", self._profile,
                     self._resumed_at)
        elif self._profile:
            log.warning("trainer.profile_steps=%s: training ended before those steps; no "
                        "trace written", self._profile)

    def stop_if_asked(self, epochs_done: int, steps_in_epoch: int) -> None:
        """At a step boundary: checkpoint and raise Interrupted if a stop was asked for (a
        signal here; across workers, a SIGTERM to any of them, at a step they agree on)."""
        self._position = (epochs_done, steps_in_epoch)
        if self.exp.preemption is not None:
            self.exp.preemption.save_checkpoint_if_preempted()  # may call save_here, preempted
        elif self.exp.stop:
            path = self.save_here()
            raise Interrupted(
                f"stopped by signal {self.exp.stop.signum} at epoch {epochs_done + 1}, step "
                f"{steps_in_epoch}; checkpoint {path} saved. Rerun the same command to resume.",
                self.exp.stop.signum)

    def save_here(self) -> str:
        """A checkpoint at the current step boundary (mid-epoch: with the epoch's sums)."""
        epochs_done, steps = self._position
        sums = self.sums() if steps and self.sums is not None else None
        return save_checkpoint(self.exp, epochs_done, steps, sums)

    def preempted(self, path: str) -> None:
        """Every worker saved `path` at the same step after a SIGTERM to one of them."""
        epochs_done, steps = self._position
        raise Interrupted(
            f"stopped by a preemption signal (SIGTERM to a worker) at epoch {epochs_done + 1}, "
            f"step {steps}; every worker saved a checkpoint: {path}. Rerun all workers to resume.",
            signal.SIGTERM)

    def epoch_end(self, epoch: int, metrics: dict[str, float], epoch_seconds: float,
                  train_seconds: float, steps_run: int) -> dict[str, Any]:
        """Record epoch `epoch` (0-based): history row, scalars, checkpoint, summary line.

        `steps_run` is the number of steps this process ran in the epoch (fewer than
        steps_per_epoch when it resumed mid-epoch).
        """
        exp = self.exp
        examples = exp.data.examples_per_epoch * steps_run / exp.data.steps_per_epoch
        row = {
            "epoch": epoch + 1,
            "learning_rate": exp.learning_rate_at_epoch(epoch),
            **{key: metrics.get(key) for key in self.columns[2:-2]},
            "seconds": epoch_seconds,
            "examples_per_sec": examples / max(train_seconds, 1e-9),
            "train_seconds": train_seconds,
            "examples": examples,
        }
        self.epochs.append(row)
        exp.run_dir.append_history(row, self.columns)
        self._write_scalars(epoch, row)
        log.info(_summary_line(row, self.columns, exp.cfg.trainer.epochs))
        exp.epoch.assign(epoch + 1)
        exp.step_in_epoch.assign(0)
        best = exp.monitors.epoch_end(epoch + 1, row) and exp.best_manager is not None
        if best:
            exp.best_manager.save(checkpoint_number=epoch + 1)  # before a stop's checkpoint
        self.stop_if_asked(epoch + 1, 0)  # this epoch is done: a stop saves it whole
        last = epoch + 1 == exp.cfg.trainer.epochs or self.finished
        # a new best is also a main checkpoint: a resume never goes back behind checkpoints/best
        if (epoch + 1) % exp.cfg.trainer.checkpoint_every == 0 or last or best:
            save_checkpoint(exp, epoch + 1, 0)
        return row

    def _write_scalars(self, epoch: int, row: dict[str, Any]) -> None:
        names = ["loss", *self.exp.task.metric_names]
        with self._writers["train"].as_default(step=epoch):
            for key in (*names, "learning_rate", "examples_per_sec"):
                tf.summary.scalar(f"epoch_{key}", row[key])
        if row["val_loss"] is not None:
            with self._writers["validation"].as_default(step=epoch):
                for key in names:
                    tf.summary.scalar(f"epoch_{key}", row[f"val_{key}"])
        for writer in self._writers.values():
            writer.flush()

    def throughput(self) -> dict[str, Any]:
        """results.json's throughput fields: steady state (see distlab.training.throughput) and the
        plain mean over every epoch this process trained (`..._overall`)."""
        settings = self.exp.cfg.trainer.throughput
        seconds = sum(r["train_seconds"] for r in self.epochs)
        overall = sum(r["examples"] for r in self.epochs) / seconds if seconds else None
        return {**steady_state(self.intervals, self.exp.strategy.num_replicas_in_sync,
                               settings.warmup_epochs, settings.warmup_steps, settings.windows),
                "train_examples_per_sec_overall": overall}


def _summary_line(row: dict[str, Any], columns: list[str], epochs: int) -> str:
    parts = [f"epoch {row['epoch']}/{epochs}", f"learning_rate {row['learning_rate']:.3g}"]
    parts += [f"{key} {row[key]:.4f}" for key in columns[2:-2] if row[key] is not None]
    parts += [f"{row['seconds']:.1f}s", f"{row['examples_per_sec']:.0f} examples/sec"]
    return " - ".join(parts)


class Loop:
    """Interface of a training loop (the Trainer). Subclasses register in LOOPS.

    Evaluation is shared: both loops measure validation and test figures with the same
    distributed step (mean per-example loss and task metrics over the whole split).
    """

    def __init__(self, exp: Experiment) -> None:
        self.exp = exp
        self.controller = Controller(exp, sums=self.running_sums)
        self.loss_fn = exp.task.loss
        if exp.cfg.loop.jit_compile:
            self._test_step = tf.function(self._test_step, jit_compile=True)
        self._eval_all = tf.function(self._eval_dataset)

    def train(self, initial_epoch: int, skip_steps: int = 0) -> None:
        """Train epochs [initial_epoch, trainer.epochs), skipping the first `skip_steps`
        steps of `initial_epoch` (a run resumed mid-epoch)."""
        raise NotImplementedError

    def running_sums(self) -> np.ndarray | None:
        """The summed batch stats (loss, metrics..., count) of the current epoch so far,
        including the steps before a mid-epoch resume: what a mid-epoch checkpoint keeps.
        A loop that keeps no sums returns None (its resumed epoch's row then covers only the
        steps after the resume)."""
        return None

    def resumed_sums(self, steps_done: int) -> np.ndarray:
        """The sums of the epoch's first `steps_done` steps: the checkpoint's, or zeros."""
        if steps_done:
            return self.exp.epoch_sums.numpy().astype(np.float64)
        return np.zeros(self.num_stats)

    def evaluate(self) -> dict[str, float]:
        """{"test_loss", "test_<metric>"...} on the test split under the current strategy:
        exact means over the real examples, whatever the replica count (padding weighs 0)."""
        sums = self._eval_all(self._distribute(self.exp.data.test)).numpy()
        return {f"test_{k}": v for k, v in self.means(sums).items()}

    def means(self, sums) -> dict[str, float]:
        """{"loss", <metric>...} from the summed batch stats (loss, metrics..., count)."""
        count = sums[-1]
        values = {"loss": float(sums[0] / count)}
        for metric, total in zip(self.exp.task.metrics, sums[1:-1], strict=True):
            values[metric.name] = float(metric.finalize(total / count))
        return values

    def validate_now(self, epoch: int) -> bool:
        every = self.exp.cfg.trainer.validate_every
        return bool(every) and (epoch + 1) % every == 0

    def with_validation(self, epoch: int, metrics: dict[str, float]) -> dict[str, float]:
        """`metrics` plus val_loss, val_<metric>... when epoch `epoch` validates."""
        if self.validate_now(epoch):
            metrics.update({f"val_{k[len('test_'):]}": v for k, v in self.evaluate().items()})
        return metrics

    # ---- distributed pieces shared by the loops
    def _distribute(self, dataset: tf.data.Dataset):
        """Per replica (features, labels, weights); see `distlab.data.pipeline.distribute`."""
        return distribute(self.exp.strategy, dataset)

    def _batch_stats(self, labels, predictions, per_example_loss, weights):
        """Per replica, over its real rows (weight > 0): [sum of per-example loss, sum of each
        per-example metric..., number of examples], in float64 so sums do not depend on the
        split."""
        real = tf.cast(weights > 0, tf.float64)
        values = [per_example_loss] + [m.per_example(labels, predictions)
                                       for m in self.exp.task.metrics]
        sums = [tf.reduce_sum(real * tf.cast(v, tf.float64)) for v in values]
        return tf.stack([*sums, tf.reduce_sum(real)])

    def _test_step(self, features, labels, weights):
        predictions = self.exp.model(features, training=False)
        return self._batch_stats(labels, predictions, self.loss_fn(labels, predictions), weights)

    def _reduce(self, per_replica) -> tf.Tensor:
        return self.exp.strategy.reduce(SUM, per_replica, axis=None)

    @property
    def num_stats(self) -> int:
        return stats_size(self.exp.task)

    def _eval_dataset(self, dist_dataset):
        totals = tf.zeros([self.num_stats], tf.float64)
        for batch in dist_dataset:
            totals += self._reduce(self.exp.strategy.run(self._test_step, args=batch))
        return totals
