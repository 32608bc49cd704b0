"""Steady-state throughput (distlab.training.actions.throughput) and its sweep summary columns."""

from __future__ import annotations

import json

import pytest

from distlab.reporting.summary import SweepSummary, find_jobs, scaling_efficiency, swept_keys
from distlab.training.actions.throughput import Interval, steady_state


def _epoch(epoch: int, rates: list[float], steps: int = 10, batch: int = 100) -> list[Interval]:
    return [Interval(epoch, steps, steps * batch, steps * batch / r) for r in rates]


def test_the_first_epoch_is_left_out_and_the_spread_is_across_epochs():
    intervals = (_epoch(0, [1000, 5000]) + _epoch(1, [4000, 4000]) + _epoch(2, [6000, 6000])
                 + _epoch(3, [5000, 5000]))
    out = steady_state(intervals, replicas=2)
    assert out["throughput_basis"] == "epochs" and out["throughput_samples"] == 3
    steady = 6000 / (2000 / 4000 + 2000 / 6000 + 2000 / 5000)  # examples / seconds
    assert out["train_examples_per_sec"] == pytest.approx(steady)
    assert out["train_examples_per_sec_per_replica"] == pytest.approx(steady / 2)
    assert out["train_examples_per_sec_std"] == pytest.approx(1000.0)  # stdev(4000, 6000, 5000)
    assert out["warmup_s"] == pytest.approx(1000 / 1000 + 1000 / 5000)
    assert out["warmup_cost_s"] == pytest.approx(1.2 - 2000 / steady)


def test_short_runs_use_windows_of_steps_after_the_warmup_steps():
    intervals = _epoch(0, [500] + [2000] * 4 + [3000] * 5)  # one epoch of 10 intervals
    out = steady_state(intervals, replicas=1, windows=3)
    assert out["throughput_basis"] == "windows" and out["throughput_samples"] == 3
    assert out["warmup_s"] == pytest.approx(1000 / 500)  # the first tenth of the steps
    explicit = steady_state(intervals, replicas=1, warmup_steps=50, windows=5)
    assert explicit["train_examples_per_sec"] == pytest.approx(3000)
    assert explicit["train_examples_per_sec_std"] == pytest.approx(0.0)
    # an explicit step count also applies to long runs
    long = _epoch(0, [100] * 3) + _epoch(1, [200] * 3) + _epoch(2, [200] * 3)
    assert steady_state(long, 1, warmup_steps=30)["throughput_basis"] == "windows"
    assert steady_state([], 1)["train_examples_per_sec"] is None
    # two epochs: the first is the warm-up, the spread is over windows of the second
    two = steady_state(_epoch(0, [1000] * 4) + _epoch(1, [5000, 5000, 4000, 6000]), 1,
                       windows=2)
    assert two["throughput_basis"] == "windows" and two["throughput_samples"] == 2
    assert two["warmup_s"] == pytest.approx(4 * 1000 / 1000)
    assert two["train_examples_per_sec"] == pytest.approx(4000 / (0.2 + 0.2 + 0.25 + 1 / 6))


def _job(root, num: int, overrides: list[str], **results) -> None:
    job = root / str(num)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "hydra.yaml").write_text(f"hydra:\n  job:\n    num: {num}\n")
    (job / ".hydra" / "overrides.yaml").write_text(
        "".join(f"- {o}\n" for o in overrides))
    (job / "results.json").write_text(json.dumps({"status": "completed", **results}))


def test_summary_gives_scaling_efficiency_spread_and_time_to_target(tmp_path):
    for num, (devices, batch, rate, std) in enumerate(
            [(1, 32, 1000.0, 10.0), (2, 32, 1600.0, 30.0), (1, 64, 1500.0, 20.0),
             (2, 64, 2700.0, 40.0)]):
        _job(tmp_path, num, [f"strategy.cpu_devices={devices}",
                             f"dataset.batch_size_per_replica={batch}"],
             num_replicas=devices, train_examples_per_sec=rate,
             train_examples_per_sec_std=std, time_to_target_s=100.0 / devices,
             epochs_to_target=2, test_accuracy=0.9)
    jobs = find_jobs(tmp_path)
    assert scaling_efficiency(jobs, swept_keys(jobs)) == {
        0: 1.0, 1: pytest.approx(0.8), 2: 1.0, 3: pytest.approx(0.9)}
    SweepSummary().summarise(tmp_path)
    md = (tmp_path / "summary.md").read_text()
    assert "1600 ± 30" in md and "scaling efficiency" in md and "time to target (s)" in md
    csv = (tmp_path / "summary.csv").read_text().splitlines()
    header = csv[0].split(",")
    assert {"train_examples_per_sec_std", "scaling_efficiency", "time_to_target_s",
            "epochs_to_target"} <= set(header)
    assert csv[2].split(",")[header.index("scaling_efficiency")] == "0.8"
    png = (tmp_path / "summary.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000  # a PNG with a plot in it
