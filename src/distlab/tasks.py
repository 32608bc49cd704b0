"""Deprecated alias (distlab 0.1's documented path): `Task` and `Metric` are
`from distlab import Metric, Task` (defined in `distlab.components.tasks`)."""

from distlab.deprecated import warn_moved

warn_moved(__name__)

from distlab.components.tasks import Metric, Task  # noqa: E402

__all__ = ["Metric", "Task"]
