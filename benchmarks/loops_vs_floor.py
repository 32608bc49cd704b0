"""distlab's loops against the compute floor, epoch by epoch in ONE process.

Whole processes minutes apart (`harness.py floor`) see this VM's speed move by 15-40%
between rounds; here each repetition runs one epoch (938 steps) of every variant back to
back, so a variant's ratio to the floor is taken seconds apart. Variants:

- floor:   benchmarks/floor.py's epoch (one `tf.function`, in-graph gather, loss only)
- fit:     experiment=tutorial_keras_mnist_tuned with loop=keras_fit_fast (Keras' compiled
           train function, 50 steps per call)
- custom:  the same with loop=custom_fast (distlab's step, 50 steps per call)
- stream:  the floor's step and epoch function fed by tf.data's batches of the preset's data
           (`Data.train_epochs` through `Loop.distribute`: one gathered batch handed over per
           `next`) instead of in-graph gathers: what tf.data's hand-over costs

Each distlab variant is the preset's experiment as `distlab.train` builds it (data stream,
model, optimizer, schedule, metric sums), driven block by block as the Controller does.
Repetition r starts at variant r (the order rotates, as in `harness.py`). Prints every
repetition's seconds, then per variant the median of its per-repetition ratios to the floor.

    TFDS_DATA_DIR=../shared/tensorflow_datasets python benchmarks/loops_vs_floor.py --reps 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import tensorflow as tf  # noqa: E402
from floor import epoch_function, load_train, make_model, step_function  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from distlab.config import register_configs  # noqa: E402
from distlab.distribute.cluster import Worker  # noqa: E402
from distlab.records.run_dir import RunDir  # noqa: E402
from distlab.registry import LOOPS  # noqa: E402
from distlab.training import experiment, runner  # noqa: E402

LOOP = {"fit": "loop=keras_fit_fast", "custom": "loop=custom_fast"}
VARIANTS = [*LOOP, "stream"]


def preset(*overrides: str):
    with initialize_config_dir(str(HERE.parent / "conf"), version_base="1.3"):
        return compose("config", overrides=["experiment=tutorial_keras_mnist_tuned",
                                            "trainer.epochs=1000", *overrides])


def distlab_epoch(strategy: tf.distribute.Strategy, *overrides: str):
    """One epoch of the preset's loop per call, its blocks as the Controller runs them."""
    cfg = preset(*overrides)
    exp = experiment.build(cfg, RunDir(tempfile.mkdtemp(prefix="loops-vs-floor-")), strategy,
                           Worker(), time.time(), time.time())
    loop = LOOPS.get(cfg.loop.name)(exp)
    iterator, steps = loop.train_iterator(0), exp.data.steps_per_epoch

    def epoch(_: int) -> None:
        done = 0
        while done < steps:
            n = min(loop.steps_per_call, steps - done)
            loop.train_steps(iterator, n).means()  # (reads the block's sums, as each block)
            done += n

    return epoch


def stream_epoch(strategy: tf.distribute.Strategy):
    """One epoch of the floor's step (its model, Adam at 1e-3, the loss only) per call, each
    batch taken from the preset's own training stream inside the one `tf.function`."""
    cfg = preset()
    exp = experiment.build(cfg, RunDir(tempfile.mkdtemp(prefix="loops-vs-floor-")), strategy,
                           Worker(), time.time(), time.time())
    loop = LOOPS.get(cfg.loop.name)(exp)
    iterator = iter(loop.distribute(exp.data.train_epochs(0, cfg.trainer.epochs)))
    steps, step = exp.data.steps_per_epoch, step_function(make_model())

    @tf.function
    def epoch(iterator):
        total = tf.constant(0.0)
        for _ in tf.range(steps):
            x, y, _weights = next(iterator)
            total += step(x, y)
        return total

    return lambda _: float(epoch(iterator))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=8)
    p.add_argument("variants", nargs="*", help="fit, custom, stream (default: fit, custom)")
    args = p.parse_args()
    args.variants = args.variants or ["fit", "custom"]
    if unknown := set(args.variants) - set(VARIANTS):
        p.error(f"unknown variant(s) {sorted(unknown)}: choose from {VARIANTS}")
    register_configs()
    strategy = runner.connect(preset())
    runner.reset_state(0, False)
    images, labels = load_train()
    floor = epoch_function(make_model(), images, labels)
    variants = {"floor": lambda e: float(floor(tf.constant(e, tf.int64)))}
    for name in args.variants:
        variants[name] = (stream_epoch(strategy) if name == "stream"
                          else distlab_epoch(strategy, LOOP[name]))
    for run in variants.values():  # traced, untimed
        run(0)
    seconds: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for rep in range(args.reps):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            variants[name](rep + 1)
            seconds[name].append(time.perf_counter() - start)
        print(f"rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in seconds.items()),
              flush=True)
    for name in args.variants:
        ratios = [a / b for a, b in zip(seconds[name], seconds["floor"], strict=True)]
        print(f"{name}: median epoch {statistics.median(seconds[name]):.3f} s, floor "
              f"{statistics.median(seconds['floor']):.3f} s, median ratio to the floor "
              f"{statistics.median(ratios):.3f} (per repetition: "
              + ", ".join(f"{r:.3f}" for r in ratios) + ")")


if __name__ == "__main__":
    main()
