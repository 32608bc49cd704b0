"""Hypothesis strategies of distlab's configuration space, read from the schema and conf/.

`overrides()` draws a command line: an option of every group (conf/<group>/*.yaml; an
experiment or none) and a few keys of the chosen options' schemas (src/distlab/config/
schema/), each with a value of its type: `valid=True` the values its rule accepts among small
candidates (a rule's choices; the seeds, always drawn, over their whole range), else also the
edges (bounds, null, nan, wrong types). A new key, option or group is drawn without editing
this module.

`runs()` draws what a tiny in-process training run can take: one of the data worlds below (a
dataset of conf/ or a test builder, with the tasks and models that fit its inputs), the other
groups' options, valid values of the keys the harness does not set, and 1 to 3 replicas.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from distlab.config.schema import GROUP_SCHEMAS, Config, DatasetConfig
from distlab.config.store import schema_names
from distlab.errors import hydra_value
from distlab.records.fields import OBJECTIVES
from distlab.records.metrics import BUILTIN_METRICS

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
# users' config dirs (`--config-dir`): more options of distlab's groups, on user schemas or
# none (the example projects'); drawn with the `hydra.searchpath` that adds them
USER_CONF = tuple(sorted(ROOT.glob("examples/*/conf")))
# groups that are not one run's settings
NOT_DRAWN = {"hparams_search": "a sweep of many runs (Optuna), not one run's configuration"}
# free-text keys whose valid values depend on the data: what tiny training runs draw (a
# split the data lacks, or one overlapping another, is refused once the data is read)
PLAUSIBLE = {"dataset.train_split": ("train", "train[:50%]"),
             "dataset.test_split": ("test", "test[:50%]"),
             "dataset.validation": ("auto", "0.25", None)}
# keys whose values are user code (a dict of Keras callbacks, a constructor's kwargs)
USER_CODE = {"callbacks", "model.kwargs"}


@dataclass(frozen=True)
class Leaf:
    """One key of the schema: its dotted name, type, default and rule (None: any value)."""

    key: str
    type: Any
    default: Any
    rule: tuple | None


@functools.cache
def group_options(users: bool = False) -> dict[str, tuple[str | None, ...]]:
    """{group: its options}, from conf/ (experiment: also none); `users`: and from the
    users' config dirs."""
    groups = {}
    for folder in sorted(p for p in CONF.iterdir() if p.is_dir() and p.name not in NOT_DRAWN
                         and not p.name.startswith("_")):
        names = {p.stem for p in folder.glob("*.yaml")}
        for conf in USER_CONF if users else ():
            names |= {p.stem for p in (conf / folder.name).glob("*.yaml")}
        options = tuple(sorted(names))
        groups[folder.name] = (None, *options) if folder.name == "experiment" else options
    return groups


@functools.cache
def option_dir(group: str, option: str) -> Path:
    """The config dir that holds a group option: conf/, else a user's."""
    return next((conf for conf in (CONF, *USER_CONF)
                 if (conf / group / f"{option}.yaml").is_file()), CONF)


def _defaults(group: str, option: str) -> list:
    path = option_dir(group, option) / group / f"{option}.yaml"
    return yaml.safe_load(path.read_text()).get("defaults", []) or []


@functools.cache
def option_schema(group: str, option: str) -> type | None:
    """The schema dataclass a group option extends (`/schema_<group>[_<kind>]@_here_`, or that
    of the option of the same group it extends)."""
    for entry in _defaults(group, option):
        if isinstance(entry, str) and entry.startswith("/schema_"):
            name = entry[1:].split("@")[0]  # schema_dataset_common: a user dataset's
            return schema_names().get(name, DatasetConfig if "dataset" in name else None)
        if isinstance(entry, str) and entry != "_self_":
            return option_schema(group, entry)
    return None


@functools.cache
def experiment_groups(option: str | None) -> dict[str, str]:
    """{group: option} that an experiment chooses (its `override /group: option` lines and
    those of the experiments it extends)."""
    if option is None:
        return {}
    chosen: dict[str, str] = {}
    for entry in _defaults("experiment", option):  # (cached: callers copy it)
        if isinstance(entry, str) and entry != "_self_":
            chosen.update(experiment_groups(entry))
        elif isinstance(entry, dict):
            for key, value in entry.items():
                chosen[key.removeprefix("override ").strip("/ ")] = value
    return chosen


def leaves(schema: type = Config, prefix: str = "") -> list[Leaf]:
    """Every key of `schema` and of the dataclasses under it (the groups are left out at the
    top: their options' schemas give their keys)."""
    hints = typing.get_type_hints(schema)
    found = []
    for f in dataclasses.fields(schema):
        key = prefix + f.name
        if not prefix and f.name in GROUP_SCHEMAS or key in USER_CODE:
            continue
        if dataclasses.is_dataclass(f.default_factory):
            found += leaves(f.default_factory, f"{key}.")
            continue
        default = (f.default if f.default is not dataclasses.MISSING else
                   f.default_factory() if f.default_factory is not dataclasses.MISSING
                   else None)
        found.append(Leaf(key, hints[f.name], default, f.metadata.get("rule")))
    return found


@functools.cache
def group_leaves(group: str, option: str) -> tuple[Leaf, ...]:
    """The keys of a group option (its name is the option's: not drawn)."""
    schema = option_schema(group, option)
    if schema is None:
        return ()
    return tuple(leaf for leaf in leaves(schema, f"{group}.") if leaf.key != f"{group}.name")


def accepts(rule: tuple | None, value: Any) -> bool:
    """Whether `rule` accepts `value` (null is never checked), as checks.validate asks."""
    if rule is None or value is None:
        return True
    try:
        return bool(rule[0](value))
    except (TypeError, AttributeError):
        return False


def choices(rule: tuple | None) -> tuple | None:
    """The values of a `one_of(...)` rule (its closure's `choices`), else None."""
    if rule is None:
        return None
    return inspect.getclosurevars(rule[0]).nonlocals.get("choices")


@functools.cache
def _all_leaves() -> tuple[Leaf, ...]:
    every = leaves()
    for group in group_options():
        for option in group_options()[group]:
            if option is not None and group != "experiment":
                every += group_leaves(group, option)
    return tuple(every)


@functools.cache
def vocabulary() -> tuple[str, ...]:
    """The strings a free-text key is drawn from: the schema's own string defaults and
    choices, the history columns and results fields a metric key may name, split specs."""
    words = {"train", "test", "validation", "train[:50%]", "train[50%:]", "0.25", "auto"}
    for leaf in _all_leaves():
        if isinstance(leaf.default, str):
            words.add(leaf.default)
        words.update(c for c in choices(leaf.rule) or () if isinstance(c, str))
    for metric in (*BUILTIN_METRICS, "loss"):
        words.update({metric, f"val_{metric}"})
    words.update(OBJECTIVES)
    return tuple(sorted(words))


def _plain(t: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    args = typing.get_args(t)
    if typing.get_origin(t) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return t, False


def _whole_range(rule: tuple | None) -> bool:
    """A seed's rule: every value in [0, 2**32)."""
    return accepts(rule, 0) and accepts(rule, 2**32 - 1) and not accepts(rule, 2**32)


def _scalars(t: Any, leaf: Leaf, valid: bool) -> st.SearchStrategy:
    default = leaf.default if not isinstance(leaf.default, list) else None
    if t is bool:
        return st.booleans() if valid else st.sampled_from([True, False, "maybe", 2])
    if t is int:
        if _whole_range(leaf.rule):  # a seed: its range's ends, or any in it
            whole = st.sampled_from([0, 2**32 - 1]) | st.integers(0, 2**32 - 1)
            return whole if valid else whole | st.sampled_from([-1, 2**32, 2**32 + 7])
        small = sorted({0, 1, 2, 3} | ({default} if isinstance(default, int) and 0 <= default
                                       <= 3 else set()))
        if valid:
            return st.sampled_from(small)
        return st.sampled_from([-1, *small, 2**31 - 1, 2**31, 2**32, 10**20, 1.5, "abc"]) \
            | st.integers(-3, 130)
    if t is float:
        near = {0.0, 0.1, 0.5, 1.0} | ({float(default), float(default) / 10}
                                       if isinstance(default, int | float) else set())
        if valid:
            return st.sampled_from(sorted(near))
        return st.sampled_from([*sorted(near), -1.0, 1e30, math.nan, math.inf, -math.inf,
                                "abc"])
    given = choices(leaf.rule) or vocabulary()
    if t is str:
        if valid and leaf.key in PLAUSIBLE:
            return st.sampled_from(PLAUSIBLE[leaf.key])
        if valid and leaf.rule is None and default is not None:  # free text: an activation
            return st.just(default)
        return st.sampled_from(given) if valid else st.sampled_from(
            [*given, "", " ", "nope", 3])
    # Any: what its default is, the vocabulary and small numbers
    anything = [default, 0, 1, 2, "auto", *given[:8]]
    return st.sampled_from(anything) if valid else st.sampled_from([*anything, True, -1, ""])


def values(leaf: Leaf, valid: bool) -> st.SearchStrategy:
    """A value of `leaf`'s type (valid: one its rule accepts)."""
    t, optional = _plain(leaf.type)
    if typing.get_origin(t) is list:
        (item,) = typing.get_args(t)
        inner = _scalars(item, Leaf(leaf.key, item, None, None), valid)
        drawn = st.lists(inner, max_size=3)
        if not valid:
            drawn = drawn | st.sampled_from(["[", 5])
    else:
        drawn = _scalars(t, leaf, valid)
    if optional or not valid:
        drawn = drawn | st.none()
    return drawn.filter(lambda v: accepts(leaf.rule, v)) if valid else drawn


def render(value: Any) -> str:
    """A value as a Hydra override writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, list):
        return "[" + ",".join(render(v) for v in value) + "]"
    if isinstance(value, str):
        return hydra_value(value)
    return repr(value)


def override(key: str, value: Any) -> str:
    return f"{key}={render(value)}"


@st.composite
def overrides(draw, valid: bool = False, max_keys: int = 4,
              fixed: frozenset[str] = frozenset(), groups: dict | None = None,
              users: bool = False) -> list[str]:
    """A command line: an option of each group (`groups` narrows some; `users`: the users'
    config dirs' too), then up to `max_keys` keys of the chosen options (none of `fixed`)
    with drawn values."""
    options = {**group_options(users), **(groups or {})}
    experiment = draw(st.sampled_from(options.pop("experiment", (None,))))
    chosen: dict[str, str] = {}
    line = [f"experiment={experiment}"] if experiment else []
    by_experiment = experiment_groups(experiment)
    for group, names in options.items():
        if by_experiment.get(group) in names and draw(st.booleans()):  # as the experiment chose
            chosen[group] = by_experiment[group]
            continue
        chosen[group] = draw(st.sampled_from(names))
        line.append(f"{group}={chosen[group]}")
    keys = [leaf for leaf in [*leaves(), *(leaf for group, option in chosen.items()
                                           for leaf in group_leaves(group, option))]
            if leaf.key not in fixed]
    picked = draw(st.lists(st.sampled_from(keys), max_size=max_keys,
                           unique_by=lambda leaf: leaf.key))
    if valid:  # every run has its seeds: drawn each time, over their whole range
        picked += [leaf for leaf in keys if _whole_range(leaf.rule) and leaf not in picked]
    for leaf in picked:
        line.append(override(leaf.key, draw(values(leaf, valid))))
    dirs = sorted({option_dir(g, o) for g, o in [*chosen.items(), ("experiment", experiment)]
                   if o is not None} - {CONF})
    if dirs:  # as `--config-dir` adds a user's
        line.append("hydra.searchpath=[" + ",".join(f"file://{d}" for d in dirs) + "]")
    return line


# ---- runs that train: the data each option can meet
@dataclass(frozen=True)
class World:
    """A dataset with the tasks and models that fit its inputs and labels (models: None:
    every model option of conf/, each sized to the data)."""

    name: str
    option: str  # the dataset option of conf/ it starts from
    dataset: tuple[str, ...]
    tasks: tuple[str, ...]
    models: tuple[tuple[str, ...], ...] | None = None
    unfit: tuple[str, ...] = ()  # keys (prefixes) its data cannot take: augment non-images


_MLP = ("model=mlp", "model.hidden_units=[8]")
IMAGES_ONLY = ("dataset.augment.",)
_FLAT = ("model.name=flat_net",)
WORLDS = (  # the cheapest first: Hypothesis' first example of a test is its simplest
    # tests/user_inputs.py's builders: a tuple, a dict, a nested dict of floats, mixed types
    *(World(name, "mnist", ("imports=[user_inputs]", f"dataset.name={name}",
                            "dataset.preprocess.rescale=null"), ("classification", "binary"),
            (_FLAT,) + ((_MLP,) if name == "raw_breast_cancer" else ()), IMAGES_ONLY)
      for name in ("tuple_data", "dict_floats", "nested_floats", "raw_breast_cancer")),
    World("mixed_data", "mnist", ("imports=[user_inputs]", "dataset.name=mixed_data",
                                  "dataset.preprocess.rescale=null"),
          ("classification", "binary"), (("model.name=mixed_net",),), IMAGES_ONLY),
    # conftest's tfds set with its own feature names and a float label
    World("tiny_regression", "mnist", ("dataset.name=tiny_regression", "dataset.features.input="
                                       "measurements", "dataset.features.label=target",
                                       "dataset.preprocess.rescale=null"), ("regression",),
          (_MLP,), IMAGES_ONLY),
    # conf/'s datasets are tfds image classification sets (conftest's tiny copies)
    *(World(option, option, (), ("classification",))
      for option in group_options()["dataset"]),
)
# set by the harness or by the world, or not one run's business (files, clusters, trackers)
HARNESS = frozenset({
    "dataset.data_dir", "dataset.cache_dir", "dataset.features.input", "dataset.features.label",
    "trainer.epochs", "trainer.steps_per_epoch", "loop.verbose", "mode", "ckpt_path",
    "imports", "strategy.cpu_devices", "strategy.device", "strategy.cluster_resolver",
    "strategy.communication", "strategy.connect_timeout_s", "strategy.slurm_port_base",
    "logger.tracking_uri", "logger.experiment_name", "trainer.profile_steps",
    # one value per channel or input of the data: refused once the data is read if not
    "dataset.preprocess.mean", "dataset.preprocess.std", "dataset.preprocess.inputs",
})
# options a one-process run on tiny data does not take (a cluster; MLflow's store)
NOT_IN_PROCESS = {"strategy": ("multi_worker_mirrored",), "logger": ("mlflow",),
                  "experiment": ("cifar10_resnet20",)}


@st.composite
def runs(draw, fixed: frozenset[str] = frozenset(), max_keys: int = 3,
         groups: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """The overrides of a tiny training run that should complete: a world, its task and
    model, the other groups' options (`groups` narrows some), valid values of up to
    `max_keys` keys (none of `fixed`), 1-3 replicas."""
    world = draw(st.sampled_from(WORLDS))
    task = draw(st.sampled_from(world.tasks))
    narrowed = {group: tuple(o for o in names if o not in NOT_IN_PROCESS.get(group, ()))
                for group, names in {**group_options(), **(groups or {})}.items()}
    narrowed["task"] = (task,)
    narrowed["dataset"] = (world.option,)
    if world.models is not None or not world.name.endswith("mnist"):
        narrowed["experiment"] = (None,)  # the experiments are MNIST-family presets
    if world.models is not None:
        narrowed["model"] = ("mlp",)
    unfit = {leaf.key for leaf in _all_leaves() if leaf.key.startswith(world.unfit or "\0")}
    line = draw(overrides(valid=True, max_keys=max_keys, groups=narrowed,
                          fixed=HARNESS | fixed | unfit | {"dataset.name"}))
    line += list(world.dataset)
    if world.models is not None:
        line += list(draw(st.sampled_from(world.models)))
    replicas = draw(st.integers(1, 3))
    return [*line, f"strategy.cpu_devices={replicas}"]
