"""Reproducer: destroying a tf.data iterator can block until tf.data's autotuning thread
wakes up next (TF 2.21, CPU). See docs/BENCHMARKS.md, "Where the time goes".

    TFDS_DATA_DIR=../shared/tensorflow_datasets python benchmarks/iterator_stall.py \
        --strategy mirrored --distribute dff --lives 3,6,12

For each lifetime T it builds distlab's train stream (MNIST, scale, cache, shuffle(10000),
batch(64), repeat, prefetch), iterates it for T seconds under a small `tf.function` step, then
deletes the iterator and times the deletion. The autotuning thread
(`tensorflow::data::model::Model::OptimizeLoop`, started by `RootDataset::Iterator`) sleeps
10 ms, 20 ms, 40 ms ... (doubling, capped at 60 s) between optimisations, so it wakes at
about 0.01 * (2^n - 1) s: 2.55, 5.11, 10.23, 20.47, 40.95, 81.91, then every 60 s. When the
deletion blocks, it ends at the next of these instants; `gdb -p PID -ex "thread apply all
bt"` then shows the Python thread in `RootDataset::Iterator::~Iterator` joining that thread
(under MirroredStrategy via `MultiDeviceIterator::~MultiDeviceIterator`).
"""

from __future__ import annotations

import argparse
import gc
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402

AUTOTUNE = tf.data.AUTOTUNE
WAKEUPS = [0.01 * (2 ** n - 1) for n in range(1, 14)]  # up to 81.91 s
WAKEUPS += [WAKEUPS[-1] + 60 * k for k in range(1, 4)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--strategy", choices=["mirrored", "default"], default="mirrored")
    p.add_argument("--distribute", choices=["eds", "dff", "none"], default="dff",
                   help="experimental_distribute_dataset, distribute_datasets_from_function "
                        "(distlab's custom loop and evaluation), or the plain dataset")
    p.add_argument("--autotune", choices=["on", "off"], default="on",
                   help="tf.data.Options().autotune.enabled on the input dataset")
    p.add_argument("--lives", default="3,6,12", help="iterator lifetimes, seconds")
    a = p.parse_args()

    strategy = (tf.distribute.MirroredStrategy() if a.strategy == "mirrored"
                else tf.distribute.get_strategy())
    train = tfds.load("mnist", split="train", as_supervised=True)
    train = train.map(lambda i, lab: (tf.cast(i, tf.float32) / 255.0, lab),
                      num_parallel_calls=AUTOTUNE).cache()
    for _ in train:  # fill the cache first
        pass
    w = tf.random.uniform((256, 256))

    @tf.function
    def step(iterator):
        images, _ = next(iterator)
        return strategy.run(lambda x: tf.reduce_sum(x) + tf.reduce_sum(tf.matmul(w, w)),
                            args=(images,))

    print(f"strategy={a.strategy} distribute={a.distribute} autotune={a.autotune}")
    for life in [float(x) for x in a.lives.split(",")]:
        ds = train.shuffle(10000).batch(64).repeat().prefetch(AUTOTUNE)
        if a.autotune == "off":
            options = tf.data.Options()
            options.autotune.enabled = False
            ds = ds.with_options(options)
        if a.distribute == "eds":
            ds = strategy.experimental_distribute_dataset(ds)
        elif a.distribute == "dff":
            ds = strategy.distribute_datasets_from_function(lambda ctx, d=ds: d)
        start = time.perf_counter()
        iterator = iter(ds)
        while time.perf_counter() - start < life:
            step(iterator)
        lived = time.perf_counter() - start
        del iterator
        gc.collect()
        ended = time.perf_counter() - start
        nxt = min((t for t in WAKEUPS if t >= lived), default=float("nan"))
        print(f"lived {lived:6.2f} s  delete {ended - lived:6.2f} s  ended at {ended:6.2f} s  "
              f"(next autotune wake-up after {lived:.2f} s: {nxt:.2f} s)", flush=True)


if __name__ == "__main__":
    main()
