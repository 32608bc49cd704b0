"""Hand-written baseline for reference workload 2 (no distlab): the TensorFlow tutorial
"Custom training with tf.distribute.Strategy" (tensorflow/docs
tutorials/distribute/custom_training.ipynb), written for Keras 3.

    TFDS_DATA_DIR=../shared/tensorflow_datasets python benchmarks/baseline_custom_fashion.py \
        --out /tmp/bl --epochs 10

Fashion-MNIST, a custom training loop under MirroredStrategy,
Conv32-MaxPool-Conv64-MaxPool-Flatten-Dense64-Dense10-softmax, Adam 1e-3, 64 examples per
replica; the per-example loss is summed and divided by the *global* batch
(`tf.nn.compute_average_loss`), the train step runs through `strategy.run` inside one
`tf.function` per step, a test pass runs every epoch, a checkpoint every 2 epochs, then
the final test figures.

Settings follow `python run.py experiment=tutorial_custom_fashion` so the two are
equivalent for timing: tfds input with distlab's pipeline (`map(scale, AUTOTUNE)`,
`cache()`, `shuffle(10000)`, `batch(global)`, `prefetch(AUTOTUNE)`; the notebook shuffles
the whole numpy array), softmax outputs without L2, and the checkpoint after epochs 2, 4,
... (the notebook saves after epochs 1, 3, ...). It writes `results.json` in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402

AUTOTUNE = tf.data.AUTOTUNE
STARTED = time.time()  # after the imports, like distlab's wall_time_s / time_to_first_step_s


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory (checkpoints, results)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-per-replica", type=int, default=64)
    p.add_argument("--checkpoint-every", type=int, default=2)
    p.add_argument("--dataset", default="fashion_mnist", help="tfds name (mnist for fit-vs-custom)")
    p.add_argument("--strategy", choices=["mirrored", "default"], default="mirrored")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--data-dir", default=None, help="tfds data dir (default: TFDS_DATA_DIR)")
    return p.parse_args()


def scale(image, label):
    return tf.cast(image, tf.float32) / 255.0, label


def main() -> None:
    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    keras.utils.set_random_seed(args.seed)
    strategy = (tf.distribute.MirroredStrategy() if args.strategy == "mirrored"
                else tf.distribute.get_strategy())
    print(f"Number of devices: {strategy.num_replicas_in_sync}", flush=True)
    global_batch = args.batch_per_replica * strategy.num_replicas_in_sync

    (train, test), info = tfds.load(args.dataset, split=["train", "test"], as_supervised=True,
                                    with_info=True, data_dir=args.data_dir)
    num_train = info.splits["train"].num_examples
    train_ds = (train.map(scale, num_parallel_calls=AUTOTUNE).cache().shuffle(10000)
                .batch(global_batch).prefetch(AUTOTUNE))
    test_ds = (test.map(scale, num_parallel_calls=AUTOTUNE).cache().batch(global_batch)
               .prefetch(AUTOTUNE))
    train_dist = strategy.experimental_distribute_dataset(train_ds)
    test_dist = strategy.experimental_distribute_dataset(test_ds)

    with strategy.scope():
        loss_object = keras.losses.SparseCategoricalCrossentropy(reduction=None)

        def compute_loss(labels, predictions, model_losses):
            per_example_loss = loss_object(labels, predictions)
            loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch)
            if model_losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
            return loss

        test_loss = keras.metrics.Mean(name="test_loss")
        train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
        test_accuracy = keras.metrics.SparseCategoricalAccuracy(name="test_accuracy")

        model = keras.Sequential([
            keras.Input(shape=(28, 28, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ])
        optimizer = keras.optimizers.Adam(learning_rate=1e-3)
        optimizer.build(model.trainable_variables)  # Keras 3: before the step is traced
        checkpoint = tf.train.Checkpoint(optimizer=optimizer, model=model)
    checkpoint_prefix = os.path.join(args.out, "training_checkpoints", "ckpt")

    def train_step(inputs):
        images, labels = inputs
        with tf.GradientTape() as tape:
            predictions = model(images, training=True)
            loss = compute_loss(labels, predictions, model.losses)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        train_accuracy.update_state(labels, predictions)
        return loss

    def test_step(inputs):
        images, labels = inputs
        predictions = model(images, training=False)
        test_loss.update_state(loss_object(labels, predictions))
        test_accuracy.update_state(labels, predictions)

    @tf.function
    def distributed_train_step(dataset_inputs):
        per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    @tf.function
    def distributed_test_step(dataset_inputs):
        return strategy.run(test_step, args=(dataset_inputs,))

    train_seconds, first_step_at = 0.0, None
    for epoch in range(args.epochs):
        start = time.time()
        total_loss, num_batches = 0.0, 0
        for x in train_dist:
            total_loss += distributed_train_step(x)
            num_batches += 1
            if first_step_at is None:
                first_step_at = time.time()
        train_loss = float(total_loss / num_batches)
        train_seconds += time.time() - start
        for x in test_dist:
            distributed_test_step(x)
        if (epoch + 1) % args.checkpoint_every == 0:
            checkpoint.save(checkpoint_prefix)
        print(f"Epoch {epoch + 1}, Loss: {train_loss:.4f}, "
              f"Accuracy: {float(train_accuracy.result()) * 100:.2f}, "
              f"Test Loss: {float(test_loss.result()):.4f}, "
              f"Test Accuracy: {float(test_accuracy.result()) * 100:.2f} "
              f"({time.time() - start:.1f}s)", flush=True)
        final_loss, final_acc = float(test_loss.result()), float(test_accuracy.result())
        test_loss.reset_state()
        train_accuracy.reset_state()
        test_accuracy.reset_state()

    results = {"workload": f"custom_{args.dataset}", "strategy": type(strategy).__name__,
               "num_replicas": strategy.num_replicas_in_sync, "global_batch_size": global_batch,
               "epochs_completed": args.epochs, "test_loss": final_loss,
               "test_accuracy": final_acc,
               "train_examples_per_sec": num_train * args.epochs / max(train_seconds, 1e-9),
               "time_to_first_step_s": first_step_at - STARTED if first_step_at else None,
               "wall_time_s": time.time() - STARTED}
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
