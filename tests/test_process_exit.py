"""A process whose runs are complete ends without the interpreter's teardown
(`distlab.cli.end_process_now`): exit handlers run and output (and every open file) is
flushed first; a cluster worker, or a process with a thread still running that the
interpreter would wait for, ends as usual. A process pool left running (a joblib sweep's
loky workers) is shut down as at the interpreter's exit, not waited for (the test's timeout
is under loky's 300 s idle timeout)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PROGRAM = """
import atexit, sys, threading, types
sys.modules.setdefault("tensorflow", types.ModuleType("tensorflow"))  # as after a run
from distlab.cli import end_process_now
atexit.register(lambda: open(sys.argv[1], "w").write("handler ran"))
held = open(sys.argv[3], "w")  # kept open in a global: its buffer is written at the end
held.write("a buffered line")
class Proxy:  # answers every attribute by loading what it stands for (tfds' lazy builders)
    def __getattribute__(self, name):
        open(sys.argv[1] + ".proxy", "w").write(name)
        raise AttributeError(name)
proxy = Proxy()
release = threading.Event()
if sys.argv[2] == "thread":
    threading.Thread(target=release.wait).start()
if sys.argv[2] == "process pool":  # joblib's loky workers idle 300 s before they end;
    from joblib import Parallel, delayed  # started from a daemon thread (distlab's Optuna
    pool = threading.Thread(  # sweeper with n_jobs=2), the pool's own thread is a daemon
        target=lambda: Parallel(n_jobs=2)(delayed(abs)(-i) for i in range(4)), daemon=True)
    pool.start()
    pool.join()
print("written before the end", end="")  # buffered: a pipe
end_process_now()
print(" | returned", end="")
release.set()
"""


@pytest.mark.parametrize("case", ["complete", "cluster worker", "thread", "process pool"])
def test_a_complete_process_ends_after_its_exit_handlers_with_its_output(tmp_path, case):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("TF_CONFIG", None)
    env.pop("SLURM_PROCID", None)
    if case == "cluster worker":
        env["TF_CONFIG"] = '{"cluster": {"worker": ["localhost:1"]}}'
    marker = tmp_path / "handler"
    held = tmp_path / "held.txt"
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(marker), case, str(held)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert marker.read_text() == "handler ran"
    assert held.read_text() == "a buffered line"
    assert not Path(f"{marker}.proxy").exists()  # looking for open files touched no object
    ended_early = case in ("complete", "process pool")
    assert done.stdout == "written before the end" + ("" if ended_early else " | returned")
