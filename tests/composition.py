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
  overrides Hydra's `Overrides` takes as group overrides, exactly as it tells them apart),
  per `version_base` and the environment switches Hydra reads, and per content of every
  config source (each YAML file's text under a file or package source, followed through
  symbolic links; the ConfigStore's nodes, by identity). Hydra then applies the value
  overrides to a copy and fills in its own node as usual; the warnings the kept steps gave
  are given again. Not kept: a choice made by an interpolation (`model=${oc.env:M}`, or
  one in a defaults list), a source this cannot read through (a package it cannot import, a
  folder of over 2,000 entries). A node edited in place in the ConfigStore, or a kept
  defaults list edited by its caller, would go unseen: the suite does neither.

The first two take ~17% off a composition (0.094 -> 0.078 s, docs/BENCHMARKS.md section 30);
with the third, a composition that hits its kept entries takes 0.019-0.026 s against
0.105-0.143 s as released (section 31).
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
import os
import types
import warnings
from collections.abc import Iterator
from pathlib import Path

import hydra
import omegaconf
import yaml
from hydra import version
from hydra._internal import config_loader_impl
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.defaults_list import DefaultsList, create_defaults_list
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig
from omegaconf import omegaconf as omegaconf_module

CHECKED = hydra.__version__.startswith("1.3.") and omegaconf.__version__.startswith("2.3.")
_parsed: dict[str | bytes, object] = {}
_lists: dict[tuple, DefaultsList] = {}
_dynamic: dict[bytes, bool] = {}  # YAML texts: does its defaults list interpolate?
_alive: dict[int, object] = {}  # every ConfigStore node digested, by id (none reused)
ENVIRONMENT = ("SELF_WARNING_AS_ERROR", "HYDRA_DEPRECATION_WARNINGS_AS_ERRORS")
MAX_ENTRIES = 2000  # a source folder with more is not digested (nor kept)
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
    """A kept defaults list, the warnings making it gave, and (once composed) the config it
    merges to with the warnings merging gave."""

    warned: list[warnings.WarningMessage]
    composed: tuple[DictConfig, list[warnings.WarningMessage]] | None = None


def _recorded(make):
    """(make(), the warnings it gave), none of them shown."""
    with warnings.catch_warnings(record=True) as given:
        warnings.simplefilter("always")
        made = make()
    return made, given


def _warn_again(given: list[warnings.WarningMessage]) -> None:
    for w in given:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _store_state(digest) -> None:
    """The ConfigStore's nodes into `digest`: each path with its node's identity (a node
    stored again, replaced, or removed is another state)."""
    def walk(tree: dict, path: str) -> None:
        for name, item in sorted(tree.items()):
            if isinstance(item, dict):
                walk(item, f"{path}/{name}")
            else:
                node = getattr(item, "node", None)
                _alive.update({id(item): item, id(node): node})
                digest.update(f"{path}/{name}:{id(item)}:{id(node)}\0".encode())

    walk(ConfigStore.instance().repo, "")


def _sources(repo) -> str | None:
    """What the repository's sources hold now (None: a source this cannot read)."""
    digest = hashlib.blake2b()
    for name in ENVIRONMENT:
        digest.update(f"{name}={os.environ.get(name)}\0".encode())
    for source in repo.get_sources():
        digest.update(f"{source.scheme()}://{source.path}\0".encode())
        if source.scheme() == "structured":
            _store_state(digest)
            continue
        try:
            root = (Path(source.path) if source.scheme() == "file"
                    else importlib.resources.files(source.path) if source.scheme() == "pkg"
                    else None)
        except Exception:  # a package Hydra only warns about
            return None
        if not isinstance(root, Path):
            return None
        entries = 0
        for folder, dirs, files in os.walk(root, followlinks=True):  # as Hydra reads them
            dirs.sort()
            entries += len(dirs) + len(files)
            if entries > MAX_ENTRIES:
                return None
            for name in sorted(files):
                path = Path(folder, name)
                digest.update(f"{path}\0".encode())
                if path.suffix == ".yaml" and path.is_file():  # (not a broken link)
                    text = path.read_bytes()
                    if _chooses_by_interpolation(text):
                        return None
                    digest.update(text + b"\0")
            for name in dirs:
                digest.update(f"{Path(folder, name)}/\0".encode())
    return digest.hexdigest()


def _chooses_by_interpolation(text: bytes) -> bool:
    """Whether a YAML text's defaults list holds an interpolation (`- db: ${oc.env:DB}`): a
    choice this cannot key."""
    if b"${" not in text:
        return False
    if text not in _dynamic:
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError:  # Hydra says what is wrong with it
            doc = None
        _dynamic[text] = isinstance(doc, dict) and "${" in str(doc.get("defaults", ""))
    return _dynamic[text]


def _defaults_list(repo, config_name, overrides_list, prepend_hydra, skip_missing):
    """create_defaults_list, kept per choice of options and content of the sources: the
    overrides split as `hydra._internal.defaults_list.Overrides` splits them."""
    groups, values = [], []
    for override in overrides_list:
        if not override.is_sweep_override():
            is_group = (repo.group_exists(override.key_or_group)
                        and not isinstance(override.value(), dict))
            (groups if is_group else values).append(override)
    state = _sources(repo)
    if state is None or any("${" in o.input_line for o in groups):  # a choice not keyed
        return create_defaults_list(repo, config_name, overrides_list, prepend_hydra,
                                    skip_missing)
    key = (config_name, tuple(o.input_line for o in groups), prepend_hydra, skip_missing,
           str(version.getbase()), state)
    if key not in _lists:
        made, given = _recorded(lambda: create_defaults_list(
            repo, config_name, groups, prepend_hydra, skip_missing))
        _warn_again(given)
        kept = _Defaults(made.defaults)
        kept.warned = given
        _lists[key] = dataclasses.replace(made, defaults=kept)
    else:
        _warn_again(_lists[key].defaults.warned)
    return dataclasses.replace(_lists[key], config_overrides=values)


def _composed(self, defaults, repo) -> DictConfig:
    """Hydra's merge of a defaults list; a kept list's merged once (a copy handed out)."""
    if not isinstance(defaults, _Defaults):
        return _compose(self, defaults, repo)
    if defaults.composed is None:
        defaults.composed = _recorded(lambda: _compose(self, defaults, repo))
    _warn_again(defaults.composed[1])
    return copy.deepcopy(defaults.composed[0])


def install() -> None:
    if CHECKED:
        ConfigStore.__deepcopy__ = lambda self, memo: self
        omegaconf_module.yaml = _yaml
        config_loader_impl.create_defaults_list = _defaults_list
        ConfigLoaderImpl._compose_config_from_defaults_list = _composed


def uninstall() -> None:
    if "__deepcopy__" in vars(ConfigStore):
        del ConfigStore.__deepcopy__
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
