"""The tfds input pipeline: global batch, exact epochs, per-epoch order, offline failure."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from conftest import TINY_TEST, TINY_TRAIN, compose_once

from distlab.data import pipeline as data_lib
from distlab.data import tfds_source
from distlab.data.source import DataSource, RawSplits
from distlab.data.structure import dense_inputs
from distlab.errors import DistlabError


def _cfg(data_dir, *extra):
    return compose_once([f"dataset.data_dir={data_dir}", *extra]).dataset


def test_mock_data_pipeline_batches_by_the_global_batch(monkeypatch):
    monkeypatch.setattr(tfds_source, "_unreachable_host", lambda builder: None)
    with tfds.testing.mock_data(num_examples=300):
        d = data_lib.load(compose_once(["dataset.validation=null"]).dataset, num_replicas=2,
                          seed=1, steps_per_epoch=None)
        assert d.global_batch_size == 128 and d.steps_per_epoch == 3  # ceil(300 / 128)
        batches = list(d.train_epochs(0, 1))
    assert [int(b[0].shape[0]) for b in batches] == [128, 128, 44]
    images, labels = batches[0]
    assert images.dtype == tf.float32 and images.shape[1:] == (28, 28, 1)
    assert float(tf.reduce_max(images)) <= 1.0 and float(tf.reduce_min(images)) >= 0.0
    assert labels.dtype == tf.int64


def test_real_prepared_dir_and_global_batch(tiny_data_dir):
    d = data_lib.load(_cfg(tiny_data_dir, "dataset.validation=null"), num_replicas=2, seed=0,
                      steps_per_epoch=None)
    assert (d.num_train, d.num_test, d.outputs) == (TINY_TRAIN, TINY_TEST, 10)
    assert d.global_batch_size == 128 and d.steps_per_epoch == 4
    assert sum(int(b[0].shape[0]) for b in d.test) == TINY_TEST
    assert d.examples_per_epoch == TINY_TRAIN


def test_epoch_order_depends_only_on_seed_and_epoch(tiny_data_dir):
    d = data_lib.load(_cfg(tiny_data_dir), num_replicas=1, seed=5, steps_per_epoch=None)
    spe = d.steps_per_epoch
    from_zero = [b[1].numpy() for b in d.train_epochs(0, 3)]
    from_two = [b[1].numpy() for b in d.train_epochs(2, 3)]
    assert len(from_zero) == 3 * spe and len(from_two) == spe
    np.testing.assert_array_equal(np.concatenate(from_zero[2 * spe:]), np.concatenate(from_two))
    assert not np.array_equal(np.concatenate(from_zero[:spe]),
                              np.concatenate(from_zero[spe:2 * spe]))  # reshuffled per epoch
    mid = [b[1].numpy() for b in d.train_epochs(1, 3, skip_steps=3)]
    np.testing.assert_array_equal(np.concatenate(mid), np.concatenate(from_zero[spe + 3:]))


def test_fixed_steps_per_epoch_is_exact(tiny_data_dir):
    d = data_lib.load(_cfg(tiny_data_dir), num_replicas=1, seed=0, steps_per_epoch=11)
    sizes = [int(b[0].shape[0]) for b in d.train_epochs(0, 2)]
    assert sizes == [64] * 22 and d.examples_per_epoch == 11 * 64


def test_a_train_split_in_memory_streams_the_same_batches_as_row_by_row(tiny_data_dir):
    """dataset.cache (the default) keeps train as tensors and gathers each batch by shuffled
    row numbers: the same batches, images and labels, as shuffling and batching the rows
    (dataset.cache=false), a whole pass or a fixed number of steps, resumed mid-epoch too."""
    import dataclasses

    loaded = {cache: data_lib.load(_cfg(tiny_data_dir, f"dataset.cache={str(cache).lower()}"),
                                   num_replicas=1, seed=3, steps_per_epoch=None)
              for cache in (True, False)}
    assert loaded[True].train_rows is not None and loaded[False].train_rows is None
    assert loaded[True].rows_in_memory and not loaded[False].rows_in_memory
    with pytest.raises(ValueError, match="not held in memory"):
        loaded[False].train_row_epochs(0, 1)
    for steps, first, skip in [(None, 0, 0), (None, 1, 2), (11, 0, 0), (11, 1, 3)]:
        gathered, rows = ([(x.numpy(), y.numpy()) for x, y in dataclasses.replace(
            d, steps_per_epoch=steps or d.steps_per_epoch).train_epochs(first, 3, skip)]
            for d in (loaded[True], loaded[False]))
        # the row numbers a step takes (the default strategy's steps), gathered in the step
        in_memory = dataclasses.replace(loaded[True], steps_per_epoch=steps
                                        or loaded[True].steps_per_epoch)
        in_step = [tuple(t.numpy() for t in tf.function(in_memory.gathered)(index))
                   for index in in_memory.train_row_epochs(first, 3, skip)]
        assert len(gathered) == len(rows) == len(in_step) > 0
        short = in_memory.num_train % 64  # a short last batch in a whole pass
        assert short and {len(y) for _, y in gathered} == ({64} if steps else {64, short})
        for (x, y), (x2, y2), (x3, y3, w3) in zip(gathered, rows, in_step, strict=True):
            np.testing.assert_array_equal(y, y2)
            np.testing.assert_array_equal(x, x2)
            np.testing.assert_array_equal(y, y3)
            np.testing.assert_array_equal(x, x3)
            np.testing.assert_array_equal(w3, np.ones(len(y), np.float32))


def test_offline_unprepared_dataset_fails_fast_with_a_clear_message(tmp_path, monkeypatch):
    """Offline (every connection refused): one probe of the download host, no download
    (tfds would retry for minutes), and a message that says what to do."""
    import socket

    import tensorflow_datasets as tfds

    probed: list[tuple] = []

    def refused(address, *args, **kwargs):
        probed.append(address)
        raise OSError("offline")

    def download(*args, **kwargs):
        raise AssertionError("tfds download started")

    monkeypatch.setattr(socket, "create_connection", refused)
    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", download)
    with pytest.raises(DistlabError) as e:
        data_lib.load(_cfg(tmp_path), num_replicas=1, seed=0, steps_per_epoch=None)
    assert len(probed) == 1
    msg = str(e.value)
    assert "'mnist'" in msg and str(tmp_path) in msg and "TFDS_DATA_DIR" in msg


def test_data_dir_that_is_not_a_directory(tmp_path):
    with pytest.raises(DistlabError, match="dataset.data_dir"):
        data_lib.load(_cfg(tmp_path / "nope"), num_replicas=1, seed=0, steps_per_epoch=None)


def test_unknown_dataset_name(tiny_data_dir):
    with pytest.raises(DistlabError, match="dataset.name='no_such_dataset'"):
        data_lib.load(_cfg(tiny_data_dir, "dataset.name=no_such_dataset"), num_replicas=1,
                      seed=0, steps_per_epoch=None)


def test_every_seed_orders_and_augments_its_epochs_by_seed_and_epoch_only(tiny_data_dir):
    """seed=0 (tf.data's shuffle failed inside the per-epoch function), the largest seed, and
    seeds 2**31-1 apart (tf.data folds seeds modulo 2**31-1): each trains on an order of its
    own, whatever global seed the process has; seeds below 2**31-1 keep the order tf.data's
    shuffle gave them (a run trained before resumes on the same batches)."""
    cfg = _cfg(tiny_data_dir, "dataset.validation=null", "dataset.augment.flip=horizontal",
               "dataset.augment.crop_padding=2")

    def epochs(seed: int, process_seed: int) -> tuple[np.ndarray, np.ndarray]:
        tf.random.set_seed(process_seed)  # a run sets it to its seed (keras.utils)
        d = data_lib.load(cfg, num_replicas=1, seed=seed, steps_per_epoch=None)
        batches = list(d.train_epochs(0, 2))
        return np.concatenate([b[1].numpy() for b in batches]), batches[0][0].numpy()

    seeds = (0, 1, 2**31 - 1, 2**32 - 1)
    orders = {}
    for seed in seeds:
        labels, images = epochs(seed, seed)
        again, same_images = epochs(seed, 7)
        np.testing.assert_array_equal(labels, again)
        np.testing.assert_array_equal(images, same_images)  # augmented alike
        assert not np.array_equal(labels[:TINY_TRAIN], labels[TINY_TRAIN:])  # per epoch
        orders[seed] = labels
    assert len({o.tobytes() for o in orders.values()}) == len(seeds), "two seeds, one order"

    d = data_lib.load(cfg, num_replicas=1, seed=5, steps_per_epoch=None)
    labels = d.train.map(lambda x, y: y)
    tf.random.set_seed(5)
    before = tf.data.Dataset.range(2).flat_map(
        lambda e: labels.shuffle(d.shuffle_buffer, seed=5 * 1_000_003 + e))
    np.testing.assert_array_equal(np.fromiter(before.as_numpy_iterator(), np.int64),
                                  np.concatenate([b[1].numpy() for b in d.train_epochs(0, 2)]))


class _Columns(DataSource):
    """A source of in-memory columns, as a CSV or pandas source would give them: the whole
    of what a new source writes."""

    def claims(self, name: str) -> bool:
        return name.startswith("columns:")

    def splits(self, cfg) -> RawSplits:
        x = np.arange(28, dtype=np.float32).reshape(14, 2)
        y = np.arange(14) % 2
        rows = dense_inputs(tf.data.Dataset.from_tensor_slices((x, y)))
        return RawSplits(train=rows.take(10), test=rows.skip(10), num_train=10, num_test=4,
                         outputs=2, classes=True, cache_key=None)


def test_a_new_source_is_one_class_listed_in_the_pipeline_s_sources(monkeypatch):
    """A source that claims its names loads as tfds and builder sources do: preprocessing,
    batching and the train stream come from the pipeline, and its rows are fingerprinted
    by content (it knows no identities); other names still reach their own sources."""
    from distlab.data import fingerprint

    monkeypatch.setattr(data_lib, "SOURCES", (_Columns(), *data_lib.SOURCES))
    assert type(data_lib.source_for("columns:toy")) is _Columns
    assert type(data_lib.source_for("mnist")) is tfds_source.TfdsSource
    cfg = compose_once(["dataset.name=columns:toy", "dataset.validation=null",
                        "dataset.preprocess.rescale=null", "dataset.shuffle_buffer=0",
                        "dataset.batch_size_per_replica=4", "dataset.disk_cache=true"]).dataset
    d = data_lib.load(cfg, num_replicas=1, seed=0, steps_per_epoch=None)
    assert (d.num_train, d.num_test, d.outputs, d.classes) == (10, 4, 2, True)
    assert d.input_shape == (2,) and d.steps_per_epoch == 3
    batches = list(d.train_epochs(0, 1))
    assert [int(b[0].shape[0]) for b in batches] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), np.arange(10) % 2)
    assert type(d.splits.origin) is _Columns
    prints = fingerprint.of_splits(cfg, d.splits)
    assert prints["train"].startswith("10-") and prints["test"].startswith("4-")
    assert prints["validation"] is None


@pytest.mark.parametrize("name, says", [
    ("no_such_ds", "dataset.name='no_such_ds' is not a tensorflow-datasets dataset"),
    ("''", "dataset.name='' cannot be read by tensorflow-datasets in dataset.data_dir="),
    ("mnist:9.9.9", "cannot be loaded at version 9.9.9, only: 3.0.1"),
    # tfds' line ended "Here are 10 BuilderConfigs whose name closely match:" (none follow)
    ("mnist/foo", "(BuilderConfig foo not found with version 3.0.1): use a tfds name such "
                  "as mnist, name:version with a version it has, or name/config with a config"),
])
def test_a_name_tfds_cannot_read_is_one_line_naming_the_key(name, says, tiny_data_dir):
    cfg = compose_once([f"dataset.name={name}", f"dataset.data_dir={tiny_data_dir}"]).dataset
    with pytest.raises(DistlabError, match=re.escape(says)) as refused:
        data_lib.load(cfg, num_replicas=1, seed=0, steps_per_epoch=None)
    assert "\n" not in str(refused.value)
