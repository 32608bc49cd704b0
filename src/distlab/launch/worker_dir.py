"""Where a non-chief worker of a multi-worker run writes what Hydra writes for every job.

The README's two-worker commands may give every worker the same `hydra.run.dir` (one
machine, or a shared filesystem): then worker 1's `.hydra/` and `run.log` would land in the
chief's run dir, its epoch lines interleaved with the chief's. A non-chief worker therefore
always writes to `<hydra.run.dir>-<task type><index>` (`runs/mw-worker1`), whatever dir it is
given; the chief's run dir is the chief's alone. No TensorFlow.
"""

from __future__ import annotations

from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, read_write

from distlab.distribute.cluster import Worker, current_worker
from distlab.errors import DistlabError


def non_chief(config: DictConfig) -> Worker | None:
    """This process's task when it is a non-chief worker of a multi-worker run, else None
    (a bad TF_CONFIG: None here, the job reports it)."""
    strategy = config.get("strategy")
    if strategy is None or strategy.get("name") != "multi_worker_mirrored":
        return None
    try:
        worker = current_worker(strategy)
    except DistlabError:
        return None
    return worker if worker.multi_worker and not worker.is_chief else None


def own_dir(path: str, worker: Worker) -> str:
    """A non-chief worker's own directory next to `path` (a path or an unresolved
    interpolation such as `outputs/${now:%H-%M-%S}`)."""
    return f"{path.rstrip('/')}-{worker.type}{worker.index}"


class NonChiefRunDir(Callback):
    """Hydra callback (conf/config.yaml): a non-chief worker's run (or sweep) dir becomes
    its own, before Hydra creates it."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._move(config, "run")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._move(config, "sweep")

    @staticmethod
    def _move(config: DictConfig, node: str) -> None:
        worker = non_chief(config)
        if worker is None:
            return
        raw = OmegaConf.to_container(config.hydra[node], resolve=False)["dir"]
        with read_write(config.hydra[node]):
            config.hydra[node].dir = own_dir(str(raw), worker)
