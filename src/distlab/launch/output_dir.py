"""The Hydra callback (conf/config.yaml) that refuses a run's or sweep's output dir, and a
sweep's settings, that the command line's own checks (`distlab.cli`) could not see: values
from a YAML or an interpolation. It runs before Hydra creates the directory; a refusal is
one line, exit 2."""

from __future__ import annotations

import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from distlab.config.checks import swept_objective
from distlab.records.run_dir import refused_output_dir


class CheckedOutputDir(Callback):
    """Refuse, before Hydra creates it, an empty output dir or one with `[ ] * ?`; in a
    sweep also an empty `hydra.sweep.subdir` (every job in one dir) and a sweep over
    `objective` (in `hydra.sweeper.params` or the overrides: a multirun a YAML's
    `hydra.mode` makes, such as hparams_search=optuna's, has no `-m` to check)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _refuse(_dir_problem(config, "hydra.run.dir"))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _refuse(_dir_problem(config, "hydra.sweep.dir"))
        raw = OmegaConf.to_container(config.hydra.sweep, resolve=False).get("subdir")
        if raw is not None and not str(raw).strip():
            _refuse("hydra.sweep.subdir is empty, so every job would write into the sweep "
                    "dir itself: give each job a folder (the default ${hydra.job.num})")
        params = OmegaConf.select(config, "hydra.sweeper.params", default=None) or {}
        task = OmegaConf.select(config, "hydra.overrides.task", default=None) or []
        _refuse(swept_objective([*(f"{k}={v}" for k, v in params.items()), *map(str, task)]))


def _dir_problem(config: DictConfig, key: str) -> str | None:
    try:
        target = OmegaConf.select(config, key, throw_on_missing=True)
    except Exception:  # noqa: BLE001 - an interpolation Hydra reports itself
        return None
    return None if target is None else refused_output_dir(key, str(target))


def _refuse(problem: str | None) -> None:
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)  # (Hydra turns a callback's Exception into a warning)
