"""The `trainer` node's keys: epochs, validation, checkpoints, throughput, the target,
early stopping and the best checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, field

from distlab.config.schema.rules import (
    METRIC,
    MODE,
    NON_NEGATIVE,
    POSITIVE,
    checked,
    finite,
)


@dataclass
class ThroughputConfig:
    """What the steady-state examples/sec leaves out (results.json, sweep summary)."""

    # each process's first N epochs (trace, decode, cache fill)
    warmup_epochs: int = checked(1, NON_NEGATIVE)
    # instead: each process's first N steps (the spread is then over step windows)
    warmup_steps: int | None = checked(None, NON_NEGATIVE)
    # runs with < 2 steady epochs: the spread over this many step windows
    windows: int = checked(5, POSITIVE)


@dataclass
class TargetConfig:
    """Time-to-accuracy (time_to_target_s, epochs_to_target in results.json): the first epoch
    whose `metric` reaches `value`."""

    metric: str | None = checked(None, METRIC)  # a history.csv column, e.g. val_accuracy
    value: float | None = checked(None, (finite, "must be a finite number"))  # e.g. 0.9867
    mode: str = checked("auto", MODE)  # max: reached at >= value; min: at <= value
    stop: bool = False  # end training at the epoch that reaches it


@dataclass
class EarlyStoppingConfig:
    metric: str | None = checked(None, METRIC)  # a history.csv column, e.g. val_loss
    # epochs without an improvement of more than min_delta, then stop
    patience: int = checked(3, POSITIVE)
    # the least change that counts as an improvement
    min_delta: float = checked(0.0, (lambda v: finite(v) and v >= 0,
                                     "must be a finite number >= 0"))
    mode: str = checked("auto", MODE)  # max, min, or auto: a loss down, a metric its own way


@dataclass
class BestCheckpointConfig:
    """checkpoints/best/: the best epoch by this metric."""

    metric: str | None = checked(None, METRIC)  # null: early_stopping.metric if set, else none
    mode: str = checked("auto", MODE)  # max, min, or auto: a loss down, a metric its own way
    test: bool = False  # also score checkpoints/best on the test split (best_test_* fields)


@dataclass
class TrainerConfig:
    epochs: int = checked(12, POSITIVE)  # epochs to train (a rerun with more extends a run)
    steps_per_epoch: int | None = checked(None, POSITIVE)  # null: one pass over the train split
    # epochs between validation passes (val_* columns); 0: none during training
    validate_every: int = checked(1, NON_NEGATIVE)
    # epochs between test-split passes during training (test_* columns, never used to
    # choose: a tutorial's per-epoch test pass); 0: the test split is scored once, at the end
    test_every: int = checked(0, NON_NEGATIVE)
    checkpoint_every: int = checked(1, POSITIVE)  # epochs between checkpoints/ckpt-N
    max_checkpoints: int = checked(3, POSITIVE)  # the latest N checkpoints/ckpt-N kept
    export: bool = True  # SavedModel in saved_model/, reloaded and checked
    # micro-batches per optimizer update: effective batch = global batch x N
    grad_accum_steps: int = checked(1, POSITIVE)
    throughput: ThroughputConfig = field(default_factory=ThroughputConfig)
    target: TargetConfig = field(default_factory=TargetConfig)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    best_checkpoint: BestCheckpointConfig = field(default_factory=BestCheckpointConfig)
    # [first, last] steps (1-based): a TF profiler trace of those steps in logs/train
    profile_steps: list[int] | None = checked(None, (
        lambda v: len(v) == 2 and 1 <= v[0] <= v[1],
        "must be [first, last] steps with 1 <= first <= last, e.g. [10, 20]"))
