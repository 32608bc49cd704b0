"""The `dataset` group's keys: where the data comes from, its splits, features, preprocessing
and augmentation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from distlab.config.schema.rules import (
    ENTRIES_POSITIVE,
    FEATURE_NAMES,
    NON_NEGATIVE,
    POSITIVE,
    SEED,
    VALIDATION,
    checked,
    one_of,
)


@dataclass
class FeaturesConfig:
    """Which tfds features are the input and the label; null: the supervised keys."""

    # the feature fed to the model, or a list of features (the model gets a dict by name)
    input: Any = checked(None, FEATURE_NAMES)
    label: str | None = None  # the feature it learns (ClassLabel: classes; else values)


@dataclass
class PreprocessConfig:
    """Inference-time preprocessing: in the input pipeline and in the exported model (which
    then takes raw inputs, e.g. uint8 images)."""

    rescale: float | None = checked(None, POSITIVE)  # divide raw inputs by this (images: 255)
    mean: list[float] | None = None  # per channel (last axis), subtracted after rescaling
    std: list[float] | None = checked(None, ENTRIES_POSITIVE)  # per channel, after the mean
    # per feature (last axis): (x - mean) / std with the training split's mean and std, kept
    # in the model (Normalization layers: checkpointed, exported); instead of mean and std
    standardize: bool = False
    # the inputs the above apply to (cast to float32 first); null: one input tensor unless
    # strings, or a tuple's / dict's float inputs. Other inputs reach the model untouched
    inputs: list[str] | None = None


@dataclass
class AugmentConfig:
    """Train split only, seeded per (seed, epoch, example): resume-exact."""

    flip: str = checked("none", one_of("none", "horizontal", "vertical", "both"))  # at random
    # pad by N pixels, crop back at random: translations up to N
    crop_padding: int = checked(0, NON_NEGATIVE)


@dataclass
class DatasetConfig:
    name: str = MISSING  # a tfds name, a registered dataset builder, or package.module:fn
    train_split: str = "train"  # a tfds split or slice spec: train, 'train[:90%]', ...
    test_split: str = "test"  # scored once at the end, never used to choose
    # the split that chooses (val_* figures, early stopping, checkpoints/best, targets, the
    # default objective): auto (the dataset's own validation split, else 0.1 of train_split),
    # a fraction of train_split held out (seeded; stratified for classes), a tfds split or
    # slice (validation, train[90%:]), or null (none)
    validation: str | None = checked("auto", VALIDATION)
    # which rows a held-out fraction takes (apart from seed, so sweeping seed keeps them)
    validation_seed: int = checked(0, SEED)
    # examples per replica per step; the global batch is this x the replicas of all workers
    batch_size_per_replica: int = checked(64, POSITIVE)
    shuffle_buffer: int = checked(10000, NON_NEGATIVE)  # examples; 0: no shuffling
    cache: bool = True  # keep the preprocessed splits in memory (train: its rows, batches gathered)
    disk_cache: bool = True  # decoded, preprocessed tfds splits on disk, shared across runs
    cache_dir: str | None = None  # null: $DISTLAB_CACHE_DIR, else ~/.cache/distlab
    data_dir: str | None = None  # null: tfds' default, which honours TFDS_DATA_DIR
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
