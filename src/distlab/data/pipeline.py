"""Input pipelines (tfds, or a user's dataset builder), batched by the global batch.

Three splits, never mixed: train (fitted), validation (what chooses: `dataset.validation`,
a tfds split or slice, a seeded fraction held out of train, stratified for classes, or a
user's `DataSplits.validation`) and test (reported only). The train stream is built per
epoch: epoch e is shuffled, and augmented, with seeds
derived from (seed, e) and the example's place in the epoch only, so the data of an
epoch never depends on how many epochs this process has already run (resume gives the
same batches as an uninterrupted run). Inference-time preprocessing (`dataset.preprocess`)
is applied before caching and travels with the exported model; augmentation
(`dataset.augment`) is applied to the train split only, after the cache.

An example's input is whatever a Keras model takes: one tensor, a tuple or a dict of named
inputs (`tf.nest` structures), of any dtype, strings included. Ragged inputs become dense
per example, and a batch whose inputs have a dimension of unknown length is padded to its
longest example (`batched`): 0 for numbers, "" for strings.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
from omegaconf import DictConfig, OmegaConf

from distlab.data import cache as data_cache
from distlab.data import finite, slices
from distlab.data.prepared import split_names
from distlab.errors import DistlabError, described, first_line, override

log = logging.getLogger(__name__)
AUTOTUNE = tf.data.AUTOTUNE
PROBE_TIMEOUT_S = 5.0
ADAPT_BATCH = 1024  # rows per batch of Data.train_inputs (fixed: stats never depend on replicas)


@dataclass
class Data:
    """Everything a loop needs from the dataset."""

    name: str
    train: tf.data.Dataset  # preprocessed (and cached) examples, unbatched
    test: tf.data.Dataset  # batched by the global batch, cached, prefetched
    num_train: int
    num_test: int
    validation: tf.data.Dataset | None  # as `test`; None: no validation split
    num_validation: int
    validation_from: str | None  # where the validation split comes from (results.json)
    input_shape: Any  # one input: its shape per example; a tuple or dict of inputs: theirs
    outputs: int  # classes (classification) or values per example (regression)
    classes: bool  # whether labels are classes (tfds ClassLabel, or num_classes given)
    global_batch_size: int
    steps_per_epoch: int
    shuffle_buffer: int
    seed: int
    raw_input: tf.TensorSpec = None  # one raw example, as the dataset gives it
    raw_test: tf.data.Dataset = None  # unpreprocessed (input, label) pairs, unbatched
    preprocess: Callable[[tf.Tensor], tf.Tensor] = None  # raw -> model input (any batch)
    augment: Callable | None = None  # (input, seed) -> input, train split only
    input_spec: Any = None  # the model's inputs per example: a tf.TensorSpec, tuple or dict
    standardize: tuple[str, ...] = ()  # inputs dataset.preprocess.standardize normalises
    splits: Any = None  # the RawSplits as the source gave them (their rows' fingerprints)

    def train_inputs(self, batch_size: int = ADAPT_BATCH) -> tf.data.Dataset:
        """The training split's model inputs (no labels), preprocessed, unshuffled, in
        batches of `batch_size` rows whatever the replica count (padded as training batches
        are): what a model builder adapts its preprocessing layers on."""
        return batched(self.train.map(lambda x, y: x, num_parallel_calls=AUTOTUNE), batch_size)

    @property
    def full_pass(self) -> bool:
        """Whether an epoch is exactly one pass over the train split."""
        return self.steps_per_epoch == math.ceil(self.num_train / self.global_batch_size)

    @property
    def examples_per_epoch(self) -> int:
        if self.full_pass:
            return self.num_train
        return self.steps_per_epoch * self.global_batch_size

    def train_epochs(self, first_epoch: int, end_epoch: int,
                     skip_steps: int = 0) -> tf.data.Dataset:
        """Epochs [first_epoch, end_epoch) back to back, each exactly steps_per_epoch batches.

        `skip_steps` drops the first batches of `first_epoch` (resuming mid-epoch).
        """
        base, buffer, seed = self.train, self.shuffle_buffer, self.seed
        gb, steps, full_pass = self.global_batch_size, self.steps_per_epoch, self.full_pass
        augment = self.augment

        def one_epoch(epoch: tf.Tensor) -> tf.data.Dataset:
            ds = base
            if buffer > 0:
                ds = shuffled(ds, buffer, seed, epoch)
            if augment is not None:  # seeded by (seed, epoch, place in the epoch)
                key = seed * 1_000_003 + epoch + 1
                ds = ds.enumerate().map(
                    lambda i, xy: (augment(xy[0], tf.stack([key, i])), xy[1]),
                    num_parallel_calls=AUTOTUNE)
            if not full_pass:  # passes back to back, batched across their boundary: every
                ds = ds.repeat()  # batch is full (steps_per_epoch beyond one pass included)
            ds = batched(ds, gb)
            return ds if full_pass else ds.take(steps)

        epochs = tf.data.Dataset.range(first_epoch, end_epoch).flat_map(one_epoch)
        if skip_steps:
            epochs = epochs.skip(skip_steps)
        return _no_autotune(epochs.prefetch(AUTOTUNE))


_MAXINT32 = 2**31 - 1


def shuffled(ds: tf.data.Dataset, buffer: int, seed: int, epoch: tf.Tensor) -> tf.data.Dataset:
    """`ds` shuffled through a buffer of `buffer` examples, seeded by (`seed`, `epoch`) only.

    tf.data's own `shuffle(seed=...)` pairs its seed with the process's global seed in
    Python: with a tensor seed (the epoch) it fails when that global seed is 0 modulo
    2**31-1 (`seed=0`), seeds s and s + 2**31-1 shuffle alike, and the order depends on
    whatever global seed the process has. Here the op gets its two seeds explicitly: the
    run's `seed` whole, and (seed * 1_000_003 + epoch) modulo 2**31-1, which is what
    `shuffle` under `tf.random.set_seed(seed)` gave for seeds in [1, 2**31-1) (a run trained
    before resumes on the same batches)."""
    seed2 = tf.math.floormod(tf.cast(epoch, tf.int64) + seed * 1_000_003, _MAXINT32)
    if seed == 0:  # (0, 0) would mean "nondeterministic" to the op (tf.data maps it too)
        seed2 = tf.where(tf.equal(seed2, 0), tf.constant(_MAXINT32, tf.int64), seed2)
    flat = [t for spec in tf.nest.flatten(ds.element_spec) for t in spec._flat_tensor_specs]
    variant = tf.raw_ops.ShuffleDatasetV3(
        input_dataset=tf.data.experimental.to_variant(ds),
        buffer_size=tf.constant(buffer, tf.int64), seed=tf.constant(seed, tf.int64),
        seed2=seed2, seed_generator=tf.raw_ops.DummySeedGenerator(),
        output_types=[s.dtype for s in flat], output_shapes=[s.shape for s in flat],
        reshuffle_each_iteration=True)
    return tf.data.experimental.from_variant(variant, ds.element_spec)


def distribute(strategy: tf.distribute.Strategy,
               dataset: tf.data.Dataset) -> tf.distribute.DistributedDataset | tf.data.Dataset:
    """Split every global batch of `dataset` over the replicas: (features, labels, weights).

    A global batch of n rows is split evenly and in order: replica k of the R replicas of
    the whole cluster gets rows [k*q + min(k, r), ...) of length q + (k < r), with
    q, r = divmod(n, R). A full batch therefore gives every replica its configured batch,
    and a short last batch gives each at least one real row when n >= R; a replica left
    without real rows (n < R) gets one padding row of weight 0, so no layer ever sees an
    empty batch. Real rows weigh n_k * R / n, so that "sum over the replica's rows / (n_k *
    R)" (Keras' sum_over_batch_size with its 1/R scaling, and tf.nn.compute_average_loss)
    summed over replicas is the plain mean over the n real rows: a short batch averages
    over its real examples, as single-device training does. Weight > 0 marks a real row
    for metrics. Every worker reads the same stream and keeps its own replicas' rows.
    """
    if is_default(strategy):  # one replica, no distribution: the plain dataset
        return dataset.map(_whole_batch, num_parallel_calls=AUTOTUNE)

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        replicas = ctx.num_replicas_in_sync
        local = replicas // ctx.num_input_pipelines
        first = ctx.input_pipeline_id * local

        def split(features, labels) -> tf.data.Dataset:
            return tf.data.Dataset.range(first, first + local).map(
                lambda k: replica_rows((features, labels), k, replicas))

        return _no_autotune(dataset.flat_map(split).prefetch(AUTOTUNE))

    return strategy.distribute_datasets_from_function(dataset_fn)


def replica_rows(batch, k: tf.Tensor, replicas: int):
    """(features, labels, weights): replica `k`'s even share of a global `batch` (see
    `distribute`)."""
    n = tf.shape(tf.nest.flatten(batch)[0], out_type=tf.int64)[0]
    q, r = n // replicas, n % replicas
    size = q + tf.cast(k < r, tf.int64)
    real = size > 0
    start = tf.where(real, k * q + tf.minimum(k, r), 0)
    size = tf.maximum(size, 1)
    weight = tf.where(real, tf.cast(size * replicas, tf.float32) / tf.cast(n, tf.float32), 0.0)
    features, labels = tf.nest.map_structure(lambda t: t[start:start + size], batch)
    return features, labels, tf.fill([size], weight)


def _whole_batch(features, labels):
    n = tf.shape(tf.nest.flatten(labels)[0])[0]
    return features, labels, tf.ones([n], tf.float32)


_DEFAULT_STRATEGY = type(tf.distribute.get_strategy())  # imported outside any scope


def is_default(strategy: tf.distribute.Strategy) -> bool:
    return type(strategy) is _DEFAULT_STRATEGY


def _no_autotune(ds: tf.data.Dataset) -> tf.data.Dataset:
    """No tf.data autotuning thread: deleting an iterator of an autotuned pipeline waits for
    that thread's next wake-up (up to 60 s); see docs/BENCHMARKS.md and
    benchmarks/iterator_stall.py. Measured no slower here without it."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.with_options(options)


def resolve_data_dir(data_dir: str | None) -> str | None:
    """`dataset.data_dir`, checked; null keeps tfds' default (TFDS_DATA_DIR, else
    ~/tensorflow_datasets)."""
    if data_dir is None:
        return None
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise DistlabError(
            f"dataset.data_dir={data_dir!r} is not a directory: point it at a tfds data "
            "directory (one holding <name>/<version>/), or set it to null to use TFDS_DATA_DIR"
        )
    return str(path.resolve())


def _builder(name: str, data_dir: str | None) -> tfds.core.DatasetBuilder:
    try:
        return tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise DistlabError(
            f"dataset.name={name!r} is not a tensorflow-datasets dataset: use a tfds name such "
            "as mnist or fashion_mnist (see tfds.list_builders())"
        ) from None


def _unreachable_host(builder: tfds.core.DatasetBuilder) -> str | None:
    """The first download host that does not answer within PROBE_TIMEOUT_S, if any."""
    urls = list(getattr(builder, "url_infos", None) or {}) or [builder.info.homepage or ""]
    hosts = {(u.hostname, u.port or (80 if u.scheme == "http" else 443))
             for u in map(urlparse, urls) if u.hostname}
    for host, port in sorted(hosts):
        try:
            socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
        except OSError:
            return host
    return None


def ensure_prepared(name: str, data_dir: str | None) -> tfds.core.DatasetBuilder:
    """The dataset's builder, prepared; fail fast (not tfds' multi-minute hang) when offline."""
    builder = _builder(name, data_dir)
    if builder.is_prepared():
        return builder
    where = (f"dataset.data_dir={data_dir}" if data_dir else
             f"TFDS_DATA_DIR={os.environ['TFDS_DATA_DIR']}" if os.environ.get("TFDS_DATA_DIR")
             else "~/tensorflow_datasets (dataset.data_dir=null, TFDS_DATA_DIR unset)")
    host = _unreachable_host(builder)
    if host is not None:
        raise DistlabError(
            f"dataset {name!r} is not prepared in {where} and its download host {host} "
            f"is unreachable (offline?). Run once with network access (tfds then prepares it), "
            f"or prepare it where there is network (`tfds build {name} --data_dir DIR`), copy "
            f"DIR here and set TFDS_DATA_DIR or dataset.data_dir to it (it holds "
            f"{name}/<version>/)."
        )
    log.info("downloading and preparing %s into %s", name, where)
    builder.download_and_prepare()
    return builder


def _num_examples(info: tfds.core.DatasetInfo, split: str, ds: tf.data.Dataset) -> int:
    try:
        n = info.splits[split].num_examples
        if n:
            return int(n)
    except (KeyError, ValueError, TypeError):
        pass
    return _count(ds)


def load(cfg: DictConfig, num_replicas: int, seed: int, steps_per_epoch: int | None) -> Data:
    """Load `cfg` (the dataset node) for `num_replicas` replicas."""
    user = is_user_dataset(cfg.name)
    splits = _user_splits(cfg) if user else _tfds_splits(cfg)
    raw_train, raw_test = splits.train, splits.test
    source = dict(splits.source) if splits.source is not None else None
    raw_input = raw_train.element_spec[0]
    preprocess = make_preprocess(cfg.preprocess, raw_input)
    gb = cfg.batch_size_per_replica * num_replicas

    named = {cfg.train_split: raw_train, cfg.test_split: raw_test}
    if splits.validation is not None:
        named[splits.validation_from] = splits.validation
    ready = {split: ds.map(lambda x, y: (preprocess(x), y), num_parallel_calls=AUTOTUNE)
             for split, ds in named.items()}
    if cfg.disk_cache and source is not None:  # tfds only: a user's data has no version
        disk = data_cache.DiskCache(data_cache.cache_root(cfg.cache_dir))  # one per run
        files = data_cache.files_signature(source.pop("data_dir"))  # only when caching
        inputs = {**source, "files": files, "preprocess": OmegaConf.to_container(cfg.preprocess)}
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
    if cfg.cache:
        train, test = train.cache(), test.cache()
        validation = validation.cache() if validation is not None else None
    finite.check_splits(  # one pass each, which fills the memory cache: the first epoch's
        {_role("train", cfg.train_split): train,
         _role("validation", splits.validation_from): validation,
         _role("test", cfg.test_split): test}, input_names(raw_input), raw_input,
        f"dataset.name={cfg.name!r}")
    steps = steps_per_epoch or math.ceil(num_train / gb)
    return Data(
        name=cfg.name,
        train=train,
        test=_batched(test, gb),
        num_train=num_train,
        num_test=splits.num_test,
        validation=_batched(validation, gb) if validation is not None else None,
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
    )


def _role(role: str, spec: str | None) -> str:
    """"train split", or "train split (train[:50%])" where the spec is not the role's name."""
    return f"{role} split" + (f" ({spec})" if spec and spec != role else "")


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


AUTO_FRACTION = 0.1  # dataset.validation=auto without a validation split of the dataset's own


def _batched(ds: tf.data.Dataset, global_batch: int) -> tf.data.Dataset:
    return _no_autotune(batched(ds, global_batch).prefetch(AUTOTUNE))


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


def hold_out(ds: tf.data.Dataset, mask: np.ndarray) -> tuple[tf.data.Dataset, tf.data.Dataset]:
    """(the rows of `ds` not in `mask`, the rows in it), each in `ds`'s order."""
    held = tf.constant(mask)

    def rows(keep: bool) -> tf.data.Dataset:
        picked = ds.enumerate().filter(lambda i, example: tf.equal(held[i], keep))
        return picked.map(lambda i, example: example)

    return rows(False), rows(True)


def validation_choice(value: str | None) -> str | float | None:
    """`dataset.validation` as None (none), a fraction held out, "auto", or a split name."""
    from distlab.config.schema import held_out_fraction

    if value is None:
        return None
    fraction = held_out_fraction(value)
    return fraction if fraction is not None else str(value).strip()


def _labels(ds: tf.data.Dataset) -> np.ndarray:
    """Every label of an (input, label) dataset, in order."""
    batches = ds.map(lambda x, y: y).batch(8192)
    return np.concatenate([np.asarray(b) for b in batches.as_numpy_iterator()] or
                          [np.zeros([0], np.int64)])


def is_user_dataset(name: str) -> bool:
    """A registered dataset builder or an import path; anything else is a tfds name."""
    from distlab.registry import is_tfds_name

    return not is_tfds_name(name)


def _tfds_splits(cfg: DictConfig) -> RawSplits:
    """(input, label) pairs of the tfds dataset, by `dataset.features` (default: its
    supervised keys), with the number of classes (ClassLabel) or of outputs (float)."""
    data_dir = resolve_data_dir(cfg.data_dir)
    builder = ensure_prepared(cfg.name, data_dir)
    info = builder.info
    features = cfg.features
    if (features.input is None) != (features.label is None):
        raise DistlabError("dataset.features: set both input and label (or neither, for the "
                           "dataset's supervised keys)")
    keys = (features.input, features.label) if features.input else info.supervised_keys
    available = ", ".join(sorted(info.features.keys()))
    if not keys:
        raise DistlabError(f"dataset {cfg.name!r} has no supervised keys: set "
                           f"dataset.features.input and dataset.features.label to two of its "
                           f"features ({available})")
    keys = _checked_features(cfg.name, info, keys)
    choice = validation_choice(cfg.validation)
    if choice == "auto":
        choice = "validation" if "validation" in info.splits else AUTO_FRACTION
    names = [cfg.train_split, cfg.test_split, *([choice] if isinstance(choice, str) else [])]
    try:
        datasets = builder.as_dataset(split=names, shuffle_files=False)
    except (ValueError, KeyError) as e:
        raise DistlabError(
            f"dataset.train_split={cfg.train_split!r} / dataset.test_split={cfg.test_split!r}"
            + (f" / dataset.validation={choice!r}" if isinstance(choice, str) else "")
            + f" not available for {cfg.name}: {first_line(e)}") from None
    specs = {"train_split": cfg.train_split, "test_split": cfg.test_split}
    slices.check_disjoint({**specs, "validation": choice} if isinstance(choice, str) else specs,
                          info.splits)
    x, y = keys
    sizes = [_num_examples(info, name, ds) for name, ds in zip(names, datasets, strict=True)]
    train, test, *validation = (dense_inputs(ds.map(lambda ex: (_select(ex, x), ex[y]),
                                                    num_parallel_calls=AUTOTUNE))
                                for ds in datasets)
    label = info.features[y]
    classes = isinstance(label, tfds.features.ClassLabel)
    outputs = int(label.num_classes) if classes else max(1, math.prod(label.shape or ()))
    source = {"dataset": cfg.name, "version": str(info.version), "features": [x, y],
              "data_dir": builder.data_dir}
    raw = RawSplits(train, test, sizes[0], sizes[1], outputs, classes, source)
    if isinstance(choice, str):
        return dataclasses.replace(raw, validation=validation[0], num_validation=sizes[2],
                                   validation_from=choice)
    if choice is None:
        return raw
    labels = _tfds_labels(builder, cfg.train_split, x, y) if classes else None
    return dataclasses.replace(
        raw, held_out=held_out_rows(labels, sizes[0], choice, cfg.validation_seed),
        validation_from=_held_out_name(choice, cfg.train_split, classes, cfg.validation_seed))


def _held_out_name(fraction: float, train_split: str, classes: bool, seed: int) -> str:
    return (f"{fraction:g} of {train_split}, held out ({'stratified, ' if classes else ''}"
            f"dataset.validation_seed={seed})")


def _tfds_labels(builder: tfds.core.DatasetBuilder, split: str, x: str | list[str],
                 y: str) -> np.ndarray:
    """The labels of a tfds split, in order, without decoding its inputs where tfds can."""
    skip = {k: tfds.decode.SkipDecoding() for k in (x if isinstance(x, list) else [x])}
    try:
        ds = builder.as_dataset(split=split, shuffle_files=False, decoders=skip)
    except (ValueError, TypeError, KeyError):
        ds = builder.as_dataset(split=split, shuffle_files=False)
    return _labels(ds.map(lambda ex: (0, ex[y])))


def _checked_features(name: str, info: tfds.core.DatasetInfo, keys: Any) -> tuple[Any, str]:
    """(input, label) feature names, checked against the dataset's features; the input is
    one name or a list of names (the model then gets a dict keyed by them)."""
    x, y = keys
    if OmegaConf.is_list(x) or isinstance(x, list | tuple):
        x = [str(k) for k in x]
    available = ", ".join(sorted(info.features.keys()))
    for role, key in [*(("input", k) for k in (x if isinstance(x, list) else [x])),
                      ("label", y)]:
        if key not in info.features:
            raise DistlabError(f"dataset.features.{role}={key!r} is not a feature of "
                               f"{name}; its features: {available}")
    return x, y


def _select(example: dict, x: str | list[str]) -> Any:
    """The model input of a tfds example: one feature, or a dict of several by name."""
    return {k: example[k] for k in x} if isinstance(x, list) else example[x]


def _user_splits(cfg: DictConfig) -> RawSplits:
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
    try:
        splits = DATASETS.get(cfg.name)(cfg)
    except DistlabError:
        raise
    except Exception as e:  # noqa: BLE001 - user code: one line naming the key
        raise DistlabError(f"{key} failed: {described(e)}") from None
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
        outputs = int(splits.num_classes)
    else:
        outputs = int(splits.num_outputs or max(1, math.prod(label.shape)))
    classes = splits.num_classes is not None
    given = {"train": train, "test": test}
    if splits.validation is not None:
        given["validation"] = _as_dataset(splits.validation, key, "validation")
    counts = {name: _count(ds) for name, ds in given.items()}
    train, num_train = slices.select(cfg.train_split, "train_split", given, counts, key)
    test, num_test = slices.select(cfg.test_split, "test_split", given, counts, key)
    raw = RawSplits(train, test, num_train, num_test, outputs, classes, None)
    specs = {"train_split": cfg.train_split, "test_split": cfg.test_split}
    choice = validation_choice(cfg.validation)
    if choice == "auto":
        choice = "validation" if "validation" in given else AUTO_FRACTION
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
    return dataclasses.replace(
        raw, held_out=held_out_rows(_labels(train) if classes else None, raw.num_train,
                                    choice, cfg.validation_seed),
        validation_from=_held_out_name(choice, cfg.train_split, classes, cfg.validation_seed))


def _as_dataset(split: Any, key: str, which: str) -> tf.data.Dataset:
    if isinstance(split, tf.data.Dataset):
        spec = split.element_spec
        if not (isinstance(spec, tuple) and len(spec) == 2):
            raise DistlabError(f"{key}: its {which} dataset must give (input, label) pairs, "
                               f"not {spec}")
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


def _as_columns(inputs: Any, where: str, path: tuple[str, ...] = ()) -> Any:
    """A user's inputs as tensors for from_tensor_slices: an array, or a tuple or dict of
    them (nested), each with one row per example. `where` (the builder and split) and the
    input's path name it in messages."""
    if isinstance(inputs, dict):
        return {k: _as_columns(v, where, (*path, str(k))) for k, v in inputs.items()}
    if isinstance(inputs, tuple):
        return tuple(_as_columns(v, where, (*path, str(i))) for i, v in enumerate(inputs))
    return _as_column(inputs, where, _input_name(path) if path else "inputs")


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


def dense_inputs(ds: tf.data.Dataset) -> tf.data.Dataset:
    """`ds` with its inputs in the shapes a Keras model takes: ragged ones dense per example
    (padded to the example's longest row; batches then pad to their longest example, see
    `batched`), and a numeric input with one value per example (a 1-D column) shaped (1,),
    as `keras.Input(shape=(1,))`, Dense and Concatenate expect; a string stays one string
    per example (shape ()), as StringLookup and TextVectorization expect."""
    if not (any(isinstance(s, tf.RaggedTensorSpec) for s in tf.nest.flatten(ds.element_spec))
            or any(_numeric_scalar(s) for s in tf.nest.flatten(ds.element_spec[0]))):
        return ds

    def shaped(x: Any) -> Any:
        if isinstance(x, tf.RaggedTensor):
            x = x.to_tensor()
        return tf.reshape(x, [1]) if _numeric_scalar(x) else x

    def dense(x: Any) -> Any:
        return x.to_tensor() if isinstance(x, tf.RaggedTensor) else x

    return ds.map(lambda x, y: (tf.nest.map_structure(shaped, x), dense(y)),
                  num_parallel_calls=AUTOTUNE)


def _numeric_scalar(x: Any) -> bool:
    """Whether `x` (a tensor or spec) holds one number (not a string)."""
    return isinstance(x, tf.Tensor | tf.TensorSpec) and x.shape.rank == 0 \
        and x.dtype != tf.string


def batched(ds: tf.data.Dataset, size: int) -> tf.data.Dataset:
    """Batches of `size` rows; padded to each batch's longest example (0, or "" for strings)
    where an input has a dimension of unknown length."""
    if all(s.shape.is_fully_defined() for s in tf.nest.flatten(ds.element_spec)):
        return ds.batch(size)
    return ds.padded_batch(size)


def input_names(spec: Any) -> list[str]:
    """The names of the inputs, in tf.nest's order, as the exported SavedModel's signatures
    take them: one tensor is `inputs`; a dict's inputs are its keys, a tuple's `input_0`,
    `input_1`, ...; nested, the path joined by `_` (`a_b`, `a_0`). Any character but an
    ASCII letter, digit or `_` becomes `_`, and a name that does not start with a letter gets
    `input_` in front, so that TensorFlow keeps each name as it is (it renames an argument
    such as `0` or `a/b`). Two inputs with one name are refused."""
    if isinstance(spec, tf.TypeSpec):
        return ["inputs"]
    paths = list(_paths(spec))
    assert len(paths) == len(tf.nest.flatten(spec)), (paths, spec)
    named: dict[str, tuple[str, ...]] = {}
    for path in paths:
        name = _input_name(path)
        if name in named:
            raise DistlabError(
                f"the inputs {'/'.join(named[name])!r} and {'/'.join(path)!r} would both be "
                f"named {name!r} (an input's name, which the exported SavedModel's signatures "
                "take, keeps ASCII letters, digits and '_' only): rename one of the dict keys "
                "in the dataset builder")
        named[name] = path
    return list(named)


def legacy_input_names(spec: Any) -> list[str]:
    """The names the inputs had before they were made valid signature names: a tuple's
    positions (`0`, `1`), nested paths joined by `/` (`a/b`); deprecated aliases."""
    if isinstance(spec, tf.TypeSpec):
        return ["inputs"]
    return ["/".join(path) for path in _paths(spec)]


def _input_name(path: tuple[str, ...]) -> str:
    name = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_"
                   for c in "_".join(path))
    return name if name[:1].isascii() and name[:1].isalpha() else f"input_{name}"


def _paths(node: Any, prefix: tuple[str, ...] = ()):
    """The paths (keys, positions) of a structure's leaves in tf.nest's order (dict keys
    sorted)."""
    if isinstance(node, dict):
        for key in sorted(node):
            yield from _paths(node[key], (*prefix, str(key)))
    elif isinstance(node, tuple | list):
        fields = getattr(node, "_fields", None) or range(len(node))
        for field, value in zip(fields, node, strict=True):
            yield from _paths(value, (*prefix, str(field)))
    else:
        yield prefix


def named_specs(spec: Any) -> Any:
    """`spec` with each tf.TensorSpec named as its input (`input_names`), for keras.Input."""
    flat = [tf.TensorSpec(s.shape, s.dtype, name=name)
            for s, name in zip(tf.nest.flatten(spec), input_names(spec), strict=True)]
    return tf.nest.pack_sequence_as(spec, flat)


def input_shapes(spec: Any) -> Any:
    """One input's shape per example as a tuple; for several, the same structure of them."""
    return tf.nest.map_structure(lambda s: tuple(s.shape), spec)


def describe_inputs(spec: Any) -> str:
    """`name: dtype shape, ...`, for messages."""
    return ", ".join(f"{name}: {s.dtype.name} {tuple(s.shape)}" for name, s in
                     zip(input_names(spec), tf.nest.flatten(spec), strict=True))


def _count(ds: tf.data.Dataset) -> int:
    n = int(ds.cardinality())
    if n >= 0:
        return n
    return int(ds.reduce(tf.constant(0, tf.int64), lambda c, _: c + 1))


def preprocessed_inputs(cfg: DictConfig, raw: Any) -> list[str]:
    """The inputs `dataset.preprocess` applies to (`input_names`), checked.

    `dataset.preprocess.inputs` names them; null: a dataset's one input tensor unless it
    is strings, or the float inputs of a tuple or dict. Any other input reaches the model
    untouched, in its own dtype (strings, integer ids)."""
    names, specs = input_names(raw), tf.nest.flatten(raw)
    dtypes = dict(zip(names, (s.dtype for s in specs), strict=True))
    settings = [(k, cfg[k]) for k in ("rescale", "mean", "std") if cfg[k] is not None]
    if cfg.get("standardize"):
        settings.append(("standardize", "true"))
    chosen = cfg.get("inputs")
    if chosen is not None:
        chosen = [_renamed(str(name), raw) for name in chosen]
        for name in chosen:
            if name not in dtypes:
                raise DistlabError(f"dataset.preprocess.inputs names {name!r}, which is not an "
                                   f"input of this dataset; its inputs: {describe_inputs(raw)}")
            if dtypes[name] == tf.string:
                raise DistlabError(
                    f"dataset.preprocess.inputs names {name!r}, a string input: preprocessing "
                    "(float32, rescale, mean, std, standardize) is for numeric inputs; strings "
                    "reach the model as they are (adapt a TextVectorization or StringLookup "
                    "layer in the model on them)")
        return list(chosen)
    if isinstance(raw, tf.TypeSpec):
        chosen = [] if raw.dtype == tf.string else names
    else:
        chosen = [n for n in names if dtypes[n].is_floating]
    if settings and not chosen:
        key, value = settings[0]
        off = "false" if key == "standardize" else "null"
        if isinstance(raw, tf.TypeSpec):
            raise DistlabError(
                f"dataset.preprocess.{key}={value} cannot apply to this dataset's string "
                f"input: set it to {off} (strings reach the model as they are; adapt a "
                "TextVectorization or StringLookup layer in the model on them)")
        raise DistlabError(
            f"dataset.preprocess.{key}={value} applies to no input: by default it applies to "
            f"the float inputs, and this dataset's are {describe_inputs(raw)}; name the "
            f"numeric inputs to preprocess in dataset.preprocess.inputs, or set it to {off}")
    return chosen


_WARNED_RENAMED: set[str] = set()


def _renamed(name: str, raw: Any) -> str:
    """An input's name, given as it is or as it was before (`0`, `a/b`: a deprecated alias,
    which warns once)."""
    names = input_names(raw)
    old = dict(zip(legacy_input_names(raw), names, strict=True))
    if name in names or name not in old:
        return name
    if name not in _WARNED_RENAMED:
        _WARNED_RENAMED.add(name)
        log.warning("dataset.preprocess.inputs names %r, the name this input had before "
                    "distlab named inputs as the SavedModel's signatures take them; it is now "
                    "%r: write that (the old name is a deprecated alias)", name, old[name])
    return old[name]


def make_preprocess(cfg: DictConfig, raw: Any) -> Callable[[Any], Any]:
    """Raw inputs (one example or a batch; one tensor, a tuple or a dict) -> model inputs:
    each input of `preprocessed_inputs` is cast to float32, divided by `rescale`, then per
    channel (last axis) `mean` is subtracted and it is divided by `std`; the others pass
    through untouched."""
    rescale = cfg.rescale
    mean = None if cfg.mean is None else tf.constant(list(cfg.mean), tf.float32)
    std = None if cfg.std is None else tf.constant(list(cfg.std), tf.float32)
    chosen = set(preprocessed_inputs(cfg, raw))
    names = input_names(raw)
    floats = [n for n, spec in zip(names, tf.nest.flatten(raw), strict=True)
              if n in chosen and spec.dtype.is_floating]
    if rescale is not None and floats:
        log.warning("dataset.preprocess.rescale=%g divides float input(s) %s: rescale is meant "
                    "for integer pixels (uint8 0..255), and a dataset option's rescale is kept "
                    "when only dataset.name changes (mnist's 255); set "
                    "dataset.preprocess.rescale=null unless these floats need it",
                    rescale, ", ".join(floats))
    for name, spec in zip(names, tf.nest.flatten(raw), strict=True):
        channels = spec.shape[-1] if spec.shape.rank else None
        for key, value in (("mean", mean), ("std", std)):
            if (name in chosen and value is not None and channels is not None
                    and value.shape[0] not in (1, channels)):
                where = "the inputs have" if len(names) == 1 else f"input {name!r} has"
                raise DistlabError(f"dataset.preprocess.{key} has {value.shape[0]} entries but "
                                   f"{where} {channels} channels (last axis)")

    def one(x: tf.Tensor) -> tf.Tensor:
        x = tf.cast(x, tf.float32)
        if rescale is not None:
            x = x / float(rescale)
        if mean is not None:
            x = x - mean
        if std is not None:
            x = x / std
        return x

    def preprocess(inputs: Any) -> Any:
        flat = [one(x) if name in chosen else x
                for name, x in zip(names, tf.nest.flatten(inputs), strict=True)]
        return tf.nest.pack_sequence_as(inputs, flat)

    return preprocess


def standardized_inputs(cfg: DictConfig, raw: Any) -> tuple[str, ...]:
    """The inputs `dataset.preprocess.standardize` normalises (by the training split's
    per-feature mean and std, in the model: see `components.models`); () when off."""
    if not cfg.get("standardize"):
        return ()
    chosen = preprocessed_inputs(cfg, raw)
    for name, spec in zip(input_names(raw), tf.nest.flatten(raw), strict=True):
        if name in chosen and spec.shape.rank and spec.shape[-1] is None:
            raise DistlabError(
                f"dataset.preprocess.standardize=true needs each standardized input's last "
                f"axis (its features or channels) to have a known size; input {name!r} has "
                f"shape {tuple(spec.shape)}: leave it out of dataset.preprocess.inputs")
    return tuple(chosen)


def make_augment(cfg: DictConfig, spec: Any) -> Callable | None:
    """(image, seed[2]) -> image: random flips and random crops of a zero-padded image
    (translations by up to `crop_padding` pixels), stateless, so they depend on the seed
    only. None when nothing is configured."""
    flip, pad = cfg.flip, int(cfg.crop_padding)
    if flip == "none" and pad == 0:
        return None
    if not isinstance(spec, tf.TensorSpec) or spec.shape.rank != 3 or spec.dtype == tf.string:
        raise DistlabError(f"dataset.augment works on images (one input of shape (height, "
                           f"width, channels)); this dataset's inputs are "
                           f"{describe_inputs(spec)}. Set dataset.augment.flip=none and "
                           "dataset.augment.crop_padding=0")
    height, width, channels = spec.shape

    def augment(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        seeds = tf.random.experimental.stateless_split(seed, 3)
        if flip in ("horizontal", "both"):
            image = tf.image.stateless_random_flip_left_right(image, seeds[0])
        if flip in ("vertical", "both"):
            image = tf.image.stateless_random_flip_up_down(image, seeds[1])
        if pad:
            image = tf.image.pad_to_bounding_box(image, pad, pad, height + 2 * pad,
                                                 width + 2 * pad)
            image = tf.image.stateless_random_crop(image, [height, width, channels], seeds[2])
        return image

    return augment
