"""The two training loops, one interface (`distlab.loops.base.Loop`); registered by import
path in `distlab.registry.LOOPS`."""

from distlab.loops.base import Loop
from distlab.loops.custom import CustomLoop
from distlab.loops.keras_fit import KerasFitLoop

__all__ = ["Loop", "CustomLoop", "KerasFitLoop"]
