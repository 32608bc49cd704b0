"""Decoded, preprocessed tfds splits cached on disk across runs (`dataset.disk_cache`).

The first run that needs a split writes it with `tf.data.Dataset.save` into a private
temporary directory and renames it into place when complete, under a per-entry file lock:
concurrent sweep jobs wait for one writer instead of decoding twice, and a writer killed
midway leaves nothing that a reader could take for a cache entry. The entry's name is a
hash of everything its contents depend on (dataset, version, split, features,
preprocessing, the prepared files' sizes and modification times, TensorFlow's version), so
a changed input gets a new entry and an entry is never stale.

The writer adds a manifest (every file's size and CRC-32, the number of rows); a reader
checks the entry against it before use, so a truncated or corrupt entry is found before
training starts and rebuilt, with one warning naming it.

A split whose examples have a fixed shape is stored `CHUNK_ROWS` rows per element and read
back row by row (`unbatch`): tf.data reads a stored element at a fixed cost, so 60,000
MNIST rows read back in about 0.3 s instead of 2.4-4.2 s one by one (docs/BENCHMARKS.md
section 19). Other splits are stored row by row.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from distlab.errors import first_line
from distlab.records.locks import locked

log = logging.getLogger("distlab")
FORMAT = 3  # bump when what an entry holds changes (2: the manifest; 3: rows in chunks)
CHUNK_ROWS = 4096  # rows per stored element of a fixed-shape split
MANIFEST = "distlab-manifest.json"
_CHUNK = 8 << 20
_RUN: ContextVar[dict[Path, DiskCache] | None] = ContextVar("distlab_cache_run", default=None)


def cache_root(cache_dir: str | None) -> Path:
    """`dataset.cache_dir`, else $DISTLAB_CACHE_DIR, else ~/.cache/distlab (XDG)."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    if os.environ.get("DISTLAB_CACHE_DIR"):
        return Path(os.environ["DISTLAB_CACHE_DIR"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "distlab"


def files_signature(directory: str | os.PathLike) -> list[tuple[str, int, int]]:
    """(name, size, mtime in ns) of every file under a prepared tfds dataset's directory."""
    root = Path(directory)
    return sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns)
                  for p in root.rglob("*") if p.is_file())


def source_inputs(cache_key: dict[str, Any]) -> dict[str, Any]:
    """What a source's entries depend on: its cache key (dataset, version, features) with its
    `data_dir` replaced by the prepared files' signature."""
    inputs = {k: v for k, v in cache_key.items() if k != "data_dir"}
    return {**inputs, "files": files_signature(cache_key["data_dir"])}


def entry_name(label: str, inputs: dict[str, Any]) -> str:
    """`<label>-<hash of inputs>`: the directory name of a cache entry."""
    payload = json.dumps({"format": FORMAT, "tensorflow": tf.__version__, **inputs},
                         sort_keys=True, default=str)
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in label)
    return f"{safe}-{hashlib.sha256(payload.encode()).hexdigest()[:20]}"


class DiskCache:
    """The cache directory `root` as one run uses it: if the root cannot be written, the
    first entry that needs writing logs one warning and the run's other entries go on
    without the cache silently."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.unwritable = False

    def cached(self, ds: tf.data.Dataset, name: str) -> tf.data.Dataset:
        """`ds` read back from the entry `root/name`: written first if missing, rebuilt
        (one warning) if it fails its manifest check. If it cannot be written (read-only or
        full disk, no file locks), `ds` itself: the run goes on without the cache."""
        path = self.root / name
        if path.is_dir() and check(path, ds.element_spec) is None:
            return _load(path, ds.element_spec)
        if self.unwritable:
            return ds
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            _write(ds, self.root, name)
        except (OSError, tf.errors.OpError) as e:
            # (a concurrent writer's complete entry is fine)
            if not (path.is_dir() and check(path, ds.element_spec) is None):
                self._cannot_write(path, e)
                return ds
        return _load(path, ds.element_spec)

    def array(self, compute: Callable[[], np.ndarray], name: str,
              problem: Callable[[np.ndarray], str | None] = lambda a: None) -> np.ndarray:
        """The array of the entry `root/name.npy` (a split's labels: a small array that
        tf.data would read back row by row): `compute()` saved first if missing, recomputed
        (one warning) if unreadable or if `problem(array)` names what is wrong with it;
        written under the entry's lock to a temporary file renamed into place, so a reader
        never sees half of it. If it cannot be written, `compute()`'s array (one warning per
        run, as for the split entries)."""
        path = self.root / f"{name}.npy"
        if path.is_file():
            try:
                found = np.load(path, allow_pickle=False)
                why = problem(found)
            except (OSError, ValueError, EOFError):
                why = "not a readable .npy array"
            if why is None:
                return found
            log.warning("data cache: entry %s is damaged (%s); rebuilding it", path, why)
        values = compute()
        if self.unwritable:
            return values
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with locked(_lock_file(self.root, f"{name}.npy")):
                for orphan in _orphans(self.root, f"{name}.npy", "tmp"):  # a killed writer's
                    orphan.unlink(missing_ok=True)
                tmp = _private(self.root, f"{name}.npy", "tmp")
                try:
                    with open(tmp, "wb") as f:
                        np.save(f, values, allow_pickle=False)
                    os.replace(tmp, path)
                finally:
                    tmp.unlink(missing_ok=True)
        except OSError as e:
            self._cannot_write(path, e)
        return values

    def _cannot_write(self, path: Path, error: Exception) -> None:
        """The root cannot be written: one warning, and the run's other entries go on without
        the cache silently."""
        self.unwritable = True
        log.warning("data cache: cannot write %s (%s); going on without it. Point "
                    "dataset.cache_dir (or DISTLAB_CACHE_DIR) at a writable directory, "
                    "or set dataset.disk_cache=false", path, first_line(error))

    @classmethod
    def of(cls, root: Path) -> DiskCache:
        """The run's cache at `root` inside `one_run()` (so the run warns once), else a new one."""
        shared = _RUN.get()
        if shared is None:
            return cls(root)
        return shared.setdefault(Path(root), cls(root))


@contextlib.contextmanager
def one_run() -> Iterator[None]:
    """The data of one run is loaded inside: `DiskCache.of` gives every reader the same cache."""
    token = _RUN.set({})
    try:
        yield
    finally:
        _RUN.reset(token)


def cached(ds: tf.data.Dataset, root: Path, name: str) -> tf.data.Dataset:
    """`DiskCache(root).cached(ds, name)`: one entry, on its own."""
    return DiskCache(root).cached(ds, name)


def check(path: Path, element_spec: Any = None) -> str | None:
    """None if the entry at `path` matches its manifest (the set of files, their sizes and
    CRC-32s, the number of rows); else what is wrong, in a few words."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        expected = {str(name): (int(size), int(crc))  # its shape checked here, once
                    for name, (size, crc) in manifest["files"].items()}
        rows, chunk = int(manifest["rows"]), int(manifest.get("chunk", 0))
    except FileNotFoundError:
        return "no manifest"
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        return f"unreadable manifest ({first_line(e)})"
    try:
        present = {name for name in _files(path) if name != MANIFEST}
        missing, extra = sorted(set(expected) - present), sorted(present - set(expected))
        if missing:
            return f"missing {missing[0]}"
        if extra:
            return f"unexpected file {extra[0]}"
        for name, (size, _) in expected.items():  # cheap: catches truncation first
            actual = (path / name).stat().st_size
            if actual != size:
                return f"{name} has {actual} bytes, {size} were written"
        for name, (_, crc) in expected.items():
            if _crc32(path / name) != crc:
                return f"{name} fails its checksum"
        n = int(_stored(path, element_spec, chunk).cardinality())
    except (OSError, tf.errors.OpError) as e:
        return f"unreadable ({first_line(e)})"
    stored = -(-rows // chunk) if chunk else rows
    return None if n == stored else f"{n} stored elements, {stored} were written"


def _files(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def _crc32(path: Path) -> int:
    crc, buf = 0, bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            crc = zlib.crc32(view[:n], crc)
    return crc


def _load(path: Path, element_spec: Any) -> tf.data.Dataset:
    """The entry at `path` (checked: its files match the manifest's CRCs), row by row."""
    chunk = int(json.loads((path / MANIFEST).read_text()).get("chunk", 0))
    ds = _stored(path, element_spec, chunk)
    return ds.unbatch() if chunk else ds


def _stored(path: Path, element_spec: Any, chunk: int) -> tf.data.Dataset:
    """The entry's stored elements: rows, or chunks of `chunk` rows."""
    if chunk:
        element_spec = tf.nest.map_structure(
            lambda s: tf.TensorSpec([None, *s.shape], s.dtype), element_spec)
    return tf.data.Dataset.load(str(path), element_spec=element_spec)


def _rows(stored: tf.data.Dataset, chunk: int) -> int:
    """The rows of an entry's stored elements (chunks of `chunk` rows, or rows if 0)."""
    if not chunk:
        return int(stored.cardinality())
    return int(stored.reduce(np.int64(0), lambda n, batch: n + tf.shape(
        tf.nest.flatten(batch)[0], out_type=tf.int64)[0]))


def _chunk_rows(element_spec: Any) -> int:
    """Rows per stored element: `CHUNK_ROWS` for examples of a fixed shape, else 0 (stored
    row by row)."""
    specs = tf.nest.flatten(element_spec)
    fixed = all(isinstance(s, tf.TensorSpec) and s.shape.is_fully_defined() for s in specs)
    return CHUNK_ROWS if fixed else 0


def _private(root: Path, name: str, kind: str) -> Path:
    """A path of this process beside the entry `name` ("tmp": being written, "bad": damaged,
    being deleted), hidden from readers, which look for `name` only."""
    return root / f".{name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _lock_file(root: Path, name: str) -> Path:
    """The entry `name`'s lock file (`.<name>.lock`)."""
    return root / f".{name}.lock"


def _orphans(root: Path, name: str, *kinds: str) -> list[Path]:
    """The `_private` paths of `kinds` beside the entry `name` (left by a killed process when
    found under the entry's lock)."""
    return [p for kind in kinds for p in root.glob(f".{name}.{kind}-*")]


def _write(ds: tf.data.Dataset, root: Path, name: str) -> None:
    path = root / name
    with locked(_lock_file(root, name)):  # another job writing it: wait, then use its entry
        if path.is_dir():
            problem = check(path, ds.element_spec)
            if problem is None:  # written (or rebuilt) by another job meanwhile
                return
            log.warning("data cache: entry %s is damaged (%s); rebuilding it", path, problem)
            damaged = _private(root, name, "bad")
            os.rename(path, damaged)  # readers now find no entry, never a half-deleted one
            shutil.rmtree(damaged, ignore_errors=True)
        for orphan in _orphans(root, name, "tmp", "bad"):
            shutil.rmtree(orphan, ignore_errors=True)  # left by a job that was killed
        tmp = _private(root, name, "tmp")
        started = time.time()
        chunk = _chunk_rows(ds.element_spec)
        try:
            (ds.batch(chunk) if chunk else ds).save(str(tmp))
            rows = _rows(_stored(tmp, ds.element_spec, chunk), chunk)
            files = {f: [(tmp / f).stat().st_size, _crc32(tmp / f)] for f in _files(tmp)}
            (tmp / MANIFEST).write_text(json.dumps({"format": FORMAT, "rows": rows,
                                                    "chunk": chunk, "files": files}))
            os.rename(tmp, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # nothing left behind if it failed
        log.info("data cache: wrote %s in %.1f s", path, time.time() - started)
