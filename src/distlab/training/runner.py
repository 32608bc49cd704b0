"""Train or evaluate one composed config, top to bottom: connect, build the experiment,
build the loop and the checkpoints, resume, let the Controller train, test, export, report.

Imports TensorFlow; `distlab.launch.job` imports this module only after validating the
config and taking the run directory.
"""

from __future__ import annotations

import contextlib
import logging
import re
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf
from omegaconf import DictConfig

from distlab.components import optimizers, strategies
from distlab.config import JIT_ON_LOGICAL_CPUS
from distlab.distribute import multi_worker
from distlab.distribute.cluster import Worker
from distlab.distribute.preemption import (
    BEST_TEST,
    EVALUATION,
    EXPORT,
    FINAL_EVALUATION,
    TRAINING,
    Interrupted,
    Signalled,
    StopRequest,
)
from distlab.errors import DistlabError
from distlab.records.ranking import objective_fields
from distlab.records.results import with_objective_value
from distlab.records.run_dir import RunDir
from distlab.registry import LOOPS
from distlab.training import callbacks, evaluation, experiment
from distlab.training.checkpoints import Checkpoints
from distlab.training.controller import Controller
from distlab.training.experiment import Experiment, effective_batch_size, learning_rate
from distlab.training.export import export_and_check
from distlab.training.loops.base import Loop

log = logging.getLogger("distlab")


def quiet_libraries() -> None:
    """Library chatter a run does not need (applied when a job runs, not at import)."""
    for noisy in ("absl", "tensorflow"):  # tfds file listings, per-trace all-reduce notes
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # tf.data says this whenever a distributed dataset reads its options inside a tf.function
    warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data "
                            "options", category=UserWarning)
    multi_worker.quiet_collectives()


def reset_state(seed: int, deterministic: bool, precision: str = "float32") -> None:
    """Fresh Keras state, dtype policy, seeds and op determinism, so in-process jobs (sweeps,
    `distlab.train` called again) do not leak into each other."""
    keras.backend.clear_session()
    keras.mixed_precision.set_dtype_policy(precision)
    keras.utils.set_random_seed(seed)
    set_op_determinism(deterministic)


def set_op_determinism(on: bool) -> None:
    """TF op determinism on or off. TensorFlow has no public off switch, so `deterministic=
    false` after a `true` job uses the private one (`tensorflow.python.framework.config`,
    present in TF 2.9-2.21); if it is missing, the job says that it stays deterministic."""
    if on:
        tf.config.experimental.enable_op_determinism()
        return
    from tensorflow.python.framework import config as tf_config

    is_on = getattr(tf_config, "is_op_determinism_enabled", None)
    turn_off = getattr(tf_config, "disable_op_determinism", None)
    if is_on is None or not is_on():
        return
    if turn_off is None:
        log.warning("deterministic=false, but an earlier job in this process turned on op "
                    "determinism, which this TensorFlow cannot turn off; this job is "
                    "deterministic too")
        return
    turn_off()


def connect(cfg: DictConfig, results_json: Path | None = None,
            failed: dict[str, Any] | None = None) -> tf.distribute.Strategy:
    """The configured strategy (a multi-worker one forms its cluster: before any other TF
    op; if it cannot, the watchdog writes `failed` to `results_json` and ends the process)."""
    quiet_libraries()  # a multi-worker job connects before it executes
    strategies.configure_devices(cfg.strategy)  # before any TensorFlow op
    return strategies.build(cfg.strategy, results_json=results_json, failed=failed)


def execute(cfg: DictConfig, run_dir: RunDir, strategy: tf.distribute.Strategy | None = None,
            worker: Worker | None = None, origin: float | None = None,
            stop: StopRequest | None = None) -> dict[str, Any]:
    """Train (mode=train) or evaluate a checkpoint (mode=evaluate); return results.json.
    `origin`: the zero of wall_time_s and time_to_target_s (default: now). `stop`: the
    job's signal flag (`distribute.preemption.stop_on_signals`), which names each stage."""
    started = time.time()
    quiet_libraries()
    try:
        return _execute(cfg, run_dir, strategy, worker or Worker(), origin or started, started,
                        StopRequest() if stop is None else stop)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")  # the next in-process job's default


def _execute(cfg: DictConfig, run_dir: RunDir, strategy: tf.distribute.Strategy | None,
             worker: Worker, origin: float, started: float, stop: StopRequest
             ) -> dict[str, Any]:
    strategy = strategy or connect(cfg)
    if cfg.loop.jit_compile and strategies.local_cpu_replicas(strategy) > 1:
        raise DistlabError(JIT_ON_LOGICAL_CPUS)
    reset_state(cfg.seed, cfg.deterministic, cfg.precision)
    if cfg.mode == "evaluate" and worker.is_chief:
        evaluation.check_evaluation_splits(cfg)
    # before anything is built: a bad entry is one line naming callbacks.<name>
    user_callbacks = callbacks.build(cfg, worker.is_chief) if cfg.mode == "train" else {}
    checkpoints = None
    try:
        # (MultiWorkerMirroredStrategy broadcasts each variable's initial value from the chief
        # as the model is built: a peer lost then is a lost worker too)
        exp = experiment.build(cfg, run_dir, strategy, worker, started, origin)
        loop = LOOPS.build(cfg.loop.name, exp)
        if not isinstance(loop, Loop):
            raise DistlabError(
                f"loop.name={cfg.loop.name!r} built a {type(loop).__name__}, not a loop: "
                "register a distlab.Loop subclass (it implements train_step)")
        checkpoints = Checkpoints(exp, loop.state())
        return (_evaluate(exp, loop, checkpoints, stop) if cfg.mode == "evaluate"
                else _train(exp, loop, checkpoints, user_callbacks, stop))
    except tf.errors.UnimplementedError as e:
        if (refusal := _no_deterministic_xla(e, cfg)) is None:
            raise
        raise refusal from None
    except multi_worker.PEER_ERRORS as e:
        if not worker.multi_worker:
            raise
        latest = (checkpoints.latest if checkpoints else
                  tf.train.latest_checkpoint(str(run_dir.checkpoints)))  # lost while building
        raise multi_worker.lost_worker(e, worker, latest) from None


def _no_deterministic_xla(error: tf.errors.OpError, cfg: DictConfig) -> DistlabError | None:
    """XLA's refusal of an op without a deterministic implementation (it is raised when the
    first step compiles, before any update), as one line naming the two keys."""
    found = re.search(r"[^.:\]\[\n]*do not yet have a deterministic XLA implementation", str(error))
    if not found:
        return None
    return DistlabError(
        f"loop.jit_compile=true with deterministic=true cannot run this model: XLA has no "
        f"deterministic version of one of its ops (TensorFlow, whatever the device: "
        f"\"{found.group(0).strip()}\"). Set deterministic=false or loop.jit_compile=false "
        f"(loop={cfg.loop.name})")


def _results(exp: Experiment, epochs_completed: int, **extra: Any) -> dict[str, Any]:
    cfg, data = exp.cfg, exp.data
    batch = effective_batch_size(cfg, data.global_batch_size)
    results = {
        "status": "completed",
        "mode": cfg.mode,
        "loop": cfg.loop.name,
        "strategy": strategies.name(exp.strategy),
        "num_replicas": exp.strategy.num_replicas_in_sync,
        "batch_size_per_replica": cfg.dataset.batch_size_per_replica,
        "global_batch_size": data.global_batch_size,
        "grad_accum_steps": cfg.trainer.grad_accum_steps,
        "effective_batch_size": batch,
        "precision": _policy(exp.model, cfg.precision),
        "learning_rate": learning_rate(cfg, batch),
        "dataset": data.name,
        "validation": data.validation_from,
        "num_validation": data.num_validation if data.validation is not None else None,
        "steps_per_epoch": data.steps_per_epoch,
        "epochs_completed": epochs_completed,
        **objective_fields(cfg.objective, {m.name: m.higher_is_better for m in exp.task.metrics},
                           exp.monitors.best.maximize if exp.monitors.best else None,
                           validation=data.validation is not None),
        **extra,
        "wall_time_s": time.time() - exp.origin,  # time_to_target_s' zero too
    }
    return with_objective_value(results)


def _policy(model: keras.Model, configured: str) -> str:
    """The dtype policy the model was built with (what `precision` did)."""
    policy = getattr(model, "dtype_policy", None)
    return getattr(policy, "name", None) or configured


def _train(exp: Experiment, loop: Loop, checkpoints: Checkpoints,
           user_callbacks: dict[str, keras.callbacks.Callback],
           stop: StopRequest) -> dict[str, Any]:
    initial_epoch, skip_steps = checkpoints.resume()
    trains = not exp.monitors.stopped and (initial_epoch < exp.cfg.trainer.epochs or skip_steps)
    if (initial_epoch or skip_steps) and trains:
        _warn_if_other_replicas(exp)
    if trains and exp.worker.is_chief:
        exp.run_dir.record_trained_as({"num_replicas": exp.strategy.num_replicas_in_sync,
                                       "global_batch_size": exp.data.global_batch_size})
    _warn_if_nothing_to_learn(exp, initial_epoch * exp.data.steps_per_epoch + skip_steps)
    controller = Controller(exp, loop, checkpoints, user_callbacks)
    controller.stop = stop  # polled between steps; every other stage is cut short at once
    done: dict[str, Any] = {}  # the figures so far, kept if a signal cuts a stage short
    trained = None  # the position trained to, before the best test restores best's counter
    try:
        _train_epochs(exp, controller, checkpoints, initial_epoch, skip_steps, stop)
        done.update(_throughput(exp, controller))
        stop.begin(FINAL_EVALUATION)
        done.update(_final_figures(loop))
        if exp.cfg.trainer.export and not (kept := _kept_export(exp, controller)):
            stop.begin(EXPORT)
            done.update(export_and_check(exp))
        elif exp.cfg.trainer.export:  # a rerun completing another stage: the export stays
            done.update(kept)
        done.update(exp.monitors.results(exp.origin, checkpoints.best_latest))
        # best_epoch: the monitors' state, every worker's (best_checkpoint: the chief's)
        if exp.cfg.trainer.best_checkpoint.test and done.get("best_epoch"):
            # last: it replaces the final model's weights with the best epoch's
            stop.begin(BEST_TEST)
            trained = checkpoints.position
            checkpoints.restore_best(done.get("best_checkpoint"))
            best = _prefixed("best_test", loop.evaluate("test"))
            done.update(best)
            log.info("checkpoints/best (epoch %d): %s", done["best_epoch"], _figures(best))
    except (Interrupted, Signalled) as e:  # the job writes its results
        stopped = stop.as_interrupted(e)
        epoch, step = trained or checkpoints.position
        stopped.results = _results(exp, epoch, **(done or _throughput(exp, controller)),
                                   status="interrupted", interrupted_stage=stopped.stage,
                                   steps_in_epoch=step, checkpoint=checkpoints.latest)
        raise stopped from None
    except DistlabError as e:  # a stage after training failed: its record keeps the figures
        if done:               # measured before it (the job adds status failed and the error)
            e.results = _results(exp, (trained or checkpoints.position)[0], **done,
                                 checkpoint=checkpoints.latest)
        raise
    return _results(exp, (trained or checkpoints.position)[0], **done, **_pruned(exp, controller),
                    checkpoint=checkpoints.latest)


def _kept_export(exp: Experiment, controller: Controller) -> dict[str, Any]:
    """A completed run's export fields, when this rerun trained nothing and its saved_model/
    is there (a rerun completing the best checkpoint's test: the same model, exported
    already); else {}."""
    if controller.first_step_at is not None or not (exp.run_dir.path / "saved_model").is_dir():
        return {}
    previous = exp.run_dir.read_results() or {}
    if previous.get("status") != "completed" or not previous.get("saved_model"):
        return {}
    return {k: previous[k] for k in ("saved_model", "export_max_abs_diff") if k in previous}


def _pruned(exp: Experiment, controller: Controller) -> dict[str, Any]:
    """status pruned and `pruned` {epoch, metric, value} for a trial the search's pruner
    stopped (its value as reported; after a resume of its last stages, from history.csv)."""
    if exp.monitors.stop_reason != "pruned":
        return {}
    epoch = exp.monitors.results(exp.origin)["stopped_early"]["epoch"]
    pruned = controller.pruned or {"epoch": epoch, "metric": exp.cfg.objective,
                                   "value": _history_value(exp, epoch, str(exp.cfg.objective))}
    return {"status": "pruned", "pruned": pruned}


def _history_value(exp: Experiment, epoch: int, metric: str) -> float | None:
    import csv

    try:
        with (exp.run_dir.path / "history.csv").open(newline="") as f:
            for row in csv.DictReader(f):
                if int(row.get("epoch") or 0) == epoch and row.get(metric):
                    return float(row[metric])
    except (OSError, ValueError):
        pass
    return None


def _train_epochs(exp: Experiment, controller: Controller, checkpoints: Checkpoints,
                  initial_epoch: int, skip_steps: int, stop: StopRequest) -> None:
    """The training stage: the Controller's epochs, from the resumed position."""
    # across workers SIGTERM goes to TensorFlow's PreemptionCheckpointHandler, which makes
    # every worker save at one step; on one machine distlab's own flag does it
    stop.begin(TRAINING, polled=True)
    with contextlib.ExitStack() as scratch_dir:
        if exp.worker.multi_worker:  # (a scratch dir only here: a kill -9 leaves it behind)
            scratch = scratch_dir.enter_context(
                tempfile.TemporaryDirectory(prefix="distlab-preemption-"))
            controller.preemption = multi_worker.preemption_handler(
                exp, Path(scratch), save=controller.save_here, stop=controller.preempted)
        try:
            if exp.monitors.stopped:
                log.info("training ended early at epoch %d; not training further",
                         checkpoints.position[0])
            elif initial_epoch >= exp.cfg.trainer.epochs and not skip_steps:
                log.info("training is done (%d epoch(s)); completing the run's other stages",
                         initial_epoch)
            else:
                controller.train(initial_epoch, skip_steps)
            optimizers.apply_leftover_gradients(exp.optimizer, exp.strategy,
                                                checkpoints.save_again)
        finally:
            controller.close()
    stop.check()  # a signal after the last step's check: training is saved, stop here


# what a rerun that trained nothing keeps of the attempt that trained, besides its
# throughput: how it trained (this process may have other devices). (Not time_to_target_s:
# measured in the process that reached the target, from the zero of its wall_time_s.)
AS_TRAINED = ("strategy", "num_replicas", "global_batch_size", "effective_batch_size",
              "learning_rate", "steps_per_epoch")


def _throughput(exp: Experiment, controller: Controller) -> dict[str, Any]:
    """The throughput fields; a rerun that trained nothing (a stage after training was cut
    short, or an export asked since) keeps those of the attempt that trained, and its
    AS_TRAINED fields."""
    own = controller.throughput()
    if controller.first_step_at is None:
        previous = exp.run_dir.read_results() or {}
        own.update({k: previous[k] for k in [*own, *AS_TRAINED] if previous.get(k) is not None})
    return own


def _final_figures(loop: Loop) -> dict[str, float | None]:
    """The model's val_* (None without a validation split) and test_* figures, logged."""
    validation = loop.evaluate("validation") if loop.exp.data.validation is not None else {
        k: None for k in ("loss", *loop.exp.task.metric_names)}
    figures = {**_prefixed("val", validation), **_prefixed("test", loop.evaluate("test"))}
    log.info(_figures(figures))
    return figures


def _prefixed(prefix: str, figures: dict[str, float]) -> dict[str, float]:
    return {f"{prefix}_{k}": v for k, v in figures.items()}


def _warn_if_other_replicas(exp: Experiment) -> None:
    """A resume on another number of replicas (another machine's GPUs, another worker count)
    trains on another global batch from here: allowed, but no longer the run it resumes."""
    previous = exp.run_dir.trained_as()
    replicas, batch = previous.get("num_replicas"), previous.get("global_batch_size")
    if batch is not None and batch != exp.data.global_batch_size:
        log.warning("resuming on %d replica(s), a global batch of %d: the run trained on %s "
                    "replica(s), a global batch of %d, so from here it trains differently from "
                    "an uninterrupted run (resume on as many replicas to continue it exactly)",
                    exp.strategy.num_replicas_in_sync, exp.data.global_batch_size,
                    replicas, batch)


def _warn_if_nothing_to_learn(exp: Experiment, first_step: int) -> None:
    """A schedule at 0 for every step still to train (a finished cosine decay with alpha=0,
    extended) would change nothing: say so instead of training silently."""
    last_step = exp.cfg.trainer.epochs * exp.data.steps_per_epoch - 1
    if first_step <= last_step and float(exp.schedule(first_step)) == 0.0 \
            and float(exp.schedule(last_step)) == 0.0:
        log.warning("the learning rate is 0 from step %d to the end (schedule=%s): the "
                    "remaining epochs will not change the model", first_step + 1,
                    exp.cfg.schedule.name)


def _evaluate(exp: Experiment, loop: Loop, checkpoints: Checkpoints,
              stop: StopRequest) -> dict[str, Any]:
    evaluation.check_evaluation_rows(exp)
    prefix = checkpoints.restore_model(exp.cfg.ckpt_path)
    if prefix:
        evaluation.warn_if_figures_differ(exp, prefix)
    log.info("restored %s", prefix or "the chief's checkpoint")
    try:
        stop.begin(EVALUATION)
        figures = _final_figures(loop)
    except (Interrupted, Signalled) as e:
        stopped = stop.as_interrupted(e)
        stopped.results = _results(exp, checkpoints.position[0], status="interrupted",
                                   interrupted_stage=stopped.stage, checkpoint=prefix,
                                   train_examples_per_sec=None, learning_rate=None,
                                   steps_per_epoch=None)
        raise stopped from None
    return _results(exp, checkpoints.position[0], **figures, checkpoint=prefix,
                    train_examples_per_sec=None, learning_rate=None, steps_per_epoch=None,
                    trained=evaluation.trained_with(prefix) if prefix else None)


def _figures(figures: dict[str, float | None]) -> str:
    return " - ".join(f"{k} {v:.4f}" for k, v in figures.items() if v is not None)
