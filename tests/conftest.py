"""Shared fixtures: a tiny prepared tfds data dir, Hydra composition, in-process and CLI runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from distlab.config import register_configs  # noqa: E402

register_configs()
TINY_TRAIN, TINY_TEST = 512, 192


def pytest_configure(config):
    """Three logical CPUs for the whole session (must happen before any TF op), so in-process
    tests can use strategy.cpu_devices=1, 2 or 3."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 3)


def _write_tiny(name: str, data_dir: Path) -> None:
    """A learnable tiny dataset in tfds' own on-disk format, read back by tfds' real builder."""
    import numpy as np
    import tensorflow as tf
    import tensorflow_datasets as tfds

    rng = np.random.default_rng(0)

    def split(n: int) -> tf.data.Dataset:
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 60, (n, 28, 28, 1)).astype(np.uint8)
        for i, label in enumerate(labels):  # a bright bar whose row encodes the label
            images[i, 2 + 2 * label : 4 + 2 * label, 4:24, 0] = 250
        return tf.data.Dataset.from_tensor_slices({"image": images, "label": labels})

    features = tfds.features.FeaturesDict({
        "image": tfds.features.Image(shape=(28, 28, 1)),
        "label": tfds.features.ClassLabel(num_classes=10),
    })
    tfds.dataset_builders.TfDataBuilder(
        name=name, version="3.0.1", features=features, data_dir=str(data_dir),
        split_datasets={"train": split(TINY_TRAIN), "test": split(TINY_TEST)},
    ).download_and_prepare()


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory) -> Path:
    data_dir = tmp_path_factory.mktemp("tfds")
    for name in ("mnist", "fashion_mnist"):
        _write_tiny(name, data_dir)
    return data_dir


def fast_overrides(data_dir: Path) -> list[str]:
    return [f"dataset.data_dir={data_dir}", "trainer.epochs=2", "loop.verbose=0",
            "trainer.export=false", "dataset.shuffle_buffer=512"]


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose("config", overrides=overrides)


@pytest.fixture
def run_inprocess(tiny_data_dir, tmp_path):
    """Run distlab in this process; return the run's results.json as a dict."""
    import distlab

    counter = iter(range(1000))

    def _run(*overrides: str, out: Path | None = None) -> dict:
        out = out or tmp_path / f"run{next(counter)}"
        distlab.run(compose(fast_overrides(tiny_data_dir) + list(overrides)), output_dir=out)
        return json.loads((out / "results.json").read_text())

    return _run


def run_cli(*args: str, timeout: float = 300, env: dict | None = None,
            ) -> subprocess.CompletedProcess:
    """`python run.py ARGS` from the repository root."""
    return subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})
