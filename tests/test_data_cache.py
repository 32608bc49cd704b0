"""The on-disk cache of decoded, preprocessed tfds splits (dataset.disk_cache)."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import TINY_TEST, TINY_TRAIN, compose_once, fast_overrides

from distlab.data import cache as data_cache


def _entries(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


@pytest.mark.slow
def test_runs_share_entries_keyed_by_everything_the_data_depends_on(run_inprocess, tmp_path):
    root = Path(os.environ["DISTLAB_CACHE_DIR"])
    shared = set(root.glob("*")) if root.is_dir() else set()  # other tests' entries
    # one device and a small MLP: the data is the point, not the model or the strategy
    common = ("trainer.epochs=1", "trainer.steps_per_epoch=1", "dataset.cache_dir=" + str(
        tmp_path / "cache"), "trainer.validate_every=0", "strategy=default", "model=mlp",
              "model.hidden_units=[8]")
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
    results = _read_concurrently(ds, tmp_path, "entry-abc")
    assert len(calls) == 50  # decoded by one writer; the others waited for its entry
    assert all(sorted(r) == list(np.arange(50) * 2) for r in results) and len(results) == 3
    assert _entries(tmp_path) == ["entry-abc"]  # no temporary directory left


def test_an_unwritable_cache_dir_warns_once_per_run_and_the_run_goes_on(
        tiny_data_dir, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    data = _load(tiny_data_dir, blocker / "sub")  # both splits (train and test) need writing
    assert _rows(data.test.unbatch()) == TINY_TEST  # validation: held out of train
    assert _rows(data.train) + _rows(data.validation.unbatch()) == TINY_TRAIN
    warnings = _cache_warnings(caplog)
    assert len(warnings) == 1 and "dataset.cache_dir" in warnings[0]
    assert "disk_cache=false" in warnings[0] and "\n" not in warnings[0]
    caplog.clear()
    _load(tiny_data_dir, blocker / "sub")  # the next run (same process) warns once again
    assert len(_cache_warnings(caplog)) == 1


def _load(data_dir: Path, cache_dir: Path):
    from distlab.data import pipeline as data

    cfg = compose_once([*fast_overrides(data_dir), f"dataset.cache_dir={cache_dir}"])
    return data.load(cfg.dataset, num_replicas=1, seed=0, steps_per_epoch=None)


def _rows(ds: tf.data.Dataset) -> int:
    return int(ds.reduce(0, lambda n, _: n + 1))


def _cache_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelname == "WARNING" and "data cache" in r.getMessage()]


def _shard(entry: Path) -> Path:
    return sorted(entry.glob("*/*.shard/*.snapshot"))[0]


@pytest.fixture(scope="module")
def built_cache(tiny_data_dir, tmp_path_factory) -> Path:
    """A cache dir as the first load of the tiny data writes it, written once per module
    (the tests that damage it work on a copy)."""
    cache = tmp_path_factory.mktemp("built") / "cache"
    _load(tiny_data_dir, cache)
    return cache


@pytest.mark.parametrize("how", ["records", "bytes"])
def test_a_truncated_entry_is_rebuilt_before_use(tiny_data_dir, tmp_path, caplog, how,
                                                 built_cache):
    shutil.copytree(built_cache, tmp_path / "cache")  # as _load(tiny_data_dir, it) writes
    entries = _entries(tmp_path / "cache")
    (entry,) = (tmp_path / "cache").glob("mnist-test-*")
    stored = tf.data.Dataset.load(str(entry))  # fixed-shape rows: stored in chunks
    intact = [x.numpy() for x, _ in stored.unbatch()]
    shard = _shard(entry)
    if how == "records":  # a shard of the first 48 rows: Dataset.load still says 192
        stored.unbatch().take(48).batch(data_cache.CHUNK_ROWS).save(str(tmp_path / "short"))
        shutil.copyfile(_shard(tmp_path / "short"), shard)
    else:
        os.truncate(shard, shard.stat().st_size // 2)
    data = _load(tiny_data_dir, tmp_path / "cache")
    warnings = _cache_warnings(caplog)
    assert len(warnings) == 1 and str(entry) in warnings[0] and "rebuilding" in warnings[0]
    assert _entries(tmp_path / "cache") == entries  # rebuilt in place, nothing left over
    images = np.concatenate([x.numpy() for x, _ in data.test])
    np.testing.assert_array_equal(images, np.stack(intact))
    caplog.clear()
    _load(tiny_data_dir, tmp_path / "cache")  # the rebuilt entry passes its check
    assert not _cache_warnings(caplog)


@pytest.mark.parametrize("damage", ["flipped bytes", "deleted shard", "deleted metadata",
                                    "deleted manifest", 'manifest {"files": null}',
                                    "manifest of bare sizes", "manifest a list"])
def test_a_corrupt_entry_is_found_before_use_and_rebuilt(tmp_path, caplog, damage):
    ds = tf.data.Dataset.range(300).map(lambda x: (tf.fill([8], x), x * 3))
    data_cache.cached(ds, tmp_path, "entry-abc")
    entry = tmp_path / "entry-abc"
    shard = _shard(entry)
    if damage == "flipped bytes":
        raw = bytearray(shard.read_bytes())
        for i in range(len(raw) // 2, len(raw) // 2 + 16):
            raw[i] ^= 0xFF
        shard.write_bytes(raw)
    elif damage == "deleted shard":
        shard.unlink()
    elif damage == "deleted metadata":
        (entry / "snapshot.metadata").unlink()
    elif damage == "deleted manifest":
        (entry / data_cache.MANIFEST).unlink()
    else:  # valid JSON of the wrong shape
        manifest = json.loads((entry / data_cache.MANIFEST).read_text())
        shapes = {'manifest {"files": null}': {"files": None, "rows": 1},
                  "manifest of bare sizes": {**manifest, "files": {
                      name: size for name, (size, _) in manifest["files"].items()}},
                  "manifest a list": [1, 2]}
        (entry / data_cache.MANIFEST).write_text(json.dumps(shapes[damage]))
    loaded = data_cache.cached(ds, tmp_path, "entry-abc")
    warnings = _cache_warnings(caplog)  # found (and rebuilt) before any element is read
    assert len(warnings) == 1 and str(entry) in warnings[0] and "\n" not in warnings[0]
    assert data_cache.check(entry, ds.element_spec) is None
    assert [int(y) for _, y in loaded] == [3 * i for i in range(300)]
    assert _entries(tmp_path) == ["entry-abc"]  # no damaged copy or temporary left


def test_an_intact_entry_is_used_without_rewriting(tmp_path, caplog):
    ds = tf.data.Dataset.range(20)
    data_cache.cached(ds, tmp_path, "entry-abc")
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "entry-abc").rglob("*")}
    assert list(data_cache.cached(ds, tmp_path, "entry-abc").as_numpy_iterator()) == list(
        range(20))
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "entry-abc").rglob("*")} == before
    assert not _cache_warnings(caplog)


def test_concurrent_readers_of_a_damaged_entry_rebuild_it_once(tmp_path, caplog):
    calls = []

    def decode(x):
        calls.append(1)
        return x * 2

    ds = tf.data.Dataset.range(50).map(lambda x: tf.py_function(decode, [x], tf.int64))
    data_cache.cached(ds, tmp_path, "entry-abc")
    os.truncate(_shard(tmp_path / "entry-abc"), 100)
    calls.clear()
    results = _read_concurrently(ds, tmp_path, "entry-abc")
    assert len(calls) == 50 and len(_cache_warnings(caplog)) == 1  # one job rebuilt it
    assert all(r == list(range(0, 100, 2)) for r in results)
    assert _entries(tmp_path) == ["entry-abc"]


def _read_concurrently(ds, root, name: str, jobs: int = 3) -> list[list[int]]:
    """`jobs` threads each read `ds` through the cache entry root/name; their values."""
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def job():
        try:
            results.append([int(v) for v in data_cache.cached(ds, root, name).as_numpy_iterator()])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=job) for _ in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and len(results) == jobs, errors
    return results


def test_an_array_entry_is_computed_once_and_a_damaged_one_rebuilt(tmp_path, caplog):
    calls = []

    def labels():
        calls.append(1)
        return np.arange(7) % 3

    def problem(array):
        return None if array.shape == (7,) and array.dtype.kind in "iu" else "not 7 labels"

    def read(root=tmp_path):
        return data_cache.DiskCache(root).array(labels, "d-train-labels-abc", problem)

    first = read()
    np.testing.assert_array_equal(first, np.arange(7) % 3)
    np.testing.assert_array_equal(read(), first)  # the next run reads it
    assert len(calls) == 1 and sorted(p.name for p in tmp_path.iterdir()
                                      if not p.name.endswith(".lock")) == [
        "d-train-labels-abc.npy"]  # no temporary file left
    entry = tmp_path / "d-train-labels-abc.npy"
    damages = [lambda: entry.write_bytes(entry.read_bytes()[:-5]),  # truncated
               lambda: entry.write_bytes(b"\x00garbage" * 50),
               lambda: np.save(entry, np.arange(5)),  # another split's length
               lambda: np.save(entry, np.zeros(7, np.float32))]  # not class labels
    for i, damage in enumerate(damages, start=2):
        damage()
        np.testing.assert_array_equal(read(), first)
        assert len(calls) == i and len(_cache_warnings(caplog)) == i - 1
        assert "damaged" in _cache_warnings(caplog)[-1]
        assert "pickle" not in _cache_warnings(caplog)[-1]
    (tmp_path / ".d-train-labels-abc.npy.tmp-123-dead").write_bytes(b"x")  # a killed writer's
    entry.unlink()
    read()
    assert not list(tmp_path.glob(".d-train-labels-abc.npy.tmp-*"))
    blocker = tmp_path / "file"
    blocker.write_text("")  # unwritable: computed, one warning, no entry
    caplog.clear()
    np.testing.assert_array_equal(read(blocker), first)
    assert len(_cache_warnings(caplog)) == 1 and "cannot write" in _cache_warnings(caplog)[0]


def test_fixed_shape_rows_are_stored_in_chunks_and_read_back_row_by_row(tmp_path, monkeypatch):
    monkeypatch.setattr(data_cache, "CHUNK_ROWS", 64)  # 150 rows: two whole chunks and a part
    fixed = tf.data.Dataset.range(150).map(lambda x: (tf.fill([3], x), x))
    varying = tf.data.Dataset.range(10).map(lambda x: tf.range(x))
    for name, ds, rows, stored in [("fixed", fixed, 150, 3), ("varying", varying, 10, 10)]:
        loaded = data_cache.cached(ds, tmp_path, name)
        assert int(tf.data.Dataset.load(str(tmp_path / name)).cardinality()) == stored
        assert sum(1 for _ in loaded) == rows
        for a, b in zip(loaded.as_numpy_iterator(), ds.as_numpy_iterator(), strict=True):
            tf.nest.map_structure(np.testing.assert_array_equal, a, b)
