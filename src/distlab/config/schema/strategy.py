"""The `strategy` group's keys: which tf.distribute strategy, and its devices and workers."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from distlab.config.schema.rules import (
    NON_NEGATIVE,
    POSITIVE,
    checked,
    one_of,
)


@dataclass
class RayConfig:
    # null: start a Ray instance on this machine; "auto": join the cluster `ray start` runs
    # here; or a cluster's address (host:port, ray://host:10001)
    address: str | None = None
    # spread: the workers on different nodes where possible; pack: on as few as possible
    placement: str = checked("spread", one_of("spread", "pack"))
    num_cpus: float = checked(1.0, POSITIVE)  # CPUs reserved for each worker
    num_gpus: float = checked(0.0, NON_NEGATIVE)  # GPUs of each worker (it sees only those)


@dataclass
class StrategyConfig:
    name: str = MISSING  # default | one_device | mirrored | auto | multi_worker_mirrored
    # split the host CPU into N logical devices (no GPUs; mirrored/auto then have N replicas);
    # null: the one CPU device, also in a process an earlier job split
    cpu_devices: int | None = checked(None, POSITIVE)
    device: str | None = None  # one_device: e.g. "/gpu:0"; null: the first GPU, else the CPU
    # multi-worker: the collective implementation
    communication: str = checked("auto", one_of("auto", "ring", "nccl"))
    # multi-worker: where the cluster comes from: TF_CONFIG, or SLURM (launched by srun)
    cluster_resolver: str = checked("tf_config", one_of("tf_config", "slurm"))
    # multi-worker: exit, the unreachable workers named, if the cluster does not form
    connect_timeout_s: float = checked(120.0, POSITIVE)
    # cluster_resolver=slurm: a node's tasks listen on this port, the next one, ...
    slurm_port_base: int = checked(8888, (lambda v: 1024 <= v < 65536,
                                          "must be a port in [1024, 65536)"))
    # multi-worker: start this many workers from one command (without TF_CONFIG); with
    # TF_CONFIG or srun, null or the cluster's size
    workers: int | None = checked(None, POSITIVE)
    # strategy.workers: who starts them: local (processes on this machine) or ray (actors)
    launcher: str = checked("local", one_of("local", "ray"))
    ray: RayConfig = field(default_factory=RayConfig)  # strategy.launcher=ray
