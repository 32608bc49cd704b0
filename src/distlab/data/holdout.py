"""The validation split held out of train (`dataset.validation=0.1`): which rows (seeded,
stratified for classes), splitting them off, and what `dataset.validation` asks for."""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf
from omegaconf import DictConfig
from tensorflow.autograph.experimental import do_not_convert

from distlab.data.source import RawSplits
from distlab.errors import DistlabError

HOLD_OUT_CHUNK = 4096  # rows picked per step by hold_out
AUTO_FRACTION = 0.1  # dataset.validation=auto without a validation split of the dataset's own


def held_out_rows(labels: np.ndarray | None, n: int, fraction: float, seed: int,
                  key: str = "dataset.validation") -> np.ndarray:
    """A mask of the `fraction` of `n` rows held out for validation: seeded, and stratified
    when `labels` (class indices) are given (that fraction of each class, rounded)."""
    rng = np.random.default_rng(seed)
    mask = np.zeros(n, dtype=bool)
    groups = [np.arange(n)] if labels is None else [np.flatnonzero(labels == c)
                                                     for c in np.unique(labels)]
    for rows in groups:
        mask[rng.permutation(rows)[:round(fraction * len(rows))]] = True
    if not mask.any() or mask.all():
        raise DistlabError(f"{key}={fraction} holds out {int(mask.sum())} of the train split's "
                           f"{n} examples: choose a fraction that leaves both splits non-empty")
    return mask


def hold_out(ds: tf.data.Dataset, mask: np.ndarray,
             chunk: int = HOLD_OUT_CHUNK) -> tuple[tf.data.Dataset, tf.data.Dataset]:
    """(the rows of `ds` not in `mask`, the rows in it), each in `ds`'s order. Rows of a fixed
    shape are picked `chunk` at a time (a boolean mask per batch: a per-row filter costs
    seconds over 60,000 rows); others one by one."""
    held = tf.constant(mask)
    fixed = all(s.shape.is_fully_defined() for s in tf.nest.flatten(ds.element_spec))

    def rows(keep: bool) -> tf.data.Dataset:
        if fixed:
            @do_not_convert
            def pick(i, batch):
                n = tf.shape(tf.nest.flatten(batch)[0], out_type=tf.int64)[0]
                chosen = tf.equal(held[i * chunk:i * chunk + n], keep)
                return tf.nest.map_structure(lambda t: tf.boolean_mask(t, chosen), batch)

            return ds.batch(chunk).enumerate().map(pick).unbatch()
        picked = ds.enumerate().filter(do_not_convert(lambda i, example: tf.equal(held[i], keep)))
        return picked.map(do_not_convert(lambda i, example: example))

    return rows(False), rows(True)


def validation_choice(value: str | None, has_own: bool | None = None) -> str | float | None:
    """`dataset.validation` as None (none), a fraction held out, or a split name; "auto" is
    the source's own validation split if it `has_own` one, else `AUTO_FRACTION` of train (kept
    as "auto" when `has_own` is not given)."""
    from distlab.config.schema import held_out_fraction

    if value is None:
        return None
    fraction = held_out_fraction(value)
    choice = fraction if fraction is not None else str(value).strip()
    if choice == "auto" and has_own is not None:
        return "validation" if has_own else AUTO_FRACTION
    return choice


def with_held_out(raw: RawSplits, labels: np.ndarray | None, fraction: float,
                  cfg: DictConfig) -> RawSplits:
    """`raw` with `fraction` of its train rows held out for validation (seeded by
    dataset.validation_seed; stratified by `labels`, the train split's classes, if given)."""
    return dataclasses.replace(
        raw, held_out=held_out_rows(labels, raw.num_train, fraction, cfg.validation_seed),
        validation_from=held_out_name(fraction, cfg.train_split, raw.classes,
                                      cfg.validation_seed))


def class_labels(ds: tf.data.Dataset) -> np.ndarray:
    """Every label of an (input, label) dataset, in order."""
    batches = ds.map(lambda x, y: y).batch(8192)
    return np.concatenate([np.asarray(b) for b in batches.as_numpy_iterator()] or
                          [np.zeros([0], np.int64)])


def held_out_name(fraction: float, train_split: str, classes: bool, seed: int) -> str:
    """results.json's `validation` for a held-out fraction."""
    return (f"{fraction:g} of {train_split}, held out ({'stratified, ' if classes else ''}"
            f"dataset.validation_seed={seed})")
