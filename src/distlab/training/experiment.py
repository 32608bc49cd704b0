"""The experiment: every piece a run is built from, built once from the config, then read.

`build` resolves each group through its registry (data, task, model, schedule, optimizer,
monitors) inside the strategy's scope. Nothing here saves, restores or trains: checkpoints
(`training.checkpoints`) and the epoch loop (`training.controller`) take an Experiment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import keras
import tensorflow as tf
from omegaconf import DictConfig

from distlab.components import models, optimizers, schedules, tasks
from distlab.components.tasks import Task
from distlab.data import pipeline
from distlab.data.pipeline import Data
from distlab.distribute.cluster import Worker
from distlab.launch.results import check_objective
from distlab.launch.run_dir import RunDir
from distlab.training.actions.monitors import Monitors


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
    monitors: Monitors  # target, early stopping, best checkpoint (state in the checkpoint)
    run_dir: RunDir
    worker: Worker  # this process's role in a multi-worker cluster (a lone chief outside)
    started: float  # when this job started building (wall_time_s' zero)
    origin: float  # time-to-target's zero: the process start (a sweep job: its own start)

    def learning_rate_at_epoch(self, epoch: int) -> float:
        """The learning rate of the first step of `epoch` (0-based)."""
        return float(self.schedule(epoch * self.data.steps_per_epoch))


def build(cfg: DictConfig, run_dir: RunDir, strategy: tf.distribute.Strategy, worker: Worker,
          started: float, origin: float) -> Experiment:
    """The experiment `cfg` describes, under `strategy` (its variables in its scope)."""
    data = pipeline.load(cfg.dataset, strategy.num_replicas_in_sync, cfg.seed,
                         cfg.trainer.steps_per_epoch)
    task = tasks.build(cfg.task)
    tasks.check_labels(task, cfg.task.name, data.name, data.classes)
    check_objective(cfg.objective, cfg.task.name, task.metric_names,  # a user task's: now
                    data.validation is not None)
    lr = learning_rate(cfg, effective_batch_size(cfg, data.global_batch_size))
    with strategy.scope():
        model = models.build_for(cfg.model, data)
        schedule = schedules.build(cfg.schedule, lr, data.steps_per_epoch, cfg.trainer.epochs)
        optimizer = optimizers.with_training_options(
            optimizers.build(cfg.optimizer, schedule), cfg.trainer.grad_accum_steps,
            loss_scaling=cfg.precision == "mixed_float16",
            distributed=not pipeline.is_default(strategy),
            epochs=cfg.trainer.epochs if cfg.mode == "train" else None,
            steps_per_epoch=data.steps_per_epoch)
        # Build the slots now, inside the scope: a custom loop must not create them while
        # tracing, and restoring a checkpoint needs them to exist.
        optimizer.build(model.trainable_variables)
    tasks.settle(task, model)
    return Experiment(cfg=cfg, strategy=strategy, data=data, model=model, optimizer=optimizer,
                      schedule=schedule, task=task,
                      monitors=Monitors(cfg.trainer, task, data.validation is not None),
                      run_dir=run_dir, worker=worker, started=started, origin=origin)


def effective_batch_size(cfg: DictConfig, global_batch_size: int) -> int:
    """Examples per optimizer update: the global batch x trainer.grad_accum_steps."""
    return global_batch_size * cfg.trainer.grad_accum_steps


def learning_rate(cfg: DictConfig, global_batch_size: int) -> float:
    """The base learning rate after the batch-size scaling rule (`global_batch_size` is the
    effective batch: examples per update)."""
    opt = cfg.optimizer
    return optimizers.scaled_learning_rate(opt.learning_rate, opt.lr_scaling, global_batch_size,
                                           opt.base_batch_size)
