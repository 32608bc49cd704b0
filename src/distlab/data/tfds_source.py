"""The tfds source: a tensorflow-datasets dataset (`dataset.name=mnist`), prepared offline or
fail-fast, its (input, label) pairs chosen by `dataset.features` (default: its supervised
keys), its splits by tfds split specs."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
from omegaconf import DictConfig, OmegaConf
from tensorflow.autograph.experimental import do_not_convert

from distlab.data import cache as data_cache
from distlab.data import slices
from distlab.data.holdout import class_labels, validation_choice, with_held_out
from distlab.data.source import DataSource, RawSplits
from distlab.data.structure import AUTOTUNE, count_rows, dense_inputs
from distlab.errors import DistlabError, first_line

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 5.0


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
    except (ValueError, AssertionError) as e:  # an empty name, a version tfds does not have
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        # tfds lists "BuilderConfigs whose name closely match:" on the lines after (none
        # for a dataset without configs); the first line keeps only the reason
        why = re.sub(r"\. Here are \d+ \w+ whose name closely match:\s*$", "", why)
        why = re.sub(r"^Failed to construct dataset \"[^\"]*\", builder_kwargs \"[^\"]*\": ",
                     "", why)
        where = f" in dataset.data_dir={data_dir}" if data_dir else ""
        raise DistlabError(f"dataset.name={name!r} cannot be read by tensorflow-datasets"
                           f"{where} ({why}): use a tfds name such as mnist, name:version "
                           "with a version it has, or name/config with a config it has"
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
    return count_rows(ds)


def tfds_splits(cfg: DictConfig) -> RawSplits:
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
    choice = validation_choice(cfg.validation, has_own="validation" in info.splits)
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
    select = do_not_convert(lambda ex: (_select(ex, x), ex[y]))
    train, test, *validation = (dense_inputs(ds.map(select, num_parallel_calls=AUTOTUNE))
                                for ds in datasets)
    label = info.features[y]
    classes = isinstance(label, tfds.features.ClassLabel)
    outputs = int(label.num_classes) if classes else max(1, math.prod(label.shape or ()))
    cache_key = {"dataset": cfg.name, "version": str(info.version), "features": [x, y],
                 "data_dir": builder.data_dir}
    raw = RawSplits(train, test, sizes[0], sizes[1], outputs, classes, cache_key)
    if isinstance(choice, str):
        return dataclasses.replace(raw, validation=validation[0], num_validation=sizes[2],
                                   validation_from=choice)
    if choice is None:
        return raw
    labels = _tfds_labels(builder, cfg, x, y, cache_key, sizes[0]) if classes else None
    return with_held_out(raw, labels, choice, cfg)


def _tfds_labels(builder: tfds.core.DatasetBuilder, cfg: DictConfig, x: str | list[str],
                 y: str, cache_key: dict[str, Any], rows: int) -> np.ndarray:
    """The labels of the train split, in order, without decoding its inputs where tfds can;
    kept in the disk cache (`dataset.disk_cache`) beside the decoded splits, since tfds still
    parses every record to read them (seconds for 60,000 rows, on every run)."""
    skip = {k: tfds.decode.SkipDecoding() for k in (x if isinstance(x, list) else [x])}
    try:
        ds = builder.as_dataset(split=cfg.train_split, shuffle_files=False, decoders=skip)
    except (ValueError, TypeError, KeyError):
        ds = builder.as_dataset(split=cfg.train_split, shuffle_files=False)
    labels = ds.map(do_not_convert(lambda ex: (0, ex[y])))
    if not cfg.disk_cache:
        return class_labels(labels)
    name = data_cache.entry_name(f"{cfg.name}-{cfg.train_split}-labels", {
        **data_cache.source_inputs(cache_key), "split": cfg.train_split,
        "spec": str(labels.element_spec)})
    disk = data_cache.DiskCache.of(data_cache.cache_root(cfg.cache_dir))
    return disk.array(lambda: class_labels(labels), name, problem=_not_labels_of(rows))


def _not_labels_of(rows: int):
    """What is wrong with an array given as the class labels of a split of `rows` rows."""
    def problem(array: np.ndarray) -> str | None:
        if array.shape != (rows,):
            return f"{array.shape} labels, the split has {rows} rows"
        if array.dtype.kind not in "iu":
            return f"{array.dtype} labels, class labels are integers"
        return None
    return problem


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
    if y in (x if isinstance(x, list) else [x]):
        raise DistlabError(f"dataset.features.label={y!r} is also in dataset.features.input: "
                           f"the model would be given its label; choose other inputs of "
                           f"{name}")
    return x, y


def _select(example: dict, x: str | list[str]) -> Any:
    """The model input of a tfds example: one feature, or a dict of several by name."""
    return {k: example[k] for k in x} if isinstance(x, list) else example[x]


def row_identities(cfg: DictConfig, splits: RawSplits) -> dict[str, str | None]:
    """The fingerprints of a tfds dataset's splits (`fingerprint.of_splits`): its name,
    version and the absolute row ranges its split specs read, and the mask of a held-out
    validation fraction. Nothing is read for it."""
    info = tfds.builder(str(cfg.name), data_dir=resolve_data_dir(cfg.data_dir)).info
    base = {"tfds": str(cfg.name), "version": str(info.version)}

    def rows(spec: str) -> list[tuple[str, int, int]]:
        try:
            absolute = tfds.core.ReadInstruction.from_spec(spec).to_absolute(info.splits)
        except (ValueError, KeyError, AttributeError, TypeError):
            return [(spec, -1, -1)]  # a spec only tfds reads: the spec stands for its rows
        return [(a.splitname, a.from_ or 0,
                 info.splits[a.splitname].num_examples if a.to is None else a.to)
                for a in absolute]

    def digest(**payload: Any) -> str:
        text = json.dumps({**base, **payload}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    train = rows(str(cfg.train_split))
    prints = {"train": digest(rows=train), "test": digest(rows=rows(str(cfg.test_split))),
              "validation": None}
    if splits.held_out is not None:
        mask = hashlib.sha256(np.packbits(splits.held_out).tobytes()).hexdigest()[:24]
        prints["train"] = digest(rows=train, held_out=mask, keep="rest")
        prints["validation"] = digest(rows=train, held_out=mask, keep="held out")
    elif splits.validation is not None:
        prints["validation"] = digest(rows=rows(str(splits.validation_from)))
    return prints


class TfdsSource(DataSource):
    """A tensorflow-datasets dataset: any `dataset.name` that is neither a registered dataset
    builder nor an import path (`mnist`, `fashion_mnist:3.0.1`)."""

    def claims(self, name: str) -> bool:
        from distlab.registry import is_tfds_name

        return is_tfds_name(name)

    def splits(self, cfg: DictConfig) -> RawSplits:
        return tfds_splits(cfg)

    def fingerprints(self, cfg: DictConfig, splits: RawSplits) -> dict[str, str | None]:
        return row_identities(cfg, splits)
