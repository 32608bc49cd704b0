"""How the suite's tests are handed to xdist's workers (`-n N`; conftest: --dist loadgroup)."""

from __future__ import annotations

import os

import pytest
import xdist_groups
from conftest import caller_chose_dist


@pytest.mark.xdist_group("scheduling")
def test_a_tests_xdist_group_reaches_the_scheduler(request):
    """xdist's scheduler groups tests by the `@group` ending of the ids a worker sends it.
    The workers are told of the conftest's loadgroup (they parse the command line again),
    and on pytest 9.2 the ending xdist appends is kept for the scheduler by
    tests/xdist_groups.py (pytest-xdist#1386), then the test's own id given back: without
    either, every group (the Ray tests', which share one Ray instance; the wheel's) would
    silently be none."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or caller_chose_dist(request.config):
        pytest.skip("only under -n N with the conftest's --dist loadgroup")
    own = request.node.nodeid
    assert request.config.getoption("loadgroup"), "the workers were not told of loadgroup"
    assert not own.endswith("@scheduling"), own  # reports and --lf name the test as pytest does
    if xdist_groups.NEEDED:
        assert xdist_groups.SENT[own] == f"{own}@scheduling"


@pytest.mark.skipif(not xdist_groups.NEEDED, reason="before pytest 9.2 xdist's suffix works")
def test_the_correction_takes_only_an_appended_group_and_gives_the_id_back():
    """An id xdist suffixed is the test's while the scheduler is sent the ids, then its own
    again; one xdist left alone, or changed otherwise, stays as it was throughout."""
    class Item:
        def __init__(self, nodeid: str, written: str | None) -> None:
            self._id = xdist_groups.NodeId.parse(nodeid)
            self.stash = pytest.Stash()
            if written is not None:
                self._nodeid = written

        nodeid = property(lambda self: str(self._id))

    grouped = Item("tests/t.py::test_a[x@y-1]", "tests/t.py::test_a[x@y-1]@ray")
    plain = Item("tests/t.py::test_b", None)
    other = Item("tests/t.py::test_c", "tests/u.py::test_c@g")
    items = [grouped, plain, other]
    xdist_groups.keep(items)
    assert [i.nodeid for i in items] == [
        "tests/t.py::test_a[x@y-1]@ray", "tests/t.py::test_b", "tests/t.py::test_c"]
    xdist_groups.give_back(items)
    assert [i.nodeid for i in items] == [
        "tests/t.py::test_a[x@y-1]", "tests/t.py::test_b", "tests/t.py::test_c"]
    assert xdist_groups.SENT["tests/t.py::test_a[x@y-1]"] == "tests/t.py::test_a[x@y-1]@ray"
