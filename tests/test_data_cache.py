"""The on-disk cache of decoded, preprocessed tfds splits (dataset.disk_cache)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from distlab import data_cache


def _entries(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def test_runs_share_entries_keyed_by_everything_the_data_depends_on(run_inprocess, tmp_path):
    root = Path(os.environ["DISTLAB_CACHE_DIR"])
    shared = set(root.glob("*")) if root.is_dir() else set()  # other tests' entries
    common = ("trainer.epochs=1", "trainer.steps_per_epoch=1", "dataset.cache_dir=" + str(
        tmp_path / "cache"), "trainer.validate_every=0")
    first = run_inprocess(*common)
    entries = _entries(tmp_path / "cache")
    assert len(entries) == 2 and all(e.startswith("mnist-") for e in entries)  # train, test
    again = run_inprocess(*common)  # reads the same entries: same figures, nothing new
    assert _entries(tmp_path / "cache") == entries
    assert again["test_loss"] == pytest.approx(first["test_loss"], abs=1e-6)
    run_inprocess(*common, "dataset.preprocess.rescale=127.5")  # other preprocessing
    assert len(_entries(tmp_path / "cache")) == 4
    run_inprocess(*common, "dataset.disk_cache=false")
    assert len(_entries(tmp_path / "cache")) == 4
    now = set(root.glob("*")) if root.is_dir() else set()
    assert now == shared, "dataset.cache_dir overrides DISTLAB_CACHE_DIR"


def test_changed_prepared_files_get_a_new_entry(tmp_path):
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    (prepared / "data.tfrecord").write_bytes(b"1")
    before = data_cache.entry_name("d-train", {"files": data_cache.files_signature(prepared)})
    (prepared / "data.tfrecord").write_bytes(b"22")
    after = data_cache.entry_name("d-train", {"files": data_cache.files_signature(prepared)})
    assert before != after and before.startswith("d-train-")


def test_concurrent_writers_decode_once_and_read_the_same_entry(tmp_path):
    calls = []

    def slow_decode(x):
        calls.append(1)
        return x * 2

    ds = tf.data.Dataset.range(50).map(
        lambda x: tf.py_function(slow_decode, [x], tf.int64))
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def job():
        try:
            cached = data_cache.cached(ds, tmp_path, "entry-abc")
            results.append([int(v) for v in cached.as_numpy_iterator()])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=job) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert len(calls) == 50  # decoded by one writer; the others waited for its entry
    assert all(sorted(r) == list(np.arange(50) * 2) for r in results) and len(results) == 3
    assert _entries(tmp_path) == ["entry-abc"]  # no temporary directory left


def test_an_unwritable_cache_dir_warns_once_and_the_run_goes_on(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    ds = data_cache.cached(tf.data.Dataset.range(3), blocker / "sub", "entry")
    assert list(ds.as_numpy_iterator()) == [0, 1, 2]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "dataset.cache_dir" in warnings[0]
    assert "disk_cache=false" in warnings[0] and "\n" not in warnings[0]
