"""What a run writes and reads back: checkpoints, history.csv, results.json, saved_model/.

Both loops go through this module, so their run directories are interchangeable.
TensorFlow is imported only by the functions that need it (the sweep summary reads
results without it).
"""

from __future__ import annotations

import csv
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from distlab.errors import DistlabError

HISTORY_COLUMNS = ["epoch", "learning_rate", "loss", "accuracy", "val_loss", "val_accuracy",
                   "seconds", "examples_per_sec"]
RESULTS_FIELDS = ["status", "loop", "strategy", "num_replicas", "batch_size_per_replica",
                  "global_batch_size", "epochs_completed", "test_loss", "test_accuracy",
                  "train_examples_per_sec", "wall_time_s"]


class RunDir:
    """One run's directory (Hydra's output dir)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    checkpoints = property(lambda self: self.path / "checkpoints")
    logs = property(lambda self: self.path / "logs")
    history_csv = property(lambda self: self.path / "history.csv")
    results_json = property(lambda self: self.path / "results.json")
    saved_model = property(lambda self: self.path / "saved_model")

    def check_writable(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.path):
                pass
        except OSError as e:
            raise DistlabError(
                f"output directory {self.path} cannot be written ({e.strerror}): choose another "
                "with hydra.run.dir=... (or hydra.sweep.dir=... for -m)"
            ) from None

    # ---- history.csv
    def append_history(self, row: dict[str, Any]) -> None:
        new = not self.history_csv.exists()
        with self.history_csv.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=HISTORY_COLUMNS, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerow({k: _fmt(row.get(k)) for k in HISTORY_COLUMNS})

    def read_history(self) -> list[dict[str, str]]:
        if not self.history_csv.exists():
            return []
        with self.history_csv.open(newline="") as f:
            return list(csv.DictReader(f))

    # ---- results.json
    def write_results(self, results: dict[str, Any]) -> None:
        """Atomic replace, so a crash never leaves a half-written results.json."""
        _write_json_atomic(self.results_json, results)

    def read_results(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.results_json.read_text())
        except (OSError, ValueError):
            return None


def _fmt(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return value


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
             for k, v in data.items()}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(clean, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def find_checkpoint(ckpt_path: str) -> str:
    """A checkpoint prefix from a run dir, its checkpoints/ dir, or a prefix itself."""
    import tensorflow as tf

    path = Path(ckpt_path).expanduser()
    for directory in (path / "checkpoints", path):
        if directory.is_dir():
            latest = tf.train.latest_checkpoint(str(directory))
            if latest:
                return latest
    if Path(f"{path}.index").exists():
        return str(path)
    raise DistlabError(
        f"ckpt_path={ckpt_path!r} holds no checkpoint: give a run directory with checkpoints/, "
        "a checkpoints/ directory, or a prefix such as <run dir>/checkpoints/ckpt-3"
    )
