"""Public import paths that moved: each old module stays importable for at least one minor
version after the move, as an alias that warns once (a FutureWarning, which Python shows to
users by default) naming the new path. Listed here, so a removal is one place to look."""

from __future__ import annotations

import os
import sys
import warnings

# old module -> (the version it moved in, the version that removes it, what to write now)
MOVED = {
    "distlab.tasks": ("0.2.0", "0.3.0", "from distlab import Metric, Task"),
    "distlab.loops": ("0.2.0", "0.3.0", "distlab.Loop (from distlab import Loop)"),
    "distlab.launch.results": ("0.2.0", "0.3.0", "distlab.records.FIELDS (from distlab.records "
                               "import FIELDS)"),
}


def warn_moved(module: str) -> None:
    """The one warning of an alias module (called as it is imported, so once a process),
    pointing at the user's import line rather than at importlib."""
    since, removed, instead = MOVED[module]
    # warnings skips importlib's bootstrap frames itself; import_module and distlab's
    # __getattr__ (distlab.tasks as an attribute) are more to skip
    frame, level = sys._getframe(2), 3  # 0: here, 1: the alias module, 2: who imported it
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith("<frozen importlib"):
            if not name.endswith((os.path.join("importlib", "__init__.py"),
                                  os.path.join("distlab", "__init__.py"))):
                break
            level += 1
        frame = frame.f_back
    warnings.warn(f"{module} is deprecated since distlab {since} and will be removed in "
                  f"{removed}: use {instead}", FutureWarning, stacklevel=level)

