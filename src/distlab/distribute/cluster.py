"""Who this process is in a multi-worker cluster (TF_CONFIG or SLURM), without TensorFlow.

Only the chief writes the run directory; the other workers write what TensorFlow needs
(checkpoints, SavedModel) to a temporary directory that is deleted afterwards.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import socket
from dataclasses import dataclass, field

from omegaconf import DictConfig

from distlab.errors import DistlabError


@dataclass
class Worker:
    """This process's role in the cluster (a lone chief outside one)."""

    type: str | None = None  # "worker" / "chief"; None outside a cluster
    index: int = 0
    workers: list[str] = field(default_factory=list)  # host:port of every task
    has_chief: bool = False  # the cluster names a separate "chief" task
    chief_run_dir: str | None = None  # the chief's run dir, once the workers exchanged it

    @property
    def multi_worker(self) -> bool:
        return len(self.workers) > 1

    @property
    def rank(self) -> int:
        """This task's position in `workers` (the chief task first, then the workers)."""
        return self.index + (1 if self.has_chief and self.type == "worker" else 0)

    @property
    def is_chief(self) -> bool:
        """As TF's tutorial: the chief task, or worker 0 when the cluster has no chief."""
        if self.type in (None, "chief"):
            return True
        return self.type == "worker" and self.index == 0 and not self.has_chief


def current_worker(strategy_cfg: DictConfig) -> Worker:
    """This process's task for `strategy=multi_worker_mirrored`; a lone chief otherwise."""
    if strategy_cfg.name != "multi_worker_mirrored":
        return Worker()
    if strategy_cfg.cluster_resolver == "slurm":
        return _sized(slurm_worker(strategy_cfg.slurm_port_base), strategy_cfg, "srun")
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return Worker()  # a single local worker
    return _sized(_tf_config_worker(raw), strategy_cfg, "TF_CONFIG")


def _sized(worker: Worker, strategy_cfg: DictConfig, source: str) -> Worker:
    """`worker`, unless strategy.workers is set to another size than its cluster's."""
    wanted = strategy_cfg.get("workers")
    if wanted is not None and wanted != len(worker.workers):
        raise DistlabError(
            f"strategy.workers={wanted} but {source} gives a cluster of "
            f"{len(worker.workers)} worker(s): unset strategy.workers (the cluster comes from "
            f"{source}) or set it to {len(worker.workers)}")
    return worker


def _tf_config_worker(raw: str) -> Worker:
    """This process's task as TF_CONFIG (`raw`) says."""
    try:
        tf_config = json.loads(raw)
        cluster, task = tf_config.get("cluster", {}), tf_config.get("task", {})
        workers = [a for role in ("chief", "worker") for a in cluster.get(role, [])]
        return Worker(type=task["type"], index=int(task.get("index", 0)), workers=workers,
                    has_chief=bool(cluster.get("chief")))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise DistlabError(
            f"TF_CONFIG is not valid JSON of the form {{\"cluster\": {{\"worker\": [\"host:port\""
            f", ...]}}, \"task\": {{\"type\": \"worker\", \"index\": 0}}}} ({e})"
        ) from None


def slurm_worker(port_base: int) -> Worker:
    """This srun task, and every task's host:port as TF's SlurmClusterResolver lays them out
    (hosts sorted, tasks of a host on consecutive ports from `port_base`)."""
    try:
        procid = int(os.environ["SLURM_PROCID"])
        hosts = expand_hostlist(os.environ["SLURM_STEP_NODELIST"])
        per_host = expand_tasks_per_node(os.environ["SLURM_STEP_TASKS_PER_NODE"])
    except KeyError as e:
        raise DistlabError(f"strategy.cluster_resolver=slurm but {e.args[0]} is not set: launch "
                           "every worker with srun inside a SLURM allocation") from None
    except ValueError as e:
        raise DistlabError(f"strategy.cluster_resolver=slurm: cannot read the SLURM step ({e})"
                           ) from None
    tasks = dict(zip(hosts, per_host, strict=False))
    workers = [f"{host}:{port_base + offset}" for host in sorted(tasks)
               for offset in range(tasks[host])]
    return Worker(type="worker", index=procid, workers=workers)


def expand_hostlist(hostlist: str) -> list[str]:
    """SLURM's compact host list ("a,node[01-03,7]") as host names."""
    hosts = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", hostlist):
        match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not match:
            hosts.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.split(","):
            first, _, last = item.partition("-")
            for n in range(int(first), int(last or first) + 1):
                hosts.append(f"{prefix}{n:0{len(first)}d}{suffix}")
    return hosts


def expand_tasks_per_node(spec: str) -> list[int]:
    """SLURM_STEP_TASKS_PER_NODE ("2(x3),1") as one count per node."""
    counts = []
    for item in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not match:
            raise ValueError(f"SLURM_STEP_TASKS_PER_NODE={spec!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


# Linux: the range connect() takes ports from
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LOWEST = 20000  # (Ray's worker processes listen on 10002-19999 by default)


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct ports free on `host` now, for workers that bind them later.

    Between 20000 and the kernel's ephemeral range where that is known (Linux: 32768-60999
    by default), so that no outgoing connection made meanwhile (Ray and gRPC make many) can
    take a port between this probe and the worker's bind. Where the range is unknown or
    starts below 20000, or after 100 draws per port all taken, the port the kernel picks
    (which may be in the ephemeral range). An address that cannot be bound raises OSError.
    """
    high = min(_ephemeral_start(), 65536) - 1
    rng, ports, tries = random.Random(), [], 0
    while len(ports) < n:
        tries += 1
        port = rng.randint(LOWEST, high) if high > LOWEST and tries <= 100 * n else 0
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError as e:
                if port and e.errno in (errno.EADDRINUSE, errno.EACCES):
                    continue  # taken (or reserved): draw another
                raise
            port = s.getsockname()[1]
        if port not in ports:
            ports.append(port)
    return ports


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (0 where it cannot be read)."""
    try:
        with open(EPHEMERAL_RANGE_FILE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
