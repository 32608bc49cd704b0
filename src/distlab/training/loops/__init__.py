"""The training loops, one interface (`base.Loop`: a loop implements its steps, the
Controller drives the epochs): `custom` (a hand-written tf.distribute step) and `keras_fit`
(`model.fit`, adapted to the Controller's hooks); registered by import path in
`distlab.registry.LOOPS`, where a user's own Loop subclass registers too."""

from distlab.training.loops.base import Loop
from distlab.training.loops.custom import CustomLoop
from distlab.training.loops.keras_fit import KerasFitLoop

__all__ = ["Loop", "CustomLoop", "KerasFitLoop"]
