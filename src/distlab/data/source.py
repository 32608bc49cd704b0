"""What a data source gives: a dataset's (input, label) splits as it reads them (`RawSplits`),
before preprocessing, caching and batching."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf


@dataclass(frozen=True)
class RawSplits:
    """A dataset's (input, label) splits as its source gives them, before preprocessing."""

    train: tf.data.Dataset
    test: tf.data.Dataset
    num_train: int
    num_test: int
    outputs: int  # classes (classification) or output values
    classes: bool  # whether the labels are class indices
    source: dict | None  # tfds: what the data depends on, for the disk cache's key
    validation: tf.data.Dataset | None = None  # a validation split of its own
    num_validation: int = 0
    held_out: np.ndarray | None = None  # or: train's rows held out for validation (a mask)
    validation_from: str | None = None  # results.json's `validation`
