"""Gradient accumulation, mixed precision, time-to-target, early stopping, the best
checkpoint and the profiler, in both loops (tiny data)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
from conftest import ROOT

# lr_scaling by the effective batch (base 128): 0.1 for 4 x 32 and for 128, 0.025 for 32
ACCUMULATE = ["optimizer=sgd", "optimizer.learning_rate=0.1", "schedule=constant",
              "optimizer.lr_scaling=linear", "optimizer.base_batch_size=128",
              "deterministic=true", "trainer.epochs=1", "trainer.validate_every=0",
              "model=mlp", "model.hidden_units=[32]"]  # the optimizer is the point


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["keras_fit", "custom"])
@pytest.mark.parametrize("replicas", [1, 2])
def test_four_accumulated_batches_of_32_equal_one_batch_of_128(loop, replicas, run_inprocess):
    strategy = ("strategy=default",) if replicas == 1 else ("strategy.cpu_devices=2",)
    accumulated = run_inprocess(f"loop={loop}", *ACCUMULATE, *strategy,
                                f"dataset.batch_size_per_replica={32 // replicas}",
                                "trainer.grad_accum_steps=4", "trainer.steps_per_epoch=8")
    whole = run_inprocess(f"loop={loop}", *ACCUMULATE, *strategy,
                          f"dataset.batch_size_per_replica={128 // replicas}",
                          "trainer.steps_per_epoch=2")
    assert accumulated["effective_batch_size"] == 128 == whole["effective_batch_size"]
    assert accumulated["learning_rate"] == pytest.approx(0.1) == whole["learning_rate"]
    assert accumulated["test_loss"] == pytest.approx(whole["test_loss"], abs=1e-5)
    if replicas == 1:  # (the replica count changes neither the rate rule nor that it differs)
        single = run_inprocess(f"loop={loop}", *ACCUMULATE, *strategy,
                               "dataset.batch_size_per_replica=32", "trainer.steps_per_epoch=8")
        assert single["learning_rate"] == pytest.approx(0.025)
        # and it is not the same as taking the 8 batches of 32 one by one
        assert abs(single["test_loss"] - whole["test_loss"]) > 1e-3


@pytest.mark.slow
def test_keras_accumulation_fails_under_a_strategy_without_the_correction():
    """The reason for distlab.keras_patches.accumulation: if this stops failing, Keras fixed it."""
    import keras
    import tensorflow as tf

    from distlab.keras_patches import accumulation as grad_accumulation

    assert grad_accumulation.corrected(), "Keras changed: re-check grad_accumulation"
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"],
                                              cross_device_ops=tf.distribute.ReductionToOneDevice())
    x, y = tf.ones([8, 3]), tf.zeros([8, 1])

    def train(optimizer_fn, steps: int = 2):
        keras.utils.set_random_seed(0)  # the same initial weights every time
        with strategy.scope():
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
            optimizer = optimizer_fn()
            optimizer.build(model.trainable_variables)

        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(tf.reduce_sum((model(x) - y) ** 2, -1),
                                                  global_batch_size=8)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

        run = tf.function(lambda: strategy.run(step, args=(x, y)))
        for _ in range(steps):
            run()
        return model

    with pytest.raises(RuntimeError, match="merge_call"):
        train(lambda: keras.optimizers.SGD(0.1, gradient_accumulation_steps=2))
    # two equal batches accumulated are one update with that batch's gradient
    corrected = train(lambda: grad_accumulation.accumulate(keras.optimizers.SGD(0.1), 2, True))
    once = train(lambda: keras.optimizers.SGD(0.1), steps=1)
    twice = train(lambda: keras.optimizers.SGD(0.1), steps=2)
    for a, b, c in zip(corrected.weights, once.weights, twice.weights, strict=True):
        assert abs(a.numpy() - b.numpy()).max() < 1e-6
        assert abs(a.numpy() - c.numpy()).max() > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_accumulation_is_the_big_batch_up_to_float32_rounding(name):
    """2 micro-batches of 16 accumulated against batches of 32, through distlab's corrected
    accumulation under a strategy: in float64 the weights agree to 1e-12 after 40 updates, for
    Adam too (its bias correction counts updates, not micro-batches), so a float32 difference
    is rounding, which Adam's normalisation amplifies. The README states the float32
    agreement measured for each optimizer."""
    import keras
    import numpy as np
    import tensorflow as tf

    from distlab.keras_patches import accumulation as grad_accumulation

    make = {"sgd": lambda: keras.optimizers.SGD(0.05),
            "adam": lambda: keras.optimizers.Adam(1e-3)}[name]
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(1280, 8)), rng.integers(0, 3, 1280)

    def train(batch: int, accumulate: int):
        keras.config.set_dtype_policy("float64")
        keras.utils.set_random_seed(0)
        try:
            with strategy.scope():
                model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, "relu"),
                                          keras.layers.Dense(3)])
                optimizer = make()
                if accumulate > 1:
                    optimizer = grad_accumulation.accumulate(optimizer, accumulate, True)
                optimizer.build(model.trainable_variables)
        finally:
            keras.config.set_dtype_policy("float32")
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        def step(x, y):
            with tf.GradientTape() as tape:
                value = loss(y, model(x, training=True))
            grads = tape.gradient(value, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

        run = tf.function(lambda x, y: strategy.run(step, args=(x, y)))
        for start in range(0, len(x), batch):
            run(tf.constant(x[start:start + batch]), tf.constant(y[start:start + batch]))
        return model, int(optimizer.iterations.numpy())

    (big, big_updates), (acc, acc_updates) = train(32, 1), train(16, 2)
    assert big_updates == acc_updates == 40  # Adam's bias correction reads this counter
    for a, b in zip(big.weights, acc.weights, strict=True):
        assert np.abs(a.numpy() - b.numpy()).max() < 1e-12
    guide = " ".join((ROOT / "docs" / "guides" / "batch-size.md").read_text().split())
    agreement = {"sgd": "SGD (lr 0.01) to", "adam": "Adam (lr 1e-3) to"}[name]
    assert agreement in guide, "the batch-size guide states the measured agreement per optimizer"


def reached_at_epoch_1(run_once, loop: str) -> tuple[dict, Path]:
    """A run whose target (any val_accuracy >= 0) is reached at epoch 1, where it stops; it
    also profiles steps 2 and 3 and tests its best checkpoint (val_loss). Trained once: read
    by the target and the profiler tests, and test_results_fields (keras_fit; keep its
    overrides the same)."""
    return run_once(f"loop={loop}", "trainer.epochs=5", "trainer.steps_per_epoch=3",
                    "model=mlp", "model.hidden_units=[32]", "trainer.target.metric=val_accuracy",
                    "trainer.target.value=0.0", "trainer.target.stop=true",
                    "trainer.best_checkpoint.metric=val_loss", "trainer.best_checkpoint.test=true",
                    "trainer.profile_steps=[2,3]")


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["keras_fit", "custom"])
def test_target_early_stopping_and_best_checkpoint(loop, run_inprocess, run_once, tmp_path):
    common = (f"loop={loop}", "trainer.epochs=5", "trainer.steps_per_epoch=3", "model=mlp",
              "model.hidden_units=[32]")
    # reached at epoch 1 (any accuracy >= 0), stop there
    reached, _ = reached_at_epoch_1(run_once, loop)
    assert reached["epochs_completed"] == 1 and reached["epochs_to_target"] == 1
    assert reached["stopped_early"] == {"epoch": 1, "reason": "target"}
    assert 0 < reached["time_to_target_s"] <= reached["wall_time_s"]  # one zero for both
    # never reached: recorded as such, all epochs trained; loss needs no validation
    missed = run_inprocess(*common, "trainer.target.metric=loss", "trainer.target.value=0.0",
                           "trainer.validate_every=2")
    assert missed["epochs_completed"] == 5 and missed["epochs_to_target"] is None
    assert missed["time_to_target_s"] is None and "stopped_early" not in missed
    # no val_loss improvement by more than 10 after epoch 1: patience 2 stops at epoch 3
    out = tmp_path / "stopped"
    stopped = run_inprocess(*common, "trainer.early_stopping.metric=val_loss",
                            "trainer.early_stopping.patience=2", "trainer.checkpoint_every=5",
                            "trainer.early_stopping.min_delta=10", out=out)
    assert stopped["epochs_completed"] == 3
    assert stopped["stopped_early"] == {"epoch": 3, "reason": "early_stopping"}
    rows = (out / "history.csv").read_text().splitlines()[1:]
    assert [int(r.split(",")[0]) for r in rows] == [1, 2, 3]
    # the best checkpoint follows the early-stopping metric: the lowest val_loss epoch
    losses = [float(r.split(",")[4]) for r in rows]
    assert stopped["best_metric"] == "val_loss"
    assert stopped["best_epoch"] == 1 + losses.index(min(losses))
    assert stopped["best_value"] == pytest.approx(min(losses), rel=1e-5)
    # checkpoints are numbered by the steps their model took, 3 per epoch, best/ too
    steps = 3 * stopped["best_epoch"]
    assert (out / "checkpoints" / "best" / f"ckpt-{steps}.index").exists()
    assert stopped["best_checkpoint"] == str(out / "checkpoints" / "best" / f"ckpt-{steps}")
    # a new best is also a main checkpoint (whatever checkpoint_every), so a resume never
    # restarts behind checkpoints/best
    assert (out / "checkpoints" / f"ckpt-{steps}.index").exists()


@pytest.mark.slow
def test_a_best_checkpoint_before_the_last_epoch_keeps_the_epochs_trained(run_inprocess, tmp_path,
                                                                         caplog):
    """trainer.best_checkpoint.test=true scores checkpoints/best's weights (epoch 1 here: the
    learning rate x1e-30 after it changes no val_loss), and results.json still counts the
    epochs trained: a rerun finds the run completed and rewrites nothing."""
    out = tmp_path / "run"
    args = ("loop=custom", "trainer.epochs=3", "trainer.steps_per_epoch=3", "model=mlp",
            "model.hidden_units=[16]", "schedule=step_decay", "schedule.boundaries=[1]",
            "schedule.factors=[1.0,1e-30]", "trainer.best_checkpoint.metric=val_loss",
            "trainer.best_checkpoint.test=true")
    done = run_inprocess(*args, out=out)
    assert (done["best_epoch"], done["epochs_completed"]) == (1, 3), done
    assert done["best_test_loss"] is not None
    written = (out / "results.json").read_bytes()
    caplog.set_level(logging.INFO, logger="distlab")
    run_inprocess(*args, out=out)
    assert any("already completed 3 epoch(s)" in r.getMessage() for r in caplog.records)
    assert (out / "results.json").read_bytes() == written


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["keras_fit", "custom"])
def test_profile_steps_write_a_trace_where_tensorboard_looks(loop, run_once):
    _, out = reached_at_epoch_1(run_once, loop)  # steps 2 and 3 of its 3 profiled
    # TensorBoard's profile plugin reads <logdir>/<run>/plugins/profile/<session>/*.xplane.pb
    traces = list((out / "logs" / "train" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0


MIXED = ("model=mlp", "model.hidden_units=[32]", "loop=custom", "trainer.epochs=1",
         "trainer.steps_per_epoch=4", "deterministic=true")


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_trains_with_float32_outputs_and_variables(precision, run_inprocess,
                                                                   run_once, tmp_path):
    results = run_inprocess(*MIXED, f"precision={precision}", "trainer.export=true",
                            out=tmp_path / precision)
    assert results["status"] == "completed" and results["precision"] == precision
    assert results["saved_model"] == "saved_model"  # exported, reloaded and checked
    # it learns as float32 does, to the low precision's rounding (an untrained classifier
    # of 10 classes is near ln 10 = 2.30; these 4 steps reach ~2.01)
    reference, _ = run_once(*MIXED, "precision=float32")
    assert reference["test_loss"] < math.log(10) - 0.2
    assert results["test_loss"] == pytest.approx(reference["test_loss"], abs=2e-3)
    assert results["test_accuracy"] == pytest.approx(reference["test_accuracy"], abs=0.03)


@pytest.mark.parametrize("precision", ["mixed_bfloat16", "mixed_float16"])
def test_low_precision_models_output_float32_and_keep_float32_variables(precision):
    """The model as a run builds it: computes in the low precision, outputs float32."""
    import keras

    from distlab.components import models

    keras.mixed_precision.set_dtype_policy(precision)
    try:
        inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        model = models.float32_outputs(inner)
        assert keras.backend.standardize_dtype(inner.outputs[0].dtype) != "float32"
        assert keras.backend.standardize_dtype(model.outputs[0].dtype) == "float32"
        assert all(v.dtype == "float32" for v in model.weights)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")


@pytest.mark.slow
@pytest.mark.parametrize("corrected", [False, True])
def test_loss_scaling_skips_a_step_that_overflows_on_any_replica(corrected):
    import keras
    import tensorflow as tf

    from distlab.keras_patches.loss_scaling import LossScaleOptimizer

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"],
                                              cross_device_ops=tf.distribute.ReductionToOneDevice())
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        optimizer = (LossScaleOptimizer if corrected else keras.optimizers.LossScaleOptimizer)(
            keras.optimizers.SGD(0.1))
        optimizer.build(model.trainable_variables)
    before = [w.numpy() for w in model.weights]

    def step():
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        x = tf.where(replica == 1, float("inf"), 1.0) * tf.ones([2, 2])  # replica 1 overflows
        with tf.GradientTape() as tape:
            loss = optimizer.scale_loss(tf.nn.compute_average_loss(model(x)[:, 0],
                                                                   global_batch_size=4))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    tf.function(lambda: strategy.run(step))()
    after = [w.numpy() for w in model.weights]
    skipped = all((a == b).all() for a, b in zip(before, after, strict=True))
    assert skipped == corrected  # Keras' own lets replica 1's inf through to the weights


@pytest.mark.parametrize("overrides,needle", [
    (["trainer.early_stopping.metric=val_acc"], "trainer.early_stopping.metric='val_acc' is not"),
    (["trainer.best_checkpoint.metric=val_loss", "trainer.validate_every=0"],
     "trainer.validate_every=0"),
    (["trainer.target.metric=rmse", "trainer.target.value=1"], "val_accuracy"),  # lists them
])
def test_watched_metrics_must_be_per_epoch_figures_of_the_task(overrides, needle):
    from conftest import compose

    from distlab.components import tasks
    from distlab.errors import DistlabError
    from distlab.training.actions.monitors import Monitors

    cfg = compose(overrides)
    task = tasks.build(cfg.task)
    with pytest.raises(DistlabError, match=needle.replace("[", r"\[")):
        Monitors(cfg.trainer, task)


def test_monitor_directions_follow_the_task():
    from conftest import compose

    from distlab.components import tasks
    from distlab.training.actions.monitors import direction

    classification = tasks.build(compose([]).task)
    regression = tasks.build(compose(["task=regression"]).task)
    assert direction("val_accuracy", "auto", classification) == "max"
    assert direction("val_loss", "auto", classification) == "min"
    assert direction("mae", "auto", regression) == "min"
    assert direction("val_loss", "max", classification) == "max"
