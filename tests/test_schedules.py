"""Learning-rate schedules (epoch boundaries exact to the step) and the batch scaling rule."""

from __future__ import annotations

import math

import pytest
from conftest import compose

from distlab.components import schedules
from distlab.components.optimizers import scaled_learning_rate

SPE = 100  # steps per epoch


def lr(schedule, step: int) -> float:
    return float(schedule(step))


def test_step_decay_matches_the_mnist_tutorial_per_epoch():
    s = schedules.build(compose(["schedule=step_decay"]).schedule, 1e-3, SPE, 12)
    # tutorial: epoch < 3 -> 1e-3, 3 <= epoch < 7 -> 1e-4, else 1e-5 (0-based epochs)
    for epoch in range(12):
        want = 1e-3 if epoch < 3 else 1e-4 if epoch < 7 else 1e-5
        for step in (epoch * SPE, epoch * SPE + SPE - 1):
            assert lr(s, step) == pytest.approx(want, rel=1e-6), (epoch, step)


def test_step_decay_changes_exactly_at_the_boundary_step():
    s = schedules.build(compose(["schedule=step_decay"]).schedule, 1e-3, SPE, 12)
    assert lr(s, 3 * SPE - 1) == pytest.approx(1e-3)
    assert lr(s, 3 * SPE) == pytest.approx(1e-4)
    assert lr(s, 7 * SPE - 1) == pytest.approx(1e-4)
    assert lr(s, 7 * SPE) == pytest.approx(1e-5)


def test_warmup_ramps_linearly_then_hands_over():
    cfg = compose(["schedule=constant", "schedule.warmup_epochs=1"]).schedule
    s = schedules.build(cfg, 0.1, SPE, 5)
    assert lr(s, 0) == pytest.approx(0.1 / SPE)
    assert lr(s, SPE // 2 - 1) == pytest.approx(0.05)
    assert lr(s, SPE - 1) == pytest.approx(0.1)
    assert lr(s, 10 * SPE) == pytest.approx(0.1)


def test_cosine_defaults_to_the_whole_run():
    s = schedules.build(compose(["schedule=cosine"]).schedule, 0.1, SPE, 4)
    assert lr(s, 0) == pytest.approx(0.1)
    assert lr(s, 2 * SPE) == pytest.approx(0.05, rel=1e-4)
    assert lr(s, 4 * SPE) == pytest.approx(0.0, abs=1e-7)


def test_exponential_decays_per_epoch():
    cfg = compose(["schedule=exponential", "schedule.decay_rate=0.5"]).schedule
    s = schedules.build(cfg, 0.1, SPE, 4)
    assert lr(s, 2 * SPE) == pytest.approx(0.025, rel=1e-5)


@pytest.mark.parametrize("rule,global_batch,want", [
    ("none", 256, 1e-3), ("linear", 256, 4e-3), ("sqrt", 256, 2e-3),
    ("linear", 32, 0.5e-3), ("sqrt", 64, 1e-3),
])
def test_lr_scaling_rule(rule, global_batch, want):
    assert math.isclose(scaled_learning_rate(1e-3, rule, global_batch, 64), want)
