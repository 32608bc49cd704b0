"""The value rules of the schema: `checked(default, RULE)` gives a key its default and
the rule its set value must follow (`checks.validate` applies them; no TensorFlow)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import field
from typing import Any

from distlab.records.results import finite  # noqa: F401 - a rule of the schema's

# (ok(value), why not): `checks.validate` refuses a set value (null is never checked) whose
# ok() is false with "<key>=<value> is invalid: <why>"; a TypeError or AttributeError (a
# value of another kind than the rule reads) counts as false.
Rule = tuple[Callable[[Any], bool], str]


def checked(default: Any, rule: Rule) -> Any:
    """A dataclass field with `default` (a list or dict is copied for each instance) whose
    value must follow `rule`."""
    metadata = {"rule": rule}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def one_of(*choices: str) -> Rule:
    return (lambda v: v in choices, "must be one of " + ", ".join(choices))


POSITIVE: Rule = (lambda v: v > 0, "must be > 0")
NON_NEGATIVE: Rule = (lambda v: v >= 0, "must be >= 0")
ENTRIES_POSITIVE: Rule = (lambda v: all(x > 0 for x in v), "entries must be > 0")
FRACTION: Rule = (lambda v: 0 <= v < 1, "must be in [0, 1)")


def held_out_fraction(validation: str | None) -> float | None:
    """`dataset.validation` as a fraction of train held out, or None (not a number)."""
    try:
        return float(validation)
    except (TypeError, ValueError):
        return None


VALIDATION: Rule = (
    lambda v: (held_out_fraction(v) is None and bool(v.strip()))
    or 0 < (held_out_fraction(v) or 0) < 1,
    "must be auto, a fraction of the train split in (0, 1) such as 0.1, a tfds split or slice "
    "(validation, 'train[90%:]'), or null for none")
# which way a watched metric improves; auto: distlab.records.ranking's rule
MODE = one_of("auto", "max", "min")
METRIC: Rule = (lambda v: bool(v.strip()), "must name a history.csv column (e.g. val_loss), "
                "or be null to turn it off")
OUTPUT_ACTIVATION: Rule = (lambda v: v in ("softmax", "sigmoid"),
                           "must be null, softmax or sigmoid (task=binary)")
RESNET_DEPTH: Rule = (lambda v: v >= 8 and (v - 2) % 6 == 0,
                      "must be 6n+2 with n >= 1 (e.g. 20, 32, 44, 56, 110)")
LEARNING_RATE: Rule = (lambda v: v > 0 and math.isfinite(v), "must be finite and > 0")
FEATURE_NAMES: Rule = (lambda v: isinstance(v, str) and bool(v) or (
    not isinstance(v, str | int | float | bool) and len(v) > 0
    and all(isinstance(k, str) and k for k in v)),
    "must be a feature name or a non-empty list of feature names")
POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")  # Keras' dtype policies
PRECISIONS = (*POLICIES, "auto")  # auto: distlab.components.precision picks one per machine
# a seed: any value in [0, 2**32) (the int32 limit below does not apply to it)
SEED: Rule = (lambda v: 0 <= v < 2**32, "must be in [0, 2**32)")
INT_LIMIT = 2**31  # every integer key of distlab's options is below it (seed: below 2**32)
