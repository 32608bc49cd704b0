"""The structure of an example's input, as a Keras model takes it: one tensor, a tuple or a
dict of named inputs (`tf.nest` structures), of any dtype, strings included. Ragged inputs
become dense per example (`dense_inputs`), and a batch whose inputs have a dimension of
unknown length is padded to its longest example (`batched`): 0 for numbers, "" for strings.
Inputs are named as the exported SavedModel's signatures take them (`input_names`)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from distlab.errors import DistlabError

AUTOTUNE = tf.data.AUTOTUNE


def dense_inputs(ds: tf.data.Dataset) -> tf.data.Dataset:
    """`ds` with its inputs in the shapes a Keras model takes: ragged ones dense per example
    (padded to the example's longest row; batches then pad to their longest example, see
    `batched`), and a numeric input with one value per example (a 1-D column) shaped (1,),
    as `keras.Input(shape=(1,))`, Dense and Concatenate expect; a string stays one string
    per example (shape ()), as StringLookup and TextVectorization expect."""
    if not (any(isinstance(s, tf.RaggedTensorSpec) for s in tf.nest.flatten(ds.element_spec))
            or any(_numeric_scalar(s) for s in tf.nest.flatten(ds.element_spec[0]))):
        return ds

    def shaped(x: Any) -> Any:
        if isinstance(x, tf.RaggedTensor):
            x = x.to_tensor()
        return tf.reshape(x, [1]) if _numeric_scalar(x) else x

    def dense(x: Any) -> Any:
        return x.to_tensor() if isinstance(x, tf.RaggedTensor) else x

    return ds.map(lambda x, y: (tf.nest.map_structure(shaped, x), dense(y)),
                  num_parallel_calls=AUTOTUNE)


def _numeric_scalar(x: Any) -> bool:
    """Whether `x` (a tensor or spec) holds one number (not a string)."""
    return isinstance(x, tf.Tensor | tf.TensorSpec) and x.shape.rank == 0 \
        and x.dtype != tf.string


def batched(ds: tf.data.Dataset, size: int) -> tf.data.Dataset:
    """Batches of `size` rows; padded to each batch's longest example (0, or "" for strings)
    where an input has a dimension of unknown length."""
    if all(s.shape.is_fully_defined() for s in tf.nest.flatten(ds.element_spec)):
        return ds.batch(size)
    return ds.padded_batch(size)


def input_names(spec: Any) -> list[str]:
    """The names of the inputs, in tf.nest's order, as the exported SavedModel's signatures
    take them: one tensor is `inputs`; a dict's inputs are its keys, a tuple's `input_0`,
    `input_1`, ...; nested, the path joined by `_` (`a_b`, `a_0`). Any character but an
    ASCII letter, digit or `_` becomes `_`, and a name that does not start with a letter gets
    `input_` in front, so that TensorFlow keeps each name as it is (it renames an argument
    such as `0` or `a/b`). Two inputs with one name are refused."""
    if isinstance(spec, tf.TypeSpec):
        return ["inputs"]
    paths = list(_paths(spec))
    assert len(paths) == len(tf.nest.flatten(spec)), (paths, spec)
    named: dict[str, tuple[str, ...]] = {}
    for path in paths:
        name = input_name(path)
        if name in named:
            raise DistlabError(
                f"the inputs {'/'.join(named[name])!r} and {'/'.join(path)!r} would both be "
                f"named {name!r} (an input's name, which the exported SavedModel's signatures "
                "take, keeps ASCII letters, digits and '_' only): rename one of the dict keys "
                "in the dataset builder")
        named[name] = path
    return list(named)


def legacy_input_names(spec: Any) -> list[str]:
    """The names the inputs had before they were made valid signature names: a tuple's
    positions (`0`, `1`), nested paths joined by `/` (`a/b`); deprecated aliases."""
    if isinstance(spec, tf.TypeSpec):
        return ["inputs"]
    return ["/".join(path) for path in _paths(spec)]


def input_name(path: tuple[str, ...]) -> str:
    name = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_"
                   for c in "_".join(path))
    return name if name[:1].isascii() and name[:1].isalpha() else f"input_{name}"


def _paths(node: Any, prefix: tuple[str, ...] = ()):
    """The paths (keys, positions) of a structure's leaves in tf.nest's order (dict keys
    sorted)."""
    if isinstance(node, dict):
        for key in sorted(node):
            yield from _paths(node[key], (*prefix, str(key)))
    elif isinstance(node, tuple | list):
        fields = getattr(node, "_fields", None) or range(len(node))
        for field, value in zip(fields, node, strict=True):
            yield from _paths(value, (*prefix, str(field)))
    else:
        yield prefix


def named_specs(spec: Any) -> Any:
    """`spec` with each tf.TensorSpec named as its input (`input_names`), for keras.Input."""
    flat = [tf.TensorSpec(s.shape, s.dtype, name=name)
            for s, name in zip(tf.nest.flatten(spec), input_names(spec), strict=True)]
    return tf.nest.pack_sequence_as(spec, flat)


def input_shapes(spec: Any) -> Any:
    """One input's shape per example as a tuple; for several, the same structure of them."""
    return tf.nest.map_structure(lambda s: tuple(s.shape), spec)


def describe_inputs(spec: Any) -> str:
    """`name: dtype shape, ...`, for messages."""
    return ", ".join(f"{name}: {s.dtype.name} {tuple(s.shape)}" for name, s in
                     zip(input_names(spec), tf.nest.flatten(spec), strict=True))


def count_rows(ds: tf.data.Dataset) -> int:
    """The rows of `ds`: its cardinality, else counted in one pass."""
    n = int(ds.cardinality())
    if n >= 0:
        return n
    return int(ds.reduce(tf.constant(0, tf.int64), lambda c, _: c + 1))
