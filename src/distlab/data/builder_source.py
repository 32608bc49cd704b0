"""The user-builder source: a dataset builder of the user's (`dataset.name` registered, or an
import path) returning `DataSplits` of tf.data datasets or arrays (NumPy, pandas columns),
whose splits `dataset.train_split`, `test_split` and `validation` select from as tfds split
specs do."""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
from typing import Any

import numpy as np
import tensorflow as tf
from omegaconf import DictConfig

from distlab.data import finite, slices
from distlab.data.holdout import class_labels, validation_choice, with_held_out
from distlab.data.prepared import split_names
from distlab.data.source import DataSource, RawSplits
from distlab.data.structure import count_rows, dense_inputs, input_name
from distlab.errors import DistlabError, described, override

log = logging.getLogger(__name__)


class BuilderSource(DataSource):
    """A dataset builder of the user's: a `dataset.name` registered in the datasets registry
    (`distlab.register`), or an import path (`my_project.data:penguins`)."""

    def claims(self, name: str) -> bool:
        from distlab.registry import is_tfds_name

        return not is_tfds_name(name)

    def splits(self, cfg: DictConfig) -> RawSplits:
        return builder_splits(cfg)


def builder_splits(cfg: DictConfig) -> RawSplits:
    """A user's dataset builder (`dataset.name`): DataSplits of datasets or arrays."""
    from distlab.data.splits import DataSplits
    from distlab.registry import DATASETS

    key = f"dataset.name={cfg.name!r}"
    given = {k: v for k, v in (cfg.get("features") or {}).items() if v is not None}
    if given:  # tfds' feature names: a builder's DataSplits are (inputs, labels) already
        name, value = next(iter(given.items()))
        raise DistlabError(
            f"dataset.features.{name}={value} names a tfds feature, and {key} is a dataset "
            "builder of yours, whose DataSplits give the inputs and labels: remove "
            f"dataset.features, or give your builder a key of its own to choose its inputs")
    splits = DATASETS.build(cfg.name, cfg)
    if not isinstance(splits, DataSplits):
        raise DistlabError(f"{key} returned {type(splits).__name__}; a dataset builder "
                           "returns distlab.DataSplits(train, test, num_classes=|num_outputs=)")
    train, test = (_as_dataset(s, key, which)
                   for s, which in ((splits.train, "train"), (splits.test, "test")))
    label = train.element_spec[1]
    if splits.num_classes is not None:
        if not label.dtype.is_integer:
            raise DistlabError(f"{key}: num_classes is set but its labels are {label.dtype.name}"
                               "; classification labels are integers (or set num_outputs)")
        if isinstance(splits.num_classes, bool) or not isinstance(splits.num_classes,
                                                                   numbers.Integral):
            raise DistlabError(f"{key}: num_classes={splits.num_classes!r} is not a whole "
                               "number: give the number of classes (labels 0..num_classes-1)")
        outputs = int(splits.num_classes)
        if outputs < 2:
            raise DistlabError(f"{key}: num_classes={outputs}; classification needs 2 classes "
                               "or more (one class is learned trivially: loss 0, accuracy 1)"
                               ": give the number of classes, num_classes=2 for yes/no labels")
    else:
        outputs = int(splits.num_outputs or max(1, math.prod(label.shape)))
    classes = splits.num_classes is not None
    given = {"train": train, "test": test}
    if splits.validation is not None:
        given["validation"] = _as_dataset(splits.validation, key, "validation")
    counts = {name: count_rows(ds) for name, ds in given.items()}
    train, num_train = slices.select(cfg.train_split, "train_split", given, counts, key)
    test, num_test = slices.select(cfg.test_split, "test_split", given, counts, key)
    raw = RawSplits(train, test, num_train, num_test, outputs, classes, None)
    specs = {"train_split": cfg.train_split, "test_split": cfg.test_split}
    choice = validation_choice(cfg.validation, has_own="validation" in given)
    if isinstance(choice, str):
        if "validation" not in given and "validation" in split_names(choice):
            raise DistlabError(
                f"dataset.validation={choice!r} names the split 'validation', which {key} "
                "does not return: return one (DataSplits(..., validation=...)), hold out a "
                "fraction of the train split (dataset.validation=0.1), or name a slice of "
                f"another split ({override('dataset.train_split', 'train[:90%]')} "
                f"{override('dataset.validation', 'train[90%:]')})")
        validation, num_validation = slices.select(choice, "validation", given, counts, key)
        specs["validation"] = choice
        raw = dataclasses.replace(
            raw, validation=validation, num_validation=num_validation,
            validation_from="DataSplits.validation" if choice == "validation" else choice)
    slices.check_disjoint(specs, slices.split_infos(counts))
    if not isinstance(choice, float):
        return raw
    if "validation" in given:
        log.warning("dataset.validation=%g holds out a fraction of the train split, so the "
                    "validation split %s returns is not used (dataset.validation=auto "
                    "uses it)", choice, key)
    return with_held_out(raw, class_labels(train) if classes else None, choice, cfg)


def check_class_range(splits: dict[str, tf.data.Dataset | None], num_classes: int,
                      key: str, ignored: int | None = None) -> None:
    """Refuse, in one line, class labels outside 0..num_classes-1 (but `ignored`, the label
    a loss's `ignore_class` masks) in a split ({"train split 'train'": dataset, ...}) of a
    builder's (the loss would fail in the first step that meets one, with TensorFlow's
    error); tfds' ClassLabel guarantees them. One pass over each split's labels (from the
    memory cache where the finite check's pass filled it)."""
    top, bottom = tf.int64.max, tf.int64.min
    for name, ds in splits.items():
        if ds is None:
            continue
        labels = ds.map(lambda x, y: tf.reshape(tf.cast(y, tf.int64), [-1])).unbatch()
        if ignored is not None:
            labels = labels.filter(lambda label: label != ignored)
        low, high = labels.batch(finite.CHECK_BATCH).reduce(
            (tf.constant(top), tf.constant(bottom)),
            lambda acc, b: (tf.minimum(acc[0], tf.reduce_min(b)),
                            tf.maximum(acc[1], tf.reduce_max(b))))
        low, high = int(low), int(high)
        if low < 0 or high >= num_classes:
            bad = low if low < 0 else high
            raise DistlabError(f"{key}: its {name} has the class label {bad}, outside "
                               f"0..{num_classes - 1} (num_classes={num_classes}): give "
                               "num_classes as the number of classes, and labels from 0")


def _as_dataset(split: Any, key: str, which: str) -> tf.data.Dataset:
    if isinstance(split, tf.data.Dataset):
        spec = split.element_spec
        if not (isinstance(spec, tuple) and len(spec) == 2):
            raise DistlabError(f"{key}: its {which} dataset must give (input, label) pairs, "
                               f"not {spec}")
        if _batched(split):
            raise DistlabError(
                f"{key}: its {which} dataset is batched (its pipeline batches): return "
                "one (input, label) example per element; distlab batches by "
                "dataset.batch_size_per_replica times the replicas")
        if split.cardinality() == tf.data.INFINITE_CARDINALITY:
            raise DistlabError(
                f"{key}: its {which} dataset is infinite (its pipeline calls repeat()): "
                "return one pass over the split; distlab repeats it for each epoch "
                "(trainer.epochs; trainer.steps_per_epoch to shorten one)")
        return dense_inputs(split)
    if isinstance(split, tuple | list) and len(split) == 2:
        where = f"{key}: its {which} split"
        try:
            columns = (_as_columns(split[0], where), _as_column(split[1], where, "label"))
            return dense_inputs(tf.data.Dataset.from_tensor_slices(columns))
        except (ValueError, TypeError, tf.errors.OpError) as e:
            raise DistlabError(f"{key}: its {which} split's (inputs, labels) do not make a "
                               f"dataset: {described(e)}") from None
    raise DistlabError(f"{key}: its {which} split must be a tf.data.Dataset of (input, label) "
                       f"pairs or a tuple (inputs, labels) of arrays, not {type(split).__name__}")


def _batched(dataset: tf.data.Dataset) -> bool:
    """Whether tf.data's batch (padded, ragged or parallel) made `dataset`'s elements, as its
    chain of transformations (each one's `_input_dataset`) shows; an unbatch undoes it."""
    for _ in range(1000):  # a chain this long is not a user's pipeline
        name = type(dataset).__name__
        if "Unbatch" in name or "FlatMap" in name or "Interleave" in name:
            return False  # (the elements a flat_map or interleave makes are its function's)
        if "Batch" in name:
            return True
        dataset = getattr(dataset, "_input_dataset", None)
        if dataset is None:
            return False
    return False


def _as_columns(inputs: Any, where: str, path: tuple[str, ...] = ()) -> Any:
    """A user's inputs as tensors for from_tensor_slices: an array, or a tuple or dict of
    them (nested), each with one row per example. `where` (the builder and split) and the
    input's path name it in messages."""
    if isinstance(inputs, dict):
        return {k: _as_columns(v, where, (*path, str(k))) for k, v in inputs.items()}
    if isinstance(inputs, tuple):
        return tuple(_as_columns(v, where, (*path, str(i))) for i, v in enumerate(inputs))
    return _as_column(inputs, where, input_name(path) if path else "inputs")


def _as_column(values: Any, where: str = "", name: str = "inputs") -> Any:
    """One input (or the labels): a NumPy array; rows of different lengths (a list of
    sequences, an object array of arrays) a tf.RaggedTensor; Python strings tf.string. An
    object array with missing values (a pandas column of strings holding NaN or None) is
    refused, naming `where` and `name`."""
    if tf.is_tensor(values):
        return values
    try:
        array = np.asarray(values)
    except ValueError:  # rows of different lengths (NumPy refuses to make them an array)
        return _ragged(values)
    if array.dtype == object:
        missing = finite.missing_in_objects(array)
        if missing:
            raise DistlabError(finite.message(where, name, missing, len(array),
                                              "missing values (NaN or None)"))
        cells = array.ravel()
        if all(isinstance(v, str | bytes) for v in cells):
            return array.astype(bytes if isinstance(cells[0], bytes) else str)
        scalars = [type(v).__name__ for v in cells if np.ndim(v) == 0]
        if len(scalars) == len(cells):  # one value a cell: numbers (pandas object dtype), or mixed
            if all(isinstance(v, int | float | np.number | np.bool_) for v in cells):
                return np.array(array.tolist())
            raise DistlabError(
                f"{where} has values of several types in input {name!r} "
                f"({', '.join(sorted(set(scalars)))}): give each input one type (strings, or "
                "numbers) in the dataset builder (e.g. pandas' astype)")
        return _ragged(values)
    return array


def _ragged(rows: Any) -> tf.RaggedTensor:
    """Rows of different lengths as a tf.RaggedTensor of their own dtype."""
    rows = [np.asarray(row) for row in rows]
    return tf.RaggedTensor.from_row_lengths(np.concatenate(rows), [len(r) for r in rows])
