"""The `data` check: the splits hold different rows (by the content of each row, not by
names), numeric inputs are finite, labels fit the task, and preprocessing adapted on the data
(`dataset.preprocess.standardize`) saw the training rows only."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from distlab.errors import DistlabError
from distlab.verification.report import FAILED, PASSED, Row
from distlab.verification.session import Session


def check(session: Session) -> Row:
    from distlab.data import fingerprint, pipeline

    cfg = session.run_config
    key = f"dataset.name={cfg.dataset.name!r}"
    try:
        raw = pipeline.source_for(cfg.dataset.name).splits(cfg.dataset)
    except DistlabError as e:
        return Row("data", FAILED, "the splits could not be read", differs=str(e),
                   cause="the dataset builder or the dataset keys (the line above says which)")
    session._test_rows = raw.num_test  # (the resume check scores at most verify.rows)
    splits = _splits(raw)
    read = {role: fingerprint.row_hashes_and_labels(ds) for role, ds in splits.items()}
    hashes = {role: h for role, (h, _) in read.items()}
    labels = {role: y for role, (_, y) in read.items()}
    if raw.held_out is not None:
        hashes["validation"] = hashes["train"][raw.held_out]
        hashes["train"] = hashes["train"][~raw.held_out]
    problems: list[tuple[str, str]] = []  # (what differs, the likely cause)
    figures: dict[str, Any] = {f"rows_{role}": len(h) for role, h in hashes.items()}
    for a, b in (("train", "test"), ("train", "validation"), ("validation", "test")):
        if a in hashes and b in hashes:
            shared = int(np.isin(hashes[b], hashes[a]).sum())
            figures[f"{b}_rows_in_{a}"] = shared
            if shared:
                problems.append((
                    f"{shared} of the {len(hashes[b])} rows of the {b} split are also rows of "
                    f"the {a} split (same inputs and label)",
                    f"{key} gives some rows to two splits: overlapping slices, rows split after "
                    "a shuffle with another seed, or the same row made twice (drop duplicates "
                    "before splitting)"))
    problems += _finite(splits, raw, key)
    problems += _labels(session, labels, raw, key)
    problems += _standardized(session, figures)
    summary = (f"{' / '.join(f'{len(h)} {r}' for r, h in hashes.items())} rows: disjoint by "
               "content, finite, labels fit task="
               f"{cfg.task.name}" + (", standardize on train only"
                                      if cfg.dataset.preprocess.standardize else ""))
    if not problems:
        return Row("data", PASSED, summary, figures=figures)
    return Row("data", FAILED, summary, differs="; ".join(p for p, _ in problems),
               cause="; ".join(dict.fromkeys(c for _, c in problems)), figures=figures)


def _splits(raw: Any) -> dict[str, tf.data.Dataset]:
    found = {"train": raw.train, "test": raw.test}
    if raw.validation is not None:
        found["validation"] = raw.validation
    return found


def _finite(splits: dict[str, tf.data.Dataset], raw: Any, key: str) -> list[tuple[str, str]]:
    from distlab.data import finite
    from distlab.data.structure import input_names

    spec = raw.train.element_spec[0]
    problems = []
    for role, ds in splits.items():
        try:
            finite.check_splits({f"{role} split": ds}, input_names(spec), spec, key)
        except DistlabError as e:  # "<key>: its <split> has NaN ... in N of M rows: why; ..."
            said = str(e).removeprefix(f"{key}: its ").split(": a model trains")[0]
            problems.append((said,
                             f"{key} gives NaN or Inf values (missing values read as NaN, or "
                             "a division by zero in the builder): drop or impute them"))
    return problems


def _labels(session: Session, found: dict[str, np.ndarray], raw: Any,
            key: str) -> list[tuple[str, str]]:
    from distlab.components import tasks

    kind = getattr(tasks.build(session.run_config.task), "labels", None)
    task = session.run_config.task.name
    problems = []
    for role, labels in found.items():
        if not labels.size:
            continue
        if labels.dtype.kind == "f" and not np.all(np.isfinite(labels)):
            continue  # the finite check said it
        if raw.classes or kind == "classes":
            whole = labels.dtype.kind in "iub" or np.all(labels == np.round(labels))
            low, high = float(labels.min()), float(labels.max())
            if not whole or low < 0 or high >= raw.outputs:
                problems.append((f"the {role} split's labels range over [{low:g}, {high:g}], "
                                 f"not the classes 0..{raw.outputs - 1}",
                                 f"{key}: its num_classes, or labels numbered from 1"))
        if kind == "binary":
            other = np.unique(labels[~np.isin(labels, (0, 1))])
            if other.size:
                problems.append((f"the {role} split's labels include {other[0]:g} "
                                 f"(task={task} needs 0 or 1)",
                                 f"{key}: labels not mapped to 0/1"))
        if kind == "values" and labels.dtype.kind != "f":
            problems.append((f"the {role} split's labels are {labels.dtype.name} "
                             f"(task={task} learns float values)",
                             f"{key}: give float labels for regression, or num_classes for "
                             "classes"))
    return problems


def _standardized(session: Session, figures: dict[str, Any]) -> list[tuple[str, str]]:
    """Each Normalization layer `standardize` adapted: its mean against the training rows'."""
    if not session.run_config.dataset.preprocess.standardize:
        return []
    import keras

    probe = session.probe("data", replicas=1)
    data = probe.exp.data
    layers = {layer.name: layer for layer in probe.exp.model._flatten_layers()
              if isinstance(layer, keras.layers.Normalization)}
    problems = []
    for name in data.standardize:
        layer = next((lay for n, lay in layers.items() if n.startswith("standardize_")
                      and n.endswith(_safe(name))), None)
        if layer is None:
            continue
        adapted = np.asarray(layer.mean).ravel()
        train = _mean(data.train, name, data)
        diff = float(np.max(np.abs(adapted - train)))
        figures[f"standardize_{name}_max_diff"] = diff
        if diff > 1e-4 * max(1.0, float(np.max(np.abs(train)))):
            problems.append((
                f"input {name!r}: the adapted mean differs from the training rows' mean by "
                f"{diff:.3g}",
                "the standardization was adapted on rows other than the training split's "
                "(a model builder adapting on its own data instead of train_inputs)"))
    return problems


def _mean(ds: tf.data.Dataset, name: str, data: Any) -> np.ndarray:
    from distlab.data.structure import input_names

    index = input_names(data.input_spec).index(name)
    column = ds.map(lambda x, y: tf.cast(tf.nest.flatten(x)[index], tf.float64)).batch(8192)
    total, count = 0.0, 0
    for batch in column.as_numpy_iterator():
        flat = batch.reshape(-1, batch.shape[-1]) if batch.ndim > 1 else batch.reshape(-1, 1)
        total, count = total + flat.sum(axis=0), count + len(flat)
    return np.asarray(total / max(count, 1)).ravel()


def _safe(name: str) -> str:
    from distlab.components.models import _safe as safe

    return safe(name)
