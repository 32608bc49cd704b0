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
    learning_rate: float = checked(1e-3, LEARNING_RATE)  # the base rate; see the schedule group
    # scale learning_rate by global batch / base_batch_size (linear), or its square root
    lr_scaling: str = checked("none", one_of("none", "linear", "sqrt"))
    base_batch_size: int = checked(64, POSITIVE)  # the batch learning_rate is meant for
    # clip each variable's gradient (summed over replicas) to this norm; null: no clipping
    clipnorm: float | None = checked(None, POSITIVE)


@dataclass
class AdamConfig(OptimizerConfig):
    name: str = "adam"
    beta_1: float = 0.9  # decay of the first-moment (mean) estimate
    beta_2: float = 0.999  # decay of the second-moment estimate
    epsilon: float = checked(1e-7, POSITIVE)  # added to the denominator, for stability
    amsgrad: bool = False  # the AMSGrad variant


@dataclass
class SGDConfig(OptimizerConfig):
    name: str = "sgd"
    learning_rate: float = checked(0.01, LEARNING_RATE)  # the base rate
    momentum: float = checked(0.0, FRACTION)  # 0: plain SGD
    nesterov: bool = False  # Nesterov momentum


@dataclass
class RMSpropConfig(OptimizerConfig):
    name: str = "rmsprop"
    rho: float = 0.9  # decay of the moving average of squared gradients
    momentum: float = checked(0.0, FRACTION)  # 0: none
    epsilon: float = checked(1e-7, POSITIVE)  # added to the denominator, for stability


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
    decay_rate: float = checked(0.9, POSITIVE)  # the factor per decay_epochs
    decay_epochs: float = checked(1.0, POSITIVE)  # epochs per factor of decay_rate
    staircase: bool = False  # decay in whole periods only
