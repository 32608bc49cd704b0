"""Deprecated alias (distlab 0.1's documented path): a loop subclasses `distlab.Loop`
(defined in `distlab.training.loops`)."""

from distlab.deprecated import warn_moved

warn_moved(__name__)

from distlab.training.loops import CustomLoop, KerasFitLoop, Loop  # noqa: E402

__all__ = ["CustomLoop", "KerasFitLoop", "Loop"]
