"""The training loops, one interface (`base.Loop`: a loop implements its steps, the
Controller drives the epochs); registered by import path in `distlab.registry.LOOPS`."""

from distlab.training.loops.base import Loop
from distlab.training.loops.custom import CustomLoop
from distlab.training.loops.keras_fit import KerasFitLoop

__all__ = ["Loop", "CustomLoop", "KerasFitLoop"]
