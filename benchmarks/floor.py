"""The compute floor of reference workload 1: what an epoch of the tutorial's training costs
with nothing around it.

The tutorial's MNIST model (Conv32-MaxPool-Dense64-Dense10), batch 64, Adam (1e-3), all
938 steps of an epoch in ONE `tf.function` over the training images already in memory as
tensors (a shuffled index per epoch, each batch an in-graph gather): no tf.data, no
strategy, no callbacks, no metrics but the loss. Prints each epoch's seconds and the median
of epochs 2 to the last (epoch 1 traces); `--out DIR` also writes DIR/results.json
(`floor_epoch_s`, `epoch_seconds`), as the harness reads it
(`python benchmarks/harness.py floor`).

    TFDS_DATA_DIR=../shared/tensorflow_datasets python benchmarks/floor.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402
from lockstep import take_turn  # noqa: E402

BATCH = 64


def make_model() -> keras.Model:
    return keras.Sequential([
        keras.Input(shape=(28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])


def load_train() -> tuple[tf.Tensor, tf.Tensor]:
    images, labels = tfds.as_numpy(tfds.load("mnist", split="train", as_supervised=True,
                                             batch_size=-1))
    return (tf.constant(images.astype(np.float32) / 255.0), tf.constant(labels))


def step_function(model: keras.Model):
    """The floor's training step, `step(x, y) -> loss`: Adam (1e-3) on the mean sparse
    cross-entropy of the logits, nothing else."""
    optimizer = keras.optimizers.Adam(1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer.build(model.trainable_variables)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    return step


def epoch_function(model: keras.Model, images: tf.Tensor, labels: tf.Tensor):
    step = step_function(model)
    n = int(images.shape[0])
    steps = -(-n // BATCH)

    @tf.function
    def epoch(seed):
        order = tf.random.experimental.stateless_shuffle(tf.range(n), seed=tf.stack([seed, 0]))
        total = tf.constant(0.0)
        for i in tf.range(steps):
            rows = order[i * BATCH:(i + 1) * BATCH]
            total += step(tf.gather(images, rows), tf.gather(labels, rows))
        return total / tf.cast(steps, tf.float32)

    return epoch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--out", default=None, help="write results.json here")
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    images, labels = load_train()
    epoch = epoch_function(make_model(), images, labels)
    seconds = []
    take_turn()  # (`harness.py floor --lockstep`: one epoch per turn; else nothing)
    for e in range(args.epochs):
        start = time.perf_counter()
        loss = float(epoch(tf.constant(e, tf.int64)))
        seconds.append(time.perf_counter() - start)
        take_turn()
        print(f"epoch {e + 1}/{args.epochs}: {seconds[-1]:.3f} s, mean loss {loss:.4f}",
              flush=True)
    steady = statistics.median(seconds[1:]) if len(seconds) > 1 else seconds[0]
    print(f"floor: {steady:.3f} s per epoch (median of epochs 2-{len(seconds)})")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump({"workload": "floor", "epochs_completed": args.epochs,
                       "floor_epoch_s": steady, "epoch_seconds": seconds,
                       "train_examples_per_sec": 60000 / steady}, f, indent=2)


if __name__ == "__main__":
    main()
