"""Dataset builders on data that ships inside scikit-learn (no download).

A dataset builder is called as `f(cfg)` with the composed `dataset` node and returns
`distlab.DataSplits`: distlab then preprocesses (`dataset.preprocess`), caches, shuffles
per (seed, epoch), batches by the global batch and distributes the splits exactly as it
does a tfds dataset. Each builder registers a schema that extends distlab's
`DatasetConfig`: the common keys (batch_size_per_replica, shuffle_buffer, cache, preprocess,
augment, ...) keep their meaning and defaults, and the builder's own keys (`test_fraction`,
`split_seed`, ...) are checked (unknown key, wrong type) before TensorFlow starts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
from omegaconf import DictConfig
from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits
from sklearn.model_selection import train_test_split

import distlab
from distlab.config import DatasetConfig

log = logging.getLogger(__name__)


@dataclass
class SplitConfig(DatasetConfig):
    """distlab's common dataset keys plus those of a deterministic train/test split (the
    stratified one for classes: digits, breast cancer)."""

    test_fraction: float = 0.25  # share of the examples held out as the test split
    split_seed: int = 0  # random_state of the train/test split


@dataclass
class DigitsConfig(SplitConfig):
    """`dataset=digits`: 1797 images, a quarter held out as the test split."""


@dataclass
class DiabetesConfig(SplitConfig):
    """`dataset=diabetes`: the split's keys (442 patients, a fifth held out) and the
    target's own."""

    test_fraction: float = 0.2
    standardize_target: bool = True  # labels (y - train mean) / train std; false: raw y


@dataclass
class BreastCancerConfig(SplitConfig):
    """`dataset=breast_cancer`: 569 tumours, a quarter held out as the test split."""


@dataclass
class BreastCancerTwoInputsConfig(BreastCancerConfig):
    """`dataset=breast_cancer_two_inputs`: as breast_cancer, plus the size bins."""

    size_bins: list[float] = field(default_factory=lambda: [400.0, 550.0, 750.0, 1000.0])
    # upper bounds of the "mean area" bins named by SIZES (one name more than bounds)


SIZES = ["small", "medium", "large", "very large", "huge"]
AREA = 3  # load_breast_cancer's column "mean area" (radius 0 and perimeter 2 go with it)


def _split(x: np.ndarray, y: np.ndarray, cfg: DictConfig,
           stratify: bool) -> tuple[np.ndarray, ...]:
    """A deterministic train/test split: x_train, x_test, y_train, y_test."""
    if not 0 < cfg.test_fraction < 1:
        raise distlab.DistlabError(
            f"dataset.test_fraction={cfg.test_fraction} is invalid: must be in (0, 1)")
    return train_test_split(x, y, test_size=cfg.test_fraction, random_state=cfg.split_seed,
                            stratify=y if stratify else None)


@distlab.register("dataset", "digits", schema=DigitsConfig)
def digits(cfg: DictConfig) -> distlab.DataSplits:
    """8x8 grey-scale digits, 10 classes: uint8 images (8, 8, 1) of raw values 0..16.

    The images stay raw; `dataset.preprocess.rescale: 16.0` maps them to [0, 1] in the
    input pipeline and in the exported model, which therefore takes raw 0..16 images.
    """
    bunch = load_digits()
    images = bunch.images.astype(np.uint8)[..., np.newaxis]  # (1797, 8, 8, 1)
    labels = bunch.target.astype(np.int64)
    x_train, x_test, y_train, y_test = _split(images, labels, cfg, stratify=True)
    return distlab.DataSplits(train=(x_train, y_train), test=(x_test, y_test), num_classes=10)


@distlab.register("dataset", "diabetes", schema=DiabetesConfig)
def diabetes(cfg: DictConfig) -> distlab.DataSplits:
    """Disease progression of 442 patients from 10 features: a float target, one output.

    The features are scikit-learn's own scaled ones (each column centred, with norm 1,
    so a standard deviation of 1/sqrt(442) = 0.0476); the YAML's `preprocess.std` brings
    them to unit variance. With `standardize_target` the labels are standardised with the
    train split's mean and standard deviation (logged), so the loss, MAE and RMSE are in
    units of that standard deviation; multiply by it for the original scale.
    """
    bunch = load_diabetes()
    x = bunch.data.astype(np.float32)
    y = bunch.target.astype(np.float32)
    x_train, x_test, y_train, y_test = _split(x, y, cfg, stratify=False)
    if cfg.standardize_target:
        mean, std = float(y_train.mean()), float(y_train.std())
        y_train, y_test = (y_train - mean) / std, (y_test - mean) / std
        log.info("diabetes: target standardised with the train split's mean %.2f and "
                 "std %.2f (losses and metrics are in units of that std)", mean, std)
    return distlab.DataSplits(train=(x_train, y_train), test=(x_test, y_test), num_outputs=1)


@distlab.register("dataset", "breast_cancer", schema=BreastCancerConfig)
def breast_cancer(cfg: DictConfig) -> distlab.DataSplits:
    """569 tumours, 30 raw features (radius, texture, ... in their own units, from 0.0 to
    over 4000), label 1 = benign: a binary task. The features stay raw:
    `dataset.preprocess.standardize: true` learns each one's mean and standard deviation on
    the training split (validation held out), inside the model, which therefore serves raw
    features."""
    x, y = load_breast_cancer(return_X_y=True)
    x_train, x_test, y_train, y_test = _split(x.astype(np.float32), y.astype(np.int64), cfg,
                                              stratify=True)
    return distlab.DataSplits(train=(x_train, y_train), test=(x_test, y_test), num_classes=2)


@distlab.register("dataset", "breast_cancer_two_inputs", schema=BreastCancerTwoInputsConfig)
def breast_cancer_two_inputs(cfg: DictConfig) -> distlab.DataSplits:
    """The same tumours and split as `breast_cancer`, as two named inputs: `measurements`
    (27 raw float features: every column but mean radius, perimeter and area) and `size`, a
    string category binned from the mean area ("small" ... "huge", `size_bins`). The model
    looks the category up (StringLookup) and embeds it; distlab standardises the float
    input (`dataset.preprocess.standardize`) and leaves the strings alone."""
    bounds = list(cfg.size_bins)
    if len(bounds) != len(SIZES) - 1 or bounds != sorted(bounds):
        raise distlab.DistlabError(
            f"dataset.size_bins={bounds} is invalid: give {len(SIZES) - 1} increasing bounds")
    x, y = load_breast_cancer(return_X_y=True)
    size = np.array(SIZES)[np.digitize(x[:, AREA], bounds)]
    inputs = {"measurements": np.delete(x, [0, 2, AREA], axis=1).astype(np.float32),
              "size": size}
    rows = np.arange(len(y))
    train, test, y_train, y_test = _split(rows, y.astype(np.int64), cfg, stratify=True)
    return distlab.DataSplits(train=({k: v[train] for k, v in inputs.items()}, y_train),
                              test=({k: v[test] for k, v in inputs.items()}, y_test),
                              num_classes=2)
