"""Every zoo model trains in both loops under 2 replicas, to the same figures; the ResNet-20
preset end to end."""

from __future__ import annotations

import math

import numpy as np
import pytest

from distlab.records.run_dir import RunDir

pytestmark = pytest.mark.slow

CIFAR = ["dataset=cifar10", "dataset.batch_size_per_replica=8", "trainer.steps_per_epoch=2",
         "trainer.epochs=1", "trainer.validate_every=0", "strategy=mirrored",
         "strategy.cpu_devices=2", "deterministic=true"]
ZOO = {
    "mlp": ["model=mlp", "model.dropout=0.2", "model.batch_norm=true"],
    "resnet": ["model=resnet", "model.depth=8", "model.sync_batch_norm=true"],
    "keras_applications": ["model=keras_applications", "model.architecture=MobileNet",
                           "+model.kwargs.alpha=0.25"],
}


@pytest.mark.parametrize("model", list(ZOO))
def test_zoo_model_trains_in_both_loops_on_two_replicas(run_inprocess, model, tmp_path):
    """deterministic=true: fit and the custom loop give the same figures (dropout, batch
    norm and synchronised batch norm included)."""
    runs = {loop: run_inprocess(*CIFAR, *ZOO[model], f"loop={loop}", out=tmp_path / loop)
            for loop in ("keras_fit", "custom")}
    for loop, results in runs.items():
        assert (results["status"], results["loop"], results["num_replicas"]) == (
            "completed", loop, 2)
        assert results["epochs_completed"] == 1 and math.isfinite(results["test_loss"])
    fit, custom = runs["keras_fit"], runs["custom"]
    assert custom["test_loss"] == pytest.approx(fit["test_loss"], rel=1e-6, abs=1e-6)
    assert custom["test_accuracy"] == pytest.approx(fit["test_accuracy"], abs=1e-6)
    # the training figures of the epoch too (history.csv keeps 6 significant digits)
    rows = {loop: RunDir(tmp_path / loop).read_history() for loop in runs}
    assert [len(r) for r in rows.values()] == [1, 1]
    for key in ("loss", "accuracy"):
        trained = float(rows["keras_fit"][0][key])
        assert math.isfinite(trained), key
        assert float(rows["custom"][0][key]) == pytest.approx(trained, rel=2e-6, abs=1e-6), key


def test_cifar10_resnet20_preset_end_to_end(tiny_data_dir, run_inprocess, tmp_path):
    """In this process (the command line is not the point), on one CPU device as run.py's."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    run_dir = tmp_path / "resnet20"
    results = run_inprocess("experiment=cifar10_resnet20", "strategy.cpu_devices=1",
                            "trainer.epochs=2", "trainer.steps_per_epoch=2",
                            "trainer.export=true", "trainer.validate_every=1",
                            "dataset.batch_size_per_replica=64", out=run_dir)
    assert (results["dataset"], results["epochs_completed"]) == ("cifar10", 2)
    config = RunDir(run_dir).started_config_yaml.read_text()
    assert "depth: 20" in config and "crop_padding: 4" in config
    assert (run_dir / "saved_model" / "saved_model.pb").exists()
    # the SavedModel serves raw test images (uint8; normalised inside) with the run's figures
    images, labels = tfds.as_numpy(tfds.load("cifar10", split="test", as_supervised=True,
                                             data_dir=str(tiny_data_dir), batch_size=-1))
    serve = tf.saved_model.load(str(run_dir / "saved_model")).signatures["serving_default"]
    logits = serve(inputs=tf.constant(images))["output_0"].numpy()
    assert float(np.mean(logits.argmax(-1) == labels)) == pytest.approx(
        results["test_accuracy"], abs=1e-6)
    # the run's own check of the reloaded model (its tolerance: 1e-4 of the largest output)
    assert 0.0 <= results["export_max_abs_diff"] <= 1e-4 * max(1.0, float(np.abs(logits).max()))
