"""The figures a run reports, as numbers: history.csv at full precision, precision and recall
as float64 ratios of their counts, `objective_value` beside `objective`, and a figure that is
undefined on its rows (AUC on one class, precision without predicted positives, recall
without positives) null, not 0, with nothing selecting on it."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import numpy as np
import pytest
from test_binary_metrics import BINARY, _binary_task, _probabilities, _split, binary_data  # noqa: F401

from distlab.records.run_dir import RunDir


def _rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "history.csv", newline="") as f:
        return list(csv.DictReader(f))


# --------------------------------------------------------------------------- no training

def test_history_csv_keeps_every_digit(tmp_path):
    values = {"epoch": 1, "loss": 0.1234567890123456, "val_loss": 2 / 3, "accuracy": 1e-17,
              "seconds": np.float32(0.1), "examples_per_sec": None}
    RunDir(tmp_path).append_history(values, list(values))
    [row] = _rows(tmp_path)
    assert float(row["loss"]) == 0.1234567890123456 and float(row["val_loss"]) == 2 / 3
    assert float(row["accuracy"]) == 1e-17
    assert float(row["seconds"]) == float(np.float32(0.1))  # the float32's own value
    assert row["epoch"] == "1" and row["examples_per_sec"] == ""


def _stateful(*names: str):
    import tensorflow as tf

    from distlab.training.metrics import StatefulMetrics

    return StatefulMetrics(_binary_task(*names), tf.distribute.get_strategy())


def _state(metrics, **counts: float) -> np.ndarray:
    """A state vector with the named variables (true_positives...) set, the rest zero."""
    values = []
    for obj in metrics.scratch.objects:
        for v in obj.variables:
            name = v.name.split("/")[-1].split(":")[0]
            values.append(np.full(int(np.prod(v.shape)), counts.get(name, 0.0)))
    return np.concatenate(values)


def test_precision_and_recall_are_float64_ratios_of_their_counts():
    metrics = _stateful("precision", "recall")
    precision, recall = metrics.results(_state(metrics, true_positives=16, false_positives=7,
                                               false_negatives=9))
    assert precision == 16 / 23 and recall == 16 / 25  # not float32's 0.695652186870575


def test_an_undefined_figure_is_none_and_warned_about_once(caplog):
    metrics = _stateful("auc", "precision", "recall")
    # no predicted positives and no positive labels: 5 negatives, all predicted negative
    state = _state(metrics, true_negatives=5, false_positives=0, false_negatives=0,
                   true_positives=0)
    with caplog.at_level(logging.WARNING, logger="distlab"):
        assert metrics.results(state, "val_") == [None, None, None]
        assert metrics.results(state, "val_") == [None, None, None]
        assert metrics.results(state) == [None, None, None]  # running figures: no warning
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3, warned
    assert warned[0].startswith("val_auc is undefined: the validation rows have only "
                                "negative labels (AUC needs both classes)")
    assert "val_precision is undefined: the validation rows have no predicted positives" \
        in warned[1]
    assert "val_recall is undefined: the validation rows have no positive labels" in warned[2]
    # 4 negatives and one positive, all predicted negative: AUC and recall (a real 0) are
    # defined, precision is not
    auc, precision, recall = metrics.results(_state(metrics, true_negatives=4,
                                                    false_negatives=1), "test_")
    assert auc is not None and (precision, recall) == (None, 0.0)  # (AUC: both classes)


# --------------------------------------------------------------------------- training runs

@pytest.mark.slow
def test_one_class_validation_reports_null_and_nothing_selects_on_it(
        binary_data, run_inprocess, tmp_path, caplog):  # noqa: F811
    """Breast cancer with a one-row validation split (train[:1], a negative): val_auc and
    val_recall are undefined, so they are null in results.json, empty in history.csv, warned
    about once each, and neither the best checkpoint (val_auc) nor early stopping
    (val_recall, patience 1) acts on them; the test split's figures are exact float64."""
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="distlab"):
        results = run_inprocess(
            *BINARY, "dataset.train_split='train[1:]'", "dataset.validation='train[:1]'",
            "trainer.epochs=3", "trainer.steps_per_epoch=4",
            "trainer.best_checkpoint.metric=val_auc",
            "trainer.early_stopping.metric=val_recall", "trainer.early_stopping.patience=1",
            out=out)
    x_val, y_val = _split(binary_data, "train[:1]")
    assert y_val.tolist() == [0]
    for name in ("val_auc", "val_recall"):
        assert results[name] is None, name
        assert [row[name] for row in _rows(out)] == ["", "", ""], name
        assert caplog.text.count(f"{name} is undefined") == 1, name
    predicted_positive = bool(_probabilities(out, x_val)[0] > 0.5)
    assert results["val_precision"] == (0.0 if predicted_positive else None)
    assert results["epochs_completed"] == 3 and "stopped_early" not in results
    assert results["best_epoch"] is None and results["best_checkpoint"] is None
    assert not (out / "checkpoints" / "best").exists() or not list(
        (out / "checkpoints" / "best").glob("ckpt-*.index"))
    # the test split has both classes: exact ratios of the checkpoint's counts, in float64
    x_test, y_test = _split(binary_data, "test")
    predicted = _probabilities(out, x_test) > 0.5
    tp = int(np.sum(predicted & (y_test == 1)))
    assert results["test_precision"] == tp / int(np.sum(predicted))
    assert results["test_recall"] == tp / int(np.sum(y_test == 1))
    # the history's last row and results.json agree to the last digit
    last = _rows(out)[-1]
    assert float(last["val_loss"]) == results["val_loss"]
    assert float(last["val_accuracy"]) == results["val_accuracy"]
    assert results["objective"] == "val_accuracy"
    assert results["objective_value"] == results["val_accuracy"]
    assert json.loads((out / "results.json").read_text())["objective_value"] is not None
