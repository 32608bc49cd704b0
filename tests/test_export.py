"""The exported SavedModel serves raw inputs through `serving_default` (saved_model_cli)."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def _raw_test_split(data_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    import tensorflow_datasets as tfds

    ds = tfds.load("mnist", split="test", data_dir=str(data_dir), as_supervised=True,
                   batch_size=-1)
    return tfds.as_numpy(ds)


def test_saved_model_cli_on_raw_images_reproduces_test_accuracy(tiny_data_dir, tmp_path,
                                                                run_inprocess):
    run_dir = tmp_path / "run"  # trained and exported in this process; served by a process
    results = run_inprocess("trainer.export=true", "trainer.epochs=1", "model=mlp",
                            "model.hidden_units=[32]", "trainer.validate_every=0",
                            "optimizer.learning_rate=2e-4", "strategy.cpu_devices=2", out=run_dir)
    images, labels = _raw_test_split(tiny_data_dir)
    assert images.dtype == np.uint8  # raw pixels, as a client sends them
    np.save(tmp_path / "raw.npy", images)
    cli = Path(sys.executable).parent / "saved_model_cli"
    served = subprocess.run(
        [str(cli), "run", "--dir", str(run_dir / "saved_model"), "--tag_set", "serve",
         "--signature_def", "serving_default", "--inputs", f"inputs={tmp_path / 'raw.npy'}",
         "--outdir", str(tmp_path / "served")], capture_output=True, text=True, timeout=180)
    assert served.returncode == 0, served.stderr[-3000:]
    logits = np.load(tmp_path / "served" / "output_0.npy").astype(np.float64)
    accuracy = float(np.mean(logits.argmax(-1) == labels))
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    loss = float(-log_probs[np.arange(len(labels)), labels].mean())
    assert 0.0 < results["test_accuracy"] < 1.0  # not a trivially perfect model
    assert accuracy == pytest.approx(results["test_accuracy"], abs=1e-6)
    assert loss == pytest.approx(results["test_loss"], abs=1e-5)


def test_a_completed_run_rerun_with_export_exports_its_final_model(tmp_path, run_inprocess,
                                                                    caplog):
    """The run's stages after training are completed again (final figures, then the
    export), nothing is trained; a rerun of the exported run is already completed."""
    import tensorflow as tf

    from distlab.records.run_dir import RunDir

    run_dir, common = tmp_path / "run", ("trainer.epochs=2", "trainer.steps_per_epoch=2",
                                         "model=mlp", "model.hidden_units=[8]")
    first = run_inprocess(*common, out=run_dir)  # (trainer.export=false: fast_overrides)
    history = RunDir(run_dir).read_history()
    assert first["status"] == "completed" and "saved_model" not in first
    caplog.set_level(logging.INFO, logger="distlab")
    # a copy without its checkpoints has nothing to export from: completed, never retrained
    shutil.copytree(run_dir, tmp_path / "bare")
    shutil.rmtree(tmp_path / "bare" / "checkpoints")
    bare = run_inprocess(*common, "trainer.export=true", out=tmp_path / "bare")
    assert bare == first and "already completed 2 epoch(s)" in caplog.text
    assert RunDir(tmp_path / "bare").read_history() == history
    caplog.clear()
    again = run_inprocess(*common, "trainer.export=true", out=run_dir)
    assert "completed without an export: its stages after training run again" in caplog.text
    assert (again["status"], again["saved_model"], again["epochs_completed"]) == (
        "completed", "saved_model", 2)
    assert again["export_max_abs_diff"] < 1e-5
    for key in ("test_loss", "test_accuracy", "val_loss", "train_examples_per_sec"):
        assert again[key] == pytest.approx(first[key], rel=1e-6), key
    assert RunDir(run_dir).read_history() == history  # no epoch trained again
    assert "serving_default" in tf.saved_model.load(str(run_dir / "saved_model")).signatures
    caplog.clear()
    assert run_inprocess(*common, "trainer.export=true", out=run_dir)["saved_model"]
    assert "already completed 2 epoch(s); not retraining" in caplog.text


def test_a_completed_run_rerun_with_the_best_checkpoint_test_tests_it(tmp_path, run_inprocess,
                                                                      caplog):
    """trainer.best_checkpoint.test=true on a completed run that kept checkpoints/best: the
    stages after training run again, with the best checkpoint's test, and nothing is trained
    (it was refused as a config change)."""
    from distlab.records.run_dir import RunDir

    run_dir = tmp_path / "run"
    common = ("trainer.epochs=2", "trainer.steps_per_epoch=2", "model=mlp",
              "model.hidden_units=[8]", "trainer.best_checkpoint.metric=val_loss",
              "trainer.export=true")
    first = run_inprocess(*common, out=run_dir)
    history = RunDir(run_dir).read_history()
    assert first["status"] == "completed" and first.get("best_test_loss") is None
    exported = (run_dir / "saved_model" / "saved_model.pb").stat().st_mtime_ns
    caplog.set_level(logging.INFO, logger="distlab")
    tested = run_inprocess(*common, "trainer.best_checkpoint.test=true", out=run_dir)
    assert "completed without the test of its best checkpoint: its stages after training " \
           "run again (nothing is trained)" in caplog.text
    assert tested["best_test_loss"] is not None and tested["epochs_completed"] == 2
    assert tested["test_loss"] == pytest.approx(first["test_loss"], rel=1e-6)
    assert RunDir(run_dir).read_history() == history  # no epoch trained again
    # the model exported already: kept, not exported again
    assert (run_dir / "saved_model" / "saved_model.pb").stat().st_mtime_ns == exported
    assert (tested["saved_model"], tested["export_max_abs_diff"]) == (
        "saved_model", first["export_max_abs_diff"])
    caplog.clear()
    assert run_inprocess(*common, "trainer.best_checkpoint.test=true",
                         out=run_dir) == tested
    assert "already completed 2 epoch(s); not retraining" in caplog.text


@pytest.mark.parametrize("loop", ["keras_fit", "custom"])
def test_a_callback_saves_the_whole_model_in_both_loops(loop, tmp_path, run_inprocess):
    """keras.callbacks.ModelCheckpoint to .keras (the model with its optimizer): the same in
    both loops; the file loads and predicts as the run's exported final model (no compile
    config: keras_fit's compiled metrics are distlab's sums, which Keras cannot serialize)."""
    import keras
    import tensorflow as tf

    run_dir = tmp_path / "run"
    run_inprocess(f"loop={loop}", "trainer.epochs=1", "trainer.steps_per_epoch=2", "model=mlp",
                  "model.hidden_units=[8]", "trainer.validate_every=0", "trainer.export=true",
                  "+callbacks.mc._target_=keras.callbacks.ModelCheckpoint",
                  f"+callbacks.mc.filepath='{tmp_path}/model_{{epoch}}.keras'", out=run_dir)
    saved = keras.models.load_model(tmp_path / "model_1.keras")
    assert not saved.compiled
    raw = np.random.default_rng(0).integers(0, 256, (4, 28, 28, 1), dtype=np.uint8)
    serve = tf.saved_model.load(str(run_dir / "saved_model")).signatures["serving_default"]
    (served,) = serve(tf.constant(raw)).values()  # raw pixels in; dataset.preprocess inside
    np.testing.assert_allclose(saved.predict(raw.astype(np.float32) / 255, verbose=0),
                               served.numpy(), atol=1e-5)


def test_tuple_inputs_are_served_under_the_names_the_log_gives(tmp_path, run_inprocess, caplog):
    """A tuple's inputs are `input_0`, `input_1` in the log and in the SavedModel's signature
    (they were `0`, `1` in the log while TensorFlow renamed them `arg_0`, `arg_1`), with
    standardize (Normalization on a tuple) inside; saved_model_cli serves them by name."""
    import tensorflow as tf
    import user_inputs

    run_dir = tmp_path / "run"
    caplog.set_level(logging.INFO, logger="distlab")
    results = run_inprocess("imports=[user_inputs]", "dataset.name=tuple_data",
                            "dataset.preprocess.rescale=null", "model.name=flat_net",
                            "dataset.preprocess.standardize=true", "strategy=default",
                            "trainer.epochs=1", "trainer.export=true", out=run_dir)
    assert results["status"] == "completed"
    assert "serving_default takes raw inputs input_0: float32 (2,), input_1: float64 (4,)" \
        in caplog.text
    signature = tf.saved_model.load(str(run_dir / "saved_model")).signatures["serving_default"]
    assert {k: tuple(s.shape) for k, s in signature.structured_input_signature[1].items()} == {
        "input_0": (None, 2), "input_1": (None, 4)}
    a, b, y = user_inputs.tuple_arrays()
    for name, values in (("input_0", a[80:]), ("input_1", b[80:])):
        np.save(tmp_path / f"{name}.npy", values)
    cli = Path(sys.executable).parent / "saved_model_cli"
    served = subprocess.run(
        [str(cli), "run", "--dir", str(run_dir / "saved_model"), "--tag_set", "serve",
         "--signature_def", "serving_default", "--outdir", str(tmp_path / "served"), "--inputs",
         f"input_0={tmp_path / 'input_0.npy'};input_1={tmp_path / 'input_1.npy'}"],
        capture_output=True, text=True, timeout=180)
    assert served.returncode == 0, served.stderr[-3000:]
    logits = np.load(tmp_path / "served" / "output_0.npy")
    assert float(np.mean(logits.argmax(-1) == y[80:])) == pytest.approx(
        results["test_accuracy"], abs=1e-9)
