"""EpochSums: the one layout of the sums an epoch's training figures are made of (the batch
stats, then the stateful metrics' state), their sum, figures and checkpoint vector."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import compose


def _layout(*overrides: str):
    import tensorflow as tf

    from distlab.components import tasks
    from distlab.training.epoch_sums import SumsLayout
    from distlab.training.metrics import StatefulMetrics

    task = tasks.build(compose(list(overrides)).task)
    return SumsLayout(task, StatefulMetrics(task, tf.distribute.get_strategy()))


def test_the_layout_is_the_loss_per_example_metrics_count_then_the_state():
    layout = _layout("task=binary", "task.metrics=[accuracy,precision]")
    assert layout.num_stats == 3  # loss, accuracy (per example), count
    assert layout.size == 3 + layout.metrics.size == 3 + 2  # precision: TP, FP at 0.5
    sums = layout.zeros()
    assert sums.vector().tolist() == [0.0] * layout.size


def test_sums_add_and_make_the_figures_of_their_rows():
    from distlab.training.epoch_sums import EpochSums

    layout = _layout("task=classification")  # accuracy, per example: no state
    first = EpochSums(layout, [6.0, 3.0, 4.0])  # 4 rows: loss 6, 3 right
    second = EpochSums(layout, [2.0, 1.0, 4.0])
    both = first + second
    assert (both.loss, both.count) == (8.0, 8.0)
    assert both.means() == {"loss": 1.0, "accuracy": 0.5}
    assert first.means(prefix="") == {"loss": 1.5, "accuracy": 0.75}


def test_the_checkpoint_vector_round_trips_with_the_state():
    from distlab.training.epoch_sums import EpochSums

    layout = _layout("task=binary", "task.metrics=[accuracy,precision]")
    state = np.arange(layout.metrics.size, dtype=np.float64)
    sums = EpochSums(layout, [1.0, 2.0, 3.0], state)
    again = layout.from_vector(sums.vector())
    assert again.stats.tolist() == [1.0, 2.0, 3.0] and again.state.tolist() == state.tolist()
    with pytest.raises(ValueError, match="a vector of"):
        layout.from_vector(np.zeros(layout.size + 1))
    with pytest.raises(ValueError, match="sums of 2 stats"):
        EpochSums(layout, [1.0, 2.0])


def test_indexing_the_sums_as_the_old_vector_is_deprecated():
    from distlab.training.epoch_sums import EpochSums

    sums = EpochSums(_layout("task=classification"), [6.0, 3.0, 4.0])
    with pytest.warns(FutureWarning, match="use .loss, .count, .stats or .means()"):
        assert sums[-1] == 4.0
