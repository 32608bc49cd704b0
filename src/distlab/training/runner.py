"""Build an experiment from the composed config and train or evaluate it.

Imports TensorFlow; `distlab.run` imports this module only after validating the config.
"""

from __future__ import annotations

import logging
import re
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from omegaconf import DictConfig

from distlab.components import models, optimizers, schedules, strategies, tasks
from distlab.config import JIT_ON_LOGICAL_CPUS
from distlab.data import pipeline as data_lib
from distlab.distribute import multi_worker
from distlab.distribute.cluster import Task
from distlab.distribute.preemption import Interrupted, stop_on_signals
from distlab.errors import DistlabError, first_line
from distlab.launch.results import maximizes, objective_field
from distlab.launch.run_dir import RunDir, find_checkpoint
from distlab.registry import LOOPS
from distlab.training.loops.base import Experiment, stats_size
from distlab.training.monitors import Monitors

log = logging.getLogger("distlab")
# the checkpoint's name for Experiment.epoch_sums; checkpoints older than it lack it
EPOCH_SUMS = "epoch_sums"
# how far the reloaded SavedModel may be from the trained model, relative to the largest
# output: the two graphs round differently, in the precision they compute in
EXPORT_RTOL = {"float32": 1e-4, "mixed_float16": 2e-3, "mixed_bfloat16": 2e-2}


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


def build_experiment(cfg: DictConfig, run_dir: RunDir, strategy: tf.distribute.Strategy,
                     started: float) -> Experiment:
    data = data_lib.load(cfg.dataset, strategy.num_replicas_in_sync, cfg.seed,
                         cfg.trainer.steps_per_epoch)
    task = tasks.build(cfg.task)
    tasks.check_labels(task, cfg.task.name, data.name, data.classes)
    fields = ["test_loss", *(f"test_{m}" for m in task.metric_names)]
    if cfg.objective and cfg.objective.startswith("test_") and cfg.objective not in fields:
        raise DistlabError(f"objective={cfg.objective} is not a result of task "
                           f"{cfg.task.name!r}; its results: {', '.join(fields)}")
    lr = learning_rate(cfg, effective_batch_size(cfg, data.global_batch_size))
    with strategy.scope():
        model = models.build(cfg.model, data.input_shape, data.outputs)
        schedule = schedules.build(cfg.schedule, lr, data.steps_per_epoch, cfg.trainer.epochs)
        optimizer = optimizers.with_training_options(
            optimizers.build(cfg.optimizer, schedule), cfg.trainer.grad_accum_steps,
            loss_scaling=cfg.precision == "mixed_float16",
            distributed=not data_lib.is_default(strategy),
            epochs=cfg.trainer.epochs if cfg.mode == "train" else None,
            steps_per_epoch=data.steps_per_epoch)
        # Build the slots now, inside the scope: a custom loop must not create them while
        # tracing, and restoring a checkpoint needs them to exist.
        optimizer.build(model.trainable_variables)
    tasks.settle(task, model)
    monitors = Monitors(cfg.trainer, task)
    epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
    step_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="step_in_epoch")
    epoch_sums = tf.Variable(tf.zeros([stats_size(task)], tf.float64), trainable=False,
                             name="epoch_sums")
    state = {"model": model, "optimizer": optimizer, "epoch": epoch,
             "step_in_epoch": step_in_epoch, EPOCH_SUMS: epoch_sums, **monitors.state,
             **rng_states(model)}
    checkpoint = tf.train.Checkpoint(**state)
    manager = tf.train.CheckpointManager(checkpoint, str(run_dir.checkpoints),
                                         max_to_keep=cfg.trainer.max_checkpoints)
    best = (tf.train.CheckpointManager(checkpoint, str(run_dir.best_checkpoints), max_to_keep=1)
            if monitors.best else None)
    return Experiment(cfg=cfg, strategy=strategy, data=data, model=model, optimizer=optimizer,
                      schedule=schedule, task=task,
                      run_dir=run_dir, checkpoint=checkpoint, manager=manager, epoch=epoch,
                      step_in_epoch=step_in_epoch, epoch_sums=epoch_sums, monitors=monitors,
                      best_manager=best, started=started, state=state)


def model_state(exp: Experiment) -> dict[str, Any]:
    """What an evaluation restores from a checkpoint: the model weights and the epoch counter
    (never the optimizer, whatever it was trained with)."""
    return {"model": exp.model, "epoch": exp.epoch}


def rng_states(model: keras.Model) -> dict[str, list]:
    """The layers' random-generator states (Dropout, random augmentation layers): Keras'
    SeedGenerator is not tracked by tf.train.Checkpoint, so without them a resumed run would
    draw other dropout masks than an uninterrupted one."""
    states = [v for v in model.non_trainable_variables if v.name == "seed_generator_state"]
    return {"seed_states": states} if states else {}


def effective_batch_size(cfg: DictConfig, global_batch_size: int) -> int:
    """Examples per optimizer update: the global batch x trainer.grad_accum_steps."""
    return global_batch_size * cfg.trainer.grad_accum_steps


def learning_rate(cfg: DictConfig, global_batch_size: int) -> float:
    """The base learning rate after the batch-size scaling rule (`global_batch_size` is the
    effective batch: examples per update)."""
    opt = cfg.optimizer
    return optimizers.scaled_learning_rate(opt.learning_rate, opt.lr_scaling, global_batch_size,
                                           opt.base_batch_size)


def connect(cfg: DictConfig, results_json: Path | None = None,
            failed: dict[str, Any] | None = None) -> tf.distribute.Strategy:
    """The configured strategy (a multi-worker one forms its cluster: before any other TF
    op; if it cannot, the watchdog writes `failed` to `results_json` and ends the process)."""
    quiet_libraries()  # a multi-worker job connects before it executes
    strategies.configure_devices(cfg.strategy)  # before any TensorFlow op
    return strategies.build(cfg.strategy, results_json=results_json, failed=failed)


def execute(cfg: DictConfig, run_dir: RunDir, strategy: tf.distribute.Strategy | None = None,
            task: Task | None = None, origin: float | None = None) -> dict[str, Any]:
    """Train (mode=train) or evaluate a checkpoint (mode=evaluate); return results.json.
    `origin`: when the clock of time_to_target_s started (default: now)."""
    started = time.time()
    quiet_libraries()
    try:
        return _execute(cfg, run_dir, strategy, task, origin or started, started)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")  # the next in-process job's default


def _execute(cfg: DictConfig, run_dir: RunDir, strategy: tf.distribute.Strategy | None,
             task: Task | None, origin: float, started: float) -> dict[str, Any]:
    task = task or Task()
    strategy = strategy or connect(cfg)
    if cfg.loop.jit_compile and strategies.local_cpu_replicas(strategy) > 1:
        raise DistlabError(JIT_ON_LOGICAL_CPUS)
    reset_state(cfg.seed, cfg.deterministic, cfg.precision)
    exp = build_experiment(cfg, run_dir, strategy, started)
    exp.worker = task
    exp.origin = origin
    try:
        return _evaluate(exp) if cfg.mode == "evaluate" else _train(exp)
    except tf.errors.UnimplementedError as e:
        if (refusal := _no_deterministic_xla(e, cfg)) is None:
            raise
        raise refusal from None
    except multi_worker.PEER_ERRORS as e:
        if not task.multi_worker:
            raise
        raise multi_worker.lost_worker(e, task, exp.manager.latest_checkpoint) from None


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


def _results(exp: Experiment, **extra: Any) -> dict[str, Any]:
    cfg, data = exp.cfg, exp.data
    return {
        "status": "completed",
        "mode": cfg.mode,
        "loop": cfg.loop.name,
        "strategy": strategies.name(exp.strategy),
        "num_replicas": exp.strategy.num_replicas_in_sync,
        "batch_size_per_replica": cfg.dataset.batch_size_per_replica,
        "global_batch_size": data.global_batch_size,
        "grad_accum_steps": cfg.trainer.grad_accum_steps,
        "effective_batch_size": effective_batch_size(cfg, data.global_batch_size),
        "precision": _policy(exp.model, cfg.precision),
        "learning_rate": learning_rate(cfg, effective_batch_size(cfg, data.global_batch_size)),
        "dataset": data.name,
        "steps_per_epoch": data.steps_per_epoch,
        "epochs_completed": int(exp.epoch.numpy()),
        **objective(cfg.objective, exp.task,
                    exp.monitors.best.maximize if exp.monitors.best else None),
        **extra,
        "wall_time_s": time.time() - exp.started,
    }


def _policy(model: keras.Model, configured: str) -> str:
    """The dtype policy the model was built with (what `precision` did)."""
    policy = getattr(model, "dtype_policy", None)
    return getattr(policy, "name", None) or configured


def _train(exp: Experiment) -> dict[str, Any]:
    initial_epoch, skip_steps = resume(exp)
    _warn_if_nothing_to_learn(exp, initial_epoch * exp.data.steps_per_epoch + skip_steps)
    loop = LOOPS.get(exp.cfg.loop.name)(exp)
    # across workers SIGTERM goes to TensorFlow's PreemptionCheckpointHandler, which makes
    # every worker save at one step; on one machine distlab's own flag does it
    with stop_on_signals(sigterm=not exp.worker.multi_worker) as exp.stop, \
            tempfile.TemporaryDirectory(prefix="distlab-preemption-") as scratch:
        if exp.worker.multi_worker:
            exp.preemption = multi_worker.preemption_handler(
                exp, Path(scratch), save=loop.controller.save_here,
                stop=loop.controller.preempted)
        try:
            if exp.monitors.stopped:
                log.info("training ended early at epoch %d; not training further",
                         int(exp.epoch.numpy()))
            else:
                loop.train(initial_epoch, skip_steps)
            optimizers.apply_leftover_gradients(exp)  # a last, partial accumulation
        except Interrupted:
            exp.run_dir.write_results(_results(
                exp, status="interrupted", steps_in_epoch=int(exp.step_in_epoch.numpy()),
                checkpoint=exp.manager.latest_checkpoint))
            raise
        finally:
            loop.controller.close()
    test = loop.evaluate()
    log.info(_figures(test))
    export = export_and_check(exp) if exp.cfg.trainer.export else {}
    first = loop.controller.first_step_at
    return _results(
        exp, **test,
        **loop.controller.throughput(),
        time_to_first_step_s=(first - exp.started) if first else None,
        **exp.monitors.results(exp.origin, exp.best_manager.latest_checkpoint
                               if exp.best_manager else None),
        checkpoint=exp.manager.latest_checkpoint,
        **export,
    )


def _warn_if_nothing_to_learn(exp: Experiment, first_step: int) -> None:
    """A schedule at 0 for every step still to train (a finished cosine decay with alpha=0,
    extended) would change nothing: say so instead of training silently."""
    last_step = exp.cfg.trainer.epochs * exp.data.steps_per_epoch - 1
    if first_step <= last_step and float(exp.schedule(first_step)) == 0.0 \
            and float(exp.schedule(last_step)) == 0.0:
        log.warning("the learning rate is 0 from step %d to the end (schedule=%s): the "
                    "remaining epochs will not change the model", first_step + 1,
                    exp.cfg.schedule.name)


def _evaluate(exp: Experiment) -> dict[str, Any]:
    if exp.worker.multi_worker:  # the chief's disk holds the checkpoint: restore, broadcast
        prefix = find_checkpoint(exp.cfg.ckpt_path) if exp.worker.is_chief else None
        multi_worker.restore_from_chief(exp, prefix, lambda p: restore_model(exp, p),
                                        state=model_state(exp))
    else:
        prefix = find_checkpoint(exp.cfg.ckpt_path)
        restore_model(exp, prefix)
    if prefix:
        _warn_if_other_precision(exp, prefix)
    test = LOOPS.get(exp.cfg.loop.name)(exp).evaluate()
    log.info("restored %s: %s", prefix or "the chief's checkpoint", _figures(test))
    return _results(exp, **test, checkpoint=prefix, train_examples_per_sec=None,
                    learning_rate=None, steps_per_epoch=None,
                    trained=trained_with(prefix) if prefix else None)


def objective(name: str | None, task: tasks.Task,
              best_maximizes: bool | None = None) -> dict[str, str]:
    """results.json's `objective` (the field sweepers get: `name`, else the task's first
    metric) and `objective_direction` (`distlab.launch.results.maximizes`: task metrics their own
    way, times and epochs to target down, `best_value` as its metric)."""
    higher = {m.name: m.higher_is_better for m in task.metrics}
    field = objective_field(name, task.metric_names)
    maximize = maximizes(field, higher, best_maximizes)
    return {"objective": field, "objective_direction": "maximize" if maximize else "minimize"}


def _figures(test: dict[str, float]) -> str:
    return " - ".join(f"{k} {v:.4f}" for k, v in test.items())


TRAINED_FIELDS = ("loop", "strategy", "num_replicas", "batch_size_per_replica",
                  "global_batch_size", "grad_accum_steps", "effective_batch_size", "precision",
                  "learning_rate", "steps_per_epoch", "epochs_completed")


def trained_with(prefix: str) -> dict[str, Any] | None:
    """How the checkpoint was trained, from its run dir's results.json (None if not there).
    In an evaluation's results.json the top-level batch fields are the evaluation's own."""
    trained = _run_dir_of(prefix).read_results()
    return {k: trained.get(k) for k in TRAINED_FIELDS} if trained else None


def _run_dir_of(prefix: str) -> RunDir:
    run_dir = Path(prefix).parent.parent  # <run dir>/checkpoints/ckpt-N
    if run_dir.name == "checkpoints":  # <run dir>/checkpoints/best/ckpt-N
        run_dir = run_dir.parent
    return RunDir(run_dir)


def _warn_if_other_precision(exp: Experiment, prefix: str) -> None:
    """An evaluation in another precision than the checkpoint was trained in does not
    reproduce its figures: say so, with the override that does."""
    started = _run_dir_of(prefix).started_config() or {}
    trained = started.get("precision")
    if trained and trained != exp.cfg.precision:
        log.warning("%s was trained with precision=%s and is evaluated with precision=%s, "
                    "which moves its figures by that precision's rounding; add "
                    "precision=%s to reproduce them", prefix, trained, exp.cfg.precision,
                    trained)


def resume(exp: Experiment) -> tuple[int, int]:
    """Restore the run dir's latest checkpoint, if any: (epochs done, steps into the next)."""
    latest = exp.manager.latest_checkpoint if exp.worker.is_chief else None

    def restore(prefix: str) -> None:
        if _holds(prefix, EPOCH_SUMS):
            _restore(exp.checkpoint, prefix, exp, what="resume from")
            return
        # written before checkpoints kept the epoch's running sums: the rest of its state
        state = {k: v for k, v in exp.state.items() if k != EPOCH_SUMS}
        _restore(tf.train.Checkpoint(**state), prefix, exp, what="resume from")
        if int(exp.step_in_epoch.numpy()):
            log.warning("%s predates the epoch sums in checkpoints: the history row of epoch "
                        "%d (which the target, early stopping and best checkpoint read) "
                        "covers only its steps after step %d", prefix,
                        int(exp.epoch.numpy()) + 1, int(exp.step_in_epoch.numpy()))

    if exp.worker.multi_worker:  # only the chief's disk need hold the run dir
        multi_worker.restore_from_chief(exp, latest, restore)
    elif latest:
        restore(latest)
    if not latest:  # rows of an attempt killed before its first checkpoint are trained again
        exp.run_dir.truncate_history(0)
        return int(exp.epoch.numpy()), int(exp.step_in_epoch.numpy())
    epoch, step = int(exp.epoch.numpy()), int(exp.step_in_epoch.numpy())
    exp.run_dir.truncate_history(epoch)
    log.info("resuming from %s: %d epoch(s) done, %d step(s) into the next", latest, epoch, step)
    return epoch, step


def _holds(prefix: str, name: str) -> bool:
    """Whether checkpoint `prefix` saved an object `name` at its root (True when it cannot be
    read: restoring it reports why)."""
    try:
        return any(key.split("/")[0] == name for key, _ in tf.train.list_variables(prefix))
    except (tf.errors.OpError, ValueError):
        return True


def restore_model(exp: Experiment, prefix: str) -> None:
    """Restore the model weights (and epoch counter) of `prefix`, checking they fit the model.

    Only those: they are restored into a twin of the model (same builder, outside any
    strategy scope), then copied. Restored into exp.model itself, the checkpoint's other
    objects under it would stay pending there: a `loop=keras_fit` checkpoint also holds
    model.optimizer (compile attaches it), which TensorFlow would restore into the optimizer a
    later compile attaches, this config's (other slots or shapes: an error)."""
    twin = models.build(exp.cfg.model, exp.data.input_shape, exp.data.outputs)
    _restore(tf.train.Checkpoint(**{**model_state(exp), "model": twin}), prefix, exp,
             what="restore", partial=True)
    for variable, value in zip(exp.model.variables, twin.variables, strict=True):
        variable.assign(value)


def _restore(checkpoint: tf.train.Checkpoint, prefix: str, exp: Experiment, what: str,
             partial: bool = False) -> None:
    status = None
    try:
        status = checkpoint.restore(prefix)
        if partial:
            status.expect_partial()
        status.assert_existing_objects_matched()
    except (tf.errors.DataLossError, tf.errors.OutOfRangeError, IndexError) as e:
        raise DistlabError(
            f"cannot {what} checkpoint {prefix}: it is truncated or corrupt ({first_line(e)}). "
            "Point ckpt_path at an intact checkpoint (ckpt-N prefix), or move the damaged files "
            "away; nothing was deleted"
        ) from None
    except (tf.errors.OpError, ValueError, AssertionError) as e:
        if status is not None:
            status.expect_partial()  # no list of unrestored values when it is deleted
        raise DistlabError(
            f"cannot {what} checkpoint {prefix}: it does not match the configured model "
            f"({exp.cfg.model.name}, dataset {exp.cfg.dataset.name}): {_mismatch(e)}. Use the "
            "overrides it was trained with (see its run dir's .hydra/config.yaml)"
        ) from None


def _mismatch(error: BaseException) -> str:
    """TF's mismatch message without the variables' values it lists."""
    text = first_line(error)
    return text.split(": [<", 1)[0].split(". Showing", 1)[0].rstrip(".")


def export_and_check(exp: Experiment) -> dict[str, Any]:
    """Export a SavedModel that serves raw inputs, and check it reloaded.

    Its `serve` and `serving_default` signatures take the dataset's raw inputs (dtype and
    shape as the dataset gives them, e.g. uint8 images) under the input name `inputs`, apply
    the inference-time preprocessing (`dataset.preprocess`; never augmentation), and return
    the model's outputs as `output_0`. The check compares raw-input predictions of the
    reloaded model, with and without the strategy, to the trained model's."""
    path = str(exp.run_dir.saved_model)
    data, model = exp.data, exp.model
    spec = tf.TensorSpec([None, *data.raw_input.shape], data.raw_input.dtype, name="inputs")

    def serve(inputs: tf.Tensor) -> tf.Tensor:
        return model(data.preprocess(inputs), training=False)

    archive = keras.export.ExportArchive()
    archive.track(model)
    for endpoint in ("serve", "serving_default"):
        archive.add_endpoint(endpoint, serve, input_signature=[spec])
    archive.write_out(path, verbose=False)
    raw = next(iter(data.raw_test.batch(32)))[0]
    expected = np.asarray(model(data.preprocess(raw), training=False))
    plain = tf.saved_model.load(path)
    default = plain.signatures["serving_default"](inputs=raw)["output_0"]
    diffs = [np.max(np.abs(plain.serve(raw).numpy() - expected)),
             np.max(np.abs(default.numpy() - expected))]
    with exp.strategy.scope():  # inside the scope it must be called through strategy.run
        scoped = tf.saved_model.load(path)
        outputs = exp.strategy.run(scoped.serve, args=(raw,))
    diffs.append(np.max(np.abs(exp.strategy.experimental_local_results(outputs)[0].numpy()
                               - expected)))
    diff = float(max(diffs))
    scale = max(1.0, float(np.max(np.abs(expected))))  # outputs can be large early in training
    tolerance = EXPORT_RTOL.get(exp.cfg.precision, EXPORT_RTOL["float32"])
    if diff > tolerance * scale:
        raise DistlabError(f"the exported SavedModel in {path} predicts differently from the "
                           f"trained model (max abs diff {diff:.3g} > {tolerance} x "
                           f"{scale:.3g}, the largest output, for precision={exp.cfg.precision})")
    log.info("exported %s: serving_default takes raw %s inputs %s (reloaded with and without "
             "the strategy, max abs diff %.2g)", path, data.raw_input.dtype.name,
             tuple(data.raw_input.shape), diff)
    return {"saved_model": "saved_model", "export_max_abs_diff": diff}
