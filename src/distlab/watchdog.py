"""A separate watchdog process for cluster formation.

MultiWorkerMirroredStrategy blocks inside TensorFlow's C++ runtime, holding the GIL and
ignoring SIGTERM, while a peer is missing; no thread of the waiting process can run. This
script, started as its own process, waits `timeout` seconds; if it has not been stopped by
then it names the workers that do not answer and SIGKILLs the waiting process.

    python watchdog.py PARENT_PID TIMEOUT_S HOST:PORT [HOST:PORT ...]
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time


def unreachable(workers: list[str]) -> list[str]:
    down = []
    for address in workers:
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
        except (OSError, ValueError):
            down.append(address)
    return down


def main(argv: list[str]) -> int:
    parent, timeout, workers = int(argv[0]), float(argv[1]), argv[2:]
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.getppid() != parent:  # the parent is gone: nothing to guard
            return 0
        time.sleep(0.2)
    down = ", ".join(unreachable(workers)) or "none refused a connection (a peer may be stuck)"
    print(f"error: the multi-worker cluster did not form within strategy.connect_timeout_s="
          f"{timeout:g} s; unreachable workers: {down}. Start every worker listed in TF_CONFIG "
          "(or srun all tasks), or raise strategy.connect_timeout_s", file=sys.stderr, flush=True)
    os.kill(parent, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
