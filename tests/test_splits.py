"""Three splits, used honestly: train is fitted, validation chooses, test only reports.

Fast tests check the held-out fraction (seeded, stratified, disjoint from train), tfds
slices, a builder's own validation split and the refusals; the slow ones train and check
that early stopping and checkpoints/best follow the val_ column, that test_* is the final
(and, when asked, the best) model's, and that validation figures do not depend on the
replica count.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import TINY_TRAIN, compose_once

from distlab.config.checks import validate
from distlab.data import holdout, pipeline, stream
from distlab.errors import ConfigError, DistlabError


def _load(tiny_data_dir, *overrides: str, replicas: int = 1, seed: int = 3):
    cfg = compose_once([f"dataset.data_dir={tiny_data_dir}", "dataset.disk_cache=false",
                        *overrides])
    return pipeline.load(cfg.dataset, num_replicas=replicas, seed=seed, steps_per_epoch=None)


def _rows(ds: tf.data.Dataset) -> list[tuple[bytes, int]]:
    """(image bytes, label) of every example of an unbatched (input, label) dataset."""
    return [(x.tobytes(), int(y)) for x, y in ds.as_numpy_iterator()]


def test_held_out_fraction_is_disjoint_seeded_and_stratified(tiny_data_dir):
    data = _load(tiny_data_dir)  # dataset.validation=auto: tiny mnist has no validation split
    train, held = _rows(data.train), _rows(data.validation.unbatch())
    assert len(train) + len(held) == TINY_TRAIN == data.num_train + data.num_validation
    assert not set(train) & set(held) and len(set(train) | set(held)) == TINY_TRAIN
    counts = np.bincount([y for _, y in train + held], minlength=10)  # all of train
    held_counts = np.bincount([y for _, y in held], minlength=10)
    np.testing.assert_array_equal(held_counts, np.round(0.1 * counts))  # per class
    assert "0.1 of train" in data.validation_from and "stratified" in data.validation_from
    # the same rows whatever the training seed; another validation_seed moves them
    again = _rows(_load(tiny_data_dir, seed=7).validation.unbatch())
    other = _rows(_load(tiny_data_dir, "dataset.validation_seed=1").validation.unbatch())
    assert again == held and set(other) != set(held)
    assert len(_rows(_load(tiny_data_dir, "dataset.validation=0.25").validation.unbatch())) \
        == sum(round(0.25 * c) for c in counts)


@pytest.mark.parametrize("chunk", [1, 3, 4096])
def test_holding_out_by_chunks_picks_the_same_rows_as_row_by_row(chunk):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(23, 2, 2)).astype(np.float32), np.arange(23)
    mask = rng.random(23) < 0.3
    fixed = tf.data.Dataset.from_tensor_slices(({"a": x, "b": x[:, 0]}, y))
    train, held = holdout.hold_out(fixed, mask, chunk=chunk)
    assert train.element_spec == fixed.element_spec
    assert [int(b) for _, b in train.as_numpy_iterator()] == list(y[~mask])
    np.testing.assert_array_equal(np.stack([f["a"] for f, _ in held.as_numpy_iterator()]),
                                  x[mask])
    varying = tf.data.Dataset.from_generator(  # rows of varying length: one by one
        lambda: ((np.ones(i % 4 + 1, np.float32), i) for i in range(23)),
        output_signature=(tf.TensorSpec([None], tf.float32), tf.TensorSpec([], tf.int64)))
    train, held = holdout.hold_out(varying, mask, chunk=chunk)
    assert [int(b) for _, b in held.as_numpy_iterator()] == list(y[mask])
    assert [len(a) for a, _ in train.as_numpy_iterator()] == [i % 4 + 1 for i in y[~mask]]


def test_held_out_rows_rules():
    labels = np.array([0] * 10 + [1] * 30)
    mask = holdout.held_out_rows(labels, 40, 0.2, seed=0)
    assert (mask[:10].sum(), mask[10:].sum()) == (2, 6)
    np.testing.assert_array_equal(mask, holdout.held_out_rows(labels, 40, 0.2, seed=0))
    assert holdout.held_out_rows(None, 40, 0.5, seed=0).sum() == 20
    with pytest.raises(DistlabError, match="dataset.validation=0.01 holds out 0 of"):
        holdout.held_out_rows(None, 40, 0.01, seed=0)


def test_a_tfds_slice_is_the_validation_split_and_must_not_overlap(tiny_data_dir):
    data = _load(tiny_data_dir, "dataset.train_split='train[:75%]'",
                 "dataset.validation='train[75%:]'")
    assert (data.num_train, data.num_validation) == (384, 128)
    assert data.validation_from == "train[75%:]"
    assert not set(_rows(data.train)) & set(_rows(data.validation.unbatch()))
    with pytest.raises(DistlabError, match=r"\"dataset.validation='train\[75%:\]'\" shares "
                       r"examples with dataset.train_split=train"):
        _load(tiny_data_dir, "dataset.validation='train[75%:]'")
    with pytest.raises(DistlabError, match="dataset.validation='valid'.* not available"):
        _load(tiny_data_dir, "dataset.validation=valid")


def test_a_builders_own_validation_split(tiny_data_dir, monkeypatch):
    from distlab import DataSplits
    from distlab.registry import DATASETS

    rng = np.random.default_rng(0)

    def arrays(n):
        return rng.normal(size=(n, 4)).astype("float32"), rng.integers(0, 3, n)

    def builder(cfg):
        return DataSplits(train=arrays(90), test=arrays(30), validation=arrays(20),
                          num_classes=3)

    monkeypatch.setitem(DATASETS._items, "three_splits", builder)
    data = _load(tiny_data_dir, "dataset.name=three_splits")
    assert (data.num_train, data.num_validation, data.num_test) == (90, 20, 30)
    assert data.validation_from == "DataSplits.validation"
    held = _load(tiny_data_dir, "dataset.name=three_splits", "dataset.validation=0.1")
    assert (held.num_train, held.num_validation) == (81, 9)  # stratified: 0.1 of each class
    assert _load(tiny_data_dir, "dataset.name=three_splits",
                 "dataset.validation=null").validation is None
    named = _load(tiny_data_dir, "dataset.name=three_splits", "dataset.validation=validation")
    assert (named.num_validation, named.validation_from) == (20, "DataSplits.validation")


def test_a_builders_splits_take_tfds_slices(tiny_data_dir, monkeypatch):
    """dataset.train_split / test_split / validation slice a builder's splits as tfds slices
    its own (they were recorded and ignored): the rows, steps per epoch and test rows follow."""
    from distlab import DataSplits
    from distlab.registry import DATASETS

    def rows(first: int, n: int):  # input = the row's id, so that each row can be traced
        ids = np.arange(first, first + n, dtype=np.float32)[:, None]
        return ids, (np.arange(n) % 2).astype(np.int64)

    monkeypatch.setitem(DATASETS._items, "ids",
                        lambda cfg: DataSplits(train=rows(0, 800), test=rows(1000, 100),
                                               num_classes=2))
    user = ("dataset.name=ids", "dataset.preprocess.rescale=null", "dataset.shuffle_buffer=0")

    def ids(ds: tf.data.Dataset) -> list[int]:
        return [int(x[0]) for x, _ in ds.as_numpy_iterator()]

    def load(*overrides: str) -> stream.Data:
        return _load(tiny_data_dir, *user, "dataset.validation=null", *overrides)

    whole = load()
    assert (whole.num_train, whole.steps_per_epoch, whole.num_test) == (800, 13, 100)
    half = load("dataset.train_split='train[:50%]'")
    assert (half.num_train, half.steps_per_epoch) == (400, 7)
    assert ids(half.train) == list(range(400))
    assert load("dataset.train_split='train[:800]'").steps_per_epoch == 13
    tail = load("dataset.test_split='test[10:]'")
    assert tail.num_test == 90 and ids(tail.test.unbatch()) == list(range(1010, 1100))
    assert tail.steps_per_epoch == 13
    sliced = _load(tiny_data_dir, *user, "dataset.train_split='train[:90%]'",
                   "dataset.validation='train[90%:]'")
    assert (sliced.num_train, sliced.num_validation, sliced.validation_from) == (
        720, 80, "train[90%:]")
    assert ids(sliced.validation.unbatch()) == list(range(720, 800))
    held = _load(tiny_data_dir, *user, "dataset.train_split='train[:50%]'",
                 "dataset.validation=0.1")
    assert (held.num_train, held.num_validation) == (360, 40)
    assert max(ids(held.train) + ids(held.validation.unbatch())) == 399

    for overrides, message in (
            (["dataset.test_split='train[:10]'"], "\"dataset.test_split='train[:10]'\" shares "
             "examples with dataset.train_split=train"),
            (["dataset.train_split='train[:0]'"], "dataset.train_split='train[:0]' selects no "
             "rows of the splits dataset.name='ids' returns: train (800 rows), test (100 rows)"),
            (["dataset.train_split=valid"], "dataset.train_split='valid' cannot be read from "
             "the splits dataset.name='ids' returns: .* Unknown split 'valid'"),
            (["dataset.validation=validation"], "dataset.validation='validation' names the "
             "split 'validation', which dataset.name='ids' does not return"),
            # tfds' feature keys have no meaning for a builder: refused, not recorded
            (["dataset.features.input=age"], "dataset.features.input=age names a tfds "
             "feature, and dataset.name='ids' is a dataset builder of yours")):
        with pytest.raises(DistlabError, match=re.escape(message).replace(r"\.\*", ".*")):
            _load(tiny_data_dir, *user, *overrides)
    with pytest.raises(DistlabError,
                       match=re.escape("\"dataset.test_split='train[:10]'\" shares")):
        _load(tiny_data_dir, "dataset.test_split='train[:10]'")  # a tfds dataset's, likewise
    # a whole split the builder returns empty: refused as a slice without rows is
    monkeypatch.setitem(DATASETS._items, "no_test",
                        lambda cfg: DataSplits(train=rows(0, 800), test=rows(1000, 0),
                                               num_classes=2))
    with pytest.raises(DistlabError, match=re.escape(
            "dataset.test_split='test': the split 'test' that dataset.name='no_test' returns "
            "has no rows (train (800 rows), test (0 rows))")):
        _load(tiny_data_dir, *user, "dataset.name=no_test")


@pytest.mark.parametrize("overrides,needle", [
    (["dataset.validation=test"], "dataset.validation='test' is the test split"),
    (["dataset.validation=1.5"], "dataset.validation='1.5' is invalid"),
    (["dataset.validation=0"], "dataset.validation='0' is invalid"),
    (["trainer.early_stopping.metric=test_accuracy"],
     "trainer.early_stopping.metric=test_accuracy would choose on the test split"),
    (["trainer.target.metric=test_loss", "trainer.target.value=0.1"],
     "would choose on the test split"),
    (["objective=test_accuracy"], "test_* fields are not objectives"),
    (["dataset.validation=null", "trainer.best_checkpoint.metric=val_loss"],
     "trainer.best_checkpoint.metric=val_loss needs a validation split"),
    (["dataset.validation=null", "objective=val_accuracy"],
     "objective=val_accuracy needs a validation split"),
    (["objective=best_value"], "objective=best_value needs checkpoints/best, and none is "
                               "configured: set it (e.g. trainer.best_checkpoint.metric=val_loss)"),
    (["objective=epochs_to_target"], "objective=epochs_to_target needs trainer.target, and none"),
    (["trainer.best_checkpoint.test=true"],
     "trainer.best_checkpoint.test=true scores checkpoints/best, which exists only with"),
])
def test_choosing_on_the_test_split_is_refused(overrides, needle):
    with pytest.raises(ConfigError, match=None) as e:
        validate(compose_once(overrides))
    assert needle in str(e.value), str(e.value)


def test_without_a_validation_split_no_val_columns_and_no_default_objective():
    from distlab.records.ranking import objective_fields
    from distlab.records.run_dir import history_columns

    assert history_columns(["accuracy"], validation=False) == [
        "epoch", "learning_rate", "loss", "accuracy", "seconds", "examples_per_sec"]
    assert objective_fields(None, {"accuracy": True}, validation=False) == {
        "objective": None, "objective_direction": None}
    assert objective_fields("best_value", {"accuracy": True}, True, validation=False) == {
        "objective": "best_value", "objective_direction": "maximize"}
    assert objective_fields(None, {"mae": False})["objective"] == "val_mae"
    validate(compose_once(["dataset.validation=null", "objective=best_value",
                           "trainer.best_checkpoint.metric=loss"]))  # a train metric: accepted


def test_the_tutorial_presets_keep_their_tutorials_splits():
    fit = compose_once(["experiment=tutorial_keras_mnist"])
    custom = compose_once(["experiment=tutorial_custom_fashion"])
    assert fit.dataset.validation is None and fit.trainer.validate_every == 0
    assert custom.dataset.validation is None and custom.trainer.test_every == 1
    assert compose_once([]).dataset.validation == "auto"
    assert compose_once(["hparams_search=optuna"]).objective == "val_accuracy"


def _history(run_dir) -> list[dict[str, float]]:
    with open(run_dir / "history.csv") as f:
        return [{k: float(v) if v else None for k, v in row.items()} for row in csv.DictReader(f)]


SELECTED = ("loop=custom", "trainer.epochs=4", "deterministic=true", "seed=11",
            "optimizer.learning_rate=0.02", "trainer.best_checkpoint.metric=val_loss",
            "trainer.best_checkpoint.test=true", "trainer.early_stopping.metric=val_accuracy",
            "trainer.early_stopping.patience=1", "model=mlp", "model.hidden_units=[16]")


@pytest.mark.slow
def test_selection_follows_the_validation_column_and_test_only_reports(run_once, run_inprocess,
                                                                       tmp_path):
    results, run_dir = run_once(*SELECTED)
    rows = _history(run_dir)
    val_loss = [r["val_loss"] for r in rows]
    assert results["best_epoch"] == int(np.argmin(val_loss)) + 1  # the val_ column's argmin
    assert results["best_value"] == pytest.approx(min(val_loss), rel=1e-5)
    if "stopped_early" in results:  # patience 1 on val_accuracy
        accuracy = [r["val_accuracy"] for r in rows]
        assert accuracy[-1] <= max(accuracy[:-1])
    assert results["val_loss"] == pytest.approx(val_loss[-1], rel=1e-5)  # the final model's
    assert results["val_loss"] != pytest.approx(results["test_loss"], rel=1e-3)
    assert "test_loss" not in rows[0] and results["objective"] == "val_accuracy"
    assert results["num_validation"] == 51 and "0.1 of train" in results["validation"]
    # best_test_*: checkpoints/best on the test split, as an evaluation of it gives
    best = run_inprocess("mode=evaluate", f"ckpt_path={results['best_checkpoint']}",
                         "model=mlp", "model.hidden_units=[16]", "loop=custom")
    assert results["best_test_loss"] == pytest.approx(best["test_loss"], abs=1e-6)
    assert results["best_test_accuracy"] == best["test_accuracy"]
    # the validation figures of one checkpoint on 1 and 2 replicas
    two = run_inprocess("mode=evaluate", f"ckpt_path={results['best_checkpoint']}",
                        "model=mlp", "model.hidden_units=[16]", "loop=custom",
                        "strategy.cpu_devices=2")
    assert two["val_loss"] == pytest.approx(best["val_loss"], abs=1e-6)
    assert two["val_accuracy"] == pytest.approx(best["val_accuracy"], abs=1e-6)
    assert best["val_loss"] == pytest.approx(results["best_value"], abs=1e-6)


@pytest.mark.slow
def test_a_per_epoch_test_pass_is_labelled_test(run_inprocess, tmp_path):
    out = tmp_path / "tutorial_like"
    results = run_inprocess("loop=custom", "model=mlp", "model.hidden_units=[16]",
                            "dataset.validation=null", "trainer.validate_every=0",
                            "trainer.test_every=1", out=out)
    rows = _history(out)
    assert [k for k in rows[0] if "loss" in k] == ["loss", "test_loss"]  # no empty val_ columns
    assert results["val_loss"] is None and results["val_accuracy"] is None
    assert rows[-1]["test_loss"] == pytest.approx(results["test_loss"], rel=1e-5)  # 6 digits
    assert results["validation"] is None and results["num_validation"] is None
    assert (results["objective"], results["objective_direction"]) == (None, None)
    assert (out / "logs" / "test").is_dir() and not (out / "logs" / "validation").exists()


@pytest.mark.slow
def test_an_evaluation_on_other_splits_than_the_training_run_is_refused(run_once, run_inprocess,
                                                                        tmp_path):
    """A checkpoint trained on all of train (dataset.validation=null) evaluated with a held-out
    fraction would report val_ figures on rows it trained on: refused, naming the override."""
    _, run_dir = run_once("loop=custom", "model=mlp", "model.hidden_units=[16]",
                          "dataset.validation=null", "trainer.epochs=1")
    out = tmp_path / "evaluate"
    with pytest.raises(SystemExit) as e:
        run_inprocess("mode=evaluate", f"ckpt_path={run_dir}", "model=mlp",
                      "model.hidden_units=[16]", out=out)
    assert e.value.code == 2
    error = (out / "results.json").read_text()
    assert "was trained with dataset.validation=null" in error
    assert "Add dataset.validation=null to evaluate on its splits" in error
    same = run_inprocess("mode=evaluate", f"ckpt_path={run_dir}", "model=mlp",
                         "model.hidden_units=[16]", "dataset.validation=null",
                         out=tmp_path / "same")
    assert same["val_loss"] is None and same["test_loss"] > 0
    # another spec of the same rows is the same split: evaluated
    whole = run_inprocess("mode=evaluate", f"ckpt_path={run_dir}", "model=mlp",
                          "model.hidden_units=[16]", "dataset.validation=null",
                          "dataset.test_split='test[:100%]'", out=tmp_path / "whole")
    assert whole["test_loss"] == same["test_loss"]
    # the test split's rows differ (a tfds slice): found by the rows' fingerprints
    out = tmp_path / "half"
    with pytest.raises(SystemExit) as e:
        run_inprocess("mode=evaluate", f"ckpt_path={run_dir}", "model=mlp",
                      "model.hidden_units=[16]", "dataset.validation=null",
                      "dataset.test_split='test[:50%]'", out=out)
    assert e.value.code == 2
    assert json.loads((out / "results.json").read_text())["error"] == (
        f"ckpt_path={run_dir} was trained with dataset.test_split=test, and this evaluation "
        "has \"dataset.test_split='test[:50%]'\": its test split would hold other rows than the "
        "run's (rows it trained on, perhaps). Add dataset.test_split=test to evaluate on its "
        "splits")


EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tabular_project"


@pytest.fixture
def example(run_inprocess, monkeypatch):
    """run_inprocess for examples/tabular_project's experiment=breast_cancer (its conf/ on
    the search path, its package importable), 1 epoch of 3 steps on one device."""
    pytest.importorskip("sklearn")
    monkeypatch.syspath_prepend(str(EXAMPLE))

    def run(*overrides: str, out: Path) -> dict:
        return run_inprocess(f"hydra.searchpath=[file://{EXAMPLE / 'conf'}]",
                             "experiment=breast_cancer", "strategy=default", "trainer.epochs=1",
                             "trainer.steps_per_epoch=3", *overrides, out=out)

    return run


def _refused(run, *overrides: str, out: Path) -> str:
    with pytest.raises(SystemExit) as e:
        run(*overrides, out=out)
    assert e.value.code == 2
    return json.loads((out / "results.json").read_text())["error"]


@pytest.mark.slow
def test_an_evaluation_on_moved_rows_or_with_other_preprocessing_is_refused(example,
                                                                            tmp_path):
    """The tabular example's own split key (dataset.split_seed) moves trained rows into the
    test split: refused, naming the key, as is another dataset.preprocess (the model would
    score other inputs). The same keys evaluate the training run's own test figures. A run
    dir from before the rows' fingerprints is held to its dataset keys."""
    trained = tmp_path / "train"
    results = example(out=trained)
    evaluate = ("mode=evaluate", f"ckpt_path={trained}")
    error = _refused(example, *evaluate, "dataset.split_seed=7", out=tmp_path / "seed")
    assert error == (
        f"ckpt_path={trained} was trained with dataset.split_seed=0, and this evaluation has "
        "dataset.split_seed=7: its train, validation and test splits would hold other rows "
        "than the run's (rows it trained on, perhaps). Add dataset.split_seed=0 to evaluate "
        "on its splits")
    error = _refused(example, *evaluate, "dataset.preprocess.rescale=10.0",
                     "dataset.preprocess.standardize=false", out=tmp_path / "rescale")
    assert error == (
        f"ckpt_path={trained} was trained with dataset.preprocess.rescale=null "
        "dataset.preprocess.standardize=true, and this evaluation has "
        "dataset.preprocess.rescale=10.0 dataset.preprocess.standardize=false: the model "
        "would score inputs prepared otherwise than those it was trained on. Add "
        "dataset.preprocess.rescale=null dataset.preprocess.standardize=true to evaluate with "
        "its preprocessing")
    same = example(*evaluate, out=tmp_path / "same")
    for key in ("test_loss", "test_accuracy", "test_auc", "val_loss"):
        assert same[key] == pytest.approx(results[key], abs=1e-6), key
    (trained / ".distlab" / "splits.json").unlink()  # as a run dir of an earlier version
    error = _refused(example, *evaluate, "dataset.split_seed=7", out=tmp_path / "old")
    assert error.startswith(f"ckpt_path={trained} was trained with dataset.split_seed=0, and "
                            "this evaluation's splits differ")


@pytest.mark.slow
def test_a_run_on_a_slice_of_a_builders_splits(run_inprocess):
    """The figures of a run follow dataset.train_split on a builder (426 training rows):
    half of them (213; 22 held out for validation) is 3 steps of 64, not 6."""
    user = ("imports=[user_inputs]", "dataset.name=raw_breast_cancer",
            "dataset.preprocess.rescale=null", "model=mlp", "model.hidden_units=[8]",
            "trainer.epochs=1", "strategy=default")
    half = run_inprocess(*user, "dataset.train_split='train[:50%]'")
    assert (half["steps_per_epoch"], half["num_validation"]) == (3, 22)
    assert half["validation"].startswith("0.1 of train[:50%], held out")
