"""`DataSplits`: what a user's dataset builder returns (no TensorFlow import here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class DataSplits:
    """The train and test splits of a user dataset, unbatched and unshuffled.

    `train` / `test`: a `tf.data.Dataset` of `(input, label)` pairs, or a tuple
    `(inputs, labels)` of NumPy arrays. Give `num_classes` for classification (integer
    labels in [0, num_classes)) or `num_outputs` for regression (float labels, this many
    per example; default 1). distlab batches by the global batch, shuffles per (seed,
    epoch), preprocesses, caches and distributes them like a tfds dataset.
    """

    train: Any
    test: Any
    num_classes: int | None = None
    num_outputs: int | None = None
