"""Every config key: its type, its default (stated here only), what it means and, where a
value can be impossible, the rule it must follow (`checked(default, RULE)`).

Hydra checks types and unknown keys while composing; `checks.validate` then applies the
rules below and the few that relate several keys. The YAMLs under conf/ state only what
differs from these defaults (`python run.py --cfg job` shows the whole composed config).
Nothing here imports TensorFlow.

One module per group (`strategy`, `dataset`, `task`, `model`, `optimizer` with the
`schedule`s, `loop`, `trainer`, `logger`), the value rules in `rules`; this module holds
the composed config (`Config`) and every name, so `distlab.config.schema.X` keeps working.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from distlab.config.schema.dataset import (
    AugmentConfig,
    DatasetConfig,
    FeaturesConfig,
    PreprocessConfig,
)
from distlab.config.schema.logger import LoggerConfig, MlflowLoggerConfig
from distlab.config.schema.loop import CustomLoopConfig, KerasFitLoopConfig, LoopConfig
from distlab.config.schema.model import (
    CnnModelConfig,
    KerasApplicationsModelConfig,
    MlpModelConfig,
    ResNetModelConfig,
)
from distlab.config.schema.optimizer import (
    AdamConfig,
    ConstantScheduleConfig,
    CosineScheduleConfig,
    ExponentialScheduleConfig,
    OptimizerConfig,
    RMSpropConfig,
    ScheduleConfig,
    SGDConfig,
    StepDecayConfig,
)
from distlab.config.schema.rules import (
    ENTRIES_POSITIVE,
    FEATURE_NAMES,
    FRACTION,
    INT_LIMIT,
    LEARNING_RATE,
    METRIC,
    MODE,
    NON_NEGATIVE,
    OUTPUT_ACTIVATION,
    POLICIES,
    POSITIVE,
    PRECISIONS,
    RESNET_DEPTH,
    SEED,
    VALIDATION,
    Rule,
    checked,
    finite,
    held_out_fraction,
    one_of,
)
from distlab.config.schema.strategy import StrategyConfig
from distlab.config.schema.task import (
    METRIC_NAMES,
    BinaryTaskConfig,
    ClassificationTaskConfig,
    RegressionTaskConfig,
)
from distlab.config.schema.trainer import (
    BestCheckpointConfig,
    EarlyStoppingConfig,
    TargetConfig,
    ThroughputConfig,
    TrainerConfig,
)
from distlab.records.fields import OBJECTIVES

# the numeric results.json fields `objective` may name for sweepers: records.fields.OBJECTIVES
OBJECTIVE: Rule = (
    lambda v: v in OBJECTIVES or v.startswith("val_"),
    "must name a numeric results.json field: val_loss, val_<metric of the task> (e.g. "
    "val_accuracy, val_rmse, val_auc), " + ", ".join(o for o in OBJECTIVES if o[:4] != "val_")
    + ". A sweep never chooses on the test split, so test_* fields are not objectives")


@dataclass
class SearchConfig:
    """The Optuna trial a job of `hparams_search=optuna` runs: set by the sweeper, never by
    hand (null outside a search). The job reports its validation objective to the trial at
    each validated epoch and stops when the pruner says so."""

    storage: str | None = None  # the study's journal file or database URL
    study: str | None = None  # the study's name
    trial: int | None = None  # the trial's number (= the job's number in the sweep)
    pruner: str = "none"  # hydra.sweeper.pruner: none, median, successive_halving, hyperband
    pruner_args: Any = None  # hydra.sweeper.pruner_args: the pruner's arguments


@dataclass
class Config:
    """The composed config: one option of each group, then the shared settings."""

    strategy: Any = MISSING
    dataset: Any = MISSING
    model: Any = MISSING
    optimizer: Any = MISSING
    schedule: Any = MISSING
    loop: Any = MISSING
    task: Any = MISSING
    logger: Any = MISSING  # experiment tracking beside TensorBoard (distlab.tracking)
    # your modules, imported before names are resolved (they may distlab.register names)
    imports: list[str] = field(default_factory=list)
    # Keras callbacks, by a name of your choice: {_target_: package.Class, <its arguments>}
    # (hydra.utils.instantiate), or {name: <registered callback>, ...}; `_chief_only_: true`
    # runs one on the chief only (multi-worker). See the Callbacks guide
    callbacks: dict[str, Any] = field(default_factory=dict)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    # seeds the model, the data order of each epoch (with the epoch) and augmentation
    seed: int = checked(42, SEED)
    deterministic: bool = False  # true: seed everything and turn on TF op determinism
    # the Keras dtype policy; auto: mixed_bfloat16 where every device the strategy trains
    # on computes bfloat16 natively (a CPU with avx512_bf16/amx_bf16, GPUs of compute
    # capability 8.0+), else float32, chosen as the run starts and recorded in its run dir
    precision: str = checked("float32", one_of(*PRECISIONS))
    # train, or evaluate ckpt_path's checkpoint on the splits it was trained with
    mode: str = checked("train", (lambda v: v in ("train", "evaluate"),
                                  "must be train or evaluate"))
    ckpt_path: str | None = None  # mode=evaluate: a run directory or checkpoint prefix
    # the results.json field returned to sweepers; null: the task's first validation metric
    # (val_accuracy for classification, val_mae for regression); never a test_ field
    objective: str | None = checked(None, OBJECTIVE)
    search: SearchConfig = field(default_factory=SearchConfig)  # set by the Optuna sweeper


# The schema of each group's options, by option: a group option's YAML starts with
# `defaults: [/schema_<group>[_<option>]@_here_, _self_]` (store.register_configs).
GROUP_SCHEMAS: dict[str, dict[str, type]] = {
    "strategy": {"": StrategyConfig},
    "dataset": {"": DatasetConfig},
    "model": {"cnn": CnnModelConfig, "mlp": MlpModelConfig, "resnet": ResNetModelConfig,
              "keras_applications": KerasApplicationsModelConfig},
    "task": {"classification": ClassificationTaskConfig, "regression": RegressionTaskConfig,
             "binary": BinaryTaskConfig},
    "optimizer": {"adam": AdamConfig, "sgd": SGDConfig, "rmsprop": RMSpropConfig},
    "schedule": {"constant": ConstantScheduleConfig, "step_decay": StepDecayConfig,
                 "cosine": CosineScheduleConfig, "exponential": ExponentialScheduleConfig},
    "loop": {"keras_fit": KerasFitLoopConfig, "custom": CustomLoopConfig},
    "logger": {"tensorboard": LoggerConfig, "mlflow": MlflowLoggerConfig},
}

__all__ = ["AdamConfig", "AugmentConfig", "BestCheckpointConfig", "BinaryTaskConfig",
           "ClassificationTaskConfig", "CnnModelConfig", "Config", "ConstantScheduleConfig",
           "CosineScheduleConfig", "CustomLoopConfig", "DatasetConfig", "ENTRIES_POSITIVE",
           "EarlyStoppingConfig", "ExponentialScheduleConfig", "FEATURE_NAMES", "FRACTION",
           "FeaturesConfig", "GROUP_SCHEMAS", "INT_LIMIT", "KerasApplicationsModelConfig",
           "KerasFitLoopConfig", "LEARNING_RATE", "LoggerConfig", "LoopConfig", "METRIC",
           "METRIC_NAMES", "MODE", "MlflowLoggerConfig", "MlpModelConfig", "NON_NEGATIVE",
           "OBJECTIVE", "OBJECTIVES", "OUTPUT_ACTIVATION", "OptimizerConfig", "POLICIES",
           "POSITIVE", "PRECISIONS", "PreprocessConfig", "RESNET_DEPTH", "RMSpropConfig",
           "RegressionTaskConfig", "ResNetModelConfig", "Rule", "SEED", "SGDConfig",
           "ScheduleConfig",
           "StepDecayConfig", "StrategyConfig", "TargetConfig", "ThroughputConfig",
           "TrainerConfig", "VALIDATION", "checked", "finite", "held_out_fraction", "one_of"]
