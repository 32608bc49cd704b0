"""The config: what a composed config may hold and which values it may take (no TensorFlow).

`schema` holds the structured dataclasses registered in Hydra's ConfigStore (the defaults of
every key), the value checks (`validate`) and the rules about which keys a rerun may change
(`training_diff`, `effective`).
"""

from distlab.config.schema import (
    JIT_ON_LOGICAL_CPUS,
    DatasetConfig,
    effective,
    register_configs,
    training_diff,
    validate,
)

__all__ = ["DatasetConfig", "JIT_ON_LOGICAL_CPUS", "effective", "register_configs",
           "training_diff", "validate"]
