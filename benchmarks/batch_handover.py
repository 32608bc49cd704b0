"""Where a training batch is gathered: in tf.data (distlab's stream) or in the step.

One process, the compute floor's model and step (`benchmarks/floor.py`: the tutorial's MNIST
model, batch 64, Adam), the train images held in variables, epochs alternating between:

- `floor`: all 938 steps in one `tf.function`, each batch sliced from an in-graph shuffle
  and gathered in the step (no tf.data);
- `data`: row numbers shuffled and batched by tf.data, each batch gathered by tf.data (a
  `map`) and handed to the step with its row weights, 50 steps per `tf.function` call (as
  distlab's stream and `loop=custom_fast` do);
- `step`: the same row numbers from tf.data, gathered inside the step.

Prints each epoch's wall and process CPU seconds and their medians (epoch 0 traces and is
left out). Whole-process A/B of a change is `benchmarks/harness.py compare-repos`; this
isolates the one difference.

    TFDS_DATA_DIR=../shared/tensorflow_datasets python benchmarks/batch_handover.py --reps 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from floor import BATCH, load_train, make_model  # noqa: E402

BLOCK = 50  # steps per tf.function call (loop.steps_per_loop of loop=custom_fast)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=6, help="timed epochs per variant")
    p.add_argument("--variants", default="floor,data,step")
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    images, labels = load_train()
    n = int(images.shape[0])
    steps = -(-n // BATCH)
    x_rows = tf.Variable(images, trainable=False)
    y_rows = tf.Variable(labels, trainable=False)
    model = make_model()
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step(x, y, w):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(loss_fn(y, model(x, training=True)) * w) / BATCH
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return tf.cast(loss, tf.float64)

    def gather(rows):
        return tf.gather(x_rows, rows), tf.gather(y_rows, rows), tf.ones([tf.size(rows)])

    @tf.function
    def floor_epoch(seed):
        order = tf.random.experimental.stateless_shuffle(tf.range(n), seed=tf.stack([seed, 0]))
        total = tf.constant(0.0, tf.float64)
        for i in tf.range(steps):
            total += step(*gather(order[i * BATCH:(i + 1) * BATCH]))
        return total

    @tf.function
    def block_of_batches(iterator, k):
        total = tf.constant(0.0, tf.float64)
        for _ in tf.range(k):
            total += step(*next(iterator))
        return total

    @tf.function
    def block_of_rows(iterator, k):
        total = tf.constant(0.0, tf.float64)
        for _ in tf.range(k):
            total += step(*gather(next(iterator)))
        return total

    def row_numbers(epoch: int) -> tf.data.Dataset:
        return tf.data.Dataset.range(n).shuffle(n, seed=epoch).batch(BATCH)

    def blocks(function, dataset):
        iterator = iter(dataset.prefetch(2))
        for start in range(0, steps, BLOCK):
            function(iterator, tf.constant(min(BLOCK, steps - start)))

    variants = {
        "floor": lambda e: floor_epoch(tf.constant(e, tf.int64)),
        "data": lambda e: blocks(block_of_batches, row_numbers(e).map(gather)),
        "step": lambda e: blocks(block_of_rows, row_numbers(e)),
    }
    names = args.variants.split(",")
    seconds: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for rep in range(args.reps + 1):
        for name in names:
            cpu, wall = time.process_time(), time.perf_counter()
            variants[name](rep)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            print(f"epoch {rep} {name}: {wall:.3f} s wall, {cpu:.3f} s CPU", flush=True)
            if rep:
                seconds[name].append((wall, cpu))
    for name in names:
        walls, cpus = zip(*seconds[name], strict=True)
        print(f"{name}: median {statistics.median(walls):.3f} s wall, "
              f"{statistics.median(cpus):.3f} s CPU per epoch")


if __name__ == "__main__":
    main()
