"""Missing and non-finite numbers (NaN, Inf, None) in a dataset's splits, refused as the data
loads: a model trained on them learns nothing (its loss is NaN, or it predicts the majority
class) and says nothing, so distlab names the split, the input and the number of rows."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tensorflow as tf

from distlab.data.structure import batched
from distlab.errors import DistlabError

CHECK_BATCH = 8192  # rows per batch of the check's one pass over a split
REMEDY = "drop or impute those rows in the dataset builder (e.g. pandas' dropna or fillna)"


def message(where: str, name: str, rows: int, total: int, what: str = "NaN or Inf") -> str:
    """One line: `where` (e.g. "dataset.name='penguins': its train split") has `what` in
    input `name` (or "label") in `rows` of its `total` rows, and the remedy."""
    which = "the label" if name == "label" else f"input {name!r}"
    why = ("a model trains and is scored on finite numbers only" if what == "NaN or Inf" else
           "distlab does not fill in missing values")
    return f"{where} has {what} in {which} in {rows} of {total} rows: {why}; {REMEDY}"


def missing_in_objects(array: np.ndarray) -> int:
    """Rows of an object array (a pandas column of strings, say) holding a missing value: a
    float NaN or None among its values."""
    def missing(v: Any) -> bool:
        return v is None or (isinstance(v, float) and math.isnan(v))

    if array.ndim == 0:
        return int(missing(array.item()))
    flags = np.frompyfunc(missing, 1, 1)(array).astype(bool)
    return int(flags.reshape(len(array), -1).any(axis=1).sum())


def check_splits(splits: dict[str, tf.data.Dataset | None], names: list[str], raw: Any,
                 owner: str) -> None:
    """Refuse, in one line, the first split of `splits` ({"train split 'train'": dataset of
    (input, label) pairs, ...}) with a NaN or Inf in a float input or label. One pass over
    each split, batched; inputs whose raw dtype (`raw`, the unpreprocessed input spec) is
    not floating cannot hold one and are skipped (a dataset of images is not read)."""
    for split, ds in splits.items():
        if ds is None:
            continue
        specs = tf.nest.flatten(ds.element_spec)
        floating = [s.dtype.is_floating for s in tf.nest.flatten(raw)] + [specs[-1].dtype
                                                                         .is_floating]
        picks = [i for i, (s, f) in enumerate(zip(specs, floating, strict=True))
                 if f and s.dtype.is_floating]
        if not picks:
            continue
        bad, total = _non_finite_rows(ds, picks)
        for i, rows in zip(picks, bad, strict=True):
            if rows:
                raise DistlabError(message(f"{owner}: its {split}", [*names, "label"][i],
                                           rows, total))


def _non_finite_rows(ds: tf.data.Dataset, picks: list[int]) -> tuple[list[int], int]:
    """(rows with a NaN or Inf in each picked component of the flattened (input, label), the
    number of rows), in one pass (which also fills a `cache()` upstream)."""
    columns = ds.map(lambda x, y: tuple(tf.nest.flatten((x, y))[i] for i in picks))

    def add(counts: tf.Tensor, batch: tuple[tf.Tensor, ...]) -> tf.Tensor:
        rows = tf.shape(batch[0], out_type=tf.int64)[:1]
        bad = [tf.reduce_sum(tf.cast(tf.reduce_any(
            tf.reshape(~tf.math.is_finite(t), [tf.shape(t)[0], -1]), axis=1), tf.int64))
            for t in batch]
        return counts + tf.concat([tf.stack(bad), rows], 0)

    counts = batched(columns, CHECK_BATCH).reduce(tf.zeros([len(picks) + 1], tf.int64), add)
    counts = [int(c) for c in counts.numpy()]
    return counts[:-1], counts[-1]
