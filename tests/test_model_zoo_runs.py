"""Every zoo model trains in both loops under 2 replicas; the ResNet-20 preset end to end."""

from __future__ import annotations

import json

import pytest
from conftest import fast_overrides, run_cli

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


@pytest.mark.parametrize("loop", ["keras_fit", "custom"])
@pytest.mark.parametrize("model", list(ZOO))
def test_zoo_model_trains_in_both_loops_on_two_replicas(run_inprocess, model, loop):
    results = run_inprocess(*CIFAR, *ZOO[model], f"loop={loop}")
    assert results["status"] == "completed" and results["num_replicas"] == 2
    assert results["epochs_completed"] == 1 and 0.0 <= results["test_accuracy"] <= 1.0


def test_cifar10_resnet20_preset_end_to_end(tiny_data_dir, tmp_path):
    run_dir = tmp_path / "resnet20"
    out = run_cli("experiment=cifar10_resnet20", *fast_overrides(tiny_data_dir),
                  "trainer.epochs=2", "trainer.export=true", "trainer.validate_every=1",
                  "dataset.batch_size_per_replica=64", f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert (results["dataset"], results["epochs_completed"]) == ("cifar10", 2)
    assert results["export_max_abs_diff"] is not None
    config = (run_dir / ".hydra" / "config.yaml").read_text()
    assert "depth: 20" in config and "crop_padding: 4" in config
    assert (run_dir / "saved_model" / "saved_model.pb").exists()
