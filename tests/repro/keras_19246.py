"""keras#19246: compile(steps_per_execution>1) with several replicas. Standalone repro.

    python keras_19246.py            # Keras as it is: fails ("You must feed a value for
                                     # placeholder tensor ...")
    python keras_19246.py --fixed    # with distlab.keras_patches.fixes: trains, and its weights
                                     # equal steps_per_execution=1's

Prints BUG, FIXED or MISMATCH and exits 0 for the outcome the mode expects, else 1.
Two logical CPUs; MirroredStrategy with its default (collective) cross-device ops.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras  # noqa: E402


def train(strategy, steps_per_execution: int) -> list[np.ndarray]:
    keras.utils.set_random_seed(1)
    x = np.random.default_rng(0).random((64, 8)).astype("float32")
    y = np.random.default_rng(1).integers(0, 3, 64)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(3)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=steps_per_execution)
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=2, verbose=0,
              shuffle=False)
    return [w.numpy() for w in model.weights]


def main(fixed: bool) -> int:
    if fixed:
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))
        from distlab.keras_patches import fixes as keras_fixes

        assert keras_fixes.apply()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    try:
        blocks = train(strategy, 2)
    except tf.errors.InvalidArgumentError as e:
        lines = [ln for ln in str(e).splitlines() if "placeholder" in ln] or [str(e)]
        print("BUG", lines[0].strip()[:200])
        return 1 if fixed else 0
    single = train(strategy, 1)
    same = all(np.allclose(a, b, atol=1e-6) for a, b in zip(blocks, single, strict=True))
    print("FIXED" if same else "MISMATCH")
    return 0 if fixed and same else 1


if __name__ == "__main__":
    sys.exit(main("--fixed" in sys.argv))
