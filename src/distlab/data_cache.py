"""Decoded, preprocessed tfds splits cached on disk across runs (`dataset.disk_cache`).

The first run that needs a split writes it with `tf.data.Dataset.save` into a private
temporary directory and renames it into place when complete, under a per-entry file lock:
concurrent sweep jobs wait for one writer instead of decoding twice, and a writer killed
midway leaves nothing that a reader could take for a cache entry. The entry's name is a
hash of everything its contents depend on (dataset, version, split, features,
preprocessing, the prepared files' sizes and modification times, TensorFlow's version), so
a changed input gets a new entry and an entry is never stale.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import tensorflow as tf

from distlab.errors import first_line

log = logging.getLogger("distlab")
FORMAT = 1  # bump when what an entry holds changes


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


def entry_name(label: str, inputs: dict[str, Any]) -> str:
    """`<label>-<hash of inputs>`: the directory name of a cache entry."""
    payload = json.dumps({"format": FORMAT, "tensorflow": tf.__version__, **inputs},
                         sort_keys=True, default=str)
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in label)
    return f"{safe}-{hashlib.sha256(payload.encode()).hexdigest()[:20]}"


def cached(ds: tf.data.Dataset, root: Path, name: str) -> tf.data.Dataset:
    """`ds` read back from the cache entry `root/name`, written first if missing. If the
    entry cannot be written (read-only or full disk, no file locks), `ds` itself, after one
    warning: the run goes on without the cache."""
    path = root / name
    if not path.is_dir():
        try:
            root.mkdir(parents=True, exist_ok=True)
            _write(ds, root, name)
        except (OSError, tf.errors.OpError) as e:
            if not path.is_dir():  # (a concurrent writer's complete entry is fine)
                log.warning("data cache: cannot write %s (%s); going on without it. Point "
                            "dataset.cache_dir (or DISTLAB_CACHE_DIR) at a writable directory, "
                            "or set dataset.disk_cache=false", path, first_line(e))
                return ds
    return tf.data.Dataset.load(str(path), element_spec=ds.element_spec)


def _write(ds: tf.data.Dataset, root: Path, name: str) -> None:
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another job writing it: wait, then use its entry
        if (root / name).is_dir():
            return
        for orphan in root.glob(f".{name}.tmp-*"):  # left by a writer that was killed
            shutil.rmtree(orphan, ignore_errors=True)
        tmp = root / f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        started = time.time()
        try:
            ds.save(str(tmp))
            os.rename(tmp, root / name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # nothing left behind if it failed
        log.info("data cache: wrote %s in %.1f s", root / name, time.time() - started)
