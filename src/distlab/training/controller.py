"""The Controller runs the epochs of every loop: a loop only runs steps (see `training.loops`).

For each epoch it asks the loop for blocks of `loop.steps_per_call` steps
(`loop.train_steps(iterator, n)`, which returns their `EpochSums`) and, at every step
boundary, adds them up, times them, guards against a non-finite loss, runs the profiler and
stops at a signal or preemption with a checkpoint; at every epoch end it measures
validation (and, with trainer.test_every, the test split, reported only), records the row
(history.csv, TensorBoard, the summary line), updates the monitors (target, early stopping,
best checkpoint) and saves checkpoints on their cadence. Every loop therefore writes the
same run dir.

The same hooks drive the user's Keras callbacks (`callbacks:`, Keras' `CallbackList`) and the
progress bar, once, for every loop: train begin and end, epoch begin and end (the logs: the
history row's columns), and train batch begin and end around each block of
`loop.steps_per_call` steps (the logs: the epoch's running loss and metrics; across
workers every worker reads them when the chief's bar or callbacks do: the read is a
collective). A callback that sets `model.stop_training` ends training after the current
block: that epoch's row covers the steps it ran (as in `model.fit`), it is checkpointed, and
results.json records `stopped_early` with reason `callback`.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
import warnings
from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf

from distlab.distribute.preemption import Interrupted, StopRequest
from distlab.training.actions.history import History
from distlab.training.actions.nan_guard import check_finite
from distlab.training.actions.profiler import Profiler
from distlab.training.actions.pruning import Pruning
from distlab.training.actions.throughput import Interval, steady_state
from distlab.training.callbacks import Callbacks, check_monitors, has_batch_hooks, warn_resumed
from distlab.training.checkpoints import Checkpoints
from distlab.training.epoch_sums import EpochSums
from distlab.training.experiment import Experiment

if TYPE_CHECKING:
    from distlab.training.loops.base import Loop

log = logging.getLogger("distlab")


class Controller:
    """Drives `loop` over the run's epochs and does everything between its steps."""

    def __init__(self, exp: Experiment, loop: Loop, checkpoints: Checkpoints,
                 callbacks: dict[str, keras.callbacks.Callback] | None = None) -> None:
        """`callbacks`: the user's Keras callbacks this process runs, by key
        (`training.callbacks.build`)."""
        self.exp, self.loop, self.checkpoints = exp, loop, checkpoints
        self.stop = StopRequest()  # set by a signal (distlab.distribute.preemption)
        self.preemption: Any = None  # PreemptionCheckpointHandler across workers, else None
        self.history = History(exp.run_dir, exp.task.metric_names, exp.cfg.trainer.epochs,
                               test=bool(exp.cfg.trainer.test_every),
                               validation=exp.data.validation is not None)
        self.epochs: list[dict[str, Any]] = []  # the rows this process recorded
        self.intervals: list[Interval] = []  # timed training steps, for steady_state
        self.first_step_at: float | None = None
        epoch, step = checkpoints.position  # built after the resume
        self.profiler = Profiler(exp.cfg.trainer.profile_steps, exp.run_dir.logs / "train",
                                 loop.steps_per_call,
                                 resumed_at=epoch * exp.data.steps_per_epoch + step)
        self._position = (0, 0)  # (epochs done, steps into the next) at the last boundary
        self._mark = (0.0, 0)  # (time, steps into the epoch) at the last step boundary
        self._start, self._first = 0.0, 0  # the epoch's start: time, steps done before it
        self._base = exp.sums.zeros()  # a resumed epoch's sums before the resume
        self._steps_sums = exp.sums.zeros()  # the batch stats of this epoch's steps
        check_monitors(callbacks or {}, {m.name: m.higher_is_better for m in exp.task.metrics},
                       test=bool(exp.cfg.trainer.test_every),
                       validation=exp.data.validation is not None, trainer=exp.cfg.trainer)
        self.callbacks = Callbacks(callbacks or {}, model=exp.model, verbose=0,
                                   epochs=exp.cfg.trainer.epochs, steps=exp.data.steps_per_epoch)
        self._batch_logs = has_batch_hooks(self.callbacks.callbacks)  # else no batch hooks
        # whether every block's running figures are read (across workers a collective: every
        # worker reads when the chief does, see `train`)
        self._read_figures = self._batch_logs or self.shows_progress
        self._bar: keras.utils.Progbar | None = None  # this epoch's progress bar
        self._stop_asked = False  # a callback set model.stop_training (multi-worker: pending)
        self.pruning = Pruning.build(exp)  # a search's trial (search.*), else None
        self.pruned: dict[str, Any] | None = None  # {epoch, metric, value} once pruned

    @property
    def finished(self) -> bool:
        """Whether training ended early (target reached with stop, early stopping, or a
        callback's model.stop_training)."""
        return self.exp.monitors.stopped

    # ---- the epoch loop
    def train(self, initial_epoch: int, skip_steps: int = 0) -> None:
        """Train epochs [initial_epoch, trainer.epochs), skipping the first `skip_steps`
        steps of `initial_epoch` (a run resumed mid-epoch)."""
        self.exp.model.stop_training = False
        if self.exp.worker.multi_worker:  # the chief's bar or batch callbacks read the figures
            from distlab.distribute.multi_worker import from_chief

            self._read_figures = bool(int(from_chief(self.exp.strategy, [tf.constant(
                int(self._read_figures), tf.int64)])[0]))
        if initial_epoch or skip_steps:
            warn_resumed(self.callbacks.by_key, initial_epoch)
        self.callbacks.on_train_begin()
        self._run_epochs(initial_epoch, skip_steps)
        self.callbacks.on_train_end(self.epoch_logs(self.epochs[-1]) if self.epochs else None)

    def _run_epochs(self, initial_epoch: int, skip_steps: int) -> None:
        """The epoch loop, the same for every loop: blocks of loop.steps_per_call steps from
        one stream, the last block of an epoch cut to the steps it has left."""
        exp, loop = self.exp, self.loop
        steps, epochs = exp.data.steps_per_epoch, exp.cfg.trainer.epochs
        iterator = loop.train_iterator(initial_epoch, skip_steps)
        for epoch in range(initial_epoch, epochs):
            done = skip_steps if epoch == initial_epoch else 0
            self.epoch_begin(epoch, done)
            while done < steps:
                n = min(loop.steps_per_call, steps - done)
                self.step_begin(epoch, done)
                block = self._block_sums(loop.train_steps(iterator, n))
                self._steps_sums = self._steps_sums + block
                done += n
                self.step_end(epoch, done, block.loss)
                if exp.model.stop_training:  # a callback's, after a block (as model.fit)
                    break
            if self.epoch_end(epoch):  # target, early stopping, or a callback's stop
                break

    def _block_sums(self, block: Any) -> EpochSums:
        """A block's EpochSums; a loop's own train_steps that returns the batch-stats vector
        (before EpochSums) is converted, with a warning (deprecated)."""
        if isinstance(block, EpochSums):
            return block
        if not getattr(self, "_warned_vector", False):
            self._warned_vector = True
            # a FutureWarning, as every deprecation of distlab's (distlab.deprecated): Python
            # shows it wherever it is raised (a DeprecationWarning from here would be hidden)
            warnings.warn(f"loop.name={self.exp.cfg.loop.name!r}: its train_steps returned "
                          f"{type(block).__name__!r}, not an EpochSums (what Loop.train_steps "
                          "returns: EpochSums(self.exp.sums, stats)); a vector goes in 0.3.0",
                          FutureWarning, stacklevel=3)
        return EpochSums(self.exp.sums, block)

    @property
    def shows_progress(self) -> bool:
        """Whether this process draws a progress bar: the chief's, with loop.verbose=1, or
        auto (the default) when stdout is a terminal (not in a pipe, a log or CI)."""
        verbose = self.exp.cfg.loop.verbose
        return self.exp.worker.is_chief and (
            verbose == 1 or (verbose == "auto" and sys.stdout.isatty()))

    def _progress_bar(self, epoch: int) -> keras.utils.Progbar | None:
        if not self.shows_progress:
            return None
        print(f"Epoch {epoch + 1}/{self.exp.cfg.trainer.epochs}", flush=True)
        names = ["loss", *self.exp.task.metric_names]
        return keras.utils.Progbar(self.exp.data.steps_per_epoch, verbose=1,
                                   stateful_metrics=[*names, "examples/sec"])

    def _update_bar(self, steps_done: int, figures: dict[str, float],
                    finalize: bool | None = None) -> None:
        if self._bar is None:
            return
        seconds = max(time.time() - self._start, 1e-9)
        rate = (self._examples(steps_done) - self._examples(self._first)) / seconds
        shown = [(k, v) for k, v in figures.items() if v is not None]
        self._bar.update(steps_done, [*shown, ("examples/sec", rate)],
                         finalize=finalize)
        if finalize or steps_done >= self.exp.data.steps_per_epoch:
            self._bar = None  # finished: its last line ends with a newline

    def running_sums(self) -> EpochSums:
        """The current epoch's sums so far (its blocks' batch stats, then the stateful
        metrics' state), the steps before a mid-epoch resume included: what a mid-epoch
        checkpoint keeps."""
        state = EpochSums(self.exp.sums, state=self.exp.metrics.train.read())
        return self._base + self._steps_sums + state

    # ---- the hooks of the epoch loop
    def epoch_begin(self, epoch: int, steps_done: int = 0) -> None:
        """Before the first step the loop runs in epoch `epoch` (after `steps_done` steps)."""
        self._start = time.time()
        self._first, self._mark = steps_done, (self._start, steps_done)
        self._base = (self.checkpoints.resumed_sums() if steps_done
                      else self.exp.sums.zeros())
        self._steps_sums = self.exp.sums.zeros()
        self.exp.metrics.train.reset()
        self.profiler.at(epoch * self.exp.data.steps_per_epoch + steps_done)
        self._bar = self._progress_bar(epoch)
        self.callbacks.on_epoch_begin(epoch)

    def step_begin(self, epoch: int, steps_done: int) -> None:
        """Before a step (or a block of steps) of epoch `epoch`, after `steps_done` steps."""
        if self._batch_logs:  # (else every batch hook is Keras' no-op)
            self.callbacks.on_train_batch_begin(steps_done)

    def step_end(self, epoch: int, steps_done: int, loss: float) -> None:
        """After a step (or a block of steps): timing, NaN guard, the callbacks' batch end
        and the progress bar, preemption, profiler."""
        now = time.time()
        if self.first_step_at is None:
            self.first_step_at = now
            log.info("time to first step: %.1f s", self.first_step_at - self.exp.started)
        started, before = self._mark
        self.checkpoints.trained_steps.assign_add(steps_done - before)  # the ckpt-N number
        self.intervals.append(Interval(epoch, steps_done - before, self._examples(steps_done)
                                       - self._examples(before), now - started))
        self._mark = (now, steps_done)
        self.profiler.at(epoch * self.exp.data.steps_per_epoch + steps_done)
        check_finite(loss, epoch, steps_done, self.checkpoints.latest)
        # (reading them is a cross-worker collective: every worker reads, or none)
        figures = ({k: v for k, v in self.running_sums().means().items()
                    if v is not None}  # an undefined running figure is left out
                   if self._read_figures else None)
        if self._batch_logs:
            self.callbacks.on_train_batch_end(steps_done - 1, figures)  # the block's last step
        self._update_bar(steps_done, figures or {})
        self._callback_stop()
        if steps_done < self.exp.data.steps_per_epoch:  # else epoch_end stops, after its row
            self.stop_if_asked(epoch, steps_done)

    def epoch_end(self, epoch: int) -> bool:
        """Record epoch `epoch` (0-based): validation, history row, scalars, monitors,
        checkpoints. True when training must end now (target with stop, early stopping)."""
        exp, train_end = self.exp, time.time()
        # the whole epoch's, resumed or not
        figures = self.running_sums().means(prefix="")
        self._update_bar(self._mark[1], figures, finalize=True)  # before any line is logged
        validated = self._every(epoch, "validate_every") and exp.data.validation is not None
        if validated:
            figures.update({f"val_{k}": v for k, v in self.loop.evaluate("validation").items()})
        if self._every(epoch, "test_every"):  # reported (a tutorial's pass), never watched
            figures.update({f"test_{k}": v for k, v in self.loop.evaluate("test").items()})
        steps_run = self._mark[1] - self._first  # fewer than steps_per_epoch after a resume
        examples = exp.data.examples_per_epoch * steps_run / exp.data.steps_per_epoch
        train_seconds = train_end - self._start
        row = self.history.row(epoch, exp.learning_rate_at_epoch(epoch), figures,
                               seconds=time.time() - self._start,
                               examples_per_sec=examples / max(train_seconds, 1e-9),
                               train_seconds=train_seconds, examples=examples)
        self.epochs.append(row)
        self.history.record(row)
        ckpt = self.checkpoints
        ckpt.epoch.assign(epoch + 1)
        ckpt.step_in_epoch.assign(0)
        best = exp.monitors.epoch_end(epoch + 1, row) and ckpt.best is not None
        self.callbacks.on_epoch_end(epoch, self.epoch_logs(row))
        if self._callback_stop(epoch_end=True) and not self.finished:
            log.info("a callback stopped training at epoch %d (model.stop_training)", epoch + 1)
            exp.monitors.stop(epoch + 1, "callback")
        if validated and self.pruning is not None and not self.finished:
            self._prune(epoch + 1, figures)
        if best:
            ckpt.save_best(epoch + 1)  # before a stop's checkpoint
        self.stop_if_asked(epoch + 1, 0)  # this epoch is done: a stop saves it whole
        last = epoch + 1 == exp.cfg.trainer.epochs or self.finished
        # a new best is also a main checkpoint: a resume never goes back behind checkpoints/best
        if (epoch + 1) % exp.cfg.trainer.checkpoint_every == 0 or last or best:
            ckpt.save(epoch + 1, 0)
        return self.finished

    def _prune(self, epochs_done: int, figures: dict[str, Any]) -> None:
        """Report the objective's validation figure to the search's trial; stop after this
        epoch when the pruner prunes it."""
        last = epochs_done == self.exp.cfg.trainer.epochs
        value = self.pruning.check(epochs_done, figures, last)
        if value is not None:
            self.exp.monitors.stop(epochs_done, "pruned")
            self.pruned = {"epoch": epochs_done, "metric": self.pruning.metric, "value": value}

    def epoch_logs(self, row: dict[str, Any]) -> dict[str, float]:
        """The callbacks' logs of an epoch: its history row's columns but `epoch` (figures
        not measured that epoch left out, as `model.fit` leaves out val_ ones)."""
        return {k: row[k] for k in self.history.columns[1:] if row.get(k) is not None}

    def _callback_stop(self, epoch_end: bool = False) -> bool:
        """Whether a callback asked to stop (`model.stop_training`). Across workers the
        chief's request counts, and only at an epoch end (every worker stops there
        together): a request during an epoch waits for its end."""
        model = self.exp.model
        self._stop_asked = self._stop_asked or bool(model.stop_training)
        if not self.exp.worker.multi_worker:
            return self._stop_asked
        model.stop_training = False  # the epoch loop must not end this worker's epoch alone
        if not epoch_end or not self.exp.cfg.get("callbacks"):  # (the same on every worker)
            return False
        from distlab.distribute.multi_worker import from_chief

        asked = int(from_chief(self.exp.strategy, [tf.constant(int(self._stop_asked),
                                                               tf.int64)])[0])
        self._stop_asked = bool(asked)
        model.stop_training = self._stop_asked
        return self._stop_asked

    def _every(self, epoch: int, key: str) -> bool:
        """Whether epoch `epoch` (0-based) is one of every trainer.<key> epochs."""
        every = self.exp.cfg.trainer[key]
        return bool(every) and (epoch + 1) % every == 0

    def _examples(self, steps: int) -> float:
        """Training examples in the first `steps` steps of an epoch."""
        data = self.exp.data
        return min(steps * data.global_batch_size, data.examples_per_epoch)

    # ---- stopping
    def stop_if_asked(self, epochs_done: int, steps_in_epoch: int) -> None:
        """At a step boundary: checkpoint and raise Interrupted if a stop was asked for (a
        signal here; across workers, a SIGTERM to any of them, at a step they agree on)."""
        self._position = (epochs_done, steps_in_epoch)
        if self.preemption is not None:
            self.preemption.save_checkpoint_if_preempted()  # may call save_here, preempted
        elif self.stop:
            path = self.save_here()
            where = (f"at epoch {epochs_done + 1}, step {steps_in_epoch}" if steps_in_epoch
                     else f"after epoch {epochs_done}")
            raise Interrupted(
                f"stopped by signal {self.stop.signum} {where}; checkpoint {path} saved. Rerun "
                "the same command to resume.", self.stop.signum)

    def save_here(self) -> str:
        """A checkpoint at the current step boundary (mid-epoch: with the epoch's sums)."""
        epochs_done, steps = self._position
        return self.checkpoints.save(epochs_done, steps, self.running_sums() if steps else None)

    def preempted(self, path: str) -> None:
        """Every worker saved `path` at the same step after a SIGTERM to one of them."""
        epochs_done, steps = self._position
        raise Interrupted(
            f"stopped by a preemption signal (SIGTERM to a worker) at epoch {epochs_done + 1}, "
            f"step {steps}; every worker saved a checkpoint: {path}. Rerun all workers to resume.",
            signal.SIGTERM)

    def close(self) -> None:
        """End of training (or a stop): a running profiler trace is written out, and an
        unfinished progress bar's line is ended before any message."""
        self.profiler.close()
        if self._bar is not None:
            print(flush=True)
            self._bar = None

    # ---- results
    def throughput(self) -> dict[str, Any]:
        """results.json's throughput fields: steady state (see `actions.throughput`) and the
        plain mean over every epoch this process trained (`..._overall`)."""
        settings = self.exp.cfg.trainer.throughput
        seconds = sum(r["train_seconds"] for r in self.epochs)
        overall = sum(r["examples"] for r in self.epochs) / seconds if seconds else None
        return {**steady_state(self.intervals, self.exp.strategy.num_replicas_in_sync,
                               settings.warmup_epochs, settings.warmup_steps, settings.windows),
                "train_examples_per_sec_overall": overall,
                "time_to_first_step_s": (self.first_step_at - self.exp.started
                                         if self.first_step_at else None)}
