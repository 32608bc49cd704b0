"""User code, before anything is built: plug-in packages, `imports:`, the groups' names.

`check(cfg)` runs before TensorFlow starts (unless user code imports it): it loads the
`distlab.plugins` entry points once per process, imports the `imports:` modules, then
resolves every group's `name` and checks it against the builder's schema, so a bad
import path, a wrong signature, a name registered twice or a module that raises is one
line naming the key, within seconds. A module that starts TensorFlow when imported (a
module-level Keras metric or variable) is remembered: `started_tensorflow()` names it.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import entry_points

from omegaconf import DictConfig, OmegaConf, open_dict

from distlab.config.checks import check_metric_names, check_unknown_keys
from distlab.data.prepared import check_tfds
from distlab.errors import ConfigError, DistlabError, UserCodeError, described, first_line
from distlab.registry import CALLBACKS, DATASETS, REGISTRIES, is_tfds_name

ENTRY_POINT_GROUP = "distlab.plugins"
_loaded_plugins = False
_tf_started_by: str | None = None  # the user module whose import started TensorFlow


def tensorflow_started() -> bool:
    """Whether TensorFlow's runtime is initialised in this process (its devices then fixed).
    TensorFlow has no public probe: its eager context's handle exists once it is."""
    if sys.modules.get("tensorflow") is None:  # not imported (or blocked)
        return False
    from tensorflow.python.eager import context

    return context.context()._context_handle is not None


def started_tensorflow() -> str | None:
    """The user module (and the key that imported it) whose import started TensorFlow, if
    one did; None when TensorFlow was started by anything else or not at all."""
    return _tf_started_by


@contextmanager
def _watching(what: str) -> Iterator[None]:
    """Remember `what` if TensorFlow was not running before it and is afterwards."""
    global _tf_started_by
    before = tensorflow_started()
    yield
    if not before and _tf_started_by is None and tensorflow_started():
        _tf_started_by = what


def load_plugins() -> None:
    """Import every installed `distlab.plugins` entry point (a module, or a function that is
    then called with no arguments), once per process."""
    global _loaded_plugins
    if _loaded_plugins:
        return
    _loaded_plugins = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            module = ep.value.partition(":")[0].strip()
            with _watching(f"{module!r} (the distlab.plugins entry point {ep.name})"):
                target = ep.load()
                if callable(target):
                    target()
        except DistlabError as e:
            raise DistlabError(f"plug-in entry point {ep.name} = {ep.value}: {e}") from None
        except Exception as e:  # noqa: BLE001 - any failure of user code, one line
            raise DistlabError(f"plug-in entry point {ep.name} = {ep.value} failed: "
                               f"{described(e)}; fix or uninstall that package") from None


def import_modules(modules: list[str]) -> None:
    """Import the `imports:` modules, relative to the current directory as `python -m`
    would (so a project's own package is found when distlab runs from the project)."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    for i, module in enumerate(modules):
        try:
            with _watching(f"{module!r} (imports[{i}])"):
                importlib.import_module(module)
        except DistlabError as e:
            raise DistlabError(f"imports[{i}]={module!r}: {e}") from None
        except ModuleNotFoundError as e:
            if e.name and module.startswith(e.name):
                _refuse_not_a_module(i, module, e.name)
                raise ConfigError(
                    f"imports[{i}]={module!r} does not import: no module named {e.name!r} "
                    "(run from the directory that holds it, or pip install its package)"
                ) from None
            raise ConfigError(f"imports[{i}]={module!r} raised {described(e)}") from None
        except (Exception, SystemExit) as e:  # noqa: BLE001 - user code, reported on one line
            raise UserCodeError(f"imports[{i}]={module!r} raised {described(e)}") from e


def _refuse_not_a_module(i: int, module: str, missing: str) -> None:
    """An `imports:` entry naming an import path or an attribute, not a module: one line
    saying so (Python's own "No module named 'a.b'; 'a' is not a package" does not)."""
    if ":" in module:
        raise ConfigError(f"imports[{i}]={module!r} is an import path; imports: lists modules "
                          f"to import, e.g. {module.split(':')[0]!r}")
    parent, _, name = missing.rpartition(".")
    if not parent:
        return
    try:
        owner = importlib.import_module(parent)
    except Exception:  # noqa: BLE001 - the parent's own failure is reported as before
        return
    if hasattr(owner, name):
        raise ConfigError(f"imports[{i}]={module!r}: {name!r} is an attribute of module "
                          f"{parent!r}, not a module; list the module ({parent!r})")
    if not hasattr(owner, "__path__"):
        raise ConfigError(f"imports[{i}]={module!r} does not import: module {parent!r} has no "
                          f"submodule {name!r} (it is a module, not a package)")


def check(cfg: DictConfig) -> None:
    """Load user code, then resolve and schema-check every group's `name`."""
    load_plugins()
    import_modules(list(cfg.get("imports") or []))
    for group, registry in REGISTRIES.items():
        node = cfg.get(group)
        if node is None or node.get("name") is None:
            continue
        name = node.name
        if registry is DATASETS and is_tfds_name(name):
            model = str(OmegaConf.select(cfg, "model.name", default=""))
            check_tfds(cfg, builtin_model=REGISTRIES["model"].is_builtin(model))
            continue  # the rest is checked when tfds loads it
        with _watching(f"{str(name).partition(':')[0]!r} ({group}.name)"):
            registry.check(name)
        schema = registry.schemas.get(name)
        if schema is not None:
            checked = check_schema(group, node, schema)
            with open_dict(cfg):
                cfg[group] = checked
    check_unknown_keys(cfg)  # (a user option's node: check_schema above)
    with _watching("a task.metrics import path"):
        check_metric_names(cfg)  # task.metrics: distlab's, registered or import paths
    for key, entry in (cfg.get("callbacks") or {}).items():  # their names (not _target_s)
        name = entry if isinstance(entry, str) else entry.get("name")
        if name is not None:
            try:
                CALLBACKS.check(str(name))
            except DistlabError as e:
                raise ConfigError(str(e).replace("callback.name=", f"callbacks.{key}.name="
                                                 )) from None


def check_schema(group: str, node: DictConfig, schema: type) -> DictConfig:
    """`node` against a user's dataclass `schema`: unknown keys and wrong types refused;
    returns it with the schema's defaults filled in."""
    declared = {f.name for f in dataclasses.fields(schema)} | {"name"}
    unknown = sorted(set(node.keys()) - declared)
    if unknown:
        raise ConfigError(
            f"{group}.{unknown[0]} is not a key of {group} {node.name!r} (its schema "
            f"{schema.__name__} declares: {', '.join(sorted(declared))})")
    values = OmegaConf.to_container(node, resolve=True)
    name = values.pop("name")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), values)
    except Exception as e:  # noqa: BLE001 - OmegaConf validation errors, one line
        where = f"{group}.{e.full_key}" if getattr(e, "full_key", None) else group
        raise ConfigError(f"{where} is invalid for {group} {name!r} "
                          f"({schema.__name__}): {first_line(e)}") from None
    return OmegaConf.create({**OmegaConf.to_container(merged), "name": name})

