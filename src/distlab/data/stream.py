"""The training stream and its split over the replicas. `Data` holds what a loop needs;
its train stream is built per epoch: epoch e is shuffled, and augmented, with seeds derived
from (seed, e) and the example's place in the epoch only, so the data of an epoch never
depends on how many epochs this process has already run (resume gives the same batches as
an uninterrupted run). A train split held in memory (`dataset.cache`) is streamed as
indices: the shuffle and batching run on row numbers, each batch is gathered from the
in-memory tensors, and the batches are the same as shuffling and batching the rows
themselves (a shuffle's order does not depend on what it shuffles), and tf.data no
longer reads, shuffles and copies the examples one by one. Under the default strategy a
loop's steps take the row numbers themselves and gather their batch (`train_row_epochs`,
`gathered`): the same batches, without tf.data handing each one over (about 8% of a small
model's epoch on 2 cores; docs/BENCHMARKS.md section 27). `distribute` gives
each replica its even share of a global batch, with the row weights that let a short last
batch be split over any replica count.

distlab's own dataset functions are traced as written (`do_not_convert`): none has Python
control flow on tensors, and autograph's conversion of them cost about 0.5 s per run."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tensorflow as tf
from tensorflow.autograph.experimental import do_not_convert

from distlab.data.structure import batched

AUTOTUNE = tf.data.AUTOTUNE
ADAPT_BATCH = 1024  # rows per batch of Data.train_inputs (fixed: stats never depend on replicas)
IN_MEMORY_CHUNK = 4096  # rows read at a time into a split held in memory (`in_memory`)


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
    train_rows: Any = None  # `train`'s rows in memory (variables, `in_memory`), or None

    def train_inputs(self, batch_size: int = ADAPT_BATCH) -> tf.data.Dataset:
        """The training split's model inputs (no labels), preprocessed, unshuffled, in
        batches of `batch_size` rows whatever the replica count (padded as training batches
        are): what a model builder adapts its preprocessing layers on."""
        return batched(self.train.map(do_not_convert(lambda x, y: x), num_parallel_calls=AUTOTUNE),
                       batch_size)

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
        return self._epochs(first_epoch, end_epoch, skip_steps, gather=True)

    @property
    def rows_in_memory(self) -> bool:
        """Whether the train stream can be taken as row numbers (`train_row_epochs`): the
        split is held in memory and not augmented (an augmented one streams row by row)."""
        return self.train_rows is not None and self.augment is None

    def train_row_epochs(self, first_epoch: int, end_epoch: int,
                         skip_steps: int = 0) -> tf.data.Dataset:
        """As `train_epochs`, each batch as the numbers of its rows in memory (an int64
        vector): `gathered(batch)` is then the batch `train_epochs` gives, with its weights.
        Only where `rows_in_memory`."""
        if not self.rows_in_memory:
            raise ValueError("the train split is not held in memory as rows")
        return self._epochs(first_epoch, end_epoch, skip_steps, gather=False)

    @do_not_convert
    def gathered(self, index: tf.Tensor) -> tuple[Any, Any, tf.Tensor]:
        """(features, labels, weights) of the rows numbered `index`: one replica's whole batch
        (see `distribute`), taken from memory inside a training step."""
        return _whole_batch(*self._gather(index))

    def _gather(self, index: tf.Tensor) -> Any:
        return tf.nest.map_structure(lambda v: tf.gather(v, index), self.train_rows)

    def _epochs(self, first_epoch: int, end_epoch: int, skip_steps: int,
                gather: bool) -> tf.data.Dataset:
        base, buffer, seed = self.train, self.shuffle_buffer, self.seed
        gb, steps, full_pass = self.global_batch_size, self.steps_per_epoch, self.full_pass
        augment = self.augment
        rows = self.train_rows if augment is None else None  # augmenting: row by row
        num_rows = int(tf.nest.flatten(rows)[0].shape[0]) if rows is not None else 0

        @do_not_convert
        def one_epoch(epoch: tf.Tensor) -> tf.data.Dataset:
            if rows is not None:  # the row numbers take the examples' place, then gather
                ds = tf.data.Dataset.range(num_rows)
            else:
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
            ds = ds if full_pass else ds.take(steps)
            if rows is not None and gather:  # (variables: a captured tensor would be copied)
                ds = ds.map(do_not_convert(self._gather))
            return ds

        epochs = tf.data.Dataset.range(first_epoch, end_epoch).flat_map(one_epoch)
        if skip_steps:
            epochs = epochs.skip(skip_steps)
        return no_autotune(epochs.prefetch(AUTOTUNE))


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

        @do_not_convert
        def split(features, labels) -> tf.data.Dataset:
            return tf.data.Dataset.range(first, first + local).map(
                lambda k: replica_rows((features, labels), k, replicas))

        return no_autotune(dataset.flat_map(split).prefetch(AUTOTUNE))

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


@do_not_convert
def _whole_batch(features, labels):
    n = tf.shape(tf.nest.flatten(labels)[0])[0]
    return features, labels, tf.ones([n], tf.float32)


_DEFAULT_STRATEGY = type(tf.distribute.get_strategy())  # imported outside any scope


def is_default(strategy: tf.distribute.Strategy) -> bool:
    return type(strategy) is _DEFAULT_STRATEGY


def no_autotune(ds: tf.data.Dataset) -> tf.data.Dataset:
    """No tf.data autotuning thread: deleting an iterator of an autotuned pipeline waits for
    that thread's next wake-up (up to 60 s); see docs/BENCHMARKS.md and
    benchmarks/iterator_stall.py. Measured no slower here without it."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.with_options(options)


def in_memory(ds: tf.data.Dataset, rows: int,
              chunk: int = IN_MEMORY_CHUNK) -> tuple[tf.data.Dataset, Any]:
    """`(dataset, variables)`: the `rows` examples of `ds` read once into variables (one per
    input and label, all rows stacked; written in place chunk by chunk, so memory holds them
    once, as `ds.cache()` would), and the dataset of their rows in order. `(ds, None)` where
    they cannot be: an input whose shape varies from example to example, strings, an empty
    split, or a distribution strategy's scope (its variables would be the strategy's)."""
    specs = tf.nest.flatten(ds.element_spec)
    if (rows == 0 or tf.distribute.has_strategy()
            or not all(s.shape.is_fully_defined() and s.dtype != tf.string for s in specs)):
        return ds, None
    variables = tf.nest.map_structure(
        lambda s: tf.Variable(tf.zeros([rows, *s.shape], s.dtype), trainable=False),
        ds.element_spec)
    start = 0
    for batch in ds.batch(chunk):
        n = int(tf.shape(tf.nest.flatten(batch)[0])[0])
        if start + n > rows:  # more rows than the split was said to have
            return ds, None
        index = tf.range(start, start + n)
        tf.nest.map_structure(lambda v, t, at=index: v.scatter_update(tf.IndexedSlices(t, at)),
                              variables, batch)
        start += n
    if start != rows:  # the split is not the size it was said to be: stream it as it is
        return ds, None
    by_row = tf.data.Dataset.range(rows).batch(chunk).map(do_not_convert(
        lambda index: tf.nest.map_structure(lambda v: tf.gather(v, index), variables)))
    return by_row.unbatch(), variables


def prefetched(ds: tf.data.Dataset, global_batch: int) -> tf.data.Dataset:
    """`ds` batched by the global batch and prefetched (an evaluation split's batches)."""
    return no_autotune(batched(ds, global_batch).prefetch(AUTOTUNE))
