"""keras#20585: model.fit under MultiWorkerMirroredStrategy. Standalone repro.

    python keras_20585.py            # starts 2 workers on 127.0.0.1; Keras as it is: both
                                     # fail ("Attempt to convert a value (PerReplica...)")
    python keras_20585.py --fixed    # with distlab.keras_patches.fixes: both train, and their
                                     # weights equal a 1-process, 2-replica run's

Prints BUG, FIXED or MISMATCH and exits 0 for the outcome the mode expects, else 1.
"""

import json
import os
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def train(strategy):
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(1)
    x = np.random.default_rng(0).random((64, 8)).astype("float32")
    y = np.random.default_rng(1).integers(0, 3, 64)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(3)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    model.fit(data.with_options(options), epochs=2, verbose=0, shuffle=False)
    return [w.numpy() for w in model.weights]


def worker(fixed: bool) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    if fixed:
        sys.path.insert(0, os.path.join(HERE, "..", "..", "src"))
        from distlab.keras_patches import fixes as keras_fixes

        assert keras_fixes.apply()
    try:
        weights = train(strategy)
    except (ValueError, tf.errors.OpError) as e:
        print("BUG", str(e).strip().splitlines()[0][:200], flush=True)
        sys.exit(3)
    np.savez(os.environ["REPRO_OUT"], *weights)


def reference() -> list:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    return train(tf.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice()))


def main(fixed: bool) -> int:
    import tempfile

    import numpy as np

    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    out = tempfile.mkdtemp()
    procs = [subprocess.Popen(
        [sys.executable, __file__, "--worker", *(["--fixed"] if fixed else [])],
        env={**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0", "REPRO_OUT": f"{out}/w{i}.npz",
             "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})},
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for i in range(2)]
    outputs = []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:
            p.kill()
            outputs.append("TIMEOUT")
    if any(p.returncode for p in procs):
        print("BUG" if "BUG" in "".join(outputs) else "FAILED", outputs[0].strip()[:300])
        return 1 if fixed else 0
    workers = [list(np.load(f"{out}/w{i}.npz").values()) for i in range(2)]
    ref = reference()
    same = all(np.array_equal(a, b) and np.allclose(a, c, atol=1e-6)
               for a, b, c in zip(workers[0], workers[1], ref, strict=True))
    print("FIXED" if same else "MISMATCH")
    return 0 if fixed and same else 1


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker("--fixed" in sys.argv)
    else:
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
        sys.exit(main("--fixed" in sys.argv))
