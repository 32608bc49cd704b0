"""Which rows each split holds, as a fingerprint: recorded when a run trains, compared when a
checkpoint is evaluated, so an evaluation never scores rows other than those the checkpoint
was validated and tested on (perhaps rows it trained on) without a word.

A split's fingerprint is computed once, as the data loads, and does not depend on the rows'
order nor on preprocessing:
- a tfds dataset: the rows' identities, its name, version and the absolute row ranges its
  split specs read (`train[:90%]` -> train rows 0..54000), and for a validation fraction
  held out of train, the mask of held-out rows (`tfds_source.row_identities`, the source's
  `fingerprints`). Nothing is read for it.
- a user's dataset builder (any source without `fingerprints`): the rows' content, a
  64-bit fingerprint of each (input, label) pair (every tensor serialised, dtype and shape
  included), sorted and hashed. That is one pass over the builder's raw splits.

`<run dir>/.distlab/splits.json` holds a training run's fingerprints.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from omegaconf import DictConfig

from distlab.config.checks import flatten
from distlab.errors import DistlabError, override

ROLES = ("train", "validation", "test")
# dataset keys that never decide which rows a split holds (what the rows become, or how they
# are read, batched and cached)
NOT_ROWS = ("batch_size_per_replica", "shuffle_buffer", "cache", "disk_cache", "cache_dir",
            "preprocess", "augment")


def of_splits(cfg: DictConfig, splits: Any) -> dict[str, str | None]:
    """{"train", "validation", "test": fingerprint (None: no validation split)} of a
    dataset's raw splits (`source.RawSplits`); `cfg`: the dataset node."""
    known = splits.origin.fingerprints(cfg, splits) if splits.origin is not None else None
    if known is not None:  # the rows' identities (tfds)
        return known
    train = row_hashes(splits.train)
    prints = {"train": _digest(train), "test": _digest(row_hashes(splits.test)),
              "validation": None}
    if splits.held_out is not None:
        prints["train"], prints["validation"] = (_digest(train[~splits.held_out]),
                                                 _digest(train[splits.held_out]))
    elif splits.validation is not None:
        prints["validation"] = _digest(row_hashes(splits.validation))
    return prints


def row_hashes(ds: tf.data.Dataset) -> np.ndarray:
    """A uint64 fingerprint of each (input, label) row of `ds`, in order."""
    return row_hashes_and_labels(ds)[0]


def row_hashes_and_labels(ds: tf.data.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """(`row_hashes`, every label value flattened) of `ds`, in one pass."""
    def one(x: Any, y: Any) -> tuple[tf.Tensor, tf.Tensor]:
        parts = [tf.io.serialize_tensor(t) for t in tf.nest.flatten((x, y))]
        framed = [tf.strings.join([tf.strings.as_string(tf.strings.length(p)), p],
                                  separator=":") for p in parts]
        return tf.fingerprint(tf.expand_dims(tf.strings.join(framed), 0))[0], y

    batches = ds.map(one, num_parallel_calls=tf.data.AUTOTUNE).batch(8192)
    hashes, labels = [], []
    for h, y in batches.as_numpy_iterator():
        hashes.append(np.asarray(h))
        labels.append(np.asarray(y).ravel())
    if not hashes:
        return np.zeros(0, np.uint64), np.zeros(0)
    return np.concatenate(hashes).view(np.uint64).ravel(), np.concatenate(labels)


def _digest(hashes: np.ndarray) -> str:
    """The fingerprint of a multiset of row fingerprints: their count and sorted values."""
    payload = np.sort(np.asarray(hashes, np.uint64)).astype("<u8").tobytes()
    return f"{len(hashes)}-{hashlib.sha256(payload).hexdigest()[:24]}"


# ---- the record, and the check at evaluation (no TensorFlow needed from here on)

def record(path: Path, prints: dict[str, str | None]) -> None:
    """Keep a training run's fingerprints in `path` (its run dir's `.distlab/splits.json`;
    each start: what it trains on)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(prints, indent=2) + "\n")
    tmp.replace(path)


def recorded(path: Path) -> dict[str, str | None] | None:
    """The fingerprints a training run recorded in `path` (None: none, a run from before
    them)."""
    try:
        prints = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return prints if isinstance(prints, dict) and set(ROLES) <= set(prints) else None


def row_keys(dataset: dict[str, Any]) -> dict[str, Any]:
    """The dataset keys (dotted, under `dataset.`) that may decide which rows a split holds."""
    return {f"dataset.{k}": v for k, v in flatten(dataset).items()
            if k.split(".", 1)[0] not in NOT_ROWS}


def check(ckpt_path: str, trained_config: dict[str, Any] | None,
          trained: dict[str, str | None], now: dict[str, str | None],
          dataset: dict[str, Any]) -> None:
    """Refuse, in one line, an evaluation whose splits hold other rows than the training
    run's (`trained`, `now`: fingerprints), naming the dataset keys that differ from the
    training run's (`trained_config`; `dataset`: this evaluation's dataset node)."""
    moved = [role for role in ROLES if trained.get(role) != now.get(role)]
    if not moved:
        return
    before = row_keys((trained_config or {}).get("dataset") or {})
    after = row_keys(dataset)
    keys = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    splits = (f"{', '.join(moved[:-1])} and {moved[-1]} splits" if len(moved) > 1
              else f"{moved[0]} split")
    if keys:
        given = " ".join(override(k, before.get(k)) for k in keys)
        now_given = " ".join(override(k, after.get(k)) for k in keys)
        raise DistlabError(
            f"ckpt_path={ckpt_path} was trained with {given}, and this evaluation has "
            f"{now_given}: its {splits} would hold other rows than the run's (rows it "
            f"trained on, perhaps). Add {given} to evaluate on its splits")
    raise DistlabError(
        f"ckpt_path={ckpt_path}: the rows of this evaluation's {splits} differ from the "
        "training run's, with the same dataset keys: the data its dataset gives has changed "
        "since (its builder's code or random state, or its files). Evaluate on the data it "
        "was trained with")
