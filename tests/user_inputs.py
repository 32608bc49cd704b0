"""A user's datasets and models with structured inputs (`imports=[user_inputs]`).

Datasets: `mixed_data` (a dict of NumPy arrays: floats, a string category, variable-length
integer ids), `mixed_stream` (the same as a tf.data.Dataset of (dict, label)), `text_data`
(one string per example), `tuple_data` (a tuple of two float inputs), `dict_floats` and
`nested_floats` (a dict and a nested dict of float inputs) and `raw_breast_cancer`
(scikit-learn's 30 raw features). Models: `mixed_net` (StringLookup adapted on the training
split, an Embedding of the ids), `text_net` (TextVectorization adapted on it) and `flat_net`
(any structure of numeric inputs, flattened and concatenated).
"""

from __future__ import annotations

import numpy as np

import distlab

COLORS = np.array(["red", "green", "blue"])
GOOD, BAD, FILLER = ["good", "great", "fine"], ["bad", "awful", "poor"], [
    "the", "a", "movie", "plot", "was", "acting", "really", "quite", "and", "it"]


def mixed_arrays(n: int, seed: int) -> tuple[dict, np.ndarray]:
    """The label is (num[0] > 0) xor (color is red); ids 1..20 of 1 to 6 per example, id 7
    more often in class 1 (a weak signal)."""
    rng = np.random.default_rng(seed)
    num = rng.normal(size=(n, 3)).astype(np.float32)
    color = COLORS[rng.integers(0, 3, n)]
    y = ((num[:, 0] > 0) ^ (color == "red")).astype(np.int64)
    ids = [np.append(rng.integers(1, 21, rng.integers(0, 6)), 7 if label else 3)
           for label in y]
    return {"num": num, "color": color, "ids": ids}, y


@distlab.register("dataset", "mixed_data")
def mixed_data(cfg):
    return distlab.DataSplits(train=mixed_arrays(256, 0), test=mixed_arrays(96, 1),
                              num_classes=2)


@distlab.register("dataset", "mixed_stream")
def mixed_stream(cfg):
    import tensorflow as tf

    def stream(n: int, seed: int) -> tf.data.Dataset:
        x, y = mixed_arrays(n, seed)
        return tf.data.Dataset.from_tensor_slices(({"num": x["num"], "color": x["color"]}, y))

    return distlab.DataSplits(train=stream(256, 0), test=stream(96, 1), num_classes=2)


def sentences(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """3 to 9 words each; class 1 has a word of GOOD, class 0 one of BAD."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    texts = []
    for label in y:
        words = list(rng.choice(FILLER, rng.integers(2, 9)))
        words.insert(int(rng.integers(0, len(words) + 1)), rng.choice(GOOD if label else BAD))
        texts.append(" ".join(words))
    return np.array(texts), y.astype(np.int64)


@distlab.register("dataset", "text_data")
def text_data(cfg):
    return distlab.DataSplits(train=sentences(256, 0), test=sentences(96, 1), num_classes=2)


def tuple_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """a (100, 2) float32, b (100, 4) float64, y = a[:, 0] > b[:, 0]: `tuple_data`'s rows."""
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(100, 2)).astype(np.float32), rng.normal(size=(100, 4))
    return a, b, (a[:, 0] > b[:, 0]).astype(np.int64)


@distlab.register("dataset", "tuple_data")
def tuple_data(cfg):
    a, b, y = tuple_arrays()
    return distlab.DataSplits(train=((a[:80], b[:80]), y[:80]), test=((a[80:], b[80:]), y[80:]),
                              num_classes=2)


def float_columns(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (n, 3) float32 and z (n,) float64 on their own scales, y = x[:, 0] + z > 0."""
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(n, 3)) * [1, 10, 100] + [0, 5, -50]).astype(np.float32)
    z = rng.normal(3.0, 2.0, size=n)
    return x, z, (x[:, 0] + z - 3 > 0).astype(np.int64)


@distlab.register("dataset", "dict_floats")
def dict_floats(cfg):
    """A dict of two float inputs: x (3 features) and z (one value per example)."""
    def split(n, seed):
        x, z, y = float_columns(n, seed)
        return {"x": x, "z": z}, y
    return distlab.DataSplits(train=split(120, 0), test=split(40, 1), num_classes=2)


@distlab.register("dataset", "nested_floats")
def nested_floats(cfg):
    """A nested dict: {"a": {"b": x}, "c": z} (inputs named a_b and c)."""
    def split(n, seed):
        x, z, y = float_columns(n, seed)
        return {"a": {"b": x}, "c": z}, y
    return distlab.DataSplits(train=split(120, 0), test=split(40, 1), num_classes=2)


@distlab.register("model", "flat_net")
def flat_net(cfg, input_shape, outputs, *, input_spec):
    """Every (numeric) input flattened and concatenated, one hidden layer: any structure."""
    import keras
    import tensorflow as tf

    inputs = distlab.keras_inputs(input_spec)
    flat = [keras.layers.Flatten()(t) for t in tf.nest.flatten(inputs)]
    x = keras.layers.Concatenate()(flat) if len(flat) > 1 else flat[0]
    x = keras.layers.Dense(16, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(outputs)(x), name="flat_net")


def breast_cancer_split() -> tuple[np.ndarray, ...]:
    """x_train, x_test, y_train, y_test: 426 / 143 patients, 30 raw float features."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    bunch = load_breast_cancer()
    return train_test_split(bunch.data.astype(np.float32), bunch.target.astype(np.int64),
                            test_size=0.25, random_state=0, stratify=bunch.target)


@distlab.register("dataset", "raw_breast_cancer")
def breast_cancer(cfg):
    x_train, x_test, y_train, y_test = breast_cancer_split()
    return distlab.DataSplits(train=(x_train, y_train), test=(x_test, y_test), num_classes=2)


@distlab.register("model", "mixed_net")
def mixed_net(cfg, input_shape, outputs, *, input_spec, train_inputs):
    """num (standardized or not), color one-hot by a StringLookup adapted on the training
    split, ids averaged by an Embedding (0 is padding); one hidden layer."""
    import keras

    colors = keras.layers.StringLookup(output_mode="one_hot", name="colors")
    colors.adapt(train_inputs.map(lambda x: x["color"]))
    inputs = distlab.keras_inputs(input_spec)
    ids = keras.layers.Embedding(21, 4, mask_zero=True)(inputs["ids"])
    x = keras.layers.Concatenate()([inputs["num"], colors(inputs["color"]),
                                    keras.layers.GlobalAveragePooling1D()(ids)])
    x = keras.layers.Dense(32, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(outputs)(x), name="mixed_net")


@distlab.register("model", "text_net")
def text_net(cfg, input_shape, outputs, input_spec=None, train_inputs=None):
    """Words by a TextVectorization adapted on the training split, embedded, averaged."""
    import keras

    words = keras.layers.TextVectorization(max_tokens=40, name="words")
    words.adapt(train_inputs)
    inputs = distlab.keras_inputs(input_spec)
    x = keras.layers.Embedding(40, 8, mask_zero=True)(words(inputs))
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, keras.layers.Dense(outputs)(x), name="text_net")


def not_a_metric(cfg, task):
    """A metric builder that returns neither a distlab Metric nor a keras.metrics.Metric."""
    return "auc"
