"""The suite's tiers (tests/tiers.py): which tests the suite leaves to the exhaustive tier,
and the guard against a name there that no test has."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import conftest
import pytest
import tiers

TESTS = Path(__file__).parent


def _functions(file: str) -> set[str]:
    tree = ast.parse((TESTS / file).read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_every_name_in_tiers_is_a_test_function_of_its_file():
    for key in [*tiers.EXHAUSTIVE_TESTS, *tiers.EXHAUSTIVE_VARIANTS]:
        file, function = key.split("::")
        assert function in _functions(file), key
    assert not set(tiers.EXHAUSTIVE_TESTS) & set(tiers.EXHAUSTIVE_VARIANTS)
    assert all(tiers.EXHAUSTIVE_VARIANTS.values())


def test_a_variant_is_exhaustive_when_tiers_names_it():
    key = ("test_sweep_signals.py::test_a_stopped_sweep_checkpoints_every_job_then_its_rerun_"
           "resumes_them")
    assert not tiers.exhaustive(key, "joblib-SIGTERM")
    assert tiers.exhaustive(key, "joblib-SIGINT")
    assert not tiers.exhaustive(key, "a-variant-added-later")  # the suite's
    whole = next(iter(tiers.EXHAUSTIVE_TESTS))
    assert tiers.exhaustive(whole, None) and tiers.exhaustive(whole, "any")
    assert not tiers.exhaustive("test_tiers.py::test_x", None)
    assert tiers.matches("custom-3replicas", "custom-*") and not tiers.matches("custom-3", "custom")
    assert not tiers.matches("keras_fit-custom", "custom-*")


class _Item:
    def __init__(self, file: str, name: str, variant: str | None = None):
        self.path = TESTS / file
        self.originalname = name
        self.name = name if variant is None else f"{name}[{variant}]"
        self.nodeid = f"tests/{file}::{self.name}"
        if variant is not None:
            self.callspec = SimpleNamespace(id=variant)


def test_problems_name_what_tiers_gets_wrong(monkeypatch):
    monkeypatch.setattr(tiers, "EXHAUSTIVE_TESTS", frozenset({"test_tiers.py::test_whole"}))
    monkeypatch.setattr(tiers, "EXHAUSTIVE_VARIANTS", {"test_tiers.py::test_v": ("ab", "b-*")})
    seen = {"test_tiers.py::test_whole": {None}, "test_tiers.py::test_v": {"a", "ab", "b-1"}}
    whole = {"test_tiers.py"}
    assert tiers.problems(seen, whole) == []
    # a function no test is, in a file collected whole (not when narrowed by id or --lf)
    assert tiers.problems({"test_tiers.py::test_v": {"a", "ab", "b-1"}}, whole) == [
        "tests/tiers.py names test_tiers.py::test_whole, which no test is: fix or remove "
        "the name"]
    assert tiers.problems({"test_tiers.py::test_v": {"a", "ab", "b-1"}}, set()) == []
    # a pattern no variant has; every variant exhaustive
    monkeypatch.setitem(tiers.EXHAUSTIVE_VARIANTS, "test_tiers.py::test_v", ("ab", "gone"))
    assert [p.split(" to ")[0] for p in tiers.problems(seen, whole)] == [
        "tests/tiers.py gives test_tiers.py::test_v[gone]"]
    monkeypatch.setitem(tiers.EXHAUSTIVE_VARIANTS, "test_tiers.py::test_v", ("*",))
    assert "leaves no variant of test_tiers.py::test_v" in tiers.problems(seen, whole)[0]
    # a file that is gone (renamed), whatever was collected
    monkeypatch.setattr(tiers, "EXHAUSTIVE_TESTS", frozenset({"test_gone.py::test_x"}))
    monkeypatch.setitem(tiers.EXHAUSTIVE_VARIANTS, "test_tiers.py::test_v", ("ab",))
    assert tiers.problems(seen, set()) == [
        "tests/tiers.py names test_gone.py::test_x, but there is no tests/test_gone.py: fix "
        "or remove the name"]


def test_a_test_asked_for_by_id_or_failed_last_time_is_asked_for():
    item = _Item("test_tiers.py", "test_v", "a")
    named = [(TESTS / "test_tiers.py", "test_v")]
    assert conftest._asked_for(item, named, {})
    assert conftest._asked_for(item, [(TESTS / "test_tiers.py", "test_v[a]")], {})
    assert not conftest._asked_for(item, [(TESTS / "test_tiers.py", "test_v[ab]")], {})
    assert not conftest._asked_for(item, [(TESTS / "test_tiers.py", "test_")], {})
    assert not conftest._asked_for(item, [(TESTS / "test_data.py", "test_v")], {})
    assert conftest._asked_for(item, [], {"tests/test_tiers.py::test_v[a]": True})
    assert not conftest._asked_for(item, [], {})


def test_a_file_given_whole_besides_an_id_of_it_is_not_narrowed():
    def narrowed(*args: str) -> set[str]:
        config = SimpleNamespace(args=list(args),
                                 invocation_params=SimpleNamespace(dir=TESTS.parent))
        return conftest._narrowed(config, conftest._named(config))

    one = "tests/test_lockstep.py::test_children_run_their_epochs_in_turns_rotated_each_epoch"
    assert narrowed(one) == {"test_lockstep.py"}
    assert narrowed(one, "tests/test_data.py") == {"test_lockstep.py"}
    assert narrowed(one, "tests/test_lockstep.py") == set()
    assert narrowed(one, "tests") == set()
    assert narrowed("tests/test_data.py") == set()


@pytest.mark.parametrize("exhaustive, markexpr, runs", [
    (False, "", False), (False, "not slow", False), (True, "slow", True),
    (False, "exhaustive", True), (False, "slow and not exhaustive", True)],
    ids=["default", "not-slow", "--exhaustive", "-m-exhaustive", "-m-not-exhaustive"])
def test_the_exhaustive_tier_runs_when_asked_for(exhaustive, markexpr, runs):
    options = {"exhaustive": exhaustive, "markexpr": markexpr}
    assert conftest.runs_exhaustive(SimpleNamespace(getoption=options.get)) is runs


@pytest.mark.slow  # pytest sessions that import TensorFlow
def test_a_session_under_xdist_stops_in_one_line_on_a_wrong_name_and_says_what_it_left_out(
        tmp_path):
    """The README's `-n 2`: a name in tiers.py that no test has stops the session in one
    line, exit 4, before any test (a worker's UsageError was xdist's INTERNALERROR); a
    session that leaves tests of the tier out says how many; one asked for by id runs."""
    plugin = tmp_path / "tiers_wrong.py"
    plugin.write_text("import tiers\n"
                      "tiers.EXHAUSTIVE_TESTS = tiers.EXHAUSTIVE_TESTS | "
                      "{'test_tiers.py::test_renamed'}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), str(TESTS), os.environ.get("PYTHONPATH", "")])}

    def pytest_run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2",
                               "-p", "no:cacheprovider", *args], cwd=TESTS.parent, env=env,
                              capture_output=True, text=True, timeout=300)

    wrong = pytest_run("-p", "tiers_wrong", "tests/test_tiers.py", "-m", "not slow")
    assert wrong.returncode == 4, wrong.stdout + wrong.stderr
    output = wrong.stdout + wrong.stderr
    assert "INTERNALERROR" not in output and " passed" not in output, output
    assert ("tests/tiers.py names test_tiers.py::test_renamed, which no test is: fix or "
            "remove the name") in output

    # test_lockstep.py's deadline test is the tier's; the help test asked for by id runs
    assert "test_lockstep.py::test_a_child_past_the_deadline_is_killed_and_says_so" in (
        tiers.EXHAUSTIVE_TESTS)
    asked = "test_config.py::test_help_into_a_closed_pipe_ends_without_a_traceback"
    assert asked in tiers.EXHAUSTIVE_TESTS
    fine = pytest_run("tests/test_lockstep.py", f"tests/{asked}", "-m", "not slow")
    assert fine.returncode == 0, fine.stdout + fine.stderr
    assert re.search(r"\b6 passed\b", fine.stdout), fine.stdout  # 5 of lockstep's, the help
    assert ("the exhaustive tier (tests/tiers.py) left out: 1 test in the files collected; "
            "--exhaustive or -m exhaustive runs them") in fine.stdout, fine.stdout
    assert "left out" not in wrong.stdout + wrong.stderr  # a session stopped runs nothing
