"""Structured schema for the composed config (dataclasses in Hydra's ConfigStore).

Hydra checks types and unknown keys while composing; `validate` then checks values
(positive counts, known enum values) and reports the first bad key on one line.
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from distlab.errors import ConfigError
from distlab.launch.results import OBJECTIVES, builtin_task_metrics, check_watched, finite

# --------------------------------------------------------------------------- groups


@dataclass
class StrategyConfig:
    name: str = MISSING  # default | one_device | mirrored | multi_worker_mirrored
    cpu_devices: int | None = None  # split the host CPU into N logical devices (no GPUs)
    device: str | None = None  # one_device: e.g. "/gpu:0"; null: first GPU, else CPU
    communication: str = "auto"  # multi-worker collectives: auto | ring | nccl
    cluster_resolver: str = "tf_config"  # multi-worker: tf_config | slurm
    connect_timeout_s: float = 120.0  # multi-worker: give up if the cluster does not form
    slurm_port_base: int = 8888  # cluster_resolver=slurm: first port of each node's tasks


@dataclass
class FeaturesConfig:
    """Which tfds features are the input and the label; null: the supervised keys."""

    input: str | None = None  # the feature fed to the model
    label: str | None = None  # the feature it learns (ClassLabel: classes; else values)


@dataclass
class PreprocessConfig:
    """Inference-time preprocessing: in the input pipeline and in the exported model."""

    rescale: float | None = None  # divide raw inputs by this (images: 255)
    mean: list[float] | None = None  # per channel (last axis), subtracted after rescaling
    std: list[float] | None = None  # per channel, divided by after the mean


@dataclass
class AugmentConfig:
    """Train split only, seeded per (seed, epoch, example): resume-exact."""

    flip: str = "none"  # none | horizontal | vertical | both (random flips)
    crop_padding: int = 0  # pad by N pixels, crop back at random: translations up to N


@dataclass
class DatasetConfig:
    name: str = MISSING  # a tfds name, a registered dataset builder, or package.module:fn
    train_split: str = "train"
    test_split: str = "test"
    batch_size_per_replica: int = 64
    shuffle_buffer: int = 10000
    cache: bool = True  # keep the preprocessed splits in memory after the first pass
    disk_cache: bool = True  # decoded, preprocessed tfds splits on disk, shared across runs
    cache_dir: str | None = None  # null: $DISTLAB_CACHE_DIR, else ~/.cache/distlab
    data_dir: str | None = None  # null: tfds' default, which honours TFDS_DATA_DIR
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)


@dataclass
class ClassificationTaskConfig:
    name: str = "classification"
    from_logits: bool | None = None  # null: as the model outputs (softmax/sigmoid or logits)
    top_k: int | None = None  # also report top<k>_accuracy


@dataclass
class RegressionTaskConfig:
    name: str = "regression"


@dataclass
class ModelConfig:
    name: str = MISSING  # registry name of the builder
    conv_filters: list[int] = field(default_factory=lambda: [32])
    kernel_size: int = 3
    dense_units: list[int] = field(default_factory=lambda: [64])
    output_activation: str | None = None  # null: logits; "softmax": probabilities
    l2: float = 0.0


@dataclass
class MlpModelConfig:
    name: str = MISSING
    hidden_units: list[int] = field(default_factory=lambda: [128, 64])
    activation: str = "relu"  # of the hidden layers (a Keras activation name)
    batch_norm: bool = False  # BatchNormalization between each hidden Dense and its activation
    dropout: float = 0.0  # Dropout rate after each hidden layer; 0: none
    output_activation: str | None = None
    l2: float = 0.0


@dataclass
class ResNetModelConfig:
    name: str = MISSING
    depth: int = 20  # 6n+2: 20, 32, 44, 56, 110
    l2: float = 1e-4
    sync_batch_norm: bool = False  # BatchNormalization over the global batch (all replicas)
    output_activation: str | None = None


@dataclass
class KerasApplicationsModelConfig:
    name: str = MISSING
    architecture: str = "MobileNetV2"  # a keras.applications name, e.g. ResNet50
    kwargs: dict[str, Any] = field(default_factory=dict)  # passed through, e.g. {alpha: 0.35}
    output_activation: str | None = None


@dataclass
class OptimizerConfig:
    name: str = MISSING
    learning_rate: float = 1e-3
    lr_scaling: str = "none"  # none | linear | sqrt (by global batch / base_batch_size)
    base_batch_size: int = 64
    clipnorm: float | None = None


@dataclass
class AdamConfig(OptimizerConfig):
    name: str = "adam"
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-7
    amsgrad: bool = False


@dataclass
class SGDConfig(OptimizerConfig):
    name: str = "sgd"
    learning_rate: float = 0.01
    momentum: float = 0.0
    nesterov: bool = False


@dataclass
class RMSpropConfig(OptimizerConfig):
    name: str = "rmsprop"
    rho: float = 0.9
    momentum: float = 0.0
    epsilon: float = 1e-7


@dataclass
class ScheduleConfig:
    name: str = MISSING
    warmup_epochs: float = 0.0  # linear warmup from 0 to the schedule's value


@dataclass
class ConstantScheduleConfig(ScheduleConfig):
    name: str = "constant"


@dataclass
class StepDecayConfig(ScheduleConfig):
    name: str = "step_decay"
    boundaries: list[int] = field(default_factory=lambda: [3, 7])  # epochs (0-based)
    factors: list[float] = field(default_factory=lambda: [1.0, 0.1, 0.01])  # x learning_rate


@dataclass
class CosineScheduleConfig(ScheduleConfig):
    name: str = "cosine"
    decay_epochs: float | None = None  # null: trainer.epochs
    alpha: float = 0.0  # final fraction of the learning rate


@dataclass
class ExponentialScheduleConfig(ScheduleConfig):
    name: str = "exponential"
    decay_rate: float = 0.9
    decay_epochs: float = 1.0
    staircase: bool = False


@dataclass
class LoopConfig:
    name: str = MISSING
    verbose: int = 1  # 0 silent, 1 progress bar, 2 one line per epoch
    jit_compile: bool = False


@dataclass
class KerasFitLoopConfig(LoopConfig):
    name: str = "keras_fit"
    steps_per_execution: int = 1


@dataclass
class CustomLoopConfig(LoopConfig):
    name: str = "custom"
    steps_per_loop: int = 1


@dataclass
class ThroughputConfig:
    """What the steady-state examples/sec leaves out (results.json, sweep summary)."""

    warmup_epochs: int = 1  # each process's first N epochs (trace, decode, cache fill)
    warmup_steps: int | None = None  # instead: each process's first N steps (then windows)
    windows: int = 5  # runs with < 2 steady epochs: the spread over this many step windows


@dataclass
class TargetConfig:
    """Time-to-accuracy: the first epoch whose `metric` reaches `value`."""

    metric: str | None = None  # a history.csv column: val_accuracy, accuracy...; null: off
    value: float | None = None
    mode: str = "auto"  # max: reached at >= value; min: at <= value; auto: by the metric
    stop: bool = False  # end training at the epoch that reaches it


@dataclass
class EarlyStoppingConfig:
    metric: str | None = None  # a history.csv column; null: off
    patience: int = 3  # epochs without an improvement of more than min_delta, then stop
    min_delta: float = 0.0
    mode: str = "auto"  # max | min | auto (by the metric)


@dataclass
class BestCheckpointConfig:
    metric: str | None = None  # null: trainer.early_stopping.metric (if set), else none kept
    mode: str = "auto"  # max | min | auto (by the metric)


@dataclass
class TrainerConfig:
    epochs: int = 12
    steps_per_epoch: int | None = None  # null: one full pass over the train split
    validate_every: int = 1  # epochs between test-split passes during training; 0: never
    checkpoint_every: int = 1  # epochs
    max_checkpoints: int = 3
    export: bool = True  # SavedModel to saved_model/, reloaded and checked
    grad_accum_steps: int = 1  # micro-batches per optimizer update (effective batch x N)
    throughput: ThroughputConfig = field(default_factory=ThroughputConfig)
    target: TargetConfig = field(default_factory=TargetConfig)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    best_checkpoint: BestCheckpointConfig = field(default_factory=BestCheckpointConfig)
    profile_steps: list[int] | None = None  # [first, last] steps (1-based) traced into logs/


@dataclass
class Config:
    strategy: Any = MISSING
    dataset: Any = MISSING
    model: Any = MISSING
    optimizer: Any = MISSING
    schedule: Any = MISSING
    loop: Any = MISSING
    task: Any = MISSING
    imports: list[str] = field(default_factory=list)  # modules imported before resolving names
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    seed: int = 42
    deterministic: bool = False
    precision: str = "float32"  # float32 | mixed_float16 | mixed_bfloat16 (Keras dtype policy)
    mode: str = "train"  # train | evaluate
    ckpt_path: str | None = None
    objective: str | None = None  # results.json field for sweepers; null: the task's first metric


def register_configs() -> None:
    """Put the schemas in Hydra's ConfigStore (YAML files extend them via `defaults`).

    They are stored as top-level configs named `schema_<group>[_<option>]`, not as groups,
    so `--help` lists only the real option groups.
    """
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    for name, node in SCHEMAS.items():
        cs.store(name=name, node=node)


# A group option's YAML starts with `defaults: [/schema_<...>@_here_, _self_]`.
SCHEMAS: dict[str, type] = {
    "schema_strategy": StrategyConfig,
    "schema_dataset": DatasetConfig,
    "schema_model_cnn": ModelConfig,
    "schema_model_mlp": MlpModelConfig,
    "schema_model_resnet": ResNetModelConfig,
    "schema_model_keras_applications": KerasApplicationsModelConfig,
    "schema_task_classification": ClassificationTaskConfig,
    "schema_task_regression": RegressionTaskConfig,
    "schema_optimizer_adam": AdamConfig,
    "schema_optimizer_sgd": SGDConfig,
    "schema_optimizer_rmsprop": RMSpropConfig,
    "schema_schedule_constant": ConstantScheduleConfig,
    "schema_schedule_step_decay": StepDecayConfig,
    "schema_schedule_cosine": CosineScheduleConfig,
    "schema_schedule_exponential": ExponentialScheduleConfig,
    "schema_loop_keras_fit": KerasFitLoopConfig,
    "schema_loop_custom": CustomLoopConfig,
}


# --------------------------------------------------------------------------- values

Check = tuple[str, Callable[[Any], bool], str]

# numeric results.json fields a run writes, which `objective` may name for sweepers
MODES = (lambda v: v in ("auto", "max", "min"), "must be one of auto, max, min")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")

_POSITIVE = (lambda v: v > 0, "must be > 0")
_NON_NEGATIVE = (lambda v: v >= 0, "must be >= 0")
_METRIC = (lambda v: bool(v.strip()), "must name a history.csv column (e.g. val_loss), or be "
           "null to turn it off")
INT_LIMIT = 2**31  # every integer key of distlab's options is below it (seed: below 2**32)

CHECKS: list[Check] = [
    ("trainer.epochs", *_POSITIVE),
    ("trainer.steps_per_epoch", *_POSITIVE),
    ("trainer.validate_every", *_NON_NEGATIVE),
    ("trainer.checkpoint_every", *_POSITIVE),
    ("trainer.max_checkpoints", *_POSITIVE),
    ("trainer.grad_accum_steps", *_POSITIVE),
    ("trainer.throughput.warmup_epochs", *_NON_NEGATIVE),
    ("trainer.throughput.warmup_steps", *_NON_NEGATIVE),
    ("trainer.throughput.windows", *_POSITIVE),
    ("trainer.target.mode", *MODES),
    ("trainer.target.metric", *_METRIC),
    ("trainer.target.value", finite, "must be a finite number"),
    ("trainer.early_stopping.metric", *_METRIC),
    ("trainer.early_stopping.mode", *MODES),
    ("trainer.early_stopping.patience", *_POSITIVE),
    ("trainer.early_stopping.min_delta", lambda v: finite(v) and v >= 0,
     "must be a finite number >= 0"),
    ("trainer.best_checkpoint.metric", *_METRIC),
    ("trainer.best_checkpoint.mode", *MODES),
    ("trainer.profile_steps", lambda v: len(v) == 2 and 1 <= v[0] <= v[1],
     "must be [first, last] steps with 1 <= first <= last, e.g. [10, 20]"),
    ("precision", lambda v: v in PRECISIONS, "must be one of " + ", ".join(PRECISIONS)),
    ("dataset.batch_size_per_replica", *_POSITIVE),
    ("dataset.shuffle_buffer", *_NON_NEGATIVE),
    ("dataset.preprocess.rescale", *_POSITIVE),
    ("dataset.preprocess.std", lambda v: all(x > 0 for x in v), "entries must be > 0"),
    ("dataset.augment.flip", lambda v: v in ("none", "horizontal", "vertical", "both"),
     "must be one of none, horizontal, vertical, both"),
    ("dataset.augment.crop_padding", *_NON_NEGATIVE),
    ("task.top_k", *_POSITIVE),
    ("strategy.cpu_devices", *_POSITIVE),
    ("strategy.connect_timeout_s", *_POSITIVE),
    ("strategy.slurm_port_base", lambda v: 1024 <= v < 65536, "must be a port in [1024, 65536)"),
    ("strategy.communication", lambda v: v in ("auto", "ring", "nccl"),
     "must be one of auto, ring, nccl"),
    ("strategy.cluster_resolver", lambda v: v in ("tf_config", "slurm"),
     "must be one of tf_config, slurm"),
    ("model.kernel_size", *_POSITIVE),
    ("model.conv_filters", lambda v: all(x > 0 for x in v), "entries must be > 0"),
    ("model.dense_units", lambda v: all(x > 0 for x in v), "entries must be > 0"),
    ("model.l2", *_NON_NEGATIVE),
    ("model.hidden_units", lambda v: all(x > 0 for x in v), "entries must be > 0"),
    ("model.dropout", lambda v: 0 <= v < 1, "must be in [0, 1)"),
    ("model.depth", lambda v: v >= 8 and (v - 2) % 6 == 0,
     "must be 6n+2 with n >= 1 (e.g. 20, 32, 44, 56, 110)"),
    ("model.output_activation", lambda v: v in ("softmax",), "must be null or softmax"),
    ("optimizer.learning_rate", lambda v: v > 0 and math.isfinite(v), "must be finite and > 0"),
    ("optimizer.lr_scaling", lambda v: v in ("none", "linear", "sqrt"),
     "must be one of none, linear, sqrt"),
    ("optimizer.base_batch_size", *_POSITIVE),
    ("optimizer.clipnorm", *_POSITIVE),
    ("optimizer.momentum", lambda v: 0 <= v < 1, "must be in [0, 1)"),
    ("optimizer.epsilon", *_POSITIVE),
    ("schedule.warmup_epochs", *_NON_NEGATIVE),
    ("schedule.decay_epochs", *_POSITIVE),
    ("schedule.decay_rate", *_POSITIVE),
    ("schedule.alpha", lambda v: 0 <= v <= 1, "must be in [0, 1]"),
    ("schedule.boundaries", lambda v: list(v) == sorted(set(v)) and all(b > 0 for b in v),
     "must be strictly increasing epochs > 0"),
    ("schedule.factors", lambda v: all(f > 0 for f in v), "entries must be > 0"),
    ("loop.steps_per_execution", *_POSITIVE),
    ("loop.steps_per_loop", *_POSITIVE),
    ("loop.verbose", lambda v: v in (0, 1, 2), "must be 0, 1 or 2"),
    ("mode", lambda v: v in ("train", "evaluate"), "must be train or evaluate"),
    ("seed", lambda v: 0 <= v < 2**32, "must be in [0, 2**32)"),
    ("objective", lambda v: v in OBJECTIVES or v.startswith("test_"),
     "must name a numeric results.json field: test_loss, test_<metric of the task> (e.g. "
     "test_accuracy, test_rmse), " + ", ".join(o for o in OBJECTIVES if o[:5] != "test_")),
]


JIT_ON_LOGICAL_CPUS = (
    "loop.jit_compile=true cannot run on several logical CPU devices (strategy.cpu_devices>1): "
    "XLA compiles for the one physical CPU and cannot reach the other replicas' variables. "
    "Use jit_compile with one CPU replica (strategy=default or strategy.cpu_devices=1) or "
    "on GPUs, or set loop.jit_compile=false")


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError naming the first impossible value. Never imports TensorFlow."""
    _check_int_range(cfg)
    for key, ok, why in CHECKS:
        value = OmegaConf.select(cfg, key, default=None)
        if value is None or not _distlab_option(cfg, key):
            continue
        try:
            valid = ok(value)
        except TypeError:
            valid, why = False, f"{why} (got a {type(value).__name__})"
        if not valid:
            raise ConfigError(f"{key}={_show(value)} is invalid: {why}")
    boundaries = OmegaConf.select(cfg, "schedule.boundaries", default=None)
    factors = OmegaConf.select(cfg, "schedule.factors", default=None)
    if boundaries is not None and factors is not None and len(factors) != len(boundaries) + 1:
        raise ConfigError(
            f"schedule.factors has {len(factors)} entries but schedule.boundaries has "
            f"{len(boundaries)}: give one factor more than boundaries"
        )
    if cfg.loop.jit_compile and (OmegaConf.select(cfg, "strategy.cpu_devices") or 1) > 1:
        raise ConfigError(JIT_ON_LOGICAL_CPUS)
    target = cfg.trainer.target
    if (target.metric is None) != (target.value is None):
        raise ConfigError("trainer.target needs both metric and value (e.g. "
                          "trainer.target.metric=val_accuracy trainer.target.value=0.99), or "
                          "neither")
    if cfg.mode == "evaluate" and not cfg.ckpt_path:
        raise ConfigError("mode=evaluate needs ckpt_path=<run dir or checkpoint prefix>")
    metrics = builtin_task_metrics(cfg.task)  # a user task's are checked once it is built
    if metrics is not None:
        check_watched(cfg.trainer, list(metrics))


def _check_int_range(cfg: DictConfig) -> None:
    """Integers beyond int32 overflow TensorFlow's counters: refuse them by key."""
    for key, value in _flatten(OmegaConf.to_container(cfg, resolve=True)).items():
        if key.startswith("hydra.") or key == "seed" or not _distlab_option(cfg, key):
            continue
        values = value if isinstance(value, list) else [value]
        if any(isinstance(v, int) and not isinstance(v, bool) and abs(v) >= INT_LIMIT
               for v in values):
            raise ConfigError(f"{key}={_show(value)} is out of range: integer settings must "
                              f"be below 2**31 ({INT_LIMIT})")


def _distlab_option(cfg: DictConfig, key: str) -> bool:
    """Whether `key` belongs to one of distlab's own options (a user's component may use the
    same key names with other meanings; its registered schema checks it instead)."""
    from distlab.registry import REGISTRIES

    group = key.split(".", 1)[0]
    if group not in REGISTRIES or group == "dataset":  # every dataset has distlab's keys
        return True
    name = OmegaConf.select(cfg, f"{group}.name", default=None)
    return name is None or REGISTRIES[group].is_builtin(str(name))


def _show(value: Any) -> str:
    if OmegaConf.is_config(value):
        return str(OmegaConf.to_container(value))
    return repr(value) if isinstance(value, str) else str(value)


# --------------------------------------------------------------------------- reruns

# Keys a rerun into an existing run directory may change: they do not change what the
# optimizer sees (how long, how often to checkpoint or report, where data is read from).
RERUN_NEUTRAL_KEYS = {
    "trainer.epochs", "trainer.export", "trainer.max_checkpoints", "trainer.validate_every",
    "trainer.checkpoint_every", "loop.verbose", "loop.steps_per_loop",
    "loop.steps_per_execution", "loop.jit_compile", "objective", "mode", "ckpt_path",
    "dataset.data_dir", "dataset.cache", "dataset.disk_cache", "dataset.cache_dir",
    "strategy.connect_timeout_s", "trainer.profile_steps", "trainer.throughput.warmup_epochs",
    "trainer.throughput.warmup_steps", "trainer.throughput.windows",
}  # trainer.target is not: whether it was reached is part of the checkpoint


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def effective(config: dict[str, Any]) -> dict[str, Any]:
    """`config` flattened to dotted keys, with what a null stands for filled in where it
    depends on another key (a cosine schedule's decay_epochs: trainer.epochs)."""
    flat = _flatten(config)
    if flat.get("schedule.name") == "cosine" and flat.get("schedule.decay_epochs") is None:
        flat["schedule.decay_epochs"] = flat.get("trainer.epochs")
    return flat


def training_diff(started_with: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Dotted keys whose change would make a rerun train differently from the original run
    (compared by `effective` value: a cosine decay over trainer.epochs is a decay_epochs)."""
    old, new = effective(started_with), effective(now)
    absent = "<absent>"
    return sorted(k for k in old.keys() | new.keys()
                  if k not in RERUN_NEUTRAL_KEYS and old.get(k, absent) != new.get(k, absent))
