"""An exclusive lock on a file, across processes (the disk cache's entries, an MLflow store's
set-up, a sweep's shared tracking state)."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An flock on `path` (created if need be), held by this process until the block ends."""
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
