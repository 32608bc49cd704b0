"""The `export` check: the SavedModel a run exports, reloaded, fed the test split's raw rows
through `serving_default`, predicts what the trained model predicts on the same rows after
the pipeline's preprocessing."""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from distlab.records.run_dir import RunDir
from distlab.verification.report import FAILED, PASSED, Row
from distlab.verification.session import Session


def check(session: Session) -> Row:
    from distlab.data.structure import batched, input_names
    from distlab.training import export

    probe = session.trained()
    exp, rows = probe.exp, session.options.rows
    exp = dataclasses.replace(exp, run_dir=RunDir(session.where("export")))
    path = export.write(exp)
    raw = next(iter(batched(exp.data.raw_test.take(rows), rows)))[0]
    expected = [np.asarray(t) for t in tf.nest.flatten(
        exp.model(exp.data.preprocess(raw), training=False))]
    loaded = tf.saved_model.load(str(path))
    names = input_names(exp.data.raw_input)
    served = loaded.signatures["serving_default"](
        **dict(zip(names, tf.nest.flatten(raw), strict=True)))
    got = [np.asarray(served[k]) for k in sorted(served)]
    precision = session.run_config.precision
    tolerance = export.EXPORT_RTOL.get(precision, export.EXPORT_RTOL["float32"])
    largest = max([1.0, *(float(np.max(np.abs(e))) for e in expected if e.size)])
    diff = (float("inf") if len(got) != len(expected) or any(
        g.shape != e.shape for g, e in zip(got, expected, strict=False)) else
        max(float(np.max(np.abs(g - e))) for g, e in zip(got, expected, strict=True)))
    n = len(tf.nest.flatten(raw)[0])
    summary = (f"serving_default of the SavedModel on {n} raw test rows against the trained "
               f"model on them preprocessed (to {tolerance:g} x the largest output)")
    figures = {"max_abs_diff": diff, "rows": n, "saved_model": str(path)}
    if diff <= tolerance * largest:
        return Row("export", PASSED, summary + f": max abs diff {diff:.2g}", figures=figures)
    return Row("export", FAILED, summary,
               differs=f"predictions differ by up to {diff:.3g} (largest output {largest:.3g})",
               cause=_cause(exp, raw, got, tolerance * largest), figures=figures)


def _cause(exp, raw, got, tolerance: float) -> str:
    """Preprocessing left out of the export (the served outputs equal the model's on raw
    inputs), else another difference between the exported graph and the model."""
    try:
        unprocessed = [np.asarray(t) for t in tf.nest.flatten(exp.model(
            tf.nest.map_structure(lambda t: tf.cast(t, tf.float32) if t.dtype.is_integer
                                  else t, raw), training=False))]
        if all(float(np.max(np.abs(g - u))) <= tolerance
               for g, u in zip(got, unprocessed, strict=True)):
            return ("the export leaves out the inference-time preprocessing (dataset.preprocess)"
                    ": it feeds raw inputs to the model as they are")
    except Exception:  # noqa: BLE001 - the model may not take raw inputs at all
        pass
    return ("the exported graph computes otherwise than the model: a layer that behaves "
            "differently when traced for export (Python state, training-only branches)")
