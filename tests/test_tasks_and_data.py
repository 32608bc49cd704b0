"""The task group (classification, regression, user tasks) and data beyond tfds images:
feature mappings, float labels, user dataset builders, preprocessing and augmentation."""

from __future__ import annotations

import re
import sys
import textwrap

import numpy as np
import pytest
from conftest import TINY_REGRESSION_FEATURES, TINY_TEST, compose_once

from distlab.errors import DistlabError

REGRESSION = ["dataset.name=tiny_regression", "dataset.features.input=measurements",
              "dataset.features.label=target", "dataset.preprocess.rescale=null",
              "task=regression", "model=mlp", "model.hidden_units=[16]", "optimizer=sgd",
              "optimizer.learning_rate=0.01", "deterministic=true", "strategy=mirrored"]


@pytest.mark.slow
def test_regression_parity_across_loops_and_replicas(run_inprocess, tmp_path):
    """fit = custom, and 1 replica x 64 = 2 replicas x 32, on a tfds dataset with its own
    feature names and a float label; results and history use the task's metric names."""
    runs = {(loop, replicas): run_inprocess(
        *REGRESSION, f"loop={loop}", f"strategy.cpu_devices={replicas}",
        f"dataset.batch_size_per_replica={64 // replicas}", "objective=val_rmse",
        out=tmp_path / f"{loop}{replicas}")
        for loop in ("keras_fit", "custom") for replicas in (1, 2)}
    reference = runs[("custom", 1)]
    header = (tmp_path / "custom1" / "history.csv").read_text().splitlines()[0]
    assert header == ("epoch,learning_rate,loss,mae,rmse,val_loss,val_mae,val_rmse,seconds,"
                      "examples_per_sec")
    assert reference["test_loss"] < 5.0  # it learns the linear target (variance ~6 at start)
    assert {"test_loss", "test_mae", "test_rmse", "val_loss", "val_rmse"} <= set(reference)
    assert "test_accuracy" not in reference and reference["objective"] == "val_rmse"
    assert reference["test_rmse"] == pytest.approx(np.sqrt(reference["test_loss"]), rel=1e-6)
    assert reference["validation"].endswith("(dataset.validation_seed=0)")  # not stratified
    for key, results in runs.items():
        for field in ("test_loss", "test_mae", "test_rmse", "val_loss", "val_rmse"):
            assert results[field] == pytest.approx(reference[field], abs=1e-5), (key, field)


def test_an_objective_the_task_does_not_report_is_refused(run_inprocess, tmp_path, caplog):
    out = tmp_path / "bad"
    with pytest.raises(SystemExit):  # a built-in task's results are known: refused at validation
        run_inprocess(*REGRESSION, "loop=custom", "strategy=default", "objective=val_accuracy",
                      out=out)
    error = " ".join(r.getMessage() for r in caplog.records if r.levelname == "ERROR")
    assert "objective=val_accuracy is not a result of task 'regression'" in error
    assert "val_loss, val_mae, val_rmse" in error


@pytest.mark.slow
def test_classification_top_k_and_probabilities(run_inprocess):
    # one step: a model whose first guess is often wrong, so top-3 counts more than top-1
    common = ("strategy=default", "task.top_k=3", "trainer.epochs=1",
              "trainer.steps_per_epoch=1", "deterministic=true")
    logits = run_inprocess("loop=custom", *common)
    assert 0 < logits["test_accuracy"] < logits["test_top3_accuracy"] < 1
    # a softmax model: from_logits follows the model, so it trains and scores as the logits
    # model does (cross-entropy of its probabilities, not of logits-as-probs); the same task
    # in fit
    probs = run_inprocess("loop=keras_fit", "model.output_activation=softmax", *common)
    assert probs["test_loss"] == pytest.approx(logits["test_loss"], abs=1e-5)
    for key in ("test_accuracy", "test_top3_accuracy"):
        assert probs[key] == pytest.approx(logits[key], abs=1e-6), key


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "user_data.py").write_text(textwrap.dedent("""
        import numpy as np
        import tensorflow as tf
        from distlab import DataSplits

        def _arrays(n, seed):
            rng = np.random.default_rng(seed)
            x = rng.normal(size=(n, 4)).astype("float32")
            return x, (x[:, 0] > 0).astype("int64")

        def arrays(cfg):
            return DataSplits(train=_arrays(200, 0), test=_arrays(50, 1), num_classes=2)

        def datasets(cfg):
            train, test = (tf.data.Dataset.from_tensor_slices(_arrays(n, s))
                           for n, s in ((200, 0), (50, 1)))
            return DataSplits(train=train, test=test, num_classes=2)

        def wrong(cfg):
            return {"train": None}

        def batched(cfg):  # tf.data's batch, then a map: a batch per element
            train = tf.data.Dataset.from_tensor_slices(_arrays(200, 0)).batch(32)
            return DataSplits(train=train.map(lambda x, y: (x, y)), test=_arrays(50, 1),
                              num_classes=2)

        def infinite(cfg):  # loading it never ended: its rows were counted
            train = tf.data.Dataset.from_tensor_slices(_arrays(200, 0)).repeat()
            return DataSplits(train=train, test=_arrays(50, 1), num_classes=2)

        def batched_then_unbatched(cfg):  # examples again (unbatch, or flat_map's idiom)
            test = tf.data.Dataset.from_tensor_slices(_arrays(50, 1)).batch(8).unbatch()
            train = tf.data.Dataset.from_tensor_slices(_arrays(200, 0)).batch(8).flat_map(
                lambda x, y: tf.data.Dataset.from_tensor_slices((x, y)))
            return DataSplits(train=train, test=test, num_classes=2)

        def fractional_classes(cfg):  # truncated to 2, then "label 2 outside 0..1"
            x, y = _arrays(20, 0)
            return DataSplits(train=(x, y), test=(x, y), num_classes=2.5)

        def one_class(cfg):  # it trained to loss 0, accuracy 1
            x, y = _arrays(20, 0)
            return DataSplits(train=(x, y * 0), test=(x, y * 0), num_classes=1)

        def float_labels_as_classes(cfg):
            x, y = _arrays(20, 0)
            return DataSplits(train=(x, y.astype("float32")), test=(x, y), num_classes=2)
    """))
    yield
    sys.modules.pop("user_data", None)


USER = ["dataset.preprocess.rescale=null", "model=mlp", "model.hidden_units=[8]",
        "strategy=default", "loop=custom", "trainer.epochs=4", "dataset.batch_size_per_replica=32",
        "optimizer.learning_rate=0.02"]


@pytest.mark.slow
@pytest.mark.parametrize("builder", ["arrays", "datasets"])
def test_user_dataset_builder(user_package, run_inprocess, builder):
    results = run_inprocess(*USER, f"dataset.name=user_data:{builder}", "dataset.validation=null")
    assert results["dataset"] == f"user_data:{builder}"
    assert results["steps_per_epoch"] == 7  # 200 rows by 32, a short last batch
    assert results["test_accuracy"] > 0.8


@pytest.mark.parametrize("builder, message", [
    ("wrong", "returned dict; a dataset builder returns distlab.DataSplits"),
    ("float_labels_as_classes", "num_classes is set but its labels are float32"),
    ("batched", "dataset.name='user_data:batched': its train dataset is batched (its "
     "pipeline batches): return one (input, label) example per element; distlab "
     "batches by dataset.batch_size_per_replica times the replicas"),
    ("fractional_classes", "dataset.name='user_data:fractional_classes': num_classes=2.5 is "
     "not a whole number"),
    ("one_class", "dataset.name='user_data:one_class': num_classes=1; classification needs 2 "
     "classes or more"),
    ("infinite", "dataset.name='user_data:infinite': its train dataset is infinite (its "
     "pipeline calls repeat()): return one pass over the split"),
])
def test_user_dataset_errors(user_package, run_inprocess, tmp_path, builder, message):
    out = tmp_path / builder
    with pytest.raises(SystemExit):
        run_inprocess(*USER, f"dataset.name=user_data:{builder}", out=out)
    assert message in (out / "results.json").read_text()


def test_a_builders_dataset_batched_then_unbatched_gives_examples(user_package):
    from distlab.data.builder_source import builder_splits

    cfg = compose_once(["dataset.name=user_data:batched_then_unbatched"]).dataset
    splits = builder_splits(cfg)
    assert splits.test.element_spec[1].shape == () == splits.train.element_spec[1].shape


def test_augmentation_is_refused_for_non_images(user_package, run_inprocess, tmp_path):
    out = tmp_path / "aug"
    with pytest.raises(SystemExit):
        run_inprocess(*USER, "dataset.name=user_data:arrays", "dataset.augment.flip=horizontal",
                      out=out)
    assert "dataset.augment works on images" in (out / "results.json").read_text()


def _load(tiny_data_dir, *overrides: str):
    from distlab.data import pipeline as data

    cfg = compose_once([f"dataset.data_dir={tiny_data_dir}", *overrides])
    return data.load(cfg.dataset, num_replicas=1, seed=3, steps_per_epoch=None)


def _epoch(d, epoch: int) -> np.ndarray:
    return np.concatenate([x.numpy() for x, _ in d.train_epochs(epoch, epoch + 1)])


def test_augmentation_is_seeded_per_epoch_and_train_only(tiny_data_dir):
    plain = _load(tiny_data_dir, "dataset.name=cifar10", "dataset.shuffle_buffer=0",
                  "dataset.validation=null")
    augmented = _load(tiny_data_dir, "dataset.name=cifar10", "dataset.shuffle_buffer=0",
                      "dataset.validation=null",
                      "dataset.augment.flip=horizontal", "dataset.augment.crop_padding=4")
    e0, e0_again, e1 = _epoch(augmented, 0), _epoch(augmented, 0), _epoch(augmented, 1)
    assert np.array_equal(e0, e0_again)  # a function of (seed, epoch, place) only
    assert not np.array_equal(e0, e1) and not np.array_equal(e0, _epoch(plain, 0))
    assert e0.shape == _epoch(plain, 0).shape == (256, 32, 32, 3)
    # resuming 2 steps into an epoch gives that epoch's remaining batches exactly
    rest = np.concatenate([x.numpy() for x, _ in augmented.train_epochs(1, 2, skip_steps=2)])
    assert np.array_equal(rest, e1[2 * 64:])
    test_plain = np.concatenate([x.numpy() for x, _ in plain.test])
    test_aug = np.concatenate([x.numpy() for x, _ in augmented.test])
    assert np.array_equal(test_plain, test_aug)  # never on the test split


def test_preprocessing_normalises_per_channel(tiny_data_dir):
    d = _load(tiny_data_dir, "dataset.name=cifar10", "dataset.preprocess.rescale=255",
              "dataset.preprocess.mean=[0.1,0.2,0.3]", "dataset.preprocess.std=[0.5,0.5,0.5]")
    raw = np.stack([x.numpy() for x, _ in d.raw_test.take(4)])
    assert raw.dtype == np.uint8 and d.raw_input.dtype.name == "uint8"
    expected = (raw / 255.0 - np.array([0.1, 0.2, 0.3])) / 0.5
    assert np.allclose(d.preprocess(raw).numpy(), expected, atol=1e-6)
    first = next(iter(d.test))[0][:4].numpy()
    assert np.allclose(first, expected, atol=1e-6)
    with pytest.raises(DistlabError, match=r"dataset\.preprocess\.mean has 2 entries but the "
                                           r"inputs have 3 channels"):
        _load(tiny_data_dir, "dataset.name=cifar10", "dataset.preprocess.mean=[0.1,0.2]")


def test_feature_mapping_errors(tiny_data_dir):
    with pytest.raises(DistlabError, match=r"dataset\.features\.label='price' is not a feature "
                                           r"of tiny_regression; its features: measurements, "
                                           r"target"):
        _load(tiny_data_dir, "dataset.name=tiny_regression", "dataset.features.input=measurements",
              "dataset.features.label=price")
    with pytest.raises(DistlabError, match="no supervised keys"):
        _load(tiny_data_dir, "dataset.name=tiny_regression")
    d = _load(tiny_data_dir, "dataset.name=tiny_regression", "dataset.features.input=measurements",
              "dataset.features.label=target", "dataset.preprocess.rescale=null")
    assert (d.input_shape, d.outputs, d.num_test) == ((TINY_REGRESSION_FEATURES,), 1, TINY_TEST)


@pytest.mark.parametrize("overrides, message", [
    (["task=regression", "strategy=default"],
     "task=regression needs value labels, but dataset mnist's labels are classes"),
    ([*REGRESSION[:4], "task=classification", "strategy=default"],
     "task=classification needs class labels, but dataset tiny_regression's labels are values"),
], ids=["regression-on-classes", "classification-on-values"])
def test_a_task_the_labels_do_not_fit_is_refused(run_inprocess, tmp_path, overrides, message):
    out = tmp_path / "mismatch"
    with pytest.raises(SystemExit):
        run_inprocess(*overrides, out=out)
    assert message in (out / "results.json").read_text()


def test_a_task_whose_keras_loss_reduces_the_batch_is_one_line():
    """A Keras loss left at its default reduction gave TensorFlow's BroadcastTo error (a
    per-example loss is what distlab averages over the global batch)."""
    import keras
    from omegaconf import OmegaConf

    from distlab import Task
    from distlab.components import tasks
    from distlab.errors import DistlabError
    from distlab.registry import TASKS

    def masked(cfg, reduction="sum_over_batch_size"):
        return Task(loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, ignore_class=-100, reduction=reduction), labels="classes")

    TASKS._items["masked"] = masked
    try:
        with pytest.raises(DistlabError, match=re.escape(
                "task.name='masked': its loss SparseCategoricalCrossentropy reduces each batch "
                "to one value (reduction='sum_over_batch_size'); a task's loss returns one "
                "value per example")):
            tasks.build(OmegaConf.create({"name": "masked"}))
        TASKS._items["masked"] = lambda cfg: masked(cfg, reduction=None)
        assert tasks.build(OmegaConf.create({"name": "masked"})).loss.reduction is None
    finally:
        del TASKS._items["masked"]


def test_label_smoothing_is_keras_crossentropy_with_label_smoothing(tmp_path):
    """task.label_smoothing: 0 is the sparse loss digit for digit; e > 0 is Keras'
    categorical cross-entropy with label_smoothing=e on one-hot labels, labels of shape
    [batch] or [batch, 1], logits or probabilities; under task=binary, Keras' binary
    cross-entropy with label_smoothing=e; a value outside [0, 1), or any but 0 under
    task=regression, is one line."""
    import keras
    import tensorflow as tf
    from conftest import refusal_in_process
    from omegaconf import OmegaConf

    from distlab.components.tasks import binary, classification

    labels = np.array([0, 3, 1, 3])
    logits = np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32)
    for from_logits, outputs in ((True, logits), (False, keras.ops.softmax(logits).numpy())):
        for smoothing in (0.0, 0.1, 0.5):
            task = classification(OmegaConf.create({"label_smoothing": smoothing}))
            task.from_logits = from_logits
            expected = (keras.losses.sparse_categorical_crossentropy(
                labels, outputs, from_logits=from_logits) if not smoothing else
                keras.losses.CategoricalCrossentropy(
                    from_logits=from_logits, label_smoothing=smoothing, reduction=None)(
                    np.eye(5, dtype=np.float32)[labels], outputs))
            for shaped in (labels, labels[:, None]):
                np.testing.assert_array_equal(task.loss(shaped, outputs), expected)
    binary_labels = np.array([0, 1, 1, 0])
    binary_logits = logits[:, :1]
    for smoothing in (0.0, 0.2):
        task = binary(OmegaConf.create({"label_smoothing": smoothing}))
        task.from_logits = True
        expected = keras.losses.BinaryCrossentropy(
            from_logits=True, label_smoothing=smoothing, reduction=None)(
            binary_labels[:, None].astype(np.float32), binary_logits)
        loss = task.loss(tf.constant(binary_labels), tf.constant(binary_logits))
        np.testing.assert_allclose(loss, expected, rtol=1e-6)
    for value in ("1", "-0.1"):
        error = refusal_in_process(tmp_path / value, f"task.label_smoothing={value}")
        assert "task.label_smoothing" in error and "[0, 1)" in error, error
    # a preset's smoothing (experiment=mnist_fast) with task=regression: distlab's one line
    error = refusal_in_process(tmp_path / "regression", "experiment=mnist_fast", "task=regression")
    assert "task.label_smoothing=0.1" in error and "task=regression" in error, error
