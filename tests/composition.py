"""Three of Hydra 1.3's per-composition costs that the test suite does without (~1,000
compositions a session; distlab's own composition is Hydra's, unchanged):

- `CachingConfigRepository` deep-copies its repository at every composition, and with it
  the whole `ConfigStore` (every registered schema: ~12 ms). Nothing writes to that copy
  (`ConfigStore.load` hands out a deep copy of each node), so the suite shares the store
  (Hydra's `hydra_restore_singletons` fixture, which no test uses, would then not restore it);
- every composition parses each YAML file it reads again: here each text `OmegaConf.load`
  reads (a composition's, or a run record distlab reads back) is parsed once, and a copy of
  the parsed object handed out (a file the test changed is another text);
- most of the suite's compositions differ only in values (`trainer.epochs=3`), not in the
  options they choose, yet each builds its defaults tree and merges its configs again. Here
  the defaults list and the config merged from it are kept per choice of options (the
  overrides Hydra's `Overrides` takes as group overrides, exactly as it tells them apart) and
  per content of every config source (each YAML file's text under a file or package source,
  the ConfigStore's every `store`); Hydra then applies the value overrides to a copy and
  fills in its own node as usual.

The first two take ~17% off a composition (0.094 -> 0.078 s, docs/BENCHMARKS.md section 30).
Installed only for the versions checked (`installed()` says whether);
tests/test_config.py composes with and without them and compares.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import importlib.resources
import io
import types
from collections.abc import Iterator
from pathlib import Path

import hydra
import omegaconf
import yaml
from hydra._internal import config_loader_impl
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.defaults_list import DefaultsList, create_defaults_list
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig
from omegaconf import omegaconf as omegaconf_module

CHECKED = hydra.__version__.startswith("1.3.") and omegaconf.__version__.startswith("2.3.")
_parsed: dict[str | bytes, object] = {}
_lists: dict[tuple, DefaultsList] = {}
_stores = 0  # ConfigStore.store calls so far (a structured source's content)
_store = ConfigStore.store
_compose = ConfigLoaderImpl._compose_config_from_defaults_list


def _load(stream, Loader):
    """yaml.load, each text parsed once (the parsed object is copied for each caller). Keyed
    by the text alone: OmegaConf.load, the only caller, always passes its own loader."""
    if not hasattr(stream, "read"):
        return yaml.load(stream, Loader=Loader)
    data = stream.read()
    if data not in _parsed:
        again = io.BytesIO(data) if isinstance(data, bytes) else io.StringIO(data)
        again.name = getattr(stream, "name", "<file>")  # what a YAML error names
        _parsed[data] = yaml.load(again, Loader=Loader)
    return copy.deepcopy(_parsed[data])


_yaml = types.ModuleType("yaml")  # what OmegaConf.load calls `yaml`: yaml with that load
_yaml.__dict__.update({**vars(yaml), "load": _load})


class _Defaults(list):
    """A kept defaults list, and (once composed) the config it merges to."""

    composed: DictConfig | None = None


def _counted_store(self, *args, **kwargs):
    global _stores
    _stores += 1
    return _store(self, *args, **kwargs)


def _sources(repo) -> str | None:
    """What the repository's sources hold now (None: a source this cannot read)."""
    digest = hashlib.blake2b()
    for source in repo.get_sources():
        digest.update(f"{source.scheme()}://{source.path}\0".encode())
        if source.scheme() == "structured":
            digest.update(f"{_stores}\0".encode())
            continue
        root = (Path(source.path) if source.scheme() == "file"
                else importlib.resources.files(source.path) if source.scheme() == "pkg" else None)
        if not isinstance(root, Path):
            return None
        for path in sorted(root.rglob("*")):  # groups are folders; configs, .yaml files
            digest.update(f"{path}\0".encode())
            if path.suffix == ".yaml" and path.is_file():
                digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def _defaults_list(repo, config_name, overrides_list, prepend_hydra, skip_missing):
    """create_defaults_list, kept per choice of options and content of the sources: the
    overrides split as `hydra._internal.defaults_list.Overrides` splits them."""
    state = _sources(repo)
    if state is None:
        return create_defaults_list(repo, config_name, overrides_list, prepend_hydra,
                                    skip_missing)
    groups, values = [], []
    for override in overrides_list:
        if not override.is_sweep_override():
            is_group = (repo.group_exists(override.key_or_group)
                        and not isinstance(override.value(), dict))
            (groups if is_group else values).append(override)
    key = (config_name, tuple(o.input_line for o in groups), prepend_hydra, skip_missing, state)
    if key not in _lists:
        made = create_defaults_list(repo, config_name, groups, prepend_hydra, skip_missing)
        _lists[key] = dataclasses.replace(made, defaults=_Defaults(made.defaults))
    return dataclasses.replace(_lists[key], config_overrides=values)


def _composed(self, defaults, repo) -> DictConfig:
    """Hydra's merge of a defaults list; a kept list's merged once (a copy handed out)."""
    if not isinstance(defaults, _Defaults):
        return _compose(self, defaults, repo)
    if defaults.composed is None:
        defaults.composed = _compose(self, defaults, repo)
    return copy.deepcopy(defaults.composed)


def install() -> None:
    if CHECKED:
        ConfigStore.__deepcopy__ = lambda self, memo: self
        ConfigStore.store = _counted_store
        omegaconf_module.yaml = _yaml
        config_loader_impl.create_defaults_list = _defaults_list
        ConfigLoaderImpl._compose_config_from_defaults_list = _composed


def uninstall() -> None:
    if "__deepcopy__" in vars(ConfigStore):
        del ConfigStore.__deepcopy__
    ConfigStore.store = _store
    omegaconf_module.yaml = yaml
    config_loader_impl.create_defaults_list = create_defaults_list
    ConfigLoaderImpl._compose_config_from_defaults_list = _compose


def installed() -> bool:
    return omegaconf_module.yaml is _yaml


@contextlib.contextmanager
def as_released() -> Iterator[None]:
    """Hydra and OmegaConf as released, for the duration (then as before)."""
    was = installed()
    uninstall()
    try:
        yield
    finally:
        if was:
            install()
