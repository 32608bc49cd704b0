"""The `loop` group's keys: how each training step runs (keras_fit or custom)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from distlab.config.schema.rules import (
    POSITIVE,
    checked,
)


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
