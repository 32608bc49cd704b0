"""User code, before anything is built: plug-in packages, `imports:`, the groups' names.

`check(cfg)` runs before TensorFlow starts (unless user code imports it): it loads the
`distlab.plugins` entry points once per process, imports the `imports:` modules, then
resolves every group's `name` and checks it against the builder's schema, so a bad
import path, a wrong signature, a name registered twice or a module that raises is one
line naming the key, within seconds.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from importlib.metadata import entry_points

from omegaconf import DictConfig, OmegaConf, open_dict

from distlab.config.checks import check_metric_names
from distlab.errors import ConfigError, DistlabError, described, first_line
from distlab.registry import CALLBACKS, DATASETS, REGISTRIES, is_tfds_name

ENTRY_POINT_GROUP = "distlab.plugins"
_loaded_plugins = False


def load_plugins() -> None:
    """Import every installed `distlab.plugins` entry point (a module, or a function that is
    then called with no arguments), once per process."""
    global _loaded_plugins
    if _loaded_plugins:
        return
    _loaded_plugins = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
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
            importlib.import_module(module)
        except DistlabError as e:
            raise DistlabError(f"imports[{i}]={module!r}: {e}") from None
        except ModuleNotFoundError as e:
            if e.name and module.startswith(e.name):
                raise ConfigError(
                    f"imports[{i}]={module!r} does not import: no module named {e.name!r} "
                    "(run from the directory that holds it, or pip install its package)"
                ) from None
            raise ConfigError(f"imports[{i}]={module!r} raised {described(e)}") from None
        except Exception as e:  # noqa: BLE001 - user code, reported on one line
            raise ConfigError(f"imports[{i}]={module!r} raised {described(e)}") from None


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
            continue  # checked when tfds loads it
        registry.check(name)
        schema = registry.schemas.get(name)
        if schema is not None:
            checked = check_schema(group, node, schema)
            with open_dict(cfg):
                cfg[group] = checked
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

