"""`python SCRIPT ARGS` as a process of its own, forked from an interpreter that has already
imported TensorFlow, Keras, Hydra and distlab (multiprocessing's forkserver, one per test
process), so that the tests' many short runs do not each pay TensorFlow's import (most of a
tiny run's time).

The child is the same program as `python run.py ARGS` from the test's point of view: its own
pid, its own environment, working directory and argv, default signal handlers, exit status
(negative for a signal, as `subprocess` reports it), atexit handlers run at its end, output
captured. What it does not re-check is the import itself: the tests that a command is
refused before TensorFlow is imported use `conftest.run_command`, a fresh interpreter.
`DISTLAB_TEST_FRESH_PROCESSES=1` makes every run here a fresh interpreter too.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FRESH = os.environ.get("DISTLAB_TEST_FRESH_PROCESSES") == "1"
PRELOAD = ["tensorflow", "keras", "hydra", "omegaconf", "tensorflow_datasets",
           "distlab.cli", "distlab.training.runner"]
_context: multiprocessing.context.ForkServerContext | None = None


def _forkserver() -> multiprocessing.context.ForkServerContext:
    """The forkserver, started once, with this checkout's src/ first on its path (Python 3.11's
    forkserver ignores the sys.path it is given: without PYTHONPATH it would import the
    installed distlab, another checkout's in a git worktree)."""
    global _context
    if _context is None:
        from multiprocessing import forkserver

        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        saved = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [saved])])
        try:
            forkserver.ensure_running()
        finally:
            if saved is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = saved
        _context = context
    return _context


def _child(script: str, args: list[str], cwd: str, env: dict[str, str], out: str,
           err: str | None, new_session: bool = False) -> None:
    """In the forked process: become `python SCRIPT ARGS` in `cwd` with `env` (the leader of
    a session of its own when `new_session`)."""
    import faulthandler

    if new_session:
        os.setsid()

    for fd, path in ((1, out), (2, err or out)):
        target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOCTTY)
        os.dup2(target, fd)
        os.close(target)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python's own start-up does
    signal.signal(signal.SIGINT, signal.default_int_handler)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a hung test's stacks: kill -USR1
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # chosen again from this environment (TMPDIR), as at start-up
    os.chdir(cwd)
    sys.argv = [script, *args]
    sys.path[0] = str(Path(script).resolve().parent)
    os._exit(_run_as_main(script))


def _run_as_main(script: str) -> int:
    """Run `script` as `__main__`, then end as the interpreter does: non-daemon threads
    joined (and what libraries registered with threading, such as joblib's executor
    shutdown), then the atexit handlers; the exit status (a KeyboardInterrupt that nothing
    caught ends the process by SIGINT, as Python does)."""
    import atexit
    import runpy
    import threading
    import traceback

    status, interrupted = 0, False
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            status = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            status = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:
        traceback.print_exc()
        status = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return status


class Process:
    """A `subprocess.Popen` look-alike for `python SCRIPT ARGS` (text output; stderr into
    stdout when `merge_stderr`); `env` is added to this process' environment (a None value
    removes the variable). `fresh`: a new interpreter, for a test whose subject is what
    happens at import (a `sitecustomize`, an environment variable TensorFlow reads once).
    `new_session`: as Popen's start_new_session (a terminal's Ctrl-C is then
    `os.killpg(pid, SIGINT)`: the process and every process it started). `terminal`: its
    stdout and stderr on a pseudo-terminal (as in a user's shell), whose output is read
    back as the process's."""

    def __init__(self, script: str | Path, *args: str, cwd: Path = ROOT,
                 env: dict[str, str | None] | None = None, merge_stderr: bool = True,
                 fresh: bool = FRESH, new_session: bool = False, terminal: bool = False):
        self.args = [sys.executable, str(script), *args]
        self._folder = tempfile.TemporaryDirectory(prefix="distlab-test-proc-")
        self._out = Path(self._folder.name) / "stdout"
        self._err = None if merge_stderr or terminal else Path(self._folder.name) / "stderr"
        for path in (self._out, self._err):
            if path is not None:
                path.write_bytes(b"")
        self._terminal = _Terminal(self._out) if terminal else None
        target = self._terminal.path if self._terminal is not None else None  # both streams
        env = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
        self.returncode: int | None = None
        if fresh:
            with (open(target if terminal else self._out, "ab") as out,
                  open(target if terminal else self._err or self._out, "ab") as err):
                self._popen = subprocess.Popen(self.args, cwd=cwd, env=env, stdout=out,
                                               stderr=err, stdin=subprocess.DEVNULL,
                                               start_new_session=new_session)
            self.pid = self._popen.pid
            return
        self._popen = None
        self._process = _forkserver().Process(
            target=_child, args=(str(script), list(args), str(cwd), env,
                                 target if terminal else str(self._out),
                                 None if self._err is None else str(self._err), new_session))
        self._process.start()
        self.pid = self._process.pid

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = (self._popen.poll() if self._popen is not None
                               else self._process.exitcode)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self._popen is not None:
            self.returncode = self._popen.wait(timeout)
        else:
            self._process.join(timeout)
            if self.poll() is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        if self._terminal is not None:
            self._terminal.close()
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        """Wait for the end (TimeoutExpired on expiry, the process still running), then
        (stdout, stderr or None)."""
        self.wait(timeout)
        out = self._out.read_text(errors="replace")
        return out, None if self._err is None else self._err.read_text(errors="replace")

    def output_so_far(self) -> str:
        return self._out.read_text(errors="replace")

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __del__(self) -> None:
        if hasattr(self, "pid") and self.returncode is None and self.poll() is None:
            self.kill()
        if getattr(self, "_terminal", None) is not None:
            self._terminal.close()


class _Terminal:
    """A pseudo-terminal whose output a thread copies to the file `out`; `path` is what the
    child opens (this process holds its end open until `close`, after the child's end)."""

    def __init__(self, out: Path) -> None:
        import pty
        import threading

        self._master, self._slave = pty.openpty()
        self.path = os.ttyname(self._slave)
        self._reader = threading.Thread(target=self._copy, args=(out,), daemon=True)
        self._reader.start()

    def _copy(self, out: Path) -> None:
        """Until no end of the terminal is left open; then it closes the master end itself
        (so that no other file can be read under its number)."""
        with open(out, "ab", buffering=0) as f:
            try:
                while data := os.read(self._master, 65536):
                    f.write(data)
            except OSError:  # no writer is left: every end of the terminal closed
                pass
            finally:
                os.close(self._master)

    def close(self) -> None:
        """Close this process's end (after the child's): the copy drains and ends."""
        if self._slave is not None:
            os.close(self._slave)
            self._slave = None
            self._reader.join(timeout=10)


def run(script: str | Path, *args: str, timeout: float, cwd: Path = ROOT,
        env: dict[str, str | None] | None = None, fresh: bool = FRESH,
        ) -> subprocess.CompletedProcess:
    """As `subprocess.run([python, SCRIPT, *ARGS], capture_output=True, text=True)`: the
    process is killed on expiry (and TimeoutExpired raised)."""
    process = Process(script, *args, cwd=cwd, env=env, merge_stderr=False, fresh=fresh)
    try:
        out, err = process.communicate(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(30)
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)

