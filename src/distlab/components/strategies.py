"""tf.distribute strategies from the `strategy` group."""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import tensorflow as tf
from omegaconf import DictConfig

from distlab.distribute.cluster import current_worker, expand_tasks_per_node
from distlab.errors import DistlabError
from distlab.registry import STRATEGIES  # lists the builders here by import path

log = logging.getLogger(__name__)


_jobs_configured = 0  # configure_devices calls in this process: a later one is a later job


def configure_devices(cfg: DictConfig) -> None:
    """Split the host CPU into `cfg.cpu_devices` logical devices. Must run before any TF op.

    A process whose runtime already has at least that many logical CPUs (an earlier job of
    an in-process sweep, a test session) is fine: the strategy then uses the first N. If it
    has fewer, the error names what started TensorFlow: a user module at import, or an
    earlier job in this process.
    """
    global _jobs_configured
    from distlab import plugins

    wanted = cfg.cpu_devices
    earlier_job = _jobs_configured > 0
    _jobs_configured += 1
    if not wanted:
        return
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(wanted)]
        )
    except RuntimeError:  # the runtime is already initialised
        have = len(tf.config.list_logical_devices("CPU"))
        if have >= wanted:
            return
        cannot = (f"strategy.cpu_devices={wanted} cannot be applied: TensorFlow already runs "
                  f"in this process with {have} CPU device(s)")
        if module := plugins.started_tensorflow():
            raise DistlabError(
                f"{cannot}, started when module {module} was imported: it creates TensorFlow "
                "state at import (e.g. a module-level keras.metrics.AUC() or tf.Variable). "
                "Create TensorFlow objects inside functions (the registered builders), not "
                "at import") from None
        if earlier_job:
            raise DistlabError(
                f"{cannot}, started by an earlier job. Sweep it with one process per job "
                "(hydra/launcher=submitit_local or joblib); from Python, run it in a new "
                "process") from None
        raise DistlabError(
            f"{cannot}, started before distlab could set its devices (by code run or "
            "imported before the job). Create TensorFlow objects inside functions, not at "
            "import") from None


def _local_devices(cfg: DictConfig) -> list[str]:
    """All local GPUs; without GPUs, the first `cpu_devices` logical CPUs (null: the first,
    the one CPU device a fresh process has, also in a process an earlier job split)."""
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return [d.name for d in gpus]
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    return cpus[: cfg.cpu_devices or 1]


def default(cfg: DictConfig) -> tf.distribute.Strategy:
    return tf.distribute.get_strategy()


def one_device(cfg: DictConfig) -> tf.distribute.Strategy:
    device = cfg.device or ("/gpu:0" if tf.config.list_logical_devices("GPU") else "/cpu:0")
    return tf.distribute.OneDeviceStrategy(existing_device(device))


def _device_spec(device: str) -> tf.DeviceSpec | None:
    """`strategy.device` parsed ("/gpu:1", "GPU:1", "/cpu:0"); None if it is not a device."""
    try:
        return tf.DeviceSpec.from_string(device if device.startswith("/") else f"/{device}")
    except ValueError:
        return None


def trained_gpus(cfg: DictConfig, gpus: list) -> list:
    """Of `gpus` (one entry per GPU of this machine, in order), those a strategy of `cfg`
    trains on: `default` and `one_device` one (the first, or `cfg.device`'s; none when it
    names a CPU or no such GPU), the others every one. Empty: it trains on the CPU."""
    if not gpus or cfg.get("name") not in ("default", "one_device"):
        return list(gpus)
    device = cfg.get("device") if cfg.get("name") == "one_device" else None
    spec = _device_spec(device) if device else None
    if spec is None:  # the first GPU (an unparsable device is refused as the strategy builds)
        return list(gpus[:1])
    if (spec.device_type or "").upper() != "GPU":
        return []
    index = spec.device_index or 0
    return list(gpus[index:index + 1])


def existing_device(device: str) -> str:
    """`device` if this process has it (TF would silently place the work elsewhere)."""
    spec = _device_spec(device)
    have = [tf.DeviceSpec.from_string(d.name) for d in tf.config.list_logical_devices()]
    if spec is not None and spec.device_type and any(
            d.device_type == spec.device_type.upper() and d.device_index == (spec.device_index or 0)
            for d in have):
        return device
    names = ", ".join(f"/{d.device_type.lower()}:{d.device_index}" for d in have)
    raise DistlabError(f"strategy.device={device!r} does not exist on this machine; its devices "
                       f"are {names} (more CPUs with strategy.cpu_devices=N)")


def _mirrored(devices: list[str]) -> tf.distribute.MirroredStrategy:
    """MirroredStrategy over `devices`. Over logical CPUs, gradients are summed on one device
    (ReductionToOneDevice) instead of with collective ops: TF keys collective groups per
    process, so a second strategy over another number of CPUs in the same process (an
    in-process sweep) fails with "joining a group with size 3, but that group has size 2"."""
    cpus_only = all(_is_cpu(d) for d in devices)
    ops = tf.distribute.ReductionToOneDevice() if cpus_only and len(devices) > 1 else None
    return tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)


def mirrored(cfg: DictConfig) -> tf.distribute.Strategy:
    return _mirrored(_local_devices(cfg))


_COMMUNICATION = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


def auto(cfg: DictConfig) -> tf.distribute.Strategy:
    """MirroredStrategy when there is more than one local device, else no distribution
    (a 1-replica MirroredStrategy costs ~12% per step here, docs/BENCHMARKS.md)."""
    devices = _local_devices(cfg)
    return _mirrored(devices) if len(devices) > 1 else default(cfg)


def multi_worker_mirrored(cfg: DictConfig, results_json: Path | None = None,
                          failed: dict | None = None) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy from TF_CONFIG or SLURM; must be created before any TF op.

    TF waits forever for a missing peer, inside C++ with the GIL held and SIGTERM ignored,
    so no Python code of this process can act. A watchdog process names the unreachable
    workers and records `failed` in `results_json` (the chief's) after connect_timeout_s;
    faulthandler's C-level timer then ends this process with status 1 (no "Killed")."""
    resolver = (_slurm_resolver(cfg) if cfg.cluster_resolver == "slurm"
                else tf.distribute.cluster_resolver.TFConfigClusterResolver())
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=_COMMUNICATION[cfg.communication])
    report = json.dumps({"path": str(results_json) if results_json else None,
                         "results": failed or {}})
    watchdog_script = str(Path(__file__).parents[1] / "distribute" / "watchdog.py")
    watchdog = subprocess.Popen([sys.executable, watchdog_script,
                                 str(os.getpid()), str(cfg.connect_timeout_s), report,
                                 *current_worker(cfg).workers])
    with open(os.devnull, "w") as sink:
        faulthandler.dump_traceback_later(cfg.connect_timeout_s + GRACE_S, exit=True, file=sink)
        try:
            return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver,
                                                             communication_options=options)
        finally:
            faulthandler.cancel_dump_traceback_later()
            watchdog.kill()
            watchdog.wait()


GRACE_S = 5.0  # the watchdog reports first (its own start may lag); then this process ends


def _slurm_resolver(cfg: DictConfig) -> tf.distribute.cluster_resolver.SlurmClusterResolver:
    """TF's SlurmClusterResolver. On nodes without GPUs it is given one nominal GPU slot
    per task (it lays tasks out by GPUs, and asks nvidia-smi otherwise)."""
    slurm = tf.distribute.cluster_resolver.SlurmClusterResolver
    if tf.config.list_physical_devices("GPU"):
        return slurm(port_base=cfg.slurm_port_base)
    per_node = max(expand_tasks_per_node(os.environ.get("SLURM_STEP_TASKS_PER_NODE", "1")))
    return slurm(port_base=cfg.slurm_port_base, gpus_per_node=per_node, gpus_per_task=1,
                 auto_set_gpu=False)


def name(strategy: tf.distribute.Strategy) -> str:
    """The public class name (MultiWorkerMirroredStrategy, not CollectiveAllReduceStrategy)."""
    for public, label in ((tf.distribute.MultiWorkerMirroredStrategy,
                           "MultiWorkerMirroredStrategy"),
                          (tf.distribute.MirroredStrategy, "MirroredStrategy"),
                          (tf.distribute.OneDeviceStrategy, "OneDeviceStrategy")):
        if isinstance(strategy, public):
            return label
    return "DefaultStrategy" if strategy is tf.distribute.get_strategy() else type(
        strategy).__name__


def _is_cpu(device: str) -> bool:
    return "CPU" in device.upper().split("/")[-1]


def _worker_devices(strategy: tf.distribute.Strategy) -> tuple[str, ...]:
    try:
        return tuple(strategy.extended.worker_devices)
    except RuntimeError:  # the default strategy has none
        return ()


def local_cpu_replicas(strategy: tf.distribute.Strategy) -> int:
    """How many of this worker's replicas are (logical) CPU devices."""
    devices = _worker_devices(strategy)
    return sum(_is_cpu(d) for d in devices) if devices else 1


def build(cfg: DictConfig, results_json: Path | None = None,
          failed: dict | None = None) -> tf.distribute.Strategy:
    """The strategy `cfg` names (multi-worker: `results_json` gets `failed` on a timeout)."""
    if cfg.name == "multi_worker_mirrored":
        strategy = multi_worker_mirrored(cfg, results_json, failed)
    else:
        strategy = STRATEGIES.build(cfg.name, cfg)
    devices = _worker_devices(strategy)
    log.info("strategy %s with %d replica(s) on %s", name(strategy),
             strategy.num_replicas_in_sync, ", ".join(d.split("/")[-1] for d in devices) or "-")
    return strategy
