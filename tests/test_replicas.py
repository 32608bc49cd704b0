"""Any replica count on any split size: short last batches, replicas left without rows.

Every global batch is split evenly over the replicas (a replica without real rows gets one
padding row of weight 0), so training and evaluation give the same figures as one replica.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from distlab.data.stream import replica_rows

# a small MLP with a softmax output (fashion_cnn's probabilities path): the replica split is
# the point, not the model
MODEL = ("model=mlp", "model.hidden_units=[32]", "model.output_activation=softmax")


@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 16, 100, 192])
def test_replica_rows_cover_the_batch_once_and_weigh_to_its_mean(replicas, rows):
    features = tf.reshape(tf.range(rows * 2, dtype=tf.float32), [rows, 2])
    labels = tf.range(rows, dtype=tf.int64)
    parts = [replica_rows((features, labels), tf.constant(k, tf.int64), replicas)
             for k in range(replicas)]
    real = [(f.numpy()[w.numpy() > 0], y.numpy()[w.numpy() > 0]) for f, y, w in parts]
    np.testing.assert_array_equal(np.concatenate([y for _, y in real]), np.arange(rows))
    np.testing.assert_array_equal(np.concatenate([f for f, _ in real]), features.numpy())
    assert all(int(tf.size(y)) >= 1 for _, y, _ in parts)  # no replica ever gets 0 rows
    sizes = [int(tf.size(y)) for _, y, w in parts if float(tf.reduce_max(w)) > 0]
    assert max(sizes) - min(sizes) <= 1
    # sum over replicas of sum(w * x) / (rows_k * replicas) is the plain mean over the batch
    values = tf.cast(labels, tf.float32) ** 2
    mean = sum(float(tf.reduce_sum(w * tf.cast(y, tf.float32) ** 2))
               / (int(tf.size(y)) * replicas) for _, y, w in parts)
    assert mean == pytest.approx(float(tf.reduce_mean(values)), rel=1e-6)


def _trained(run_once, loop: str, replicas: int, train_rows: int, test_rows: int) -> tuple:
    """One epoch of a global batch of 192 in `replicas` replicas on train[:train_rows],
    tested on test[:test_rows] (trained once: the tests below only read it)."""
    return run_once(f"loop={loop}", *MODEL, "deterministic=true", "seed=5",
                    "trainer.epochs=1", f"strategy.cpu_devices={replicas}",
                    f"dataset.batch_size_per_replica={192 // replicas}",
                    f"dataset.train_split='train[:{train_rows}]'",
                    f"dataset.test_split='test[:{test_rows}]'")


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["keras_fit", "custom"])
@pytest.mark.parametrize("train_rows,test_rows", [(400, 100), (194, 2)])
def test_any_replica_count_trains_and_evaluates_like_one(loop, train_rows, test_rows,
                                                         run_once):
    # global batch 192 as 1x192, 2x96 and 3x64: the last train batch (16 or 2 rows) and the
    # test split (100 or 2 rows) leave replicas short or without rows
    results = {replicas: _trained(run_once, loop, replicas, train_rows, test_rows)[0]
               for replicas in (1, 2, 3)}
    for replicas, r in results.items():
        assert r["status"] == "completed" and r["num_replicas"] == replicas
        assert r["test_loss"] == pytest.approx(results[1]["test_loss"], abs=1e-5), replicas
        assert r["test_accuracy"] == pytest.approx(results[1]["test_accuracy"], abs=1e-6)


@pytest.mark.slow
def test_evaluation_does_not_depend_on_the_replica_count(run_once, run_inprocess, tmp_path):
    # the checkpoint of the keras_fit run on train[:400] above, on 1 replica
    _, trained = _trained(run_once, "keras_fit", 1, 400, 100)
    figures = []
    for replicas in (1, 2, 3):  # (an evaluation is refused on other splits than its run's)
        r = run_inprocess(*MODEL, "mode=evaluate", f"ckpt_path={trained}",
                          f"strategy.cpu_devices={replicas}", "dataset.train_split='train[:400]'",
                          "dataset.test_split='test[:100]'", out=tmp_path / f"e{replicas}")
        assert r["num_replicas"] == replicas
        figures.append((r["test_loss"], r["test_accuracy"]))
    for loss, accuracy in figures[1:]:
        assert loss == pytest.approx(figures[0][0], abs=1e-6)
        assert accuracy == pytest.approx(figures[0][1], abs=1e-6)


@pytest.mark.slow
def test_odd_batch_on_two_replicas_custom_loop(run_inprocess):
    # 512 rows in global batches of 66: the last has 50 rows (25 each); batch 33 per replica,
    # trained as one replica trains batches of 66
    common = ("loop=custom", "trainer.epochs=1", "deterministic=true", "dataset.validation=null",
              *MODEL)
    r = run_inprocess(*common, "dataset.batch_size_per_replica=33", "strategy.cpu_devices=2")
    assert r["status"] == "completed" and r["global_batch_size"] == 66
    assert r["steps_per_epoch"] == 8  # 7 x 66 + 50
    one = run_inprocess(*common, "dataset.batch_size_per_replica=66", "strategy.cpu_devices=1")
    assert r["test_loss"] == pytest.approx(one["test_loss"], abs=1e-5)
    assert r["test_accuracy"] == pytest.approx(one["test_accuracy"], abs=1e-6)
