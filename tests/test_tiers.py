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
    for key in [*tiers.EXHAUSTIVE_TESTS, *tiers.EXHAUSTIVE_VARIANTS]:
        file, function = key.split("::")
        assert function in _functions(file), key
    assert not set(tiers.EXHAUSTIVE_TESTS) & set(tiers.EXHAUSTIVE_VARIANTS)
    assert all(tiers.EXHAUSTIVE_VARIANTS.values())


def test_a_variant_is_exhaustive_when_tiers_names_it():
    key = "test_reliability.py::test_sigkill_then_rerun_resumes_exactly"
    assert not tiers.exhaustive(key, "custom-precision=mixed_bfloat16")
    assert tiers.exhaustive(key, "keras_fit-trainer.grad_accum_steps=4")
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
        if variant is not None:
            self.callspec = SimpleNamespace(id=variant)
        self.marks: list[str] = []

    def add_marker(self, mark):
        self.marks.append(mark.name)


def _config(*args: str, lf: bool = False) -> SimpleNamespace:
    return SimpleNamespace(args=list(args), getoption=lambda name, default=None: lf)


def test_marks_follow_tiers_and_a_stale_name_fails_the_session(monkeypatch):
    monkeypatch.setattr(tiers, "EXHAUSTIVE_TESTS", frozenset({"test_x.py::test_whole"}))
    monkeypatch.setattr(tiers, "EXHAUSTIVE_VARIANTS", {"test_x.py::test_v": ("ab", "b-*")})
    items = [_Item("test_x.py", "test_whole"), _Item("test_x.py", "test_plain"),
             *(_Item("test_x.py", "test_v", v) for v in ("a", "ab", "b-1", "c"))]
    config = _config("tests")
    conftest._mark_tiers(config, items)
    assert [item.marks for item in items] == [["exhaustive"], [], [], ["exhaustive"],
                                              ["exhaustive"], []]

    # a variant pattern no test has
    monkeypatch.setitem(tiers.EXHAUSTIVE_VARIANTS, "test_x.py::test_v", ("ab", "gone"))
    with pytest.raises(pytest.UsageError, match=r"test_x.py::test_v\[gone\] to the"):
        conftest._mark_tiers(config, items)
    # every variant exhaustive: the function belongs in EXHAUSTIVE_TESTS
    monkeypatch.setitem(tiers.EXHAUSTIVE_VARIANTS, "test_x.py::test_v", ("*",))
    with pytest.raises(pytest.UsageError, match="leaves no variant of test_x.py::test_v"):
        conftest._mark_tiers(config, items)
    # a function no test is (its file collected), or no longer parametrized
    monkeypatch.setitem(tiers.EXHAUSTIVE_VARIANTS, "test_x.py::test_v", ("ab",))
    monkeypatch.setattr(tiers, "EXHAUSTIVE_TESTS", frozenset({"test_x.py::test_renamed"}))
    with pytest.raises(pytest.UsageError, match="test_renamed, which no test is"):
        conftest._mark_tiers(config, items)
    monkeypatch.setattr(tiers, "EXHAUSTIVE_TESTS", frozenset())
    monkeypatch.setitem(tiers.EXHAUSTIVE_VARIANTS, "test_x.py::test_plain", ("a",))
    with pytest.raises(pytest.UsageError, match=r"test_plain\[a\]"):
        conftest._mark_tiers(config, items)
    # tests picked by id or by --lf: the others are not collected, nothing is checked
    conftest._mark_tiers(_config("tests/test_x.py::test_v[a]"), items[2:3])
    conftest._mark_tiers(_config("tests", lf=True), items[2:3])
    # nor in a file not collected
    conftest._mark_tiers(config, [_Item("test_y.py", "test_z")])


@pytest.mark.parametrize("exhaustive, markexpr, args, runs", [
    (False, "", ["tests"], False), (False, "not slow", [], False), (True, "slow", [], True),
    (False, "exhaustive", [], True), (False, "slow and not exhaustive", [], True),
    (False, "", ["tests/test_x.py::test_v"], True)])
def test_the_exhaustive_tier_runs_when_asked_for(exhaustive, markexpr, args, runs):
    options = {"exhaustive": exhaustive, "markexpr": markexpr}
    config = SimpleNamespace(getoption=options.get, args=args)
    assert conftest.runs_exhaustive(config) is runs
