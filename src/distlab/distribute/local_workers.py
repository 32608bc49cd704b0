"""N worker processes of one multi-worker run on this machine, started and ended together.

Each worker is a process of its own, started with its `TF_CONFIG` (127.0.0.1 and a free
port each) in its environment, so that it has it before TensorFlow's import; its output goes
to a log file (the chief's is also echoed to this process's stdout and stderr). `wait`
returns when every worker has ended, when one failed (the others are given `grace_s` to end
by themselves, as TensorFlow's collectives end them, then killed), or on expiry; SIGTERM or
SIGINT to this process is forwarded as SIGTERM to every worker (TensorFlow's coordinated
preemption: all of them checkpoint at one step). Used by `strategy.workers=N` and by
`distlab verify`'s workers check. No TensorFlow.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from distlab.distribute.cluster import free_ports

# seconds the other workers get to end by themselves after one failed (TensorFlow's
# collectives stop them within seconds; a loaded machine can take tens of seconds to exit)
GRACE_S = 60.0


def tf_config(cluster: Sequence[str], index: int) -> str:
    """The TF_CONFIG of worker `index` of `cluster` (host:port of every worker)."""
    return json.dumps({"cluster": {"worker": list(cluster)},
                       "task": {"type": "worker", "index": index}})


def local_cluster(n: int) -> list[str]:
    """host:port of `n` workers on this machine, on ports free now."""
    return [f"127.0.0.1:{port}" for port in free_ports(n)]


def source_path() -> str:
    """PYTHONPATH that makes a worker import this distlab (a checkout's src/ first)."""
    source = str(Path(__file__).resolve().parents[2])
    return os.pathsep.join([source, *filter(None, [os.environ.get("PYTHONPATH")])])


def status_text(code: int) -> str:
    """An exit status as the shell shows it (a signal: 128+N and its name)."""
    if code >= 0:
        return str(code)
    return f"{128 - code} (signal {signal.Signals(-code).name})"


def exit_status(code: int) -> int:
    """A Popen return code as a process exit status (a signal N: 128+N)."""
    return code if code >= 0 else 128 - code


def tail(path: Path, lines: int = 3) -> str:
    """The last non-blank `lines` of a log, joined by ' | '."""
    try:
        text = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(nothing)"


def _die_with(signum: int):
    """A preexec_fn (Linux): the worker gets `signum` when the process that started it dies
    (kill -9 of the launcher, a lost terminal: SIGTERM, so the workers checkpoint and stop
    with it; a killed Ray actor: SIGKILL, the worker dies with it)."""
    def preexec() -> None:
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signum)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    return preexec


def start_worker(command: Sequence[str], env: dict[str, str], log: Path, echo: bool = False,
                 cwd: str | None = None, parent_death: int = signal.SIGTERM
                 ) -> tuple[subprocess.Popen, list[threading.Thread]]:
    """One worker process (its own session: a terminal's Ctrl-C reaches the launcher only),
    its output appended to `log`; `echo`: also to this process's stdout/stderr (the threads
    that copy it are returned)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    options = {"env": env, "stdin": subprocess.DEVNULL, "start_new_session": True,
               "preexec_fn": _die_with(parent_death), "cwd": cwd}
    if not echo:
        with open(log, "ab") as out:
            return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                    **options), []
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **options)
    sink = open(log, "ab")  # noqa: SIM115 - closed by the last echo thread
    lock, done = threading.Lock(), []

    def copy(pipe: IO[bytes], to: IO[str]) -> None:
        for line in iter(pipe.readline, b""):
            with lock:
                sink.write(line)
                sink.flush()
            to.write(line.decode(errors="replace"))
            to.flush()
        with lock:
            done.append(pipe)
            if len(done) == 2:
                sink.close()

    threads = [threading.Thread(target=copy, args=(pipe, to), daemon=True)
               for pipe, to in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr))]
    for thread in threads:
        thread.start()
    return proc, threads


@dataclass
class Failure:
    """Why the workers did not all end well: the first worker that failed (or outlived the
    expiry), its status and log."""

    index: int
    code: int | None  # None: still running at expiry
    log: Path
    expired: bool = False
    reason: str | None = None  # what ended it, when not its exit status


    def line(self, cluster: Sequence[str]) -> str:
        who = f"worker {self.index} ({cluster[self.index]})"
        if self.expired:
            return (f"{who} still ran at the expiry and was killed; its last lines: "
                    f"{tail(self.log)} (log: {self.log})")
        what = self.reason or f"ended with status {status_text(self.code or 0)}"
        return (f"{who} {what}; its last lines: "
                f"{tail(self.log)} (log: {self.log})")


@dataclass
class LocalWorkers:
    """The worker processes of one run (`start`), their logs, and how they ended."""

    cluster: list[str]
    logs: list[Path]
    procs: list[subprocess.Popen] = field(default_factory=list)
    signalled: int | None = None  # the signal this process forwarded to the workers
    _echo: list[threading.Thread] = field(default_factory=list)

    @classmethod
    def start(cls, commands: Sequence[Sequence[str]], logs: Sequence[Path],
              env: dict[str, str] | None = None, echo_chief: bool = False,
              cluster: Sequence[str] | None = None) -> LocalWorkers:
        """Start worker i as `commands[i]` with its TF_CONFIG (and `env`) on `cluster` (default:
        free local ports), its output into `logs[i]`; `echo_chief`: worker 0's output also to
        this process's stdout/stderr."""
        cluster = list(cluster or local_cluster(len(commands)))
        workers = cls(cluster, [Path(p) for p in logs])
        base = {**os.environ, **(env or {}), "PYTHONPATH": source_path()}
        for index, command in enumerate(commands):
            proc, threads = start_worker(command, {**base, "TF_CONFIG": tf_config(cluster, index)},
                                         workers.logs[index], echo=echo_chief and index == 0)
            workers.procs.append(proc)
            workers._echo += threads
        return workers

    def wait(self, timeout: float | None = None, grace_s: float = GRACE_S) -> Failure | None:
        """Wait for every worker's end (SIGTERM/SIGINT meanwhile forwarded to all of them);
        None when all ended with status 0, else the first failure. The workers still running
        `grace_s` after a failure (or at the expiry) are killed."""
        expiry = None if timeout is None else time.monotonic() + timeout
        failure = None
        with self.forwarding_signals():
            while True:
                codes = [p.poll() for p in self.procs]
                if failure is None:
                    failure = next((Failure(i, c, self.logs[i]) for i, c in enumerate(codes)
                                    if c), None)
                    if failure is not None:
                        expiry = min(expiry or float("inf"), time.monotonic() + grace_s)
                if all(c is not None for c in codes):
                    break
                if expiry is not None and time.monotonic() > expiry:
                    late = next(i for i, c in enumerate(codes) if c is None)
                    failure = failure or Failure(late, None, self.logs[late], expired=True)
                    break
                time.sleep(0.1)
        self.kill()
        for thread in self._echo:
            thread.join(5)
        return failure

    @contextmanager
    def forwarding_signals(self) -> Iterator[None]:
        """SIGTERM/SIGINT to this process: SIGTERM to every worker (a second one: SIGKILL)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def forward(signum, frame):
            first = self.signalled is None
            self.signalled = self.signalled or signum
            for proc in self.procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM if first else signal.SIGKILL)

        previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def kill(self) -> None:
        """SIGKILL to every worker still running (TensorFlow ignores SIGTERM while it waits
        for its peers), then reap them."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    @property
    def codes(self) -> list[int | None]:
        return [p.poll() for p in self.procs]


def worker_logs(run_dir: Path, n: int) -> list[Path]:
    """Where each worker's output is kept: the run dir's workers/worker<i>.log."""
    return [run_dir / "workers" / f"worker{i}.log" for i in range(n)]


def program() -> list[str]:
    """This command's program, as a worker runs it (`python run.py`, the `distlab` script)."""
    script = sys.argv[0]
    if script in ("-c", "") or not Path(script).exists():
        return [sys.executable, "-m", "distlab"]
    return [sys.executable, str(Path(script).resolve())]


def ending(codes: list[int | None], failure, cluster: list[str], signalled: bool) -> int:
    """The launcher's exit status, and its one line when a non-chief worker failed (the
    chief reports its own failures and interruptions)."""
    chief = codes[0]
    if failure is not None and failure.index != 0 and not signalled:
        print(f"error: {failure.line(cluster)}; the other workers were stopped. Rerun the "
              "same command to resume from the chief's latest checkpoint", file=sys.stderr)
    if chief:
        return exit_status(chief)
    if failure is not None:
        return 1 if failure.code is None else exit_status(failure.code)
    return 0
