"""A dataset's splits, from its source to what a loop reads (`load`), batched by the global
batch.

Three splits, never mixed: train (fitted), validation (what chooses: `dataset.validation`,
a tfds split or slice, a seeded fraction held out of train, stratified for classes, or a
user's `DataSplits.validation`) and test (reported only). The source (`tfds_source`, or
`builder_source` for a user's dataset builder) gives the raw (input, label) splits;
inference-time preprocessing (`transforms`) is applied before the caches (`cache` on disk,
tfds only; `dataset.cache` in memory) and travels with the exported model; a held-out
validation fraction (`holdout`) is split off after the disk cache, whose entry is the whole
split; non-finite values are refused (`finite`); `stream.Data` then makes the per-epoch
train stream, augmented on the train split only.
"""

from __future__ import annotations

import dataclasses
import math

from omegaconf import DictConfig, OmegaConf
from tensorflow.autograph.experimental import do_not_convert

from distlab.data import cache as data_cache
from distlab.data import finite
from distlab.data.builder_source import BuilderSource, check_class_range
from distlab.data.holdout import hold_out
from distlab.data.source import DataSource
from distlab.data.stream import AUTOTUNE, Data, in_memory, prefetched
from distlab.data.structure import input_names, input_shapes, named_specs
from distlab.data.tfds_source import TfdsSource
from distlab.data.transforms import make_augment, make_preprocess, standardized_inputs

# where a dataset.name is read from: the first source that claims it (tfds claims any name
# the others do not)
SOURCES: tuple[DataSource, ...] = (BuilderSource(), TfdsSource())


def source_for(name: str) -> DataSource:
    """The source that reads `dataset.name`."""
    return next(source for source in SOURCES if source.claims(name))


def load(cfg: DictConfig, num_replicas: int, seed: int, steps_per_epoch: int | None,
         ignored_label: int | None = None) -> Data:
    """Load `cfg` (the dataset node) for `num_replicas` replicas. A builder's class labels
    must lie in 0..num_classes-1, `ignored_label` (the task's loss's `ignore_class`) aside."""
    with data_cache.one_run():  # one disk cache for the run's readers: one warning at most
        return _load(cfg, num_replicas, seed, steps_per_epoch, ignored_label)


def _load(cfg: DictConfig, num_replicas: int, seed: int, steps_per_epoch: int | None,
          ignored_label: int | None) -> Data:
    origin = source_for(cfg.name)
    splits = dataclasses.replace(origin.splits(cfg), origin=origin)
    raw_train, raw_test = splits.train, splits.test
    cache_key = splits.cache_key
    raw_input = raw_train.element_spec[0]
    preprocess = make_preprocess(cfg.preprocess, raw_input)
    gb = cfg.batch_size_per_replica * num_replicas

    named = {cfg.train_split: raw_train, cfg.test_split: raw_test}
    if splits.validation is not None:
        named[splits.validation_from] = splits.validation
    ready = {split: ds.map(do_not_convert(lambda x, y: (preprocess(x), y)),
                           num_parallel_calls=AUTOTUNE)
             for split, ds in named.items()}
    if cfg.disk_cache and cache_key is not None:  # tfds only: a user's data has no version
        disk = data_cache.DiskCache.of(data_cache.cache_root(cfg.cache_dir))  # the run's
        inputs = {**data_cache.source_inputs(cache_key),  # (files read only when caching)
                  "preprocess": OmegaConf.to_container(cfg.preprocess)}
        ready = {split: disk.cached(ds, data_cache.entry_name(
            f"{cfg.name}-{split}", {**inputs, "split": split, "spec": str(ds.element_spec)}))
            for split, ds in ready.items()}
    train, test = ready[cfg.train_split], ready[cfg.test_split]
    validation = ready.get(splits.validation_from)
    num_train, num_validation = splits.num_train, splits.num_validation
    if splits.held_out is not None:  # after the disk cache: its entry is the whole split
        train, validation = hold_out(train, splits.held_out)
        num_validation = int(splits.held_out.sum())
        num_train -= num_validation
    train_rows = None
    if cfg.cache:  # train's rows in memory where they can be (the stream gathers its batches)
        train, train_rows = in_memory(train, num_train)
        train = train if train_rows is not None else train.cache()
        test = test.cache()
        validation = validation.cache() if validation is not None else None
    roles = {_role("train", cfg.train_split): train,
             _role("validation", splits.validation_from): validation,
             _role("test", cfg.test_split): test}
    # one pass each, which fills the memory cache: the first epoch's
    finite.check_splits(roles, input_names(raw_input), raw_input, f"dataset.name={cfg.name!r}")
    if splits.classes and isinstance(origin, BuilderSource):
        check_class_range(roles, splits.outputs, f"dataset.name={cfg.name!r}", ignored_label)
    steps = steps_per_epoch or math.ceil(num_train / gb)
    return Data(
        name=cfg.name,
        train=train,
        test=prefetched(test, gb),
        num_train=num_train,
        num_test=splits.num_test,
        validation=prefetched(validation, gb) if validation is not None else None,
        num_validation=num_validation,
        validation_from=splits.validation_from,
        input_shape=input_shapes(train.element_spec[0]),
        outputs=splits.outputs,
        classes=splits.classes,
        global_batch_size=gb,
        steps_per_epoch=steps,
        shuffle_buffer=cfg.shuffle_buffer,
        seed=seed,
        raw_input=raw_input,
        raw_test=raw_test,
        preprocess=preprocess,
        augment=make_augment(cfg.augment, train.element_spec[0]),
        input_spec=named_specs(train.element_spec[0]),
        standardize=standardized_inputs(cfg.preprocess, raw_input),
        splits=splits,
        train_rows=train_rows,
    )


def _role(role: str, spec: str | None) -> str:
    """"train split", or "train split (train[:50%])" where the spec is not the role's name."""
    return f"{role} split" + (f" ({spec})" if spec and spec != role else "")
