"""The two training loops, one interface (`distlab.loops.base.Loop`)."""

from distlab.loops.base import Loop
from distlab.loops.custom import CustomLoop
from distlab.loops.keras_fit import KerasFitLoop
from distlab.registry import Registry

LOOPS: Registry = Registry("loop")
LOOPS.register("keras_fit")(KerasFitLoop)
LOOPS.register("custom")(CustomLoop)

__all__ = ["LOOPS", "Loop", "CustomLoop", "KerasFitLoop"]
