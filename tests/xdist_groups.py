"""`--dist loadgroup` grouping by `xdist_group` marks, on pytest 9.2 with pytest-xdist 3.8.

xdist's worker names a test's group by appending `@group` to `item._nodeid`, and reports the
ids to the scheduler when collection finishes; since pytest 9.2 a test's id is `item._id` (a
structured NodeId), so the suffix is lost and every test is handed out alone: the groups
silently do nothing (pytest-xdist#1386, open). Registered in xdist's workers only
(tests/conftest.py), this plugin gives the scheduler the suffixed ids, then gives each test
its own id back, so that reports, `--lf` and `--deselect` name tests as pytest does.
Only where pytest reads `item._id` (`NEEDED`).
"""

from __future__ import annotations

import pytest

try:
    from _pytest.nodeid import NodeId
except ImportError:  # pytest before 9.2: xdist's own suffix works
    NodeId = None

NEEDED = NodeId is not None and hasattr(pytest.Item, "id")
_OWN = pytest.StashKey[object]()
SENT: dict[str, str] = {}  # each test's own id: the id the scheduler was sent


def keep(items: list[pytest.Item]) -> None:
    """After xdist appended its suffixes: each suffixed id made the test's (its own kept)."""
    if not NEEDED:
        return
    for item in items:
        suffixed = getattr(item, "_nodeid", None)
        if suffixed and suffixed.startswith(item.nodeid + "@"):
            item.stash[_OWN] = item._id
            item._id = NodeId.parse(suffixed)


def give_back(items: list[pytest.Item]) -> None:
    """Once the scheduler has the ids (kept in SENT): each test's own id again."""
    for item in items:
        sent = item.nodeid
        if _OWN in item.stash:
            item._id = item.stash[_OWN]
            del item.stash[_OWN]
        SENT[item.nodeid] = sent


@pytest.hookimpl(trylast=True)  # after xdist's, which appends the suffix
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    keep(items)


@pytest.hookimpl(trylast=True)  # after xdist's, which sends the ids to the scheduler
def pytest_collection_finish(session: pytest.Session) -> None:
    give_back(session.items)
