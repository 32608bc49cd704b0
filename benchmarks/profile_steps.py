"""Where the time of reference workload 1 goes, in one process (no start-up, no stalls).

    TFDS_DATA_DIR=../shared/tensorflow_datasets python benchmarks/profile_steps.py \
        --reps 5 fit:mirrored:1 fit:default:1 fit:default:50 custom:default:50

First the input pipeline alone: the first pass over MNIST (tfds reads and decodes the PNG
records, `map(scale)` fills the cache) and a cached epoch (shuffle(10000) + batch(64)).
Then, for each variant `loop:strategy:steps[:xla]`, ms per training step of the tutorial
model (Conv32-MaxPool-Dense64-Dense10, Adam, batch 64) on the cached stream, measured over
--steps steps, alternating the variants --reps times (min and median are printed; the
machine is shared, so the min is the better estimate of the cost itself). fit is timed
from on_train_begin to on_train_end, so the iterator-deletion stall after it (see
iterator_stall.py) is not counted here.

- fit:S:N     model.fit under strategy S (mirrored = MirroredStrategy over the one CPU,
              default = no strategy) with steps_per_execution=N
- custom:S:N  a tf.function running N steps per call (`for _ in tf.range(n)`), as distlab's
              loop=custom with loop.steps_per_loop=N
- floor:S:N   as custom, but over the training images as in-memory tensors (a shuffled
              index, each batch an in-graph gather; no tf.data): benchmarks/floor.py's step
- suffix :xla jit_compile=True
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402

AUTOTUNE = tf.data.AUTOTUNE


def scale(image, label):
    return tf.cast(image, tf.float32) / 255.0, label


def make_model() -> keras.Model:
    return keras.Sequential([
        keras.Input(shape=(28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])


def fit_variant(strategy, steps_per_execution: int, jit: bool, stream):
    with strategy.scope():
        model = make_model()
        model.compile(optimizer=keras.optimizers.Adam(),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=steps_per_execution,
                      jit_compile=jit)
    data = stream()  # one dataset (one iterator inside fit per call)
    clock = _TrainClock()

    def run(steps: int) -> float:
        model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False,
                  callbacks=[clock])
        return clock.seconds  # without the iterator-deletion stall after on_train_end

    return run


class _TrainClock(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.start = time.perf_counter()

    def on_train_end(self, logs=None):
        self.seconds = time.perf_counter() - self.start


def custom_variant(strategy, steps_per_loop: int, jit: bool, stream, in_memory=None):
    with strategy.scope():
        model = make_model()
        optimizer = keras.optimizers.Adam()
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def step(images, labels):
        with tf.GradientTape() as tape:
            per_example = loss_fn(labels, model(images, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=64)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return tf.reduce_sum(per_example)

    if jit:
        step = tf.function(step, jit_compile=True)

    @tf.function
    def loop(iterator, n):
        total = tf.zeros([])
        for _ in tf.range(n):
            images, labels = next(iterator)
            total += strategy.reduce("SUM", strategy.run(step, args=(images, labels)), axis=None)
        return total

    if in_memory is not None:  # batches gathered in the graph from the tensors
        images_all, labels_all = in_memory
        rows = images_all.shape[0]
        position = tf.Variable(0, dtype=tf.int64)
        order = tf.Variable(tf.random.shuffle(tf.range(rows, dtype=tf.int64)))

        @tf.function
        def loop(iterator, n):  # noqa: F811
            total = tf.zeros([])
            for _ in tf.range(n):
                start = position % rows
                index = order[start:start + 64]
                position.assign_add(tf.cast(tf.size(index), tf.int64))
                total += step(tf.gather(images_all, index), tf.gather(labels_all, index))
            return total

        iterator = None
    else:
        iterator = iter(strategy.experimental_distribute_dataset(stream()))  # kept

    def run(steps: int) -> float:
        start, done = time.perf_counter(), 0
        while done < steps:
            n = min(steps_per_loop, steps - done)
            loop(iterator, tf.constant(n, tf.int64)).numpy()
            done += n
        return time.perf_counter() - start

    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("variants", nargs="*",
                   default=["fit:mirrored:1", "fit:default:1", "fit:default:50",
                            "custom:default:50"])
    p.add_argument("--steps", type=int, default=938, help="steps per measurement (1 epoch)")
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()

    start = time.perf_counter()
    train = tfds.load("mnist", split="train", as_supervised=True)
    train = train.map(scale, num_parallel_calls=AUTOTUNE).cache()
    for _ in train.batch(64).prefetch(AUTOTUNE):
        pass
    print(f"input, first pass (read + decode + scale + fill cache): "
          f"{time.perf_counter() - start:.2f} s", flush=True)

    def stream() -> tf.data.Dataset:
        return train.shuffle(10000).batch(64).repeat().prefetch(AUTOTUNE)

    cached = []
    for _ in range(3):
        start = time.perf_counter()
        iterator = iter(stream())
        for _ in range(938):
            next(iterator)
        cached.append(time.perf_counter() - start)
    print(f"input, one cached epoch (shuffle + batch, 938 batches): min {min(cached):.2f} s",
          flush=True)

    in_memory = train.batch(60000).get_single_element()
    strategies = {"default": tf.distribute.get_strategy(),
                  "mirrored": tf.distribute.MirroredStrategy()}
    runs = {}
    for spec in a.variants:
        loop, strategy, n, *rest = spec.split(":")
        make = fit_variant if loop == "fit" else custom_variant
        args = (strategies[strategy], int(n), rest == ["xla"], stream)
        runs[spec] = (custom_variant(*args, in_memory) if loop == "floor" else make(*args))
        runs[spec](max(int(n), 100))  # trace and warm up
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(a.reps):
        for spec, run in runs.items():
            times[spec].append(run(a.steps) / a.steps * 1e3)
    print(f"\n| variant | ms/step (min) | ms/step (median) | "
          f"all ({a.reps} reps of {a.steps} steps) |")
    print("|---|---|---|---|")
    for spec, values in times.items():
        print(f"| {spec} | {min(values):.2f} | {statistics.median(values):.2f} | "
              f"{' '.join(f'{v:.2f}' for v in values)} |")


if __name__ == "__main__":
    main()
