"""What is done to an example's inputs: the inference-time preprocessing
(`dataset.preprocess`: cast, rescale, mean and std, and which inputs `standardize`
normalises), applied before caching and exported with the model, and the train-only image
augmentation (`dataset.augment`), seeded so that it depends on the seed only."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from omegaconf import DictConfig

from distlab.data.structure import describe_inputs, input_names, legacy_input_names
from distlab.errors import DistlabError

log = logging.getLogger(__name__)


def preprocessed_inputs(cfg: DictConfig, raw: Any) -> list[str]:
    """The inputs `dataset.preprocess` applies to (`input_names`), checked.

    `dataset.preprocess.inputs` names them; null: a dataset's one input tensor unless it
    is strings, or the float inputs of a tuple or dict. Any other input reaches the model
    untouched, in its own dtype (strings, integer ids)."""
    names, specs = input_names(raw), tf.nest.flatten(raw)
    dtypes = dict(zip(names, (s.dtype for s in specs), strict=True))
    settings = [(k, cfg[k]) for k in ("rescale", "mean", "std") if cfg[k] is not None]
    if cfg.get("standardize"):
        settings.append(("standardize", "true"))
    chosen = cfg.get("inputs")
    if chosen is not None:
        chosen = [_renamed(str(name), raw) for name in chosen]
        for name in chosen:
            if name not in dtypes:
                raise DistlabError(f"dataset.preprocess.inputs names {name!r}, which is not an "
                                   f"input of this dataset; its inputs: {describe_inputs(raw)}")
            if dtypes[name] == tf.string:
                raise DistlabError(
                    f"dataset.preprocess.inputs names {name!r}, a string input: preprocessing "
                    "(float32, rescale, mean, std, standardize) is for numeric inputs; strings "
                    "reach the model as they are (adapt a TextVectorization or StringLookup "
                    "layer in the model on them)")
        return list(chosen)
    if isinstance(raw, tf.TypeSpec):
        chosen = [] if raw.dtype == tf.string else names
    else:
        chosen = [n for n in names if dtypes[n].is_floating]
    if settings and not chosen:
        key, value = settings[0]
        off = "false" if key == "standardize" else "null"
        if isinstance(raw, tf.TypeSpec):
            raise DistlabError(
                f"dataset.preprocess.{key}={value} cannot apply to this dataset's string "
                f"input: set it to {off} (strings reach the model as they are; adapt a "
                "TextVectorization or StringLookup layer in the model on them)")
        raise DistlabError(
            f"dataset.preprocess.{key}={value} applies to no input: by default it applies to "
            f"the float inputs, and this dataset's are {describe_inputs(raw)}; name the "
            f"numeric inputs to preprocess in dataset.preprocess.inputs, or set it to {off}")
    return chosen


_WARNED_RENAMED: set[str] = set()


def _renamed(name: str, raw: Any) -> str:
    """An input's name, given as it is or as it was before (`0`, `a/b`: a deprecated alias,
    which warns once)."""
    names = input_names(raw)
    old = dict(zip(legacy_input_names(raw), names, strict=True))
    if name in names or name not in old:
        return name
    if name not in _WARNED_RENAMED:
        _WARNED_RENAMED.add(name)
        log.warning("dataset.preprocess.inputs names %r, the name this input had before "
                    "distlab named inputs as the SavedModel's signatures take them; it is now "
                    "%r: write that (the old name is a deprecated alias)", name, old[name])
    return old[name]


def make_preprocess(cfg: DictConfig, raw: Any) -> Callable[[Any], Any]:
    """Raw inputs (one example or a batch; one tensor, a tuple or a dict) -> model inputs:
    each input of `preprocessed_inputs` is cast to float32, divided by `rescale`, then per
    channel (last axis) `mean` is subtracted and it is divided by `std`; the others pass
    through untouched."""
    rescale = cfg.rescale
    mean = None if cfg.mean is None else tf.constant(list(cfg.mean), tf.float32)
    std = None if cfg.std is None else tf.constant(list(cfg.std), tf.float32)
    chosen = set(preprocessed_inputs(cfg, raw))
    names = input_names(raw)
    floats = [n for n, spec in zip(names, tf.nest.flatten(raw), strict=True)
              if n in chosen and spec.dtype.is_floating]
    if rescale is not None and floats:
        log.warning("dataset.preprocess.rescale=%g divides float input(s) %s: rescale is meant "
                    "for integer pixels (uint8 0..255), and a dataset option's rescale is kept "
                    "when only dataset.name changes (mnist's 255); set "
                    "dataset.preprocess.rescale=null unless these floats need it",
                    rescale, ", ".join(floats))
    for name, spec in zip(names, tf.nest.flatten(raw), strict=True):
        channels = spec.shape[-1] if spec.shape.rank else None
        for key, value in (("mean", mean), ("std", std)):
            if (name in chosen and value is not None and channels is not None
                    and value.shape[0] not in (1, channels)):
                where = "the inputs have" if len(names) == 1 else f"input {name!r} has"
                raise DistlabError(f"dataset.preprocess.{key} has {value.shape[0]} entries but "
                                   f"{where} {channels} channels (last axis)")

    def one(x: tf.Tensor) -> tf.Tensor:
        x = tf.cast(x, tf.float32)
        if rescale is not None:
            x = x / float(rescale)
        if mean is not None:
            x = x - mean
        if std is not None:
            x = x / std
        return x

    def preprocess(inputs: Any) -> Any:
        flat = [one(x) if name in chosen else x
                for name, x in zip(names, tf.nest.flatten(inputs), strict=True)]
        return tf.nest.pack_sequence_as(inputs, flat)

    return preprocess


def standardized_inputs(cfg: DictConfig, raw: Any) -> tuple[str, ...]:
    """The inputs `dataset.preprocess.standardize` normalises (by the training split's
    per-feature mean and std, in the model: see `components.models`); () when off."""
    if not cfg.get("standardize"):
        return ()
    chosen = preprocessed_inputs(cfg, raw)
    for name, spec in zip(input_names(raw), tf.nest.flatten(raw), strict=True):
        if name in chosen and spec.shape.rank and spec.shape[-1] is None:
            raise DistlabError(
                f"dataset.preprocess.standardize=true needs each standardized input's last "
                f"axis (its features or channels) to have a known size; input {name!r} has "
                f"shape {tuple(spec.shape)}: leave it out of dataset.preprocess.inputs")
    return tuple(chosen)


def make_augment(cfg: DictConfig, spec: Any) -> Callable | None:
    """(image, seed[2]) -> image: random flips and random crops of a zero-padded image
    (translations by up to `crop_padding` pixels), stateless, so they depend on the seed
    only. None when nothing is configured."""
    flip, pad = cfg.flip, int(cfg.crop_padding)
    if flip == "none" and pad == 0:
        return None
    if not isinstance(spec, tf.TensorSpec) or spec.shape.rank != 3 or spec.dtype == tf.string:
        raise DistlabError(f"dataset.augment works on images (one input of shape (height, "
                           f"width, channels)); this dataset's inputs are "
                           f"{describe_inputs(spec)}. Set dataset.augment.flip=none and "
                           "dataset.augment.crop_padding=0")
    height, width, channels = spec.shape

    def augment(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        seeds = tf.random.experimental.stateless_split(seed, 3)
        if flip in ("horizontal", "both"):
            image = tf.image.stateless_random_flip_left_right(image, seeds[0])
        if flip in ("vertical", "both"):
            image = tf.image.stateless_random_flip_up_down(image, seeds[1])
        if pad:
            image = tf.image.pad_to_bounding_box(image, pad, pad, height + 2 * pad,
                                                 width + 2 * pad)
            image = tf.image.stateless_random_crop(image, [height, width, channels], seeds[2])
        return image

    return augment
