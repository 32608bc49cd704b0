"""A probe: the experiment of a config built as a run builds it (strategy, data, model,
optimizer, loop), stepped by hand for a few steps, with its per-step losses, weights and test
figures read back. The checks compare probes built with other replica counts, loops or
seeds; nothing is written but the scratch directory's fingerprint record."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from distlab.distribute.cluster import Worker
from distlab.records.run_dir import RunDir


@dataclasses.dataclass
class Probe:
    """A built experiment and its loop, ready to step."""

    exp: Any  # training.experiment.Experiment
    loop: Any  # training.loops.Loop
    iterator: Any = None

    def train(self, steps: int) -> list[float]:
        """The next `steps` training steps, one at a time: each step's mean loss over its
        real rows (the task's loss, as history.csv's `loss`)."""
        from distlab.training.epoch_sums import EpochSums

        if self.iterator is None:
            self.iterator = self.loop.train_iterator(0)
        losses = []
        for _ in range(steps):
            sums = self.loop.train_steps(self.iterator, 1)
            if not isinstance(sums, EpochSums):  # a loop written before EpochSums
                sums = EpochSums(self.exp.sums, sums)
            losses.append(sums.loss / max(sums.count, 1.0))
        return losses

    def weights(self) -> dict[str, np.ndarray]:
        """The model's weights by path (trainable and not: BatchNorm's moving statistics)."""
        return {w.path: np.asarray(w.numpy()) for w in self.exp.model.weights}

    def evaluate(self) -> dict[str, float | None]:
        """The test figures on the probe's test rows (loss and every task metric)."""
        return self.loop.evaluate("test")


def build(cfg: DictConfig, where: Path, test_rows: int | None = None,
          loop: Callable[[Any], Any] | None = None) -> Probe:
    """The experiment of `cfg` (validated) under its strategy, reset to its seed, with only
    the first `test_rows` rows of its test split scored (None: all); `loop`: a loop class
    in place of `loop.name`'s."""
    from distlab.data.stream import prefetched
    from distlab.registry import LOOPS
    from distlab.training import experiment, runner

    strategy = runner.connect(cfg)
    runner.reset_state(cfg.seed, cfg.deterministic, cfg.precision)
    now = time.time()
    exp = experiment.build(cfg, RunDir(where), strategy, Worker(), now, now)
    if test_rows is not None:
        data = exp.data
        test = prefetched(data.test.unbatch().take(test_rows), data.global_batch_size)
        exp = dataclasses.replace(exp, data=dataclasses.replace(data, test=test))
    return Probe(exp, (loop or LOOPS.get(cfg.loop.name))(exp))


def max_abs_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> tuple[float, str]:
    """The largest absolute difference between two weight dicts, and the weight it is in."""
    worst, where = 0.0, ""
    for key in a:
        if key not in b or a[key].shape != b[key].shape:
            return float("inf"), key
        diff = float(np.max(np.abs(a[key].astype(np.float64) - b[key]))) if a[key].size else 0.0
        if diff > worst or np.isnan(diff):
            worst, where = diff, key
    return worst, where


def scale(weights: dict[str, np.ndarray]) -> float:
    """The largest absolute weight (at least 1): what a weight tolerance is relative to."""
    return max([1.0, *(float(np.max(np.abs(w))) for w in weights.values() if w.size)])


def relative_diffs(a: list[float], b: list[float]) -> float:
    """The largest relative difference between two lists of numbers (inf if lengths differ;
    NaN counts as a difference)."""
    if len(a) != len(b):
        return float("inf")
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        if x is None or y is None:
            if x is not y:
                return float("inf")
            continue
        if np.isnan(x) or np.isnan(y):
            return float("inf")
        worst = max(worst, abs(x - y) / max(abs(x), abs(y), 1e-12))
    return worst


def not_finite(**losses: list[float | None]) -> str | None:
    """Where a run's per-step losses first stop being finite (None: all finite), e.g.
    "step 2 of the 1-replica run: loss nan", from keyword lists named by the run."""
    for name, values in losses.items():
        for i, x in enumerate(values):
            if x is None or not np.isfinite(x):
                return f"step {i + 1} of {name.replace('_', ' ')}: loss {x}"
    return None
