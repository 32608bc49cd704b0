"""The config: what a composed config may hold and which values it may take (no TensorFlow).

`schema`: the dataclasses, the only home of every key's default, meaning and value rule;
`checks`: `validate`, which applies those rules and the ones relating several keys;
`store`: `register_configs`, the schemas in Hydra's ConfigStore for conf/'s YAMLs to extend;
`reruns`: which keys a rerun may change (`training_diff`, `effective`), and which the
workers of a multi-worker run must share (`worker_config`, `worker_diff`).
"""

from distlab.config.checks import JIT_ON_LOGICAL_CPUS, validate
from distlab.config.reruns import effective, training_diff, worker_config, worker_diff
from distlab.config.schema import DatasetConfig
from distlab.config.store import register_configs

__all__ = ["DatasetConfig", "JIT_ON_LOGICAL_CPUS", "effective", "register_configs",
           "training_diff", "validate", "worker_config", "worker_diff"]
