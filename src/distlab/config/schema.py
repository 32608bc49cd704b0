"""Every config key: its type, its default (stated here only), what it means and, where a
value can be impossible, the rule it must follow (`checked(default, RULE)`).

Hydra checks types and unknown keys while composing; `checks.validate` then applies the
rules below and the few that relate several keys. The YAMLs under conf/ state only what
differs from these defaults (`python run.py --cfg job` shows the whole composed config).
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from distlab.records.fields import OBJECTIVES
from distlab.records.results import finite

# --------------------------------------------------------------------------- value rules

# (ok(value), why not): `checks.validate` refuses a set value (null is never checked) whose
# ok() is false with "<key>=<value> is invalid: <why>"; a TypeError counts as false.
Rule = tuple[Callable[[Any], bool], str]


def checked(default: Any, rule: Rule) -> Any:
    """A dataclass field with `default` (a list or dict is copied for each instance) whose
    value must follow `rule`."""
    metadata = {"rule": rule}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def one_of(*choices: str) -> Rule:
    return (lambda v: v in choices, "must be one of " + ", ".join(choices))


POSITIVE: Rule = (lambda v: v > 0, "must be > 0")
NON_NEGATIVE: Rule = (lambda v: v >= 0, "must be >= 0")
ENTRIES_POSITIVE: Rule = (lambda v: all(x > 0 for x in v), "entries must be > 0")
FRACTION: Rule = (lambda v: 0 <= v < 1, "must be in [0, 1)")


def held_out_fraction(validation: str | None) -> float | None:
    """`dataset.validation` as a fraction of train held out, or None (not a number)."""
    try:
        return float(validation)
    except (TypeError, ValueError):
        return None


VALIDATION: Rule = (
    lambda v: (held_out_fraction(v) is None and bool(v.strip()))
    or 0 < (held_out_fraction(v) or 0) < 1,
    "must be auto, a fraction of the train split in (0, 1) such as 0.1, a tfds split or slice "
    "(validation, 'train[90%:]'), or null for none")
MODE = one_of("auto", "max", "min")  # which way a watched metric improves; auto: by its name
METRIC: Rule = (lambda v: bool(v.strip()), "must name a history.csv column (e.g. val_loss), "
                "or be null to turn it off")
OUTPUT_ACTIVATION: Rule = (lambda v: v in ("softmax", "sigmoid"),
                           "must be null, softmax or sigmoid (task=binary)")
RESNET_DEPTH: Rule = (lambda v: v >= 8 and (v - 2) % 6 == 0,
                      "must be 6n+2 with n >= 1 (e.g. 20, 32, 44, 56, 110)")
LEARNING_RATE: Rule = (lambda v: v > 0 and math.isfinite(v), "must be finite and > 0")
FEATURE_NAMES: Rule = (lambda v: isinstance(v, str) and bool(v) or (
    not isinstance(v, str | int | float | bool) and len(v) > 0
    and all(isinstance(k, str) and k for k in v)),
    "must be a feature name or a non-empty list of feature names")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
INT_LIMIT = 2**31  # every integer key of distlab's options is below it (seed: below 2**32)

# --------------------------------------------------------------------------- groups


@dataclass
class StrategyConfig:
    name: str = MISSING  # default | one_device | mirrored | auto | multi_worker_mirrored
    # split the host CPU into N logical devices (no GPUs; mirrored/auto then have N replicas)
    cpu_devices: int | None = checked(None, POSITIVE)
    device: str | None = None  # one_device: e.g. "/gpu:0"; null: the first GPU, else the CPU
    # multi-worker: the collective implementation
    communication: str = checked("auto", one_of("auto", "ring", "nccl"))
    # multi-worker: where the cluster comes from: TF_CONFIG, or SLURM (launched by srun)
    cluster_resolver: str = checked("tf_config", one_of("tf_config", "slurm"))
    # multi-worker: exit, the unreachable workers named, if the cluster does not form
    connect_timeout_s: float = checked(120.0, POSITIVE)
    # cluster_resolver=slurm: a node's tasks listen on this port, the next one, ...
    slurm_port_base: int = checked(8888, (lambda v: 1024 <= v < 65536,
                                          "must be a port in [1024, 65536)"))


@dataclass
class FeaturesConfig:
    """Which tfds features are the input and the label; null: the supervised keys."""

    # the feature fed to the model, or a list of features (the model gets a dict by name)
    input: Any = checked(None, FEATURE_NAMES)
    label: str | None = None  # the feature it learns (ClassLabel: classes; else values)


@dataclass
class PreprocessConfig:
    """Inference-time preprocessing: in the input pipeline and in the exported model (which
    then takes raw inputs, e.g. uint8 images)."""

    rescale: float | None = checked(None, POSITIVE)  # divide raw inputs by this (images: 255)
    mean: list[float] | None = None  # per channel (last axis), subtracted after rescaling
    std: list[float] | None = checked(None, ENTRIES_POSITIVE)  # per channel, after the mean
    # per feature (last axis): (x - mean) / std with the training split's mean and std, kept
    # in the model (Normalization layers: checkpointed, exported); instead of mean and std
    standardize: bool = False
    # the inputs the above apply to (cast to float32 first); null: one input tensor unless
    # strings, or a tuple's / dict's float inputs. Other inputs reach the model untouched
    inputs: list[str] | None = None


@dataclass
class AugmentConfig:
    """Train split only, seeded per (seed, epoch, example): resume-exact."""

    flip: str = checked("none", one_of("none", "horizontal", "vertical", "both"))  # at random
    # pad by N pixels, crop back at random: translations up to N
    crop_padding: int = checked(0, NON_NEGATIVE)


@dataclass
class DatasetConfig:
    name: str = MISSING  # a tfds name, a registered dataset builder, or package.module:fn
    train_split: str = "train"
    test_split: str = "test"
    # the split that chooses (val_* figures, early stopping, checkpoints/best, targets, the
    # default objective): auto (the dataset's own validation split, else 0.1 of train_split),
    # a fraction of train_split held out (seeded; stratified for classes), a tfds split or
    # slice (validation, train[90%:]), or null (none)
    validation: str | None = checked("auto", VALIDATION)
    validation_seed: int = checked(0, (lambda v: 0 <= v < 2**32, "must be in [0, 2**32)"))
    batch_size_per_replica: int = checked(64, POSITIVE)
    shuffle_buffer: int = checked(10000, NON_NEGATIVE)
    cache: bool = True  # keep the preprocessed splits in memory after the first pass
    disk_cache: bool = True  # decoded, preprocessed tfds splits on disk, shared across runs
    cache_dir: str | None = None  # null: $DISTLAB_CACHE_DIR, else ~/.cache/distlab
    data_dir: str | None = None  # null: tfds' default, which honours TFDS_DATA_DIR
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)


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
    metrics: list[str] = checked(["accuracy"], METRIC_NAMES)


@dataclass
class RegressionTaskConfig:
    name: str = "regression"
    metrics: list[str] = checked(["mae", "rmse"], METRIC_NAMES)


@dataclass
class BinaryTaskConfig:
    """0/1 labels (2 classes, or 0/1 values), a model with one output unit."""

    name: str = "binary"
    # null: as the model outputs (a sigmoid last layer: probabilities, else logits)
    from_logits: bool | None = None
    # accuracy, auc, precision, recall: at probability 0.5 (auc over 1000 thresholds); also f1
    metrics: list[str] = checked(["accuracy", "auc", "precision", "recall"], METRIC_NAMES)


@dataclass
class CnnModelConfig:
    """The cnn builder; the defaults are the MNIST tutorial's Conv32-MaxPool-Dense64."""

    name: str = MISSING  # registry name of the builder
    conv_filters: list[int] = checked([32], ENTRIES_POSITIVE)  # one Conv-ReLU-MaxPool each
    kernel_size: int = checked(3, POSITIVE)
    dense_units: list[int] = checked([64], ENTRIES_POSITIVE)  # one Dense-ReLU each
    # null: logits (or raw regression values); softmax: probabilities; sigmoid: task=binary's
    output_activation: str | None = checked(None, OUTPUT_ACTIVATION)
    l2: float = checked(0.0, NON_NEGATIVE)  # L2 weight decay on every kernel


@dataclass
class MlpModelConfig:
    name: str = MISSING
    hidden_units: list[int] = checked([128, 64], ENTRIES_POSITIVE)  # of each hidden Dense
    activation: str = "relu"  # of the hidden layers (a Keras activation name)
    batch_norm: bool = False  # BatchNormalization between each hidden Dense and its activation
    dropout: float = checked(0.0, FRACTION)  # Dropout rate after each hidden layer; 0: none
    output_activation: str | None = checked(None, OUTPUT_ACTIVATION)
    l2: float = checked(0.0, NON_NEGATIVE)


@dataclass
class ResNetModelConfig:
    name: str = MISSING
    depth: int = checked(20, RESNET_DEPTH)  # 6n+2: 20, 32, 44, 56, 110
    l2: float = checked(1e-4, NON_NEGATIVE)  # the paper's weight decay, on every kernel
    sync_batch_norm: bool = False  # BatchNormalization over the global batch (all replicas)
    output_activation: str | None = checked(None, OUTPUT_ACTIVATION)


@dataclass
class KerasApplicationsModelConfig:
    name: str = MISSING
    # a keras.applications name: ResNet50, MobileNetV2, EfficientNetB0, ...
    architecture: str = "MobileNetV2"
    # passed to the constructor, e.g. {alpha: 0.35} or {include_preprocessing: false}
    kwargs: dict[str, Any] = field(default_factory=dict)
    output_activation: str | None = checked(None, OUTPUT_ACTIVATION)


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


@dataclass
class LoopConfig:
    name: str = MISSING
    # the progress bar during each epoch: auto (only when stdout is a terminal), 1 (always),
    # 0 or 2 (never: distlab's one line per epoch only)
    verbose: Any = checked("auto", (lambda v: v in ("auto", 0, 1, 2) and v is not True,
                                    "must be auto, 0, 1 or 2"))
    jit_compile: bool = False  # XLA (not over several logical CPU devices)


@dataclass
class KerasFitLoopConfig(LoopConfig):
    name: str = "keras_fit"
    steps_per_execution: int = checked(1, POSITIVE)  # steps per tf.function call


@dataclass
class CustomLoopConfig(LoopConfig):
    name: str = "custom"
    steps_per_loop: int = checked(1, POSITIVE)  # steps run inside one tf.function


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
    min_delta: float = checked(0.0, (lambda v: finite(v) and v >= 0,
                                     "must be a finite number >= 0"))
    mode: str = checked("auto", MODE)


@dataclass
class BestCheckpointConfig:
    """checkpoints/best/: the best epoch by this metric."""

    metric: str | None = checked(None, METRIC)  # null: early_stopping.metric if set, else none
    mode: str = checked("auto", MODE)
    test: bool = False  # also score checkpoints/best on the test split (best_test_* fields)


@dataclass
class TrainerConfig:
    epochs: int = checked(12, POSITIVE)
    steps_per_epoch: int | None = checked(None, POSITIVE)  # null: one pass over the train split
    # epochs between validation passes (val_* columns); 0: none during training
    validate_every: int = checked(1, NON_NEGATIVE)
    # epochs between test-split passes during training (test_* columns, never used to
    # choose: a tutorial's per-epoch test pass); 0: the test split is scored once, at the end
    test_every: int = checked(0, NON_NEGATIVE)
    checkpoint_every: int = checked(1, POSITIVE)  # epochs between checkpoints/ckpt-N
    max_checkpoints: int = checked(3, POSITIVE)
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


@dataclass
class LoggerConfig:
    """logger=tensorboard: no tracker beside TensorBoard, which every run writes (logs/)."""

    name: str = "tensorboard"  # tensorboard, mlflow, or a tracker a plug-in registered


@dataclass
class MlflowLoggerConfig(LoggerConfig):
    """logger=mlflow (pip install "distlab[mlflow]"): the config as params, each history.csv
    row as metrics (step: the epoch), results.json's figures as results/<field>, and
    config.yaml, history.csv, results.json as artifacts; a sweep is a parent run with a child
    per job; a rerun that resumes continues the same MLflow run. The chief only."""

    name: str = "mlflow"
    # any MLflow tracking URI; a relative sqlite:/// path is from the current directory (the
    # default: one store for every run; see them with `mlflow ui --backend-store-uri` it).
    # Artifacts of a sqlite store go to mlartifacts/ beside its file
    tracking_uri: str = checked("sqlite:///outputs/mlflow.db", (
        lambda v: bool(v.strip()), "must be an MLflow tracking URI, e.g. "
        "sqlite:///outputs/mlflow.db or http://host:5000"))
    experiment_name: str = checked("distlab", (lambda v: bool(v.strip()),
                                               "must name an MLflow experiment"))


# the numeric results.json fields `objective` may name for sweepers: records.fields.OBJECTIVES
OBJECTIVE: Rule = (
    lambda v: v in OBJECTIVES or v.startswith("val_"),
    "must name a numeric results.json field: val_loss, val_<metric of the task> (e.g. "
    "val_accuracy, val_rmse, val_auc), " + ", ".join(o for o in OBJECTIVES if o[:4] != "val_")
    + ". A sweep never chooses on the test split, so test_* fields are not objectives")


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
    # runs one on the chief only (multi-worker). See README "Callbacks"
    callbacks: dict[str, Any] = field(default_factory=dict)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    seed: int = checked(42, (lambda v: 0 <= v < 2**32, "must be in [0, 2**32)"))
    deterministic: bool = False  # true: seed everything and turn on TF op determinism
    precision: str = checked("float32", one_of(*PRECISIONS))  # the Keras dtype policy
    mode: str = checked("train", (lambda v: v in ("train", "evaluate"),
                                  "must be train or evaluate"))
    ckpt_path: str | None = None  # mode=evaluate: a run directory or checkpoint prefix
    # the results.json field returned to sweepers; null: the task's first validation metric
    # (val_accuracy for classification, val_mae for regression); never a test_ field
    objective: str | None = checked(None, OBJECTIVE)


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
