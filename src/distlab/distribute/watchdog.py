"""A separate watchdog process for cluster formation.

MultiWorkerMirroredStrategy blocks inside TensorFlow's C++ runtime, holding the GIL and
ignoring SIGTERM, while a peer is missing; no thread of the waiting process can run. This
script, started as its own process, waits `timeout` seconds; if it has not been stopped by
then it names the workers that do not answer, writes the failed results.json the report
names (the chief's), and leaves the waiting process to faulthandler's timer, which ends it
with status 1 a moment later; it SIGKILLs the process only if that did not happen.

    python watchdog.py PARENT_PID TIMEOUT_S REPORT_JSON HOST:PORT [HOST:PORT ...]

REPORT_JSON is {"path": results.json or null, "results": the failed results to write}.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

KILL_AFTER_S = 15.0  # after the timeout, if faulthandler has not ended the process


def unreachable(workers: list[str]) -> list[str]:
    down = []
    for address in workers:
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
        except (OSError, ValueError):
            down.append(address)
    return down


def _run_dir_class() -> type:
    """distlab's RunDir, imported while waiting (so that the failure is written at once)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: src/
    from distlab.records.run_dir import RunDir

    return RunDir


def _write_failed(run_dir: type, report: dict, message: str, waited: float) -> None:
    if not report.get("path"):
        return
    run_dir(Path(report["path"]).parent).record_failure(
        {**report.get("results", {}), "error": message, "wall_time_s": waited})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def main(argv: list[str]) -> int:
    parent, timeout, report, workers = int(argv[0]), float(argv[1]), json.loads(argv[2]), argv[3:]
    started = time.time()
    run_dir = _run_dir_class()
    while time.time() - started < timeout:
        if os.getppid() != parent:  # the parent is gone: nothing to guard
            return 0
        time.sleep(0.2)
    down = ", ".join(unreachable(workers)) or "none refused a connection (a peer may be stuck)"
    message = (f"the multi-worker cluster did not form within strategy.connect_timeout_s="
               f"{timeout:g} s; unreachable workers: {down}. Start every worker listed in "
               "TF_CONFIG (or srun all tasks), or raise strategy.connect_timeout_s")
    # the failure first: faulthandler ends the waiting process (the test of it, or a
    # user's script, then reads results.json) GRACE_S after this timeout
    _write_failed(run_dir, report, message, time.time() - started)
    print(f"error: {message}", file=sys.stderr, flush=True)
    deadline = time.time() + KILL_AFTER_S
    while time.time() < deadline and _alive(parent) and os.getppid() == parent:
        time.sleep(0.2)
    if os.getppid() == parent and _alive(parent):
        os.kill(parent, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
