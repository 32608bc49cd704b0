"""Does a run's SavedModel answer *raw* test inputs with the run's test_accuracy?

    python benchmarks/check_export.py RUN_DIR [RUN_DIR ...]

For each run directory: read its config (`.hydra/config.yaml`) and `results.json`, load the
test split's raw inputs as the dataset gives them (tfds: uint8 images; a user dataset
builder: whatever it returns, with its `imports:` imported from the current directory),
call the SavedModel's `serving_default` signature on them in batches, and print the
accuracy (argmax over outputs) and mean cross-entropy next to the run's test_accuracy and
test_loss, with the differences. Classification runs only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def raw_test(cfg) -> tuple[np.ndarray, np.ndarray]:
    from distlab import plugins
    from distlab.data.pipeline import source_for

    plugins.import_modules(list(cfg.get("imports") or []))
    test = source_for(cfg.dataset.name).splits(cfg.dataset).test.batch(100_000)
    inputs, labels = next(iter(test))
    return inputs.numpy(), labels.numpy()


def check(run_dir: Path) -> dict:
    import tensorflow as tf

    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    results = json.loads((run_dir / "results.json").read_text())
    inputs, labels = raw_test(cfg)
    serve = tf.saved_model.load(str(run_dir / "saved_model")).signatures["serving_default"]
    outputs = np.concatenate([serve(inputs=tf.constant(inputs[i:i + 1000]))["output_0"].numpy()
                              for i in range(0, len(inputs), 1000)]).astype(np.float64)
    accuracy = float(np.mean(outputs.argmax(-1) == labels))
    if np.allclose(outputs.sum(-1), 1.0, atol=1e-3) and outputs.min() >= 0:  # probabilities
        log_probs = np.log(np.clip(outputs, 1e-7, 1.0))
    else:
        shifted = outputs - outputs.max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    loss = float(-log_probs[np.arange(len(labels)), labels].mean())
    row = {"run": str(run_dir), "inputs": f"{inputs.dtype} {inputs.shape}",
           "served_accuracy": accuracy, "test_accuracy": results["test_accuracy"],
           "accuracy_diff": abs(accuracy - results["test_accuracy"]),
           "served_loss": loss, "test_loss": results["test_loss"],
           "loss_diff": abs(loss - results["test_loss"])}
    print(json.dumps(row), flush=True)
    return row


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        check(Path(arg))
