"""The objective of a composed config as a sweeper ranks it, before any job runs: the task's
metrics' directions (a user task built to learn them) for `distlab.records.ranking`."""

from __future__ import annotations

from omegaconf import DictConfig

from distlab.records.metrics import builtin_task_metrics
from distlab.records.ranking import direction


def task_metrics(cfg: DictConfig) -> dict[str, bool]:
    """{metric name: higher_is_better} of the configured task; a user task is built for it
    (its modules imported), which imports TensorFlow."""
    known = builtin_task_metrics(cfg.task)
    if known is not None:
        return known
    from distlab import plugins
    from distlab.components import tasks

    plugins.check(cfg)
    return {m.name: m.higher_is_better for m in tasks.build(cfg.task).metrics}


def objective_direction(cfg: DictConfig) -> str:
    """"maximize" or "minimize": how a sweeper ranks this config's objective."""
    return direction(cfg, task_metrics(cfg))
