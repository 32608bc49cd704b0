"""The `task` group's keys, one schema per task: its outputs and its metrics."""

from __future__ import annotations

from dataclasses import dataclass

from distlab.config.schema.rules import (
    FRACTION,
    POSITIVE,
    Rule,
    checked,
)

# task.metrics: names of the `metric` registry (distlab's: records.metrics.BUILTIN_METRICS;
# a registered name or package.module:callable), each a history column and a test_<name> field
METRIC_NAMES: Rule = (lambda v: all(isinstance(n, str) and n.strip() for n in v),
                      "must list metric names, e.g. [accuracy, auc]")


@dataclass
class ClassificationTaskConfig:
    name: str = "classification"
    # null: as the model outputs (a softmax/sigmoid last layer: probabilities, else logits)
    from_logits: bool | None = None
    top_k: int | None = checked(None, POSITIVE)  # e.g. 5: also report top5_accuracy
    # metric names (the metric registry): history columns, val_<name>, test_<name> fields
    metrics: list[str] = checked(["accuracy"], METRIC_NAMES)
    # e.g. 0.1: the loss's target is 1 - 0.1 + 0.1/K for the label, 0.1/K for each other of the
    # K classes (Szegedy et al. 2016); the loss, val_loss and test_loss are that loss
    label_smoothing: float = checked(0.0, FRACTION)


@dataclass
class RegressionTaskConfig:
    name: str = "regression"
    metrics: list[str] = checked(["mae", "rmse"], METRIC_NAMES)  # the loss: MSE
    # only 0 (config.checks): the key is here so that a preset's smoothing is refused in one line
    label_smoothing: float = checked(0.0, FRACTION)


@dataclass
class BinaryTaskConfig:
    """0/1 labels (2 classes, or 0/1 values), a model with one output unit."""

    name: str = "binary"
    # null: as the model outputs (a sigmoid last layer: probabilities, else logits)
    from_logits: bool | None = None
    # accuracy, auc, precision, recall: at probability 0.5 (auc over 1000 thresholds); also f1
    metrics: list[str] = checked(["accuracy", "auc", "precision", "recall"], METRIC_NAMES)
    # e.g. 0.1: the loss's target is 1 - 0.1/2 for a 1 label, 0.1/2 for a 0 (Keras'
    # binary_crossentropy label_smoothing); the loss, val_loss and test_loss are that loss
    label_smoothing: float = checked(0.0, FRACTION)
