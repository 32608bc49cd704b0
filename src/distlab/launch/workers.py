"""`strategy=multi_worker_mirrored strategy.workers=N`: this command starts the N workers.

Without TF_CONFIG (and without srun), a single run with `strategy.workers` set becomes the
launcher of its workers: it starts N workers of the same command (`strategy.launcher=local`:
processes on this machine; `ray`: actors on a Ray cluster, `distlab.distribute.ray_workers`),
each with its TF_CONFIG, into the same run directory (the chief's; every worker's log in its
`workers/`), and ends with the chief's exit status, or the failure's. The launcher never
imports TensorFlow: each worker imports it after its TF_CONFIG is set.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path

from omegaconf import DictConfig

from distlab.errors import DistlabError

log = logging.getLogger("distlab")
USER_ERROR = 2


def launches(cfg: DictConfig) -> bool:
    """Whether this process starts the run's workers (rather than being one of them)."""
    strategy = cfg.get("strategy")
    if strategy is None or strategy.get("name") != "multi_worker_mirrored":
        return False
    workers = strategy.get("workers")
    return (workers is not None and strategy.get("cluster_resolver") == "tf_config"
            and not os.environ.get("TF_CONFIG")
            and (workers > 1 or strategy.get("launcher") == "ray"))


def worker_arguments(run_dir: Path, index: int, argv: list[str] | None = None) -> list[str]:
    """The command line's arguments (after the program) for worker `index`: this command's,
    with the chief's run dir (a non-chief writes what Hydra writes next to its log)."""
    args = [a for a in (sys.argv[1:] if argv is None else argv)
            if not a.lstrip("+").startswith("hydra.run.dir=")]
    where = run_dir if index == 0 else run_dir / "workers" / "worker"
    return [*args, f"hydra.run.dir={quoted(str(where))}"]


def quoted(value: str) -> str:
    """`value` as a Hydra override's value: as is when plain, else single-quoted."""
    if re.fullmatch(r"[\w./~:+@%-]+", value):
        return value
    # Hydra unescapes only the backslashes before a quote (or the closing one)
    escaped = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value)
    return "'" + escaped.replace("'", "\\'") + "'"


def launch(cfg: DictConfig, output_dir: str) -> int:
    """Start the workers, wait for them, return the exit status (the chief's, or the
    failure's); errors before any worker starts are one line."""
    from distlab.config import validate

    run_dir = Path(output_dir).resolve()
    try:
        validate(cfg)
        if cfg.strategy.launcher == "ray":
            from distlab.distribute import ray_workers

            return ray_workers.launch(cfg, run_dir, worker_arguments)
    except DistlabError as e:
        print(f"error: {e}", file=sys.stderr)
        return USER_ERROR
    return _launch_local(cfg.strategy.workers, run_dir)


def _launch_local(n: int, run_dir: Path) -> int:
    from distlab.distribute.local_workers import LocalWorkers, ending, program, worker_logs

    logs = worker_logs(run_dir, n)
    commands = [[*program(), *worker_arguments(run_dir, i)] for i in range(n)]
    workers = LocalWorkers.start(commands, logs, echo_chief=True)
    log.info("started %d workers on this machine (%s): the chief's output follows; every "
             "worker's log is in %s", n, ", ".join(workers.cluster), logs[0].parent)
    failure = workers.wait()
    return ending(workers.codes, failure, workers.cluster, workers.signalled is not None)
