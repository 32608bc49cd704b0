"""Ctrl-C and SIGTERM of a sweep whose jobs run in processes of their own
(hydra/launcher=joblib or submitit_local), or in the sweep's own process (Hydra's basic
launcher, joblib with n_jobs=1): the sweep's process decides, and each running job gets
one stop.

A terminal's Ctrl-C sends SIGINT to every process of the command: to the sweep's process,
to submitit's controller of each job (which then sends its job SIGINT again and kills it
a second later) and to joblib's workers (an idle one dies, and joblib then kills the
others). So when the sweep starts (`coordinate`, in the sweep's process) SIGINT is blocked
there, and so in every process it starts from then on (a signal mask is inherited): the
launchers' processes and the jobs no longer hear the terminal. The sweep's process takes
SIGINT (a thread waiting for it) and SIGTERM (a handler) alike: the first asks each running
job to stop (SIGTERM, once: the job checkpoints at its next step, writes results.json
`interrupted` and returns), and a job not yet started does not start; the launcher then
returns as usual, the summary is written and the sweep ends with one line and status 128+N
(`end`). A second signal asks again: the jobs stop at once, as a job does on its second.

The running jobs register in a directory the sweep's process names in the environment
(`run_job`). A job process that dies (kill -9) breaks joblib's pool, which kills the other
workers at once: before it does, the running jobs are asked to stop and waited for; the
launcher's error then ends the sweep with one line, its summary written (`broken`).
No TensorFlow.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from distlab.distribute.preemption import Signalled
from distlab.errors import described
from distlab.launch.sweep_parent import alive

log = logging.getLogger("distlab")
JOBS_DIR = "DISTLAB_SWEEP_JOBS"  # the environment variable naming the running jobs' directory
STOP = "stop"  # written there once the sweep stops: a job not yet started does not start
ENTRY = "job."  # + pid: a running job
WAIT_S = 300.0  # how long the sweep waits, at most, for its jobs to stop
POLL_S = 0.1
# the launchers whose jobs run in local processes of their own, and Hydra's basic one (its
# jobs in the sweep's process, as joblib's with n_jobs=1)
BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
LAUNCHERS = ("hydra_plugins.hydra_joblib_launcher.",
             "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
             BASIC_LAUNCHER)
NAMES = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM"}
T = TypeVar("T")


@dataclass
class Ending:
    """How a coordinated sweep ended otherwise than by itself: its exit status, its one line,
    and the signal that stopped it (None: a job's process died)."""

    status: int
    message: str
    signum: int | None = None


class _Sweep:
    """The sweep's process's side: the signals it got and the stops it sent."""

    def __init__(self, folder: Path, on_end: Callable[[], None] | None,
                 in_process: bool = False) -> None:
        self.folder, self.on_end = folder, on_end
        self.in_process = in_process  # Hydra's basic launcher: no job process to die
        self.lock = threading.RLock()  # a handler may run while the main thread holds it
        self.signals: list[int] = []
        self.asked: dict[int, int] = {}  # job pid: stops sent
        self.dead: list[str] = []  # the jobs whose process died, as the line names them
        self.ending: Ending | None = None

    def stop(self, signum: int) -> None:
        """A signal: no job starts from now on; each running job is asked (again) to stop."""
        with self.lock:
            self.signals.append(signum)
            if len(self.signals) == 1:
                self.mark_stopped()
            self.ask(times=len(self.signals))

    def mark_stopped(self) -> None:
        with contextlib.suppress(OSError):  # (the sweep has ended: nothing to stop)
            (self.folder / STOP).write_text("")

    def ask(self, pids: set[int] | None = None, times: int = 1) -> None:
        """SIGTERM to each running job (those in `pids`) until it has had `times` of them."""
        with self.lock:
            for pid, _ in running(self.folder):
                if (pids is None or pid in pids) and self.asked.get(pid, 0) < times:
                    if _signal_job(self.folder, pid):
                        self.asked[pid] = self.asked.get(pid, 0) + 1

    def stop_and_wait(self, pids: set[int] | None = None) -> None:
        """Ask the running jobs (those in `pids`) to stop, then wait until they have ended."""
        self.note_dead()
        self.mark_stopped()
        self.ask(pids, times=max(1, len(self.signals)))
        deadline = time.monotonic() + WAIT_S
        while any(pids is None or pid in pids for pid, _ in running(self.folder, live=True)):
            if time.monotonic() > deadline:
                log.warning("the sweep's jobs did not stop within %.0f s of being asked",
                            WAIT_S)
                return
            time.sleep(POLL_S)

    def note_dead(self) -> None:
        """Remember the registered jobs whose process is gone without ending the job."""
        with self.lock:
            for pid, record in running(self.folder):
                name = f"job {record.get('job', '?')} (pid {pid})"
                if not alive(pid) and name not in self.dead:
                    self.dead.append(name)


_sweep: _Sweep | None = None


def coordinate(config: DictConfig, on_end: Callable[[], None] | None = None) -> None:
    """In the sweep's process, as the sweep starts: take its signals as the module says when
    its launcher runs the jobs in local processes of their own (else nothing changes).
    `on_end`: what ends the sweep (its summary callback), called by `broken`."""
    global _sweep
    target = str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")
    if (_sweep is not None or not target.startswith(LAUNCHERS)
            or threading.current_thread() is not threading.main_thread()):
        return
    folder = Path(tempfile.mkdtemp(prefix="distlab-sweep-"))
    os.environ[JOBS_DIR] = str(folder)
    _sweep = sweep = _Sweep(folder, on_end, in_process=target == BASIC_LAUNCHER)
    joblib = "joblib" in target
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # nohup, `&`: stays ignored
        _start_resource_trackers(joblib)  # they unblock SIGINT in the thread that starts them
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        threading.Thread(target=_take_sigint, args=(sweep,), daemon=True,
                         name="distlab-sweep-sigint").start()
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, lambda n, frame: sweep.stop(n))
    if joblib:
        _before_joblib_kills()


def join(threads: list[threading.Thread]) -> None:
    """Join `threads` from the sweep's main thread in POLL_S steps. A signal that the kernel
    gave to another thread (one started before SIGINT was blocked keeps it unblocked:
    OpenBLAS starts one as numpy is imported) runs its handler in the main thread only when
    that thread next runs Python code, which an untimed join would put off until the
    threads end; so a Ctrl-C stops the running jobs at once, as with one thread."""
    for thread in threads:
        while thread.is_alive():
            thread.join(POLL_S)


def _take_sigint(sweep: _Sweep) -> None:
    while True:
        sweep.stop(signal.sigwait({signal.SIGINT}))


def _start_resource_trackers(joblib: bool) -> None:
    """multiprocessing's resource tracker unblocks SIGINT in the thread that starts it:
    started now, before SIGINT is blocked, it is not started again by the launcher."""
    with contextlib.suppress(Exception):
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
    if not joblib:
        return
    with contextlib.suppress(Exception):
        from joblib.externals.loky.backend import resource_tracker as loky_tracker

        loky_tracker.ensure_running()


def _before_joblib_kills() -> None:
    """joblib's pool kills its workers (SIGKILL) when one dies: first, the jobs running in
    them are asked to stop and waited for (each then has its checkpoint and results.json)."""
    try:
        from joblib.externals.loky.process_executor import _ExecutorManagerThread
    except ImportError:  # no joblib, or a version without it: nothing to guard
        return
    kill_workers = _ExecutorManagerThread.kill_workers
    if getattr(kill_workers, "distlab", False):
        return

    def stop_jobs_then_kill(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _sweep is not None:
            _sweep.stop_and_wait({p.pid for p in list(self.processes.values())})
        return kill_workers(self, *args, **kwargs)

    stop_jobs_then_kill.distlab = True  # type: ignore[attr-defined]
    _ExecutorManagerThread.kill_workers = stop_jobs_then_kill


class Stopped(Exception):  # noqa: N818 - the sweep's stop, as KeyboardInterrupt is
    """Raised in the sweep's process by a sweeper that would start more jobs after a stop;
    `broken` ends the sweep as the signal asks."""


def stopping() -> bool:
    """In the sweep's process: whether a signal has stopped the sweep (start no more jobs)."""
    return _sweep is not None and bool(_sweep.signals)


def job_interrupted(signum: int) -> None:
    """A job stopped by signal `signum`: in the sweep's own process (joblib with n_jobs=1
    runs its jobs there), the signal was the sweep's, so no job starts from now on."""
    if _sweep is not None and not _sweep.signals:
        _sweep.stop(signum)


def coordinated() -> bool:
    """Whether this process runs a job of (or is) a sweep that coordinates its stops."""
    return bool(os.environ.get(JOBS_DIR))


def end() -> Ending | None:
    """In the sweep's process, once its launcher has returned (or failed): how the sweep
    ended, if a signal or a dead job process ended it (None: it ran to its end)."""
    global _sweep
    sweep, _sweep = _sweep, None
    if sweep is None:
        return None
    os.environ.pop(JOBS_DIR, None)
    shutil.rmtree(sweep.folder, ignore_errors=True)
    if sweep.ending is None and sweep.signals:
        signum = sweep.signals[0]
        name = NAMES.get(signum, f"signal {signum}")
        sweep.ending = Ending(
            128 + signum,
            f"sweep stopped by {name}: each running job stopped with a checkpoint "
            "(results.json interrupted) and the jobs not yet started were not started; "
            "rerun the same command to resume them", signum)
    return sweep.ending


def broken(error: BaseException) -> int | None:
    """In the sweep's process, an error out of its launcher (a job's process died, say): the
    jobs still running are asked to stop and waited for, then the sweep ends (its summary, one
    line, status 1; returned when no summary callback ends it). None: no coordinated sweep."""
    sweep = _sweep
    if sweep is None:
        return None
    if sweep.in_process and not isinstance(error, Stopped):  # no job process died: the
        end()  # launcher's own error (Hydra's, writing the sweep dir), reported as outside
        return None  # a sweep
    sweep.stop_and_wait()
    what = (f"the process of {' and '.join(sweep.dead)} died without finishing (killed, or "
            "out of memory)" if sweep.dead else f"its launcher failed ({described(error)})")
    if sweep.ending is None and not sweep.signals:  # (after a signal: as the signal ends it)
        sweep.ending = Ending(
            1, f"sweep failed: {what}; the other running jobs stopped with a checkpoint "
            "(results.json interrupted): rerun the same command to resume them")
    if sweep.on_end is not None:
        sweep.on_end()  # ends the sweep: SystemExit with the status
    ending = end() or Ending(1, f"sweep failed: {what}")
    log.error(ending.message)
    return ending.status


# --------------------------------------------------------------------------- a job


def run_job(work: Callable[[], T], job: Any, run_dir: str | Path) -> T | None:
    """In a job of a coordinated sweep: `work()` (the job), registered as running so that the
    sweep's process can ask it to stop; None when the sweep is stopping and the job does not
    start. SIGTERM before `work` installs its own handling means: do not start."""
    folder = os.environ.get(JOBS_DIR)
    if not folder or threading.current_thread() is not threading.main_thread():
        return work()
    folder_path = Path(folder)
    if (folder_path / STOP).exists():
        return None
    running_now = True

    def not_started(signum: int, frame: Any) -> None:
        if running_now:
            raise Signalled(signum)

    previous = signal.signal(signal.SIGTERM, not_started)
    entry = folder_path / f"{ENTRY}{os.getpid()}"
    done = None
    try:
        entry.write_text(json.dumps({"job": job, "run_dir": str(run_dir)}))
        if (folder_path / STOP).exists():  # stopped while registering: not started
            return None
        done = work()
        return done
    except Signalled:  # before the job took its signals (or after it ended: its result)
        return done
    finally:
        running_now = False
        with _locked(entry) as held:  # a stop the sweep sends from now on is not for us
            if held:
                entry.unlink(missing_ok=True)
        signal.signal(signal.SIGTERM, previous)


def running(folder: Path, live: bool = False) -> Iterator[tuple[int, dict[str, Any]]]:
    """The registered jobs (pid, record); `live`: only those whose process runs."""
    for entry in sorted(folder.glob(f"{ENTRY}*")):
        pid = int(entry.name[len(ENTRY):])
        if live and not alive(pid):
            continue
        try:
            record = json.loads(entry.read_text() or "{}")
        except (OSError, ValueError):
            record = {}
        yield pid, record


def _signal_job(folder: Path, pid: int) -> bool:
    """SIGTERM to job `pid` if it is still registered (under its entry's lock, so never to a
    process whose job has ended); whether it was sent."""
    entry = folder / f"{ENTRY}{pid}"
    with _locked(entry) as held:
        if not held or not entry.exists():
            return False
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return False
        return True


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[bool]:
    """An flock on `path` while it exists (False: it does not)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield True
    finally:
        os.close(fd)
