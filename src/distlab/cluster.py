"""Who this process is in a multi-worker cluster (TF_CONFIG or SLURM), without TensorFlow.

Only the chief writes the run directory; the other workers write what TensorFlow needs
(checkpoints, SavedModel) to a temporary directory that is deleted afterwards.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from omegaconf import DictConfig

from distlab.errors import DistlabError


@dataclass
class Task:
    type: str | None = None  # "worker" / "chief"; None outside a cluster
    index: int = 0
    workers: list[str] = field(default_factory=list)  # host:port of every task
    has_chief: bool = False  # the cluster names a separate "chief" task

    @property
    def is_chief(self) -> bool:
        """As TF's tutorial: the chief task, or worker 0 when the cluster has no chief."""
        if self.type in (None, "chief"):
            return True
        return self.type == "worker" and self.index == 0 and not self.has_chief


def current_task(strategy_cfg: DictConfig) -> Task:
    """This process's task for `strategy=multi_worker_mirrored`; a lone chief otherwise."""
    if strategy_cfg.name != "multi_worker_mirrored":
        return Task()
    if strategy_cfg.cluster_resolver == "slurm":
        procid = os.environ.get("SLURM_PROCID")
        if procid is None:
            raise DistlabError("strategy.cluster_resolver=slurm but SLURM_PROCID is not set: "
                               "launch with srun inside a SLURM allocation")
        return Task(type="worker", index=int(procid))
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return Task()  # a single local worker
    try:
        tf_config = json.loads(raw)
        cluster, task = tf_config.get("cluster", {}), tf_config.get("task", {})
        workers = [a for role in ("chief", "worker") for a in cluster.get(role, [])]
        return Task(type=task["type"], index=int(task.get("index", 0)), workers=workers,
                    has_chief=bool(cluster.get("chief")))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise DistlabError(
            f"TF_CONFIG is not valid JSON of the form {{\"cluster\": {{\"worker\": [\"host:port\""
            f", ...]}}, \"task\": {{\"type\": \"worker\", \"index\": 0}}}} ({e})"
        ) from None
