"""Hand-written baseline for reference workload 1 (no distlab): the TensorFlow tutorial
"Distributed training with Keras" (tensorflow/docs tutorials/distribute/keras.ipynb),
written for Keras 3.

    TFDS_DATA_DIR=../shared/tensorflow_datasets python benchmarks/baseline_keras_mnist.py \
        --out /tmp/bl --epochs 12 --export

MNIST from tfds, `model.fit` under MirroredStrategy, Conv32-MaxPool-Flatten-Dense64-Dense10
(logits), Adam, 64 examples per replica, callbacks: TensorBoard, a checkpoint every epoch,
the step-decay LearningRateScheduler (1e-3, 1e-4 from epoch 3, 1e-5 from epoch 7) and the
per-epoch learning-rate print; then evaluation on the test split and (--export) a SavedModel
export reloaded with and without the strategy.

What it does so that it is the *equivalent* of `python run.py experiment=tutorial_keras_mnist`
(and not only of the notebook), for fair timing:
- the input pipeline is distlab's: `map(scale, AUTOTUNE)`, `cache()`, `shuffle(10000)`,
  `batch(global)`, `prefetch(AUTOTUNE)`; the test split is mapped, cached, batched, prefetched;
- the checkpoint is a `tf.train.CheckpointManager` (model and optimizer, 3 kept), as distlab
  writes; the notebook's `ModelCheckpoint(save_weights_only)` is `--checkpoint h5`;
- `--validate-every N` adds distlab's per-epoch test-split pass (trainer.validate_every);
  the notebook has none (N=0, the default);
- TensorBoard with write_graph=False, as distlab's fit loop.
It writes `results.json` (test_accuracy, train_examples_per_sec, wall_time_s, ...) in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402

AUTOTUNE = tf.data.AUTOTUNE
STARTED = time.time()  # after the imports, like distlab's wall_time_s / time_to_first_step_s


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory (checkpoints, logs, results)")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch-per-replica", type=int, default=64)
    p.add_argument("--validate-every", type=int, default=0,
                   help="test-split pass every N epochs inside fit (0: none, as the tutorial)")
    p.add_argument("--export", action="store_true", help="SavedModel export + reload check")
    p.add_argument("--checkpoint", choices=["manager", "h5"], default="manager",
                   help="manager: tf.train.CheckpointManager (as distlab); h5: the notebook's "
                        "ModelCheckpoint(save_weights_only=True)")
    p.add_argument("--strategy", choices=["mirrored", "default"], default="mirrored")
    p.add_argument("--verbose", type=int, default=2)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--data-dir", default=None, help="tfds data dir (default: TFDS_DATA_DIR)")
    return p.parse_args()


def scale(image, label):
    return tf.cast(image, tf.float32) / 255.0, label


def decay(epoch: int) -> float:
    if epoch < 3:
        return 1e-3
    if epoch < 7:
        return 1e-4
    return 1e-5


class PrintLR(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        lr = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
        print(f"Learning rate for epoch {epoch + 1} is {lr}", flush=True)


class CheckpointEveryEpoch(keras.callbacks.Callback):
    def __init__(self, manager: tf.train.CheckpointManager) -> None:
        super().__init__()
        self.manager = manager

    def on_epoch_end(self, epoch, logs=None):
        self.manager.save(checkpoint_number=epoch + 1)


class TrainTimer(keras.callbacks.Callback):
    """Seconds spent in training steps (validation excluded), for examples/sec."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds, self.first_step_at, self.last_epoch_end = 0.0, None, time.time()
        self._start = None

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.time()

    def on_train_batch_end(self, batch, logs=None):
        if self.first_step_at is None:
            self.first_step_at = time.time()

    def on_test_begin(self, logs=None):
        if self._start is not None:
            self.seconds += time.time() - self._start
            self._start = None

    def on_epoch_end(self, epoch, logs=None):
        self.on_test_begin()
        self.last_epoch_end = time.time()


def main() -> None:
    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    keras.utils.set_random_seed(args.seed)
    strategy = (tf.distribute.MirroredStrategy() if args.strategy == "mirrored"
                else tf.distribute.get_strategy())
    print(f"Number of devices: {strategy.num_replicas_in_sync}", flush=True)
    global_batch = args.batch_per_replica * strategy.num_replicas_in_sync

    (train, test), info = tfds.load("mnist", split=["train", "test"], as_supervised=True,
                                    with_info=True, data_dir=args.data_dir)
    num_train = info.splits["train"].num_examples
    train_ds = (train.map(scale, num_parallel_calls=AUTOTUNE).cache().shuffle(10000)
                .batch(global_batch).prefetch(AUTOTUNE))
    eval_ds = test.map(scale, num_parallel_calls=AUTOTUNE).cache().batch(global_batch)
    eval_ds = eval_ds.prefetch(AUTOTUNE)

    with strategy.scope():
        model = keras.Sequential([
            keras.Input(shape=(28, 28, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ])
        model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optimizer=keras.optimizers.Adam(), metrics=["accuracy"])

    ckpt_dir = os.path.join(args.out, "training_checkpoints")
    timer = TrainTimer()
    callbacks = [timer, keras.callbacks.TensorBoard(log_dir=os.path.join(args.out, "logs"),
                                                    write_graph=False)]
    if args.checkpoint == "h5":
        callbacks.append(keras.callbacks.ModelCheckpoint(
            os.path.join(ckpt_dir, "ckpt_{epoch}.weights.h5"), save_weights_only=True))
    else:
        with strategy.scope():
            checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
        manager = tf.train.CheckpointManager(checkpoint, ckpt_dir, max_to_keep=3)
        callbacks.append(CheckpointEveryEpoch(manager))
    callbacks += [keras.callbacks.LearningRateScheduler(decay), PrintLR()]

    validate = args.validate_every > 0
    model.fit(train_ds, epochs=args.epochs, callbacks=callbacks, verbose=args.verbose,
              shuffle=False, validation_data=eval_ds if validate else None,
              validation_freq=args.validate_every if validate else 1)

    eval_loss, eval_acc = model.evaluate(eval_ds, verbose=args.verbose)
    # end of the last epoch -> evaluated (as distlab's run.log "end gap", see harness.py)
    end_gap = time.time() - timer.last_epoch_end
    print(f"Eval loss: {eval_loss}, Eval accuracy: {eval_acc}", flush=True)

    results = {"workload": "keras_mnist", "strategy": type(strategy).__name__,
               "num_replicas": strategy.num_replicas_in_sync, "global_batch_size": global_batch,
               "epochs_completed": args.epochs, "test_loss": float(eval_loss),
               "test_accuracy": float(eval_acc),
               "train_examples_per_sec": num_train * args.epochs / max(timer.seconds, 1e-9),
               "time_to_first_step_s": (timer.first_step_at - STARTED
                                        if timer.first_step_at else None),
               "end_gap_s": end_gap}
    if args.export:
        path = os.path.join(args.out, "saved_model")
        model.export(path, verbose=False)
        images = next(iter(eval_ds))[0][:32]
        expected = np.asarray(model(images, training=False))
        plain = tf.saved_model.load(path)  # keep a reference: its variables must stay alive
        diff = float(np.max(np.abs(plain.serve(images).numpy() - expected)))
        with strategy.scope():  # inside the scope the loaded model is called via strategy.run
            loaded = tf.saved_model.load(path)
            out = strategy.run(loaded.serve, args=(images,))
        out = strategy.experimental_local_results(out)[0].numpy()
        diff = max(diff, float(np.max(np.abs(out - expected))))
        print(f"SavedModel reloaded with and without the strategy, max abs diff {diff:.2g}")
        results["export_max_abs_diff"] = diff
    results["wall_time_s"] = time.time() - STARTED
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
