"""Steady-state training throughput, as batch-size studies report it.

A process's first epoch (or first steps) pays for tracing, data decoding and cache fills;
averaging it in decides the shape of a batch-size curve. `steady_state` leaves that
warm-up out and gives the mean examples/sec with its spread: across epochs when at least
two steady epochs ran, else across windows of steps. Pure Python (no TensorFlow).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any


@dataclass
class Interval:
    """Training steps between two step boundaries of one epoch (no validation inside)."""

    epoch: int
    steps: int
    examples: float
    seconds: float


def _rate(intervals: list[Interval]) -> float:
    seconds = sum(i.seconds for i in intervals)
    return sum(i.examples for i in intervals) / seconds if seconds > 0 else float("nan")


def _windows(intervals: list[Interval], count: int) -> list[list[Interval]]:
    """`intervals` in order, cut into at most `count` runs of about equal step counts."""
    total = sum(i.steps for i in intervals)
    groups: list[list[Interval]] = [[]]
    done = 0
    for interval in intervals:
        if groups[-1] and done >= total * len(groups) / count:
            groups.append([])
        groups[-1].append(interval)
        done += interval.steps
    return [g for g in groups if g]


def steady_state(intervals: list[Interval], replicas: int, warmup_epochs: int = 1,
                 warmup_steps: int | None = None, windows: int = 5) -> dict[str, Any]:
    """results.json's throughput fields from one process's step intervals.

    Warm-up is the first `warmup_epochs` epochs this process ran or, when `warmup_steps` is
    set, its first `warmup_steps` steps. The spread is across the steady epochs when there
    are at least two, else across `windows` windows of the steady steps. A run that never
    got past its warm-up epochs leaves out the first tenth of its steps instead (at least
    one interval).
    """
    epochs = list(dict.fromkeys(i.epoch for i in intervals))
    steady_epochs = epochs[warmup_epochs:]
    if warmup_steps is None and steady_epochs:
        warm = [i for i in intervals if i.epoch not in steady_epochs]
        steady = [i for i in intervals if i.epoch in steady_epochs]
        if len(steady_epochs) >= 2:
            samples = [_rate([i for i in steady if i.epoch == e]) for e in steady_epochs]
            basis = "epochs"
        else:
            samples = [_rate(w) for w in _windows(steady, windows)]
            basis = "windows"
    else:
        total = sum(i.steps for i in intervals)
        skip = warmup_steps if warmup_steps is not None else max(1, total // 10)
        cut, done = 0, 0
        while cut < len(intervals) and done < skip:
            done += intervals[cut].steps
            cut += 1
        if cut == len(intervals) and intervals and warmup_steps is None:
            cut = len(intervals) - 1  # keep at least one interval steady
        warm, steady = intervals[:cut], intervals[cut:]
        samples = [_rate(w) for w in _windows(steady, windows)] if steady else []
        basis = "windows"
    if not steady:
        return {"train_examples_per_sec": None, "train_examples_per_sec_std": None,
                "train_examples_per_sec_per_replica": None, "throughput_samples": 0,
                "throughput_basis": basis, "warmup_s": None, "warmup_cost_s": None}
    rate = _rate(steady)
    warm_seconds = sum(i.seconds for i in warm)
    return {
        "train_examples_per_sec": rate,
        "train_examples_per_sec_std": statistics.stdev(samples) if len(samples) > 1 else None,
        "train_examples_per_sec_per_replica": rate / replicas,
        "throughput_samples": len(samples),
        "throughput_basis": basis,  # what the spread is across: epochs or step windows
        "warmup_s": warm_seconds,  # training time of the warm-up part
        # what the warm-up cost over the same steps at the steady rate
        "warmup_cost_s": warm_seconds - sum(i.examples for i in warm) / rate,
    }
