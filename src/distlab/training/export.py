"""The SavedModel a training run exports (`trainer.export`), checked after it reloads."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from distlab.data.structure import batched, describe_inputs, input_names
from distlab.errors import DistlabError
from distlab.training.experiment import Experiment

log = logging.getLogger("distlab")
# how far the reloaded SavedModel may be from the trained model, relative to the largest
# output: the two graphs round differently, in the precision they compute in
EXPORT_RTOL = {"float32": 1e-4, "mixed_float16": 2e-3, "mixed_bfloat16": 2e-2}


def export_and_check(exp: Experiment) -> dict[str, Any]:
    """Export a SavedModel that serves raw inputs, and check it reloaded.

    Its `serve` and `serving_default` signatures take the dataset's raw inputs, each in its
    own dtype and shape as the dataset gives them (uint8 images, strings, variable-length
    ids), named as the inputs are (`structure.input_names`: one tensor is `inputs`, a dict's
    inputs their keys), apply the inference-time preprocessing (`dataset.preprocess`; never
    augmentation), and return the model's outputs as `output_0`. The check compares
    raw-input predictions of the reloaded model, with and without the strategy, to the
    trained model's."""
    path = str(exp.run_dir.saved_model)
    data, model = exp.data, exp.model
    names = input_names(data.raw_input)
    write(exp)
    raw = next(iter(batched(data.raw_test, 32)))[0]
    expected = _flat(model(data.preprocess(raw), training=False))
    plain = tf.saved_model.load(path)
    default = plain.signatures["serving_default"](
        **dict(zip(names, tf.nest.flatten(raw), strict=True)))
    diffs = [_max_diff(_flat(plain.serve(raw)), expected),
             _max_diff([default[k] for k in sorted(default)], expected)]
    with exp.strategy.scope():  # inside the scope it must be called through strategy.run
        scoped = tf.saved_model.load(path)
        outputs = exp.strategy.run(scoped.serve, args=(raw,))
    local = tf.nest.map_structure(lambda v: exp.strategy.experimental_local_results(v)[0],
                                  outputs)
    diffs.append(_max_diff(_flat(local), expected))
    diff = float(max(diffs))
    scale = max(1.0, *(float(np.max(np.abs(e))) for e in expected))  # outputs grow early on
    tolerance = EXPORT_RTOL.get(exp.cfg.precision, EXPORT_RTOL["float32"])
    if diff > tolerance * scale:
        raise DistlabError(f"the exported SavedModel in {path} predicts differently from the "
                           f"trained model (max abs diff {diff:.3g} > {tolerance} x "
                           f"{scale:.3g}, the largest output, for precision={exp.cfg.precision})")
    log.info("exported %s: serving_default takes raw inputs %s (reloaded with and without "
             "the strategy, max abs diff %.2g)", path, describe_inputs(data.raw_input), diff)
    return {"saved_model": "saved_model", "export_max_abs_diff": diff}


def write(exp: Experiment) -> Path:
    """Write the SavedModel of `exp`'s model to its run dir's saved_model/ (its `serve` and
    `serving_default` signatures take raw inputs: `serving_function`); its path."""
    data = exp.data
    names = input_names(data.raw_input)
    spec = tf.nest.pack_sequence_as(data.raw_input, [
        tf.TensorSpec([None, *s.shape], s.dtype, name=name)
        for s, name in zip(tf.nest.flatten(data.raw_input), names, strict=True)])
    archive = keras.export.ExportArchive()
    archive.track(exp.model)
    for endpoint in ("serve", "serving_default"):
        archive.add_endpoint(endpoint, serving_function(exp), input_signature=[spec])
    _write_whole(archive, exp.run_dir.saved_model)
    return exp.run_dir.saved_model


def serving_function(exp: Experiment) -> Callable[[Any], Any]:
    """Raw inputs -> the model's outputs: the inference-time preprocessing, then the model."""
    model, preprocess = exp.model, exp.data.preprocess

    def serve(inputs: Any) -> Any:
        return model(preprocess(inputs), training=False)

    return serve


def _write_whole(archive: keras.export.ExportArchive, path: Path) -> None:
    """Write the SavedModel beside `path`, then put it in place: an export cut short (a
    signal, a full disk) leaves the previous one, or none, never half of one."""
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        archive.write_out(str(partial), verbose=False)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    old = path.with_name(path.name + ".old")
    if path.exists():
        shutil.rmtree(old, ignore_errors=True)
        path.rename(old)
    partial.rename(path)
    shutil.rmtree(old, ignore_errors=True)


def _flat(outputs: Any) -> list[np.ndarray]:
    return [np.asarray(o) for o in tf.nest.flatten(outputs)]


def _max_diff(got: list[Any], expected: list[np.ndarray]) -> float:
    if len(got) != len(expected):
        return float("inf")
    return max(float(np.max(np.abs(np.asarray(g) - e))) for g, e in zip(got, expected,
                                                                         strict=True))
