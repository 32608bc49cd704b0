"""Missing and non-finite values (NaN, Inf, None) in a dataset: refused as the data loads, in
one line naming the split, the input and the number of rows (they trained silently: a NaN
input gives the majority class, or a NaN loss), checked once per load and not per epoch."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf
from conftest import compose_once

from distlab import DataSplits
from distlab.data import pipeline, stream
from distlab.errors import DistlabError
from distlab.registry import DATASETS


def _load(builder, *overrides: str, **task: object) -> stream.Data:
    DATASETS._items["with_gaps"] = builder
    try:
        cfg = compose_once(["dataset.name=with_gaps", "dataset.preprocess.rescale=null",
                            "dataset.validation=null", *overrides]).dataset
        return pipeline.load(cfg, num_replicas=1, seed=0, steps_per_epoch=None, **task)
    finally:
        del DATASETS._items["with_gaps"]


def _columns(n: int, seed: int) -> tuple[dict, np.ndarray]:
    rng = np.random.default_rng(seed)
    return ({"bill": rng.normal(40, 5, (n, 2)), "mass": rng.normal(4000, 500, n),
             "species": rng.choice(["Adelie", "Gentoo"], n).astype(object)},
            rng.integers(0, 2, n))


def _refused(builder, message: str, *overrides: str) -> None:
    with pytest.raises(DistlabError, match=re.escape(message)) as e:
        _load(builder, *overrides)
    assert "\n" not in str(e.value) and "drop or impute those rows in the dataset builder" \
        in str(e.value)


def test_nan_and_inf_in_numeric_inputs_are_named_with_their_split_and_rows():
    def penguins(cfg):  # NaN measurements, as the Palmer penguins table has
        (x, y), test = _columns(60, 0), _columns(20, 1)
        x["mass"][[3, 7, 9]] = np.nan
        return DataSplits(train=(x, y), test=test, num_classes=2)

    _refused(penguins, "dataset.name='with_gaps': its train split has NaN or Inf in input "
             "'mass' in 3 of 60 rows")

    def tuple_inf(cfg):  # in the test split, in a tuple's second input: one row, twice
        x, y = _columns(20, 1)
        bill = x["bill"].copy()
        bill[5] = [np.inf, -np.inf]
        return DataSplits(train=((x["bill"], x["mass"]), y),
                          test=((x["mass"], bill), y), num_classes=2)

    _refused(tuple_inf, "its test split has NaN or Inf in input 'input_1' in 1 of 20 rows")

    def nested_overflow(cfg):  # finite float64, but not in float32 (the model's dtype)
        x, y = _columns(30, 2)
        x["mass"][0] = 1e300
        return DataSplits(train=({"m": {"mass": x["mass"]}}, y),
                          test=({"m": {"mass": x["mass"][:5] * 0}}, y[:5]), num_classes=2)

    _refused(nested_overflow, "its train split has NaN or Inf in input 'm_mass' in 1 of 30")

    def nan_targets(cfg):  # a regression's labels
        x, _ = _columns(40, 3)
        target = x["mass"].copy()
        target[:2] = np.nan
        return DataSplits(train=(x["bill"], target), test=(x["bill"], x["mass"]),
                          num_outputs=1)

    _refused(nan_targets, "its train split has NaN or Inf in the label in 2 of 40 rows")

    def stream(cfg):  # tf.data.Datasets, the builder's own validation split
        x, y = _columns(50, 4)
        x["bill"][-1, 0] = np.nan
        ds = tf.data.Dataset.from_tensor_slices(({"bill": x["bill"]}, y))
        return DataSplits(train=ds.take(40), validation=ds.skip(40), test=ds.take(10),
                          num_classes=2)

    _refused(stream, "its validation split (DataSplits.validation) has NaN or Inf in input "
             "'bill' in 1 of 10 rows", "dataset.validation=auto")


def test_a_missing_value_in_a_string_column_is_named():
    """A pandas column of strings holding NaN (or None) was `zero-dimensional arrays cannot
    be concatenated`."""
    for gap in (float("nan"), None):
        def builder(cfg, gap=gap):
            (x, y), test = _columns(40, 0), _columns(10, 1)
            x["species"][[0, 11]] = gap
            return DataSplits(train=(x, y), test=test, num_classes=2)

        _refused(builder, "dataset.name='with_gaps': its train split has missing values (NaN "
                 "or None) in input 'species' in 2 of 40 rows")

    def mixed(cfg):  # strings and numbers in one column: named too
        (x, y), test = _columns(40, 0), _columns(10, 1)
        x["species"][3] = 7
        return DataSplits(train=(x, y), test=test, num_classes=2)

    with pytest.raises(DistlabError, match=re.escape(
            "its train split has values of several types in input 'species' (int, str)")):
        _load(mixed)

    def numbers(cfg):  # a column of numbers held as objects (pandas' object dtype): numbers
        (x, y), test = _columns(40, 0), _columns(10, 1)
        x["mass"] = x["mass"].astype(object)
        return DataSplits(train=(x, y), test=test, num_classes=2)

    assert _load(numbers).raw_input["mass"].dtype == tf.float64


def test_the_check_reads_each_split_once_not_each_epoch(tmp_path):
    """The check's one pass fills the in-memory cache: the source is read once, for the
    check and every epoch."""
    reads = tf.Variable(0, dtype=tf.int64)

    def counted(cfg):
        x, y = _columns(40, 0)
        ds = tf.data.Dataset.from_tensor_slices((x["bill"], y))

        def count(features, label):
            reads.assign_add(1)
            return features, label

        return DataSplits(train=ds.map(count), test=ds.take(8), num_classes=2)

    data = _load(counted, "dataset.batch_size_per_replica=8")
    assert int(reads.numpy()) == 40
    for _ in data.train_epochs(0, 3):
        pass
    assert int(reads.numpy()) == 40
    clean = _load(lambda cfg: DataSplits(train=_columns(40, 0), test=_columns(8, 1),
                                         num_classes=2))
    assert clean.num_train == 40  # finite data loads as before



def test_class_labels_outside_the_classes_are_named_with_their_split():
    """A builder's class label outside 0..num_classes-1 (TensorFlow's error mid-run, before)
    is one line naming the split and the label, from the same one pass per split."""
    x, y = _columns(40, 0)
    head = {k: v[:8] for k, v in x.items()}
    for labels, split, bad in ((np.where(np.arange(40) == 7, 4, y), "train", 4),
                               (np.where(np.arange(40) == 3, -1, y), "train", -1)):
        with pytest.raises(DistlabError, match=re.escape(
                f"its {split} split has the class label {bad}, outside 0..1 (num_classes=2)")):
            _load(lambda cfg, labels=labels: DataSplits(train=(x, labels), test=(head, y[:8]),
                                                        num_classes=2))
    with pytest.raises(DistlabError, match=re.escape("its test split has the class label 2")):
        _load(lambda cfg: DataSplits(train=(x, y), test=(head, np.full(8, 2)), num_classes=2))


def test_a_label_the_loss_ignores_passes_the_range_check():
    """A user task whose loss masks a label (Keras' `ignore_class=-100`) was refused by the
    class-range check."""
    x, y = _columns(40, 0)
    masked = np.where(np.arange(40) % 5 == 0, -100, y)

    def builder(cfg):
        return DataSplits(train=(x, masked), test=(x, y), num_classes=2)

    assert _load(builder, ignored_label=-100).num_train == 40
    with pytest.raises(DistlabError, match=re.escape("its train split has the class label "
                                                     "-100, outside 0..1")):
        _load(builder, ignored_label=-1)
