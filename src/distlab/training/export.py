"""The SavedModel a training run exports (`trainer.export`), checked after it reloads."""

from __future__ import annotations

import logging
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from distlab.errors import DistlabError
from distlab.training.experiment import Experiment

log = logging.getLogger("distlab")
# how far the reloaded SavedModel may be from the trained model, relative to the largest
# output: the two graphs round differently, in the precision they compute in
EXPORT_RTOL = {"float32": 1e-4, "mixed_float16": 2e-3, "mixed_bfloat16": 2e-2}


def export_and_check(exp: Experiment) -> dict[str, Any]:
    """Export a SavedModel that serves raw inputs, and check it reloaded.

    Its `serve` and `serving_default` signatures take the dataset's raw inputs (dtype and
    shape as the dataset gives them, e.g. uint8 images) under the input name `inputs`, apply
    the inference-time preprocessing (`dataset.preprocess`; never augmentation), and return
    the model's outputs as `output_0`. The check compares raw-input predictions of the
    reloaded model, with and without the strategy, to the trained model's."""
    path = str(exp.run_dir.saved_model)
    data, model = exp.data, exp.model
    spec = tf.TensorSpec([None, *data.raw_input.shape], data.raw_input.dtype, name="inputs")

    def serve(inputs: tf.Tensor) -> tf.Tensor:
        return model(data.preprocess(inputs), training=False)

    archive = keras.export.ExportArchive()
    archive.track(model)
    for endpoint in ("serve", "serving_default"):
        archive.add_endpoint(endpoint, serve, input_signature=[spec])
    archive.write_out(path, verbose=False)
    raw = next(iter(data.raw_test.batch(32)))[0]
    expected = np.asarray(model(data.preprocess(raw), training=False))
    plain = tf.saved_model.load(path)
    default = plain.signatures["serving_default"](inputs=raw)["output_0"]
    diffs = [np.max(np.abs(plain.serve(raw).numpy() - expected)),
             np.max(np.abs(default.numpy() - expected))]
    with exp.strategy.scope():  # inside the scope it must be called through strategy.run
        scoped = tf.saved_model.load(path)
        outputs = exp.strategy.run(scoped.serve, args=(raw,))
    diffs.append(np.max(np.abs(exp.strategy.experimental_local_results(outputs)[0].numpy()
                               - expected)))
    diff = float(max(diffs))
    scale = max(1.0, float(np.max(np.abs(expected))))  # outputs can be large early in training
    tolerance = EXPORT_RTOL.get(exp.cfg.precision, EXPORT_RTOL["float32"])
    if diff > tolerance * scale:
        raise DistlabError(f"the exported SavedModel in {path} predicts differently from the "
                           f"trained model (max abs diff {diff:.3g} > {tolerance} x "
                           f"{scale:.3g}, the largest output, for precision={exp.cfg.precision})")
    log.info("exported %s: serving_default takes raw %s inputs %s (reloaded with and without "
             "the strategy, max abs diff %.2g)", path, data.raw_input.dtype.name,
             tuple(data.raw_input.shape), diff)
    return {"saved_model": "saved_model", "export_max_abs_diff": diff}
