"""An epoch's row: history.csv, the one-line summary, the TensorBoard scalars and the run's
tracker (logger=mlflow...).

The scalars use the tags `keras.callbacks.TensorBoard` writes (`epoch_loss`,
`epoch_accuracy`... under logs/train and logs/validation), for both loops; a per-epoch
test pass (`trainer.test_every`) goes under logs/test.
"""

from __future__ import annotations

import logging
from typing import Any

import tensorflow as tf

from distlab.records.run_dir import RunDir, figure_columns, history_columns

log = logging.getLogger("distlab")


class History:
    """Records each epoch's row (see `distlab.records.run_dir.history_columns`)."""

    def __init__(self, run_dir: RunDir, metric_names: list[str], epochs: int,
                 test: bool = False, validation: bool = True) -> None:
        """`test`: the rows have the per-epoch test pass's columns (trainer.test_every);
        `validation`: the validation split's (none with dataset.validation=null: no val_
        columns, no logs/validation)."""
        self.run_dir, self.metric_names, self.epochs = run_dir, metric_names, epochs
        self.columns = history_columns(metric_names, test, validation)
        self.figures = figure_columns(metric_names, test, validation)
        logs = run_dir.logs
        splits = ("train", *(["validation"] if validation else []), *(["test"] if test else []))
        self._writers = {split: tf.summary.create_file_writer(str(logs / split))
                         for split in splits}

    def row(self, epoch: int, learning_rate: float, figures: dict[str, float | None],
            **timing: float) -> dict[str, Any]:
        """Epoch `epoch`'s (0-based) row: every column, figures not measured as None."""
        return {"epoch": epoch + 1, "learning_rate": learning_rate,
                **{key: figures.get(key) for key in self.figures}, **timing}

    def record(self, row: dict[str, Any]) -> None:
        self.run_dir.append_history(row, self.columns)
        self._write_scalars(row)
        if self.run_dir.tracker is not None:  # after history.csv: it never has less
            self.run_dir.tracker.log_epoch({k: row.get(k) for k in self.columns})
        log.info(self.summary(row))

    def summary(self, row: dict[str, Any]) -> str:
        parts = [f"epoch {row['epoch']}/{self.epochs}",
                 f"learning_rate {row['learning_rate']:.3g}"]
        parts += [f"{key} {row[key]:.4f}" for key in self.figures if row[key] is not None]
        parts += [f"{row['seconds']:.1f}s", f"{row['examples_per_sec']:.0f} examples/sec"]
        return " - ".join(parts)

    def _write_scalars(self, row: dict[str, Any]) -> None:
        step = row["epoch"] - 1
        names = ["loss", *self.metric_names]
        with self._writers["train"].as_default(step=step):
            for key in (*names, "learning_rate", "examples_per_sec"):
                if row[key] is not None:  # None: undefined (AUC on one class...)
                    tf.summary.scalar(f"epoch_{key}", row[key])
        for split, prefix in (("validation", "val_"), ("test", "test_")):
            if row.get(f"{prefix}loss") is not None and split in self._writers:
                with self._writers[split].as_default(step=step):
                    for key in names:
                        if row[f"{prefix}{key}"] is not None:
                            tf.summary.scalar(f"epoch_{key}", row[f"{prefix}{key}"])
        for writer in self._writers.values():
            writer.flush()
