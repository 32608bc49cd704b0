"""The training loops, one interface (`base.Loop`: `train_steps(iterator, n) -> EpochSums`
plus `state()`; the Controller runs the epochs of every loop): `custom` (a hand-written
tf.distribute step) and `keras_fit` (Keras' compiled train function, as `model.fit` runs
it); registered by import path in `distlab.registry.LOOPS`, where a user's own Loop subclass
registers too."""

from distlab.training.loops.base import Loop
from distlab.training.loops.custom import CustomLoop
from distlab.training.loops.keras_fit import KerasFitLoop

__all__ = ["Loop", "CustomLoop", "KerasFitLoop"]
