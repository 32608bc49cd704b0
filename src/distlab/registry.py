"""One registry per config group: a group's `name` -> the callable that builds it.

A name is a registered name or an import path `package.module:callable` (the module
imported, then the attribute looked up). distlab's own builders are listed here as import
paths, so checking a config's names never imports TensorFlow; user code adds names with
`distlab.register` (from an `imports:` module or a `distlab.plugins` entry point).
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from typing import Any

from distlab.errors import DistlabError, UserCodeError, described
from distlab.records.metrics import BUILTIN_METRICS, BUILTIN_TASKS

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class RegistryError(DistlabError):
    """Unknown, duplicate, unimportable or ill-fitting registry entry."""


def is_import_path(name: str) -> bool:
    """`package.module:callable` (not a tfds name such as `mnist:3.0.1`)."""
    return bool(_IMPORT_PATH.match(name))


def is_tfds_name(name: str) -> bool:
    """A `dataset.name` that is neither a registered dataset builder nor an import path."""
    return name not in DATASETS and not is_import_path(name)


class Registry:
    """Maps the names used in a config group to the callables that build them.

    `params` names the arguments every builder of the group is called with; a callable
    that cannot take them is refused when the name is resolved, before anything is built.
    `optional` names keyword arguments a builder gets only if it declares them (`call`).
    """

    def __init__(self, group: str, params: tuple[str, ...],
                 builtins: dict[str, str] | None = None, optional: tuple[str, ...] = ()) -> None:
        self.group, self.params, self.optional = group, params, optional
        self._items: dict[str, Callable | str] = dict(builtins or {})
        self._origin: dict[str, str] = {name: "distlab" for name in self._items}
        self.schemas: dict[str, type] = {}

    def register(self, name: str, fn: Callable | None = None, *,
                 schema: type | None = None) -> Any:
        """`@REG.register("my_net")` or `REG.register("my_net", fn)`. Registering a name
        twice is an error. `schema`: a dataclass the group node is checked against."""

        def decorator(fn: Callable) -> Callable:
            if name in self._items:
                raise RegistryError(
                    f"{self.group} '{name}' is already registered (by {self._origin[name]}); "
                    f"choose another name for {_where(fn)}")
            self._check_signature(fn, f"{self.group} '{name}' ({_where(fn)})")
            self._items[name], self._origin[name] = fn, _where(fn)
            if schema is not None:
                self.schemas[name] = schema
            return fn

        return decorator if fn is None else decorator(fn)

    def get(self, name: str) -> Callable:
        """The builder for `name` (registered, or an import path); one-line errors."""
        key = f"{self.group}.name={name!r}"
        if name in self._items:
            item = self._items[name]
            return _locate(item, key) if isinstance(item, str) else item
        if not is_import_path(name):
            known = ", ".join(self.names()) or "(none)"
            raise RegistryError(
                f"unknown {key}; known {self.group} names: {known}, or an import path "
                "package.module:callable")
        fn = _locate(name, key)
        self._check_signature(fn, key)
        return fn

    def build(self, name: str, *args: Any, key: str | None = None, **optional: Any) -> Any:
        """`name`'s builder called with `args` (and those of `optional` it declares, as
        `call`); an error from a builder of the user's is one line naming the key (`key`,
        default `<group>.name='<name>'`), its traceback kept as the cause."""
        fn = self.get(name)
        try:
            return call(fn, *args, **optional)
        except DistlabError:
            raise
        except (Exception, SystemExit) as e:  # (sys.exit in a builder ended a whole sweep)
            # TensorFlow's own errors (a peer lost while the model's variables broadcast)
            # keep their handling
            if self.is_builtin(name) or type(e).__module__.startswith("tensorflow"):
                raise
            what = (f"called sys.exit({e.code!r})" if isinstance(e, SystemExit) else
                    f"failed: {described(e)}")
            raise UserCodeError(f"{key or f'{self.group}.name={name!r}'} {what}") from e

    def check(self, name: str) -> None:
        """Raise if `name` cannot be resolved; registered names are not imported (distlab's
        own stay lazy, so checking a config never imports TensorFlow for them)."""
        if name not in self._items:
            self.get(name)

    def is_builtin(self, name: str) -> bool:
        """One of distlab's own names (dataset: a tfds name is distlab's too)."""
        if self is DATASETS:
            return is_tfds_name(name)
        return self._origin.get(name) == "distlab"

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def _check_signature(self, fn: Any, what: str) -> None:
        if not callable(fn):
            raise RegistryError(f"{what} is a {type(fn).__name__}, not a callable")
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin without a signature: trust it
            return
        try:
            signature.bind(*self.params, **dict.fromkeys(_declared(fn, self.optional)))
        except TypeError:
            raise RegistryError(
                f"{what} has the wrong signature {signature}: a {self.group} builder is called "
                f"as f({', '.join(self.params)})") from None


def call(fn: Callable, *args: Any, **optional: Any) -> Any:
    """`fn(*args, **those of optional it declares)`: a builder that declares an optional
    argument by name (or takes **kwargs) gets it; any other is called as before."""
    return fn(*args, **{k: optional[k] for k in _declared(fn, tuple(optional))})


def _declared(fn: Callable, names: tuple[str, ...]) -> list[str]:
    """Those of `names` that `fn` takes as keyword arguments."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return list(names)
    return [n for n in names if n in params and params[n].kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]


def _locate(path: str, key: str) -> Callable:
    """`package.module:attr` (attr may be dotted): the module imported, then the attribute
    looked up, each failure one line saying which."""
    module, _, attr = path.partition(":")
    try:
        target: Any = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - user code: any failure, one line
        raise RegistryError(f"{key} does not import: {described(e)}") from None
    for i, part in enumerate(attr.split(".")):
        if not hasattr(target, part):
            where = f"module {module!r}" if i == 0 else repr(f"{module}:{attr.rsplit('.', 1)[0]}")
            raise RegistryError(f"{key}: {where} has no attribute {part!r} (it imports; check "
                                "the name after the colon)")
        target = getattr(target, part)
    if not callable(target):
        raise RegistryError(f"{key} is a {type(target).__name__}, not a callable (a builder "
                            "function or class)")
    return target


def _where(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


# ------------------------------------------------------------------ the groups' registries

STRATEGIES = Registry("strategy", ("cfg",), {
    name: f"distlab.components.strategies:{name}"
    for name in ("default", "one_device", "mirrored", "auto", "multi_worker_mirrored")})
DATASETS = Registry("dataset", ("cfg",))  # anything else is a tfds name
MODELS = Registry("model", ("cfg", "input_shape", "outputs"), {
    name: f"distlab.components.models:{name}"
    for name in ("cnn", "mlp", "resnet", "keras_applications")},
    optional=("input_spec", "train_inputs"))
TASKS = Registry("task", ("cfg",), {
    name: f"distlab.components.tasks:{name}" for name in BUILTIN_TASKS})
OPTIMIZERS = Registry("optimizer", ("cfg", "learning_rate"), {
    name: f"distlab.components.optimizers:{name}" for name in ("adam", "sgd", "rmsprop")})
SCHEDULES = Registry("schedule", ("cfg", "base", "steps_per_epoch", "epochs"), {
    name: f"distlab.components.schedules:{name}"
    for name in ("constant", "step_decay", "cosine", "exponential")})
LOOPS = Registry("loop", ("exp",), {
    "keras_fit": "distlab.training.loops.keras_fit:KerasFitLoop",
    "custom": "distlab.training.loops.custom:CustomLoop"})
# task.metrics names: f(cfg, task) -> a distlab Metric or a keras.metrics.Metric
METRICS = Registry("metric", ("cfg", "task"), {
    name: f"distlab.components.metrics:{name}" for name in BUILTIN_METRICS})
# callbacks.<key>.name names: f(cfg) -> a keras.callbacks.Callback (cfg: that entry's keys)
CALLBACKS = Registry("callback", ("cfg",))

# logger names: a distlab.tracking.Tracker subclass, built as cls(cfg.logger) before TensorFlow
TRACKERS = Registry("logger", ("cfg",), {
    "tensorboard": "distlab.tracking.tracker:Tracker",
    "mlflow": "distlab.tracking.mlflow_tracker:MlflowTracker"})

REGISTRIES: dict[str, Registry] = {r.group: r for r in (
    STRATEGIES, DATASETS, MODELS, TASKS, OPTIMIZERS, SCHEDULES, LOOPS, METRICS, CALLBACKS,
    TRACKERS)}


def register(group: str, name: str, fn: Callable | None = None, *,
             schema: type | None = None) -> Any:
    """Add your own component: `@register("model", "my_net")` on a builder called like
    distlab's own (model: `f(cfg, input_shape, outputs) -> keras.Model`, with `input_spec=`
    and `train_inputs=` if it declares them; logger: a `distlab.tracking.Tracker` subclass;
    see the README).
    `schema`: a dataclass whose fields are the keys the group node may have."""
    if group not in REGISTRIES:
        raise RegistryError(f"register({group!r}, {name!r}): no such group; groups: "
                            + ", ".join(REGISTRIES))
    return REGISTRIES[group].register(name, fn, schema=schema)
