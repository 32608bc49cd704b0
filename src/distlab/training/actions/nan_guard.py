"""Stop at the first non-finite training loss, keeping the last good checkpoint."""

from __future__ import annotations

import math

from distlab.errors import DistlabError


class NonFiniteLoss(DistlabError):
    """Training produced a NaN or Inf loss."""


def check_finite(loss: float, epoch: int, steps_done: int, latest: str | None) -> None:
    """Raise NonFiniteLoss if `loss` (after step `steps_done` of epoch `epoch`, 0-based) is
    NaN or infinite; `latest` is the last checkpoint, which is kept."""
    if not math.isfinite(loss):
        raise NonFiniteLoss(
            f"non-finite loss ({loss}) at epoch {epoch + 1}, step {steps_done}: training "
            f"stopped; the last good checkpoint ({latest or 'none yet'}) is kept. Lower "
            "optimizer.learning_rate or set optimizer.clipnorm")
