"""Which keys a rerun into an existing run directory may change. No TensorFlow."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from distlab.config.checks import flatten, undeclared
from distlab.config.schema import GROUP_SCHEMAS, Config

# Keys a rerun into an existing run directory may change: they do not change what the
# optimizer sees (how long, how often to checkpoint or report, where data is read from).
RERUN_NEUTRAL_KEYS = {
    "trainer.epochs", "trainer.export", "trainer.best_checkpoint.test",
    "trainer.max_checkpoints", "trainer.validate_every",
    "trainer.checkpoint_every", "loop.verbose", "loop.steps_per_loop",
    "loop.steps_per_execution", "loop.jit_compile", "objective", "mode", "ckpt_path",
    "dataset.data_dir", "dataset.cache", "dataset.disk_cache", "dataset.cache_dir",
    "strategy.connect_timeout_s", "trainer.profile_steps", "trainer.throughput.warmup_epochs",
    "trainer.throughput.warmup_steps", "trainer.throughput.windows",
    # who starts the workers (the cluster's size is the checkpoint's business, as with TF_CONFIG)
    "strategy.workers", "strategy.launcher", "strategy.ray.address", "strategy.ray.placement",
    "strategy.ray.num_cpus", "strategy.ray.num_gpus",
}  # trainer.target is not: whether it was reached is part of the checkpoint
# every key under them (a rerun may add logger=mlflow; search: where the trial's study is
# stored, set by the Optuna sweeper, not what trains)
RERUN_NEUTRAL_GROUPS = ("logger", "search")


def effective(config: dict[str, Any]) -> dict[str, Any]:
    """`config` flattened to dotted keys, with what a null stands for filled in where it
    depends on another key (a cosine schedule's decay_epochs: trainer.epochs); a key the
    schema has now but the run's config lacks (a run started before that key existed, e.g.
    task.label_smoothing) at its default, which is what that run trained with; and without a
    key that no schema declares and nothing interpolated (added with `+` before distlab
    refused such keys: nothing read it)."""
    flat = flatten(config)
    for key in undeclared(config):
        flat.pop(key, None)
    defaults = OmegaConf.to_container(OmegaConf.structured(Config))  # top level, trainer, ...
    for group, options in GROUP_SCHEMAS.items():
        schema = options.get("") or options.get(str((config.get(group) or {}).get("name")))
        defaults[group] = (OmegaConf.to_container(OmegaConf.structured(schema))
                           if schema is not None and group in config else {})
    for key, value in flatten(defaults).items():
        if value != "???":  # (a key every config sets)
            flat.setdefault(key, value)
    if flat.get("schedule.name") == "cosine" and flat.get("schedule.decay_epochs") is None:
        flat["schedule.decay_epochs"] = flat.get("trainer.epochs")
    return flat


def training_diff(started_with: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Dotted keys whose change would make a rerun train differently from the original run
    (compared by `effective` value: a cosine decay over trainer.epochs is a decay_epochs)."""
    old, new = effective(started_with), effective(now)
    absent = "<absent>"
    return sorted(k for k in old.keys() | new.keys()
                  if k not in RERUN_NEUTRAL_KEYS and k.split(".", 1)[0] not in RERUN_NEUTRAL_GROUPS
                  and old.get(k, absent) != new.get(k, absent))


# Keys the workers of one multi-worker run may set differently: where each machine reads and
# caches data, what it draws or profiles, and what only the chief uses (tracking, the
# objective, the checkpoint an evaluation restores). Every other key must be the chief's.
WORKER_LOCAL_KEYS = {
    "dataset.data_dir", "dataset.cache", "dataset.disk_cache", "dataset.cache_dir",
    "strategy.connect_timeout_s", "loop.verbose", "trainer.profile_steps", "objective",
    "ckpt_path",
}
WORKER_LOCAL_GROUPS = ("logger",)


def worker_config(config: dict[str, Any]) -> dict[str, Any]:
    """What every worker of a multi-worker run must agree on: `config` (resolved) as dotted
    keys, the per-machine keys left out."""
    return {k: v for k, v in effective(config).items()
            if k not in WORKER_LOCAL_KEYS and k.split(".", 1)[0] not in WORKER_LOCAL_GROUPS}


def worker_diff(chief: dict[str, Any], mine: dict[str, Any]) -> list[str]:
    """Dotted keys on which two `worker_config`s differ."""
    absent = "<absent>"
    return sorted(k for k in chief.keys() | mine.keys()
                  if chief.get(k, absent) != mine.get(k, absent))
