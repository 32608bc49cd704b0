"""The experiment: every piece a run is built from, built once from the config, then read.

`build` resolves each group through its registry (data, task, model, schedule, optimizer,
monitors) inside the strategy's scope, and copies the task's stateful metrics into it; a
training run's chief records which rows its splits hold (`data.fingerprint`). Nothing here
saves a model, restores or trains: checkpoints (`training.checkpoints`) and the epoch
loop (`training.controller`) take an Experiment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from omegaconf import DictConfig

from distlab.components import models, optimizers, schedules, tasks
from distlab.components.tasks import Task
from distlab.config.figures import check_objective
from distlab.data import fingerprint, pipeline
from distlab.data.stream import Data, is_default
from distlab.distribute.cluster import Worker
from distlab.records.run_dir import RunDir
from distlab.training.actions.monitors import Monitors
from distlab.training.epoch_sums import SumsLayout
from distlab.training.metrics import StatefulMetrics


@dataclass(frozen=True)
class Experiment:
    """The built pieces of one run, and where it writes."""

    cfg: DictConfig
    strategy: tf.distribute.Strategy
    data: Data
    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    schedule: Any  # a keras LearningRateSchedule, per step, shared by every loop
    task: Task  # the loss and metrics (the `task` group)
    metrics: StatefulMetrics  # the task's stateful Keras metrics, copied into the scope
    sums: SumsLayout  # the layout of the sums the epochs' training figures are made of
    monitors: Monitors  # target, early stopping, best checkpoint (state in the checkpoint)
    run_dir: RunDir
    worker: Worker  # this process's role in a multi-worker cluster (a lone chief outside)
    started: float  # when this job started building (time to first step's zero)
    origin: float  # wall_time_s' and time_to_target_s' zero (see `distlab.launch.job.run`)

    @property
    def model_outputs(self) -> int:
        """The units of the model's output: the task's (task=binary: 1), else the dataset's
        classes or values per example."""
        return self.task.outputs or self.data.outputs

    def learning_rate_at_epoch(self, epoch: int) -> float:
        """The learning rate of the first step of `epoch` (0-based)."""
        return float(self.schedule(epoch * self.data.steps_per_epoch))


def build(cfg: DictConfig, run_dir: RunDir, strategy: tf.distribute.Strategy, worker: Worker,
          started: float, origin: float) -> Experiment:
    """The experiment `cfg` describes, under `strategy` (its variables in its scope)."""
    task = tasks.build(cfg.task)  # first: a task or metric mistake before the data loads
    data = pipeline.load(cfg.dataset, strategy.num_replicas_in_sync, cfg.seed,
                         cfg.trainer.steps_per_epoch, getattr(task.loss, "ignore_class", None))
    if cfg.mode == "train" and worker.is_chief:  # what an evaluation of it must score on
        fingerprint.record(run_dir.splits_json, fingerprint.of_splits(cfg.dataset, data.splits))
    tasks.check_labels(task, cfg.task.name, data.name, data.classes, data.outputs,
                       sample=lambda: some_labels(data))
    check_objective(cfg.objective, cfg.task.name, task.metric_names,  # a user task's: now
                    data.validation is not None)
    lr = learning_rate(cfg, effective_batch_size(cfg, data.global_batch_size))
    with strategy.scope():
        model = models.build_for(cfg.model, data, task.outputs or data.outputs)
        schedule = schedules.build(cfg.schedule, lr, data.steps_per_epoch, cfg.trainer.epochs)
        optimizer = optimizers.with_training_options(
            optimizers.build(cfg.optimizer, schedule), cfg.trainer.grad_accum_steps,
            loss_scaling=cfg.precision == "mixed_float16",
            distributed=not is_default(strategy),
            epochs=cfg.trainer.epochs if cfg.mode == "train" else None,
            steps_per_epoch=data.steps_per_epoch)
        # Build the slots now, inside the scope: a custom loop must not create them while
        # tracing, and restoring a checkpoint needs them to exist.
        optimizer.build(model.trainable_variables)
    tasks.settle(task, model)
    metrics = StatefulMetrics(task, strategy, sample=lambda: one_row(data, model))
    return Experiment(cfg=cfg, strategy=strategy, data=data, model=model, optimizer=optimizer,
                      schedule=schedule, task=task, metrics=metrics,
                      sums=SumsLayout(task, metrics),
                      monitors=Monitors(cfg.trainer, task, data.validation is not None),
                      run_dir=run_dir, worker=worker, started=started, origin=origin)


def some_labels(data: Data, rows: int = 1024) -> np.ndarray:
    """The test split's first `rows` labels (raw), flattened."""
    labels = [np.asarray(y).ravel() for _, y in data.raw_test.take(rows).as_numpy_iterator()]
    return np.concatenate(labels) if labels else np.zeros(0)


def one_row(data: Data, model: keras.Model) -> tuple[tf.Tensor, tf.Tensor]:
    """(labels, predictions) of one all-zeros input row, shaped and typed like the data's."""
    def zeros(spec: tf.TensorSpec) -> tf.Tensor:
        return tf.zeros([1, *(d or 1 for d in spec.shape)], spec.dtype)

    features, labels = (tf.nest.map_structure(zeros, s) for s in data.train.element_spec)
    return labels, model(features, training=False)


def effective_batch_size(cfg: DictConfig, global_batch_size: int) -> int:
    """Examples per optimizer update: the global batch x trainer.grad_accum_steps."""
    return global_batch_size * cfg.trainer.grad_accum_steps


def learning_rate(cfg: DictConfig, global_batch_size: int) -> float:
    """The base learning rate after the batch-size scaling rule (`global_batch_size` is the
    effective batch: examples per update)."""
    opt = cfg.optimizer
    return optimizers.scaled_learning_rate(opt.learning_rate, opt.lr_scaling, global_batch_size,
                                           opt.base_batch_size)
