"""benchmarks/lockstep.py, the protocol of `harness.py floor --lockstep`: processes that take
turns epoch by epoch, with plain Python children (no TensorFlow)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from conftest import ROOT, benchmark_module

lockstep = benchmark_module("lockstep")

# a child of `epochs` epochs: it takes its turn before the first and after each, writing
# "<name> <epoch>" to LOG as each epoch runs (appended: the order they ran in)
CHILD = """
import os, sys
sys.path.insert(0, {bench!r})
import lockstep
name, epochs, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lockstep.take_turn()
for e in range(epochs):
    with open(log, "a") as f:
        f.write(f"{{name}} {{e + 1}}\\n")
    lockstep.take_turn()
with open(log + "." + name, "w") as f:  # what a process it starts would inherit
    f.write(os.environ.get("LOCKSTEP_FDS", "unset"))
"""


def _children(tmp_path: Path, epochs: dict[str, int]) -> tuple[list[lockstep.Child], Path]:
    log = tmp_path / "order.log"
    code = CHILD.format(bench=str(ROOT / "benchmarks"))
    return [lockstep.Child(name, [sys.executable, "-c", code, name, str(n), str(log)],
                           str(tmp_path), tmp_path / f"{name}.out")
            for name, n in epochs.items()], log


def test_children_run_their_epochs_in_turns_rotated_each_epoch(tmp_path):
    children, log = _children(tmp_path, {"A": 3, "B": 3})
    lockstep.referee(children, 3, dict(os.environ), timeout=60, log=lambda line: None)
    assert log.read_text().split("\n")[:-1] == ["A 1", "B 1", "B 2", "A 2", "A 3", "B 3"]
    assert [c.status for c in children] == [0, 0]
    assert [len(c.turns) for c in children] == [3, 3]
    for name in "AB":  # taken out of the environment: a process it starts takes no turns
        assert (tmp_path / f"order.log.{name}").read_text() == "unset"


def test_a_child_that_ends_early_neither_hangs_the_others_nor_counts_its_turns(tmp_path):
    children, log = _children(tmp_path, {"A": 3, "B": 1})
    lockstep.referee(children, 3, dict(os.environ), timeout=60, log=lambda line: None)
    assert [c.status for c in children] == [0, 0]
    assert [len(c.turns) for c in children] == [3, 1]
    assert log.read_text().split("\n")[:-1] == ["A 1", "B 1", "A 2", "A 3"]


def test_a_child_past_the_deadline_is_killed_and_says_so(tmp_path):
    children = [lockstep.Child("slow", [sys.executable, "-c", "import time; time.sleep(60)"],
                               str(tmp_path), tmp_path / "slow.out")]
    lockstep.referee(children, 2, dict(os.environ), timeout=1, log=lambda line: None)
    assert children[0].timed_out and children[0].status == -9


@pytest.mark.parametrize("value", [None, "garbage", "files"])
def test_take_turn_without_its_pipes_does_nothing(value, monkeypatch, tmp_path):
    """No LOCKSTEP_FDS, a malformed one, or fds that are not pipes (here a file's): nothing
    written, nothing waited for."""
    lockstep._pipes.clear()
    path = tmp_path / "not_a_pipe"
    path.write_text("")
    with open(path) as r, open(path, "a") as w:
        if value is None:
            monkeypatch.delenv(lockstep.ENV, raising=False)
        else:
            monkeypatch.setenv(lockstep.ENV, f"{r.fileno()},{w.fileno()}" if value == "files"
                               else value)
        lockstep.take_turn()
    assert lockstep._pipes == [] and lockstep.ENV not in os.environ
    assert path.read_text() == ""
