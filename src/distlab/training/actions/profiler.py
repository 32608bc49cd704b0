"""`trainer.profile_steps=[first, last]`: a TensorFlow profiler trace of those run-wide
(1-based) steps, written where TensorBoard's profile plugin looks (logs/train/plugins/
profile/), at the granularity of a loop's block of steps."""

from __future__ import annotations

import logging
from pathlib import Path

import tensorflow as tf

log = logging.getLogger("distlab")


class Profiler:
    def __init__(self, steps: list[int] | None, logdir: Path, block: int,
                 resumed_at: int) -> None:
        """`block`: steps per loop call; `resumed_at`: run-wide steps done before this
        process trains (a resumed run)."""
        self._steps = list(steps or [])
        self.logdir, self.block, self.resumed_at = logdir, block, resumed_at
        self._running = False

    def at(self, steps_done: int) -> None:
        """At a step boundary (`steps_done` run-wide): start before step `first`, stop after
        step `last`."""
        if not self._steps:
            return
        first, last = self._steps  # the next call runs steps steps_done + 1 .. + block
        if not self._running and first <= steps_done + self.block and steps_done < last:
            tf.profiler.experimental.start(str(self.logdir))
            self._running = True
            log.info("profiling steps %d-%d into %s", steps_done + 1, last, self.logdir)
        elif self._running and steps_done >= last:
            self.close()

    def close(self) -> None:
        """End of training (or a stop): a running trace is written out."""
        if self._running:
            tf.profiler.experimental.stop()
            self._running, self._steps = False, []
        elif self._steps and self._steps[1] <= self.resumed_at:
            log.info("trainer.profile_steps=%s: those steps ran before this process resumed "
                     "the run (at step %d); no trace written now", self._steps,
                     self.resumed_at)
        elif self._steps:
            log.warning("trainer.profile_steps=%s: training ended before those steps; no "
                        "trace written", self._steps)
