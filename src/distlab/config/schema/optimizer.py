"""The `optimizer` and `schedule` groups' keys: the optimizer, and the learning rate's
schedule over the epochs."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING

from distlab.config.schema.rules import (
    ENTRIES_POSITIVE,
    FRACTION,
    LEARNING_RATE,
    NON_NEGATIVE,
    POSITIVE,
    checked,
    one_of,
)


@dataclass
class OptimizerConfig:
    name: str = MISSING
    learning_rate: float = checked(1e-3, LEARNING_RATE)
    # scale learning_rate by global batch / base_batch_size (linear), or its square root
    lr_scaling: str = checked("none", one_of("none", "linear", "sqrt"))
    base_batch_size: int = checked(64, POSITIVE)
    clipnorm: float | None = checked(None, POSITIVE)


@dataclass
class AdamConfig(OptimizerConfig):
    name: str = "adam"
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = checked(1e-7, POSITIVE)
    amsgrad: bool = False


@dataclass
class SGDConfig(OptimizerConfig):
    name: str = "sgd"
    learning_rate: float = checked(0.01, LEARNING_RATE)
    momentum: float = checked(0.0, FRACTION)
    nesterov: bool = False


@dataclass
class RMSpropConfig(OptimizerConfig):
    name: str = "rmsprop"
    rho: float = 0.9
    momentum: float = checked(0.0, FRACTION)
    epsilon: float = checked(1e-7, POSITIVE)


@dataclass
class ScheduleConfig:
    name: str = MISSING
    # linear warmup from 0 to the schedule's value, in epochs (fractions allowed)
    warmup_epochs: float = checked(0.0, NON_NEGATIVE)


@dataclass
class ConstantScheduleConfig(ScheduleConfig):
    name: str = "constant"


@dataclass
class StepDecayConfig(ScheduleConfig):
    """The defaults are the MNIST tutorial's: x1 for epochs 0-2, x0.1 from 3, x0.01 from 7."""

    name: str = "step_decay"
    # epochs (0-based) at which the next factor starts
    boundaries: list[int] = checked([3, 7], (
        lambda v: list(v) == sorted(set(v)) and all(b > 0 for b in v),
        "must be strictly increasing epochs > 0"))
    # multiplied by optimizer.learning_rate; one more than boundaries
    factors: list[float] = checked([1.0, 0.1, 0.01], ENTRIES_POSITIVE)


@dataclass
class CosineScheduleConfig(ScheduleConfig):
    name: str = "cosine"
    decay_epochs: float | None = checked(None, POSITIVE)  # null: trainer.epochs
    alpha: float = checked(0.0, (lambda v: 0 <= v <= 1, "must be in [0, 1]"))  # final fraction


@dataclass
class ExponentialScheduleConfig(ScheduleConfig):
    name: str = "exponential"
    decay_rate: float = checked(0.9, POSITIVE)
    decay_epochs: float = checked(1.0, POSITIVE)
    staircase: bool = False
