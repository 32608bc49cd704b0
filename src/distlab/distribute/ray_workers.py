"""`strategy.launcher=ray`: the N workers of a multi-worker run as Ray actors.

The driver (the `distlab` command) connects to Ray (`strategy.ray.address`: null starts a
local instance, "auto" joins the cluster `ray start` runs on this machine), reserves one
placement-group bundle per worker (`num_cpus`, `num_gpus`; `placement`: spread over nodes or
packed), and starts one actor per bundle. Each actor reports its node's address and a free
port; the driver builds every worker's TF_CONFIG from them; each actor then starts the same
`distlab` command as a process with its TF_CONFIG in its environment (so TensorFlow is
imported after it is set, and Ray's CUDA_VISIBLE_DEVICES: each worker sees only its own
GPUs), its output in `<run dir>/workers/worker<i>.log` on its node (the chief's also sent to
the driver; the driver's DISTLAB_*, TFDS_*, TF_*, KERAS_* and MLFLOW_* variables are set on
every worker). The driver collects the statuses: a worker that fails or an actor that dies
ends the others (`local_workers.GRACE_S` to end by themselves, then their actors are
killed, and with them their processes) with one line; SIGTERM/SIGINT to the driver is sent on
to every worker as SIGTERM (TensorFlow's coordinated preemption). The run dir is the chief's,
on the chief's node. No TensorFlow here.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig

from distlab.distribute.cluster import free_ports
from distlab.distribute.local_workers import GRACE_S, source_path, tf_config
from distlab.errors import DistlabError

log = logging.getLogger("distlab")
PLACEMENT = {"spread": "SPREAD", "pack": "PACK"}
POLL_S = 0.5
FORWARDED = ("DISTLAB_", "TFDS_", "TF_", "KERAS_", "MLFLOW_")  # forwarded_env's prefixes
DIED = -1000  # a worker whose actor died (its process with it)


def import_ray():
    """Ray, or one line naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise DistlabError("strategy.launcher=ray needs Ray, which is not installed: pip "
                           "install 'distlab[ray]' (or use strategy.launcher=local)") from None
    return ray


class WorkerActor:
    """One worker's actor: its address, then its `distlab` process (no TensorFlow here)."""

    def __init__(self) -> None:
        self.proc = None
        self.threads: list[threading.Thread] = []

    def address(self) -> str:
        """host:port for this worker: its node's IP and a port free there now."""
        import ray

        return f"{ray.util.get_node_ip_address()}:{free_ports(1, host='')[0]}"

    def start(self, command: list[str], config: str, log_path: str, echo: bool,
              cwd: str, pythonpath: str) -> int:
        """Start the worker process with TF_CONFIG `config`; its pid."""
        from distlab.distribute.local_workers import start_worker

        env = {**os.environ, "TF_CONFIG": config, "PYTHONPATH": pythonpath}
        self.proc, self.threads = start_worker(
            command, env, Path(log_path), echo=echo, cwd=cwd if os.path.isdir(cwd) else None,
            parent_death=signal.SIGKILL)  # the actor's death is the worker's
        return self.proc.pid

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None:
            for thread in self.threads:
                thread.join(5)
        return code

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)


def forwarded_env() -> dict[str, str]:
    """The driver's environment variables that a worker needs too (Ray starts actors with the
    environment of the node's Ray, not the driver's): distlab's, tfds', TensorFlow's (not
    TF_CONFIG), Keras' and MLflow's, and a PYTHONPATH that reaches this distlab."""
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED) and k != "TF_CONFIG"}
    return {**env, "PYTHONPATH": source_path()}


def launch(cfg: DictConfig, run_dir: Path, arguments: Callable[[Path, int], list[str]]) -> int:
    """Run the workers on Ray; the exit status (the chief's, or the failure's)."""
    ray = import_ray()
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from distlab.distribute.local_workers import ending, program, worker_logs

    settings, n = cfg.strategy.ray, cfg.strategy.workers
    timeout = cfg.strategy.connect_timeout_s
    started = not ray.is_initialized()
    if started and settings.address not in (None, "auto"):
        reachable(str(settings.address), timeout)
    if started:
        local = {"include_dashboard": False} if settings.address is None else {}
        ray.init(address=settings.address, log_to_driver=True,
                 logging_level=logging.WARNING, **local)
    bundle = {"CPU": float(settings.num_cpus), **({"GPU": float(settings.num_gpus)}
                                                    if settings.num_gpus else {})}
    group = placement_group([dict(bundle) for _ in range(n)],
                            strategy=PLACEMENT[settings.placement])
    try:
        try:
            ray.get(group.ready(), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise DistlabError(
                f"the Ray cluster has no room for strategy.workers={n} workers of "
                f"strategy.ray.num_cpus={settings.num_cpus:g} and "
                f"strategy.ray.num_gpus={settings.num_gpus:g} (placement "
                f"{settings.placement}) within strategy.connect_timeout_s={timeout:g} s: "
                f"lower them, or add nodes (resources: {ray.cluster_resources()})") from None
        remote = ray.remote(WorkerActor)
        actors = [remote.options(
            num_cpus=settings.num_cpus, num_gpus=settings.num_gpus,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, i),
            runtime_env={"env_vars": forwarded_env()}).remote()
            for i in range(n)]
        cluster = ray.get([a.address.remote() for a in actors], timeout=timeout)
        while len(set(cluster)) < n:  # two actors of one node drew one port: draw again
            i = next(i for i, address in enumerate(cluster) if cluster.index(address) != i)
            cluster[i] = ray.get(actors[i].address.remote(), timeout=timeout)
        logs = worker_logs(run_dir, n)
        command = program()
        ray.get([a.start.remote([*command, *arguments(run_dir, i)], tf_config(cluster, i),
                                str(logs[i]), i == 0, os.getcwd(), source_path())
                 for i, a in enumerate(actors)], timeout=timeout)
        log.info("started %d workers as Ray actors (%s): the chief's output follows; each "
                 "worker's log is <run dir>/workers/worker<i>.log on its node", n,
                 ", ".join(cluster))
        codes, first, signalled = _wait(ray, actors)
        failure = _failure(codes, first, logs)
        return ending([_as_code(c) for c in codes], failure, cluster, signalled)
    finally:
        remove_placement_group(group)  # its actors end with it
        if started:
            ray.shutdown()


def _as_code(code: int | None) -> int | None:
    return None if code is None else (-signal.SIGKILL if code == DIED else code)


def _failure(codes: list[int | None], first: int | None, logs: list[Path]):
    """The first worker that failed (`first`), as a Failure; None when all ended well."""
    from distlab.distribute.local_workers import Failure

    if first is None:
        return None
    code = codes[first]
    return Failure(first, _as_code(code), logs[first],
                   reason="died with its Ray actor" if code == DIED else None)


def _wait(ray, actors: list) -> tuple[list[int | None], int | None, bool]:
    """Poll the workers until all ended (or one failed and the others had GRACE_S to end);
    their statuses (DIED: the actor died), the first that failed, and whether a signal was
    forwarded."""
    codes: list[int | None] = [None] * len(actors)
    signalled: list[int] = []
    expiry, first = None, None

    def forward(signum, frame):
        signalled.append(signum)
        for i, actor in enumerate(actors):
            if codes[i] is None:
                actor.signal.remote(signal.SIGTERM if len(signalled) == 1 else signal.SIGKILL)

    main = threading.current_thread() is threading.main_thread()
    previous = ({s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
                if main else {})
    try:
        while any(c is None for c in codes):
            for i, actor in enumerate(actors):
                if codes[i] is None:
                    try:
                        codes[i] = ray.get(actor.poll.remote(), timeout=60)
                    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                        codes[i] = DIED
                    if codes[i] and first is None:
                        first = i
            if expiry is None and first is not None:
                expiry = time.monotonic() + GRACE_S
            if expiry is not None and time.monotonic() > expiry:
                for i, actor in enumerate(actors):
                    if codes[i] is None:
                        ray.kill(actor)
                        codes[i] = -signal.SIGKILL
                break
            time.sleep(POLL_S)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return codes, first, bool(signalled)


def reachable(address: str, timeout: float) -> None:
    """Refuse, in one line, a `strategy.ray.address` (host:port, or ray://host:port) where
    nothing answers within `timeout` seconds: `ray.init` would retry it without end."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout):
            return
    except ValueError:
        raise DistlabError(f"strategy.ray.address={address!r} is not host:port (or auto, or "
                           "null for a local Ray instance)") from None
    except OSError as e:
        raise DistlabError(
            f"cannot reach Ray at strategy.ray.address={address} within "
            f"strategy.connect_timeout_s={timeout:g} s ({e.strerror or type(e).__name__}): "
            "start the head with `ray start --head` there, or give its address (or auto on "
            "a node of the cluster, null for a local instance)") from None
