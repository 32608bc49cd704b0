"""What every data source is (`DataSource`) and what it gives (`RawSplits`): a dataset's
(input, label) splits as the source reads them, before preprocessing, caching and batching,
which `pipeline.load` does alike for every source."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import tensorflow as tf
from omegaconf import DictConfig


@dataclass(frozen=True)
class RawSplits:
    """A dataset's (input, label) splits as its source gives them, before preprocessing."""

    train: tf.data.Dataset
    test: tf.data.Dataset
    num_train: int
    num_test: int
    outputs: int  # classes (classification) or output values
    classes: bool  # whether the labels are class indices
    # what the rows depend on, naming the disk cache's entries; its "data_dir" is the folder
    # whose files' signature is checked; None: not cached on disk (dataset.disk_cache)
    cache_key: dict | None
    validation: tf.data.Dataset | None = None  # a validation split of its own
    num_validation: int = 0
    held_out: np.ndarray | None = None  # or: train's rows held out for validation (a mask)
    validation_from: str | None = None  # results.json's `validation`
    origin: DataSource | None = None  # the source that gave them (set by pipeline.load)


class DataSource(ABC):
    """Where a `dataset.name` is read from (`pipeline.SOURCES`). `splits` gives the
    train and test splits that `dataset.train_split` and `dataset.test_split` select, and
    the validation split `dataset.validation` asks for (a split of its own, or a fraction
    of train held out: `holdout`), unbatched and unshuffled; each input shaped as a Keras
    model takes it (`structure.dense_inputs`). Errors are one line naming the key."""

    @abstractmethod
    def claims(self, name: str) -> bool:
        """Whether `name` (`dataset.name`) is this source's to read."""

    @abstractmethod
    def splits(self, cfg: DictConfig) -> RawSplits:
        """The splits of `cfg` (the dataset node)."""

    def fingerprints(self, cfg: DictConfig, splits: RawSplits) -> dict[str, str | None] | None:
        """{"train", "validation", "test": fingerprint} of the rows `splits` hold, where this
        source knows their identities without reading them (tfds: name, version, row
        ranges); None (the default): `fingerprint.of_splits` hashes the rows' content."""
        return None
