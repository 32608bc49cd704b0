"""Whole processes that take turns epoch by epoch: `python benchmarks/harness.py floor
--lockstep`.

Two runs timed one after the other on a VM whose speed drifts by itself (the floor's epoch
moved 2.5-4.2 s between runs of the same command, docs/BENCHMARKS.md section 27) differ by
more than the few percent sought between them. Here every process starts at once, loads
what it needs, then waits for its turn; the referee (`referee`, in the harness's process)
lets one process run one epoch at a time, the processes in a rotated order each epoch
(epoch 1: A B, epoch 2: B A, ...), so that epoch k of every process runs within seconds of
the others' epoch k, one at a time. A waiting process computes nothing (it blocks in a
`read`); work that a run leaves running in the background after an epoch (tf.data's
prefetch) overlaps the next process's epoch, as it would overlap the run's own next epoch.

The child's side: `take_turn()` (the floor script, before its first epoch and after each),
or the Keras callback `turn_callback()` (a distlab run: `+callbacks.lockstep._target_=
lockstep.turn_callback` with this folder on PYTHONPATH), which takes its turn when training
begins and after each epoch's end (after its history row, so outside the epoch's timing).
Both do nothing unless the referee set LOCKSTEP_FDS.
"""

from __future__ import annotations

import os
import select
import signal
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV = "LOCKSTEP_FDS"  # "<read fd>,<write fd>,<referee's pid>": the child's ends of its pipes


_pipes: list[int] = []  # this process's ends: [read, write], taken from LOCKSTEP_FDS once


def take_turn() -> None:
    """Say this process is ready and wait until the referee lets it run; once the referee
    has let go (its pipes closed), run freely. Without LOCKSTEP_FDS naming two pipes given
    to this very process (the variable is taken out of the environment at once, so that a
    process this one starts does not take turns it was not given): nothing."""
    given = os.environ.pop(ENV, None)
    if given is not None:
        try:
            *ends, referee_pid = (int(x) for x in given.split(","))
            if (len(ends) == 2 and referee_pid == os.getppid()
                    and all(stat.S_ISFIFO(os.fstat(fd).st_mode) for fd in ends)):
                for fd in ends:  # a process this one starts does not hold them open
                    os.set_inheritable(fd, False)
                _pipes[:] = ends
        except (ValueError, OSError):
            pass
    if not _pipes:
        return
    try:
        os.write(_pipes[1], b".")
        if os.read(_pipes[0], 1):  # (end of file: the referee has let go)
            return
    except OSError:  # the referee has gone
        pass
    _pipes.clear()


def turn_callback() -> Any:
    """A Keras callback that takes a turn when training begins and after each epoch ends."""
    import keras

    class Turn(keras.callbacks.Callback):
        def on_train_begin(self, logs: dict | None = None) -> None:
            take_turn()

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            take_turn()

    return Turn()


@dataclass
class Child:
    """One process of a lockstep run, seen from the referee."""

    name: str
    argv: list[str]
    cwd: str
    log: Path
    proc: subprocess.Popen | None = None
    to_child: int = -1
    from_child: int = -1
    turns: list[float] = field(default_factory=list)  # seconds of each turn granted
    ended: bool = False
    timed_out: bool = False  # killed at the deadline
    started: float = 0.0
    wall: float = 0.0  # seconds from its start to its exit
    usage: Any = None
    status: int | None = None

    def start(self, env: dict[str, str]) -> None:
        child_read, self.to_child = os.pipe()
        self.from_child, child_write = os.pipe()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("w") as out:
            out.write(" ".join(self.argv) + "\n")
            out.flush()
            self.started = time.perf_counter()
            self.proc = subprocess.Popen(
                self.argv, cwd=self.cwd, stdout=out, stderr=subprocess.STDOUT,
                env={**env, ENV: f"{child_read},{child_write},{os.getpid()}"},
                pass_fds=(child_read, child_write), preexec_fn=_die_with_the_referee)
        os.close(child_read)
        os.close(child_write)

    def wait_ready(self, deadline: float) -> bool:
        """Until the child says it is ready (True), or has ended or the deadline passed."""
        while not self.ended:
            left = deadline - time.perf_counter()
            if left <= 0:
                self.kill()
                self.timed_out = True
                return False
            ready, _, _ = select.select([self.from_child], [], [], min(left, 1.0))
            if ready:
                if os.read(self.from_child, 1):
                    return True
                self.ended = True  # end of file: it exited (or closed the pipe)
            elif self.exited():
                self.ended = True
        return False

    def exited(self) -> bool:
        """Whether the child has exited (left to `reap` to collect)."""
        assert self.proc is not None
        try:
            return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT
                             ) is not None
        except ChildProcessError:
            return True

    def grant(self) -> None:
        try:
            os.write(self.to_child, b"g")
        except OSError:
            self.ended = True

    def release(self) -> None:
        """No more turns: close its pipes (its next `take_turn` runs on freely)."""
        for fd in (self.to_child, self.from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        self.to_child = self.from_child = -1

    def kill(self) -> None:
        """SIGKILL (not collected: its pid stays its own until `reap`)."""
        if self.proc is not None:
            _kill(self.proc.pid)
        self.ended = True

    def reap(self, deadline: float) -> None:
        """Wait for its exit (killed at the deadline): status, wall time, rusage."""
        assert self.proc is not None
        self.status, self.usage, timed_out = reap(self.proc.pid, deadline)
        self.timed_out = self.timed_out or timed_out
        self.proc.returncode = self.status
        self.wall = time.perf_counter() - self.started


def reap(pid: int, deadline: float) -> tuple[int, Any, bool]:
    """Wait for child `pid` to exit, killed (SIGKILL) once `deadline` (`time.perf_counter`)
    has passed: its exit code, its own rusage (`ru_maxrss`: its peak RSS), and whether the
    deadline killed it."""
    timed_out = False
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.perf_counter() > deadline:
            _kill(pid)
            timed_out = True
            _, status, usage = os.wait4(pid, 0)
            break
        time.sleep(0.02)
    return os.waitstatus_to_exitcode(status), usage, timed_out


def _kill(pid: int) -> None:
    """SIGKILL to `pid`, which may have exited already (not yet collected: still its pid)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _die_with_the_referee() -> None:
    """A preexec_fn (Linux): the child is killed when the referee's process ends, whatever
    ends it (a signal to it alone included)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def referee(children: list[Child], epochs: int, env: dict[str, str], timeout: float,
            log: Any = print) -> None:
    """Start every child, then grant `epochs` turns to each, one at a time, epoch e's turns in
    the order rotated by e (the children's own figures time their epochs; each turn's seconds,
    which include a distlab run's epoch end, go to `Child.turns`); then release all and reap
    them. Interrupted (Ctrl-C), it kills them first."""
    deadline = time.perf_counter() + timeout
    try:
        for child in children:
            child.start(env)
        for child in children:
            child.wait_ready(deadline)
        for e in range(epochs):
            shift = e % len(children)
            for child in children[shift:] + children[:shift]:
                if child.ended:
                    continue
                start = time.perf_counter()
                child.grant()
                if child.wait_ready(deadline):
                    child.turns.append(time.perf_counter() - start)
            log(f"epoch {e + 1}: " + ", ".join(
                f"{c.name} {c.turns[e]:.2f} s" if len(c.turns) > e else f"{c.name} -"
                for c in children))
    except BaseException:
        for child in children:
            child.kill()
        raise
    finally:
        for child in children:
            child.release()
        for child in children:
            if child.proc is not None:
                child.reap(deadline)
