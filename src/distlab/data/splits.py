"""`DataSplits`: what a user's dataset builder returns (no TensorFlow import here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class DataSplits:
    """The train, test and (optionally) validation splits of a user dataset, unbatched and
    unshuffled.

    `train` / `test` / `validation`: a `tf.data.Dataset` of `(input, label)` pairs, or a
    tuple `(inputs, labels)` of NumPy arrays. `validation` is what chooses (val_* figures,
    early stopping, checkpoints/best, the default objective) when `dataset.validation=auto`;
    without it, auto holds out a fraction of `train` (see the README's splits section).
    Give `num_classes` for classification (integer labels in [0, num_classes)) or
    `num_outputs` for regression (float labels, this many per example; default 1). distlab
    batches by the global batch, shuffles per (seed, epoch), preprocesses, caches and
    distributes them like a tfds dataset; `dataset.train_split`, `test_split` and
    `validation` select from them as tfds split specs do (`train[:50%]`, `test[10:]`).
    Missing or non-finite values (NaN, Inf, None) are refused as the data loads.
    """

    train: Any
    test: Any
    num_classes: int | None = None
    num_outputs: int | None = None
    validation: Any = None
