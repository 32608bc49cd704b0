"""The suite's tiers (tests/tiers.py): which tests the suite leaves to the exhaustive tier,
and the guard against a name there that no test has."""

from __future__ import annotations

import ast
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
    for key in [*tiers.EXHAUSTIVE_TESTS, *tiers.SUITE_VARIANTS]:
        file, function = key.split("::")
        assert function in _functions(file), key
    assert not set(tiers.EXHAUSTIVE_TESTS) & set(tiers.SUITE_VARIANTS)
    assert all(tiers.SUITE_VARIANTS.values())  # a function keeps at least one variant


def test_a_variant_is_exhaustive_unless_the_suite_keeps_its_prefix():
    key = "test_reliability.py::test_sigkill_then_rerun_resumes_exactly"
    assert not tiers.exhaustive(key, "custom-precision=mixed_bfloat16")
    assert tiers.exhaustive(key, "keras_fit-trainer.grad_accum_steps=4")
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
        if variant is not None:
            self.callspec = SimpleNamespace(id=variant)
        self.marks: list[str] = []

    def add_marker(self, mark):
        self.marks.append(mark.name)


def test_marks_follow_tiers_and_a_stale_name_fails_the_session(monkeypatch):
    monkeypatch.setattr(tiers, "EXHAUSTIVE_TESTS", frozenset({"test_x.py::test_whole"}))
    monkeypatch.setattr(tiers, "SUITE_VARIANTS", {"test_x.py::test_v": ("a", "b-*")})
    items = [_Item("test_x.py", "test_whole"), _Item("test_x.py", "test_plain"),
             *(_Item("test_x.py", "test_v", v) for v in ("a", "ab", "b-1", "c"))]
    config = SimpleNamespace(args=["tests"])
    conftest._mark_tiers(config, items)
    assert [item.marks for item in items] == [["exhaustive"], [], [], ["exhaustive"], [],
                                              ["exhaustive"]]

    # a kept variant no test has
    monkeypatch.setitem(tiers.SUITE_VARIANTS, "test_x.py::test_v", ("a", "gone"))
    with pytest.raises(pytest.UsageError, match=r"keeps test_x.py::test_v\[gone\]"):
        conftest._mark_tiers(config, items)
    # a function no test is (its file collected), or no longer parametrized
    monkeypatch.setitem(tiers.SUITE_VARIANTS, "test_x.py::test_v", ("a",))
    monkeypatch.setattr(tiers, "EXHAUSTIVE_TESTS", frozenset({"test_x.py::test_renamed"}))
    with pytest.raises(pytest.UsageError, match="test_renamed, which no test is"):
        conftest._mark_tiers(config, items)
    monkeypatch.setattr(tiers, "EXHAUSTIVE_TESTS", frozenset())
    monkeypatch.setitem(tiers.SUITE_VARIANTS, "test_x.py::test_plain", ("a",))
    with pytest.raises(pytest.UsageError, match=r"test_plain\[a\]"):
        conftest._mark_tiers(config, items)
    # single tests asked for by id: the other names are not collected, nothing is checked
    conftest._mark_tiers(SimpleNamespace(args=["tests/test_x.py::test_v[a]"]), items[2:3])
    # nor in a file not collected
    conftest._mark_tiers(config, [_Item("test_y.py", "test_z")])


@pytest.mark.parametrize("exhaustive, markexpr, runs", [
    (False, "", False), (False, "not slow", False), (True, "slow", True),
    (False, "exhaustive", True), (False, "slow and not exhaustive", True)])
def test_the_exhaustive_tier_runs_when_asked_for(exhaustive, markexpr, runs):
    options = {"exhaustive": exhaustive, "markexpr": markexpr}
    assert conftest.runs_exhaustive(SimpleNamespace(getoption=options.get)) is runs
