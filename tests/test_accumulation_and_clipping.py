"""Gradient accumulation and clipping: the micro-batches left over at the end of an accumulating run
make one last update; clipping acts on the gradient summed over replicas, so a clipped run
does not depend on the replica count."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from conftest import stop_at

# SGD with momentum at a constant rate; clipnorm small enough to clip every step
# the whole train split is trained on (no validation split held out), so that its batches
# divide as the comments below say
# (a small MLP: the optimizer is the point, not the model)
SGD = ("optimizer=sgd", "optimizer.learning_rate=0.1", "optimizer.momentum=0.9",
       "schedule=constant", "deterministic=true", "trainer.validate_every=0",
       "dataset.validation=null", "model=mlp", "model.hidden_units=[32]")
CLIPNORM = "optimizer.clipnorm=0.05"
# 160 examples: batches of 64 give 64, 64 and a short 32; 10 micro-batches of 16 with k=4
# give two updates of 64 and 2 micro-batches (32 examples) left over, in the same order;
# the same on 2 replicas with batches of 32 and micro-batches of 8 per replica
SHORT = "dataset.train_split='train[:160]'"


def _strategy(replicas: int) -> str:
    return "strategy=default" if replicas == 1 else f"strategy.cpu_devices={replicas}"


def _weights(run_dir: Path) -> dict[str, np.ndarray]:
    """The model's variables in the run's latest checkpoint (saved once, under the
    optimizer, which tracks them too)."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(run_dir / "checkpoints")))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
            if k.startswith("optimizer/_trainable_variables/")}


def _max_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys() and a
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


# ---- item 6: clipping after the cross-replica sum (optimizer level, fast)
def _train_dense(strategy, optimizer_fn, micro_batches: int, steps: int = 2):
    """A Dense model trained on a fixed batch of 8 rows, each update over `micro_batches`
    consecutive micro-batches split evenly over the replicas; its weights."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    x = tf.constant(np.random.default_rng(0).normal(size=(8, 3)) * 5, tf.float32)
    y = tf.constant(np.random.default_rng(1).normal(size=(8, 2)), tf.float32)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        optimizer = optimizer_fn()
        optimizer.build(model.trainable_variables)
    replicas = strategy.num_replicas_in_sync
    rows = 8 // micro_batches // replicas

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(tf.reduce_sum((model(x) - y) ** 2, -1),
                                              global_batch_size=rows * replicas)
            loss = optimizer.scale_loss(loss)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    def rows_of(micro: int, replica: int):
        first = (micro * replicas + replica) * rows
        return x[first:first + rows], y[first:first + rows]

    @tf.function
    def run(inputs):
        strategy.run(step, args=inputs)

    for _ in range(steps):
        for micro in range(micro_batches):
            if replicas == 1:
                run(rows_of(micro, 0))
            else:
                run(strategy.experimental_distribute_values_from_function(
                    lambda ctx, m=micro: rows_of(m, ctx.replica_id_in_sync_group)))
    return [w.numpy() for w in model.weights]


@pytest.mark.slow
@pytest.mark.parametrize("clip", ["clipnorm", "global_clipnorm", "clipvalue"])
def test_clipping_acts_on_the_gradient_summed_over_replicas(clip):
    """Keras clips each replica's own gradient (a clipped run then depends on the replica
    count: if the first check stops failing, Keras fixed it); distlab's optimizer clips
    their sum, alone, with accumulation and under loss scaling."""
    import keras
    import tensorflow as tf

    from distlab.components import optimizers
    from distlab.keras_patches import accumulation as grad_accumulation

    assert grad_accumulation.corrected(), "Keras changed: re-check grad_accumulation"
    two = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"],
                                         cross_device_ops=tf.distribute.ReductionToOneDevice())

    def sgd():
        return keras.optimizers.SGD(0.1, momentum=0.9, **{clip: 0.5})

    reference = _train_dense(tf.distribute.get_strategy(), sgd, micro_batches=1)
    unclipped = _train_dense(tf.distribute.get_strategy(), lambda: keras.optimizers.SGD(
        0.1, momentum=0.9), micro_batches=1)
    keras_own = _train_dense(two, sgd, micro_batches=1)
    assert max(np.max(np.abs(a - b)) for a, b in zip(reference, unclipped, strict=True)) > 1e-2
    assert max(np.max(np.abs(a - b)) for a, b in zip(reference, keras_own, strict=True)) > 1e-3
    def corrected(accumulate: int, loss_scaling: bool):
        return lambda: optimizers.with_training_options(sgd(), accumulate, loss_scaling, True)

    for accumulate, loss_scaling in ((1, False), (2, False), (1, True), (2, True)):
        weights = _train_dense(two, corrected(accumulate, loss_scaling),
                               micro_batches=accumulate)
        for a, b in zip(reference, weights, strict=True):
            assert np.max(np.abs(a - b)) < 1e-6, (accumulate, loss_scaling)
    # without a strategy, or without clipping, Keras' own optimizer is kept
    assert type(optimizers.with_training_options(sgd(), 1, False, False)) is keras.optimizers.SGD
    assert type(optimizers.with_training_options(keras.optimizers.SGD(0.1), 1, False,
                                                 True)) is keras.optimizers.SGD


# ---- item 5: the last, partial accumulation
def test_an_accumulation_longer_than_the_run_is_refused(run_inprocess, tmp_path):
    with pytest.raises(SystemExit) as e:
        run_inprocess("trainer.epochs=2", "trainer.steps_per_epoch=10",
                      "trainer.grad_accum_steps=50", out=tmp_path / "r")
    assert e.value.code == 2
    results = json.loads((tmp_path / "r" / "results.json").read_text())
    assert results["status"] == "failed"
    assert results["error"].startswith("trainer.grad_accum_steps=50 is more than the run's 20 "
                                       "training steps")
    assert "\n" not in results["error"]
    assert not list((tmp_path / "r").glob("checkpoints/ckpt-*"))  # refused before training


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["keras_fit", "custom"])
def test_leftover_micro_batches_make_a_last_update_on_any_replica_count(loop, run_inprocess,
                                                                        monkeypatch, tmp_path,
                                                                        caplog):
    """10 micro-batches of 16 with k=4: two updates of 4, then one with the mean gradient
    of the 2 left over, as batches of 64, 64 and a short 32 (clipped, momentum kept), on 1
    and 2 replicas; clipped, 1 x 64, 2 x 32 and 2 x 8 accumulated over 4 make the same
    updates (the issue's figures differed in the 3rd decimal). Then the accumulated run
    (keras_fit's on 1 replica, the custom loop's on 2) survives a stop and an extension:
    `_leftover_update_survives_a_stop_and_an_extension`."""
    common = (f"loop={loop}", *SGD, SHORT, "trainer.epochs=1")
    runs: dict[str, dict] = {}
    for replicas in (1, 2):
        clipped = (*common, CLIPNORM, _strategy(replicas))
        micro = f"dataset.batch_size_per_replica={16 // replicas}"
        a, w, d = (tmp_path / f"{name}{replicas}" for name in "awd")
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="distlab"):
            accumulated = runs[f"a{replicas}"] = run_inprocess(
                *clipped, micro, "trainer.grad_accum_steps=4", out=a)
        whole = runs[f"w{replicas}"] = run_inprocess(
            *clipped, f"dataset.batch_size_per_replica={64 // replicas}", out=w)
        dropped = run_inprocess(*clipped, micro, "trainer.grad_accum_steps=4",
                                "trainer.steps_per_epoch=8", out=d)
        assert accumulated["num_replicas"] == whole["num_replicas"] == replicas
        assert accumulated["effective_batch_size"] == 64
        assert accumulated["steps_per_epoch"] == 10 and whole["steps_per_epoch"] == 3
        assert accumulated["test_loss"] == pytest.approx(whole["test_loss"], abs=1e-6)
        # the final checkpoint holds the weights after that last update
        assert _max_diff(_weights(a), _weights(w)) < 1e-6
        assert abs(accumulated["test_loss"] - dropped["test_loss"]) > 1e-4
        assert _max_diff(_weights(a), _weights(d)) > 1e-4
        lines = [r.getMessage() for r in caplog.records if "micro-batch" in r.getMessage()]
        assert len(lines) == 1 and "the last 2 micro-batch(es)" in lines[0]
    # clipping does not depend on the replica count (nor on accumulation over replicas)
    assert runs["w2"]["test_loss"] == pytest.approx(runs["w1"]["test_loss"], abs=1e-6)
    assert runs["a2"]["test_loss"] == pytest.approx(runs["w1"]["test_loss"], abs=1e-6)
    assert _max_diff(_weights(tmp_path / "w2"), _weights(tmp_path / "w1")) < 1e-6
    unclipped = run_inprocess(*common, "strategy=default", "dataset.batch_size_per_replica=64",
                              out=tmp_path / "u")
    assert abs(unclipped["test_loss"] - runs["w1"]["test_loss"]) > 1e-3  # the clipping bites
    replicas = {"custom": 2, "keras_fit": 1}[loop]
    _leftover_update_survives_a_stop_and_an_extension(
        loop, replicas, runs[f"a{replicas}"], tmp_path / f"a{replicas}", run_inprocess,
        monkeypatch, tmp_path / "stopped")


def _leftover_update_survives_a_stop_and_an_extension(loop, replicas, uninterrupted: dict,
                                                      a: Path, run_inprocess, monkeypatch,
                                                      tmp_path: Path) -> None:
    """Stopped mid-accumulation, or after the last epoch's checkpoint but before the last
    update, a rerun ends with the uninterrupted run's weights (`uninterrupted`, run dir `a`);
    a finished run rerun is not updated again; raising trainer.epochs starts a fresh cycle
    after the last update, so the extended run equals batches of 64, 64, 32 in every
    epoch."""
    common = (f"loop={loop}", *SGD, CLIPNORM, SHORT, _strategy(replicas),
              f"dataset.batch_size_per_replica={16 // replicas}", "trainer.grad_accum_steps=4")
    whole = (f"loop={loop}", *SGD, CLIPNORM, SHORT, _strategy(replicas),
             f"dataset.batch_size_per_replica={64 // replicas}")
    tmp_path.mkdir(exist_ok=True)
    weights = _weights(a)
    for name, step in (("mid", 9), ("end", 10)):  # 1 micro-batch pending; all 10 done
        stop_at(monkeypatch, epoch=0, step=step)
        with pytest.raises(SystemExit):
            run_inprocess(*common, "trainer.epochs=1", out=tmp_path / name)
        monkeypatch.undo()
        resumed = run_inprocess(*common, "trainer.epochs=1", out=tmp_path / name)
        assert resumed["test_loss"] == pytest.approx(uninterrupted["test_loss"], abs=1e-6)
        assert _max_diff(_weights(tmp_path / name), weights) < 1e-6
    # nothing left over after the last update: a rerun (here with the completed marker
    # gone) changes nothing
    (tmp_path / "end" / "results.json").unlink()
    again = run_inprocess(*common, "trainer.epochs=1", out=tmp_path / "end")
    assert _max_diff(_weights(tmp_path / "end"), weights) < 1e-6
    assert again["test_loss"] == pytest.approx(uninterrupted["test_loss"], abs=1e-6)
    # extended to 2 epochs: epoch 2 is 2 updates of 4 and one of the 2 left over again
    extended = run_inprocess(*common, "trainer.epochs=2", out=a)
    reference = run_inprocess(*whole, "trainer.epochs=2", out=tmp_path / "w")
    assert extended["epochs_completed"] == 2
    assert extended["test_loss"] == pytest.approx(reference["test_loss"], abs=1e-6)
    assert _max_diff(_weights(a), _weights(tmp_path / "w")) < 1e-6
