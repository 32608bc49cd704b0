"""The directions of a composed config's task metrics (a user task built to learn them), for
`distlab.records.ranking` to rank its objective: in a job, and in a sweeper before any job
runs."""

from __future__ import annotations

from omegaconf import DictConfig

from distlab.records.metrics import builtin_task_metrics


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

