r"""Where gradient accumulation's difference from the big batch comes from, per optimizer.

    TFDS_DATA_DIR=../shared/tensorflow_datasets \
        python benchmarks/accumulation_adam.py [ROWS] [EPOCHS]

MNIST, the first ROWS (4096) training rows in a fixed order, an MLP (784-128-10), one device,
op determinism on. For SGD (lr 0.05, no momentum), SGD with momentum 0.9 and Adam (lr 1e-3),
in float32 and float64: EPOCHS (2) epochs of batches of 64 against the same rows as
micro-batches of 32 accumulated 2 at a time (Keras' `gradient_accumulation_steps`, the path
distlab takes on one device; under a strategy distlab's correction reproduces it). Prints,
per update count, the largest weight difference between the two runs, each run's optimizer
step counter (Adam's bias correction reads `iterations`), and the final test-loss difference.
Rounding amplified by the optimizer shows as a difference that grows with the updates in
float32 and vanishes in float64; a counter bug would show in float64 too.
"""

from __future__ import annotations

import sys

import keras
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

OPTIMIZERS = {
    "sgd": lambda **kw: keras.optimizers.SGD(0.05, **kw),
    "sgd_momentum": lambda **kw: keras.optimizers.SGD(0.05, momentum=0.9, **kw),
    "adam": lambda **kw: keras.optimizers.Adam(1e-3, **kw),
}


def data(rows: int, dtype: str):
    train = tfds.as_numpy(tfds.load("mnist", split=f"train[:{rows}]", batch_size=-1,
                                    as_supervised=True))
    test = tfds.as_numpy(tfds.load("mnist", split="test", batch_size=-1, as_supervised=True))
    cast = lambda x: (x.reshape(len(x), -1) / 255.0).astype(dtype)  # noqa: E731
    return (cast(train[0]), train[1]), (cast(test[0]), test[1])


def train(name: str, dtype: str, batch: int, accumulate: int, epochs: int, train_data,
          test_data, every: int) -> tuple[list[np.ndarray], float, int]:
    """Weights after every `every` updates, the final test loss, the step counter."""
    keras.backend.set_floatx(dtype)
    keras.config.set_dtype_policy(dtype)  # (floatx alone does not change the layers' dtype)
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(10)])
    extra = {"gradient_accumulation_steps": accumulate} if accumulate > 1 else {}
    opt = OPTIMIZERS[name](**extra)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    x, y = train_data
    snapshots, micro = [], 0
    for _ in range(epochs):
        for start in range(0, len(x), batch):
            step(x[start:start + batch], y[start:start + batch])
            micro += 1
            if micro % (accumulate * every) == 0:
                snapshots.append(np.concatenate([w.numpy().ravel()
                                                 for w in model.trainable_variables]))
    test_loss = float(loss_fn(test_data[1], model(test_data[0], training=False)))
    return snapshots, test_loss, int(opt.iterations.numpy())


def main(rows: int = 4096, epochs: int = 2) -> None:
    tf.config.experimental.enable_op_determinism()
    every = 8
    for dtype in ("float32", "float64"):
        train_data, test_data = data(rows, dtype)
        for name in OPTIMIZERS:
            big, big_loss, big_steps = train(name, dtype, 64, 1, epochs, train_data, test_data,
                                             every)
            acc, acc_loss, acc_steps = train(name, dtype, 32, 2, epochs, train_data, test_data,
                                             every)
            diffs = [float(np.max(np.abs(a - b))) for a, b in zip(big, acc, strict=True)]
            shown = {every * (i + 1): f"{d:.1e}" for i, d in enumerate(diffs)
                     if (i + 1) in (1, 2, 5, 10) or i + 1 == len(diffs)}
            print(f"{dtype} {name:12s} updates {big_steps} vs {acc_steps}; max |dw| after n "
                  f"updates {shown}; test loss {big_loss:.9f} vs {acc_loss:.9f}, |diff| "
                  f"{abs(big_loss - acc_loss):.1e}", flush=True)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
