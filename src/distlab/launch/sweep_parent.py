"""A sweep job in a process of its own (hydra/launcher=joblib or submitit_local) stops, with
a checkpoint, when the sweep's process dies (kill -9, a lost terminal): it would otherwise
train on unseen, holding its run dir, so that a rerun of the sweep is refused.

The sweep's process puts its pid in the environment its job processes inherit
(`mark_sweep_process`, when the sweep starts); a job process that is not that process
watches it (`stop_when_orphaned`) and, once it is gone, sends itself SIGTERM: the job's own
signal handling checkpoints at the next step boundary, writes results.json (interrupted) and
exits (`exit_if_orphaned`: the process too), and a rerun of the sweep resumes it. No
TensorFlow.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

log = logging.getLogger("distlab")
SWEEP_PID = "DISTLAB_SWEEP_PID"
POLL_S = 0.5
_watched: set[int] = set()  # sweep processes this process watches (one thread each)
_orphaned = threading.Event()  # the sweep's process is gone


def mark_sweep_process() -> None:
    """Called in the sweep's own process when it starts."""
    os.environ[SWEEP_PID] = str(os.getpid())


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def stop_when_orphaned() -> None:
    """In a job process a launcher started: SIGTERM to itself once the sweep's process is
    gone (a no-op in the sweep's own process, or outside a sweep)."""
    raw = os.environ.get(SWEEP_PID, "")
    if not raw.isdigit() or int(raw) == os.getpid() or int(raw) in _watched:
        return
    parent = int(raw)
    _watched.add(parent)

    def watch() -> None:
        while alive(parent):
            time.sleep(POLL_S)
        log.warning("the sweep's process (pid %d) is gone: this job stops at the next step "
                    "with a checkpoint; rerun the sweep to resume it", parent)
        _orphaned.set()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="distlab-sweep-parent", daemon=True).start()


def exit_if_orphaned(status: int) -> None:
    """After a job: a process whose sweep is gone ends now (a launcher's worker would wait
    for jobs that never come), with the job's exit `status`."""
    if _orphaned.is_set():
        logging.shutdown()
        os._exit(status)
