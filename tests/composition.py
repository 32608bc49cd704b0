"""Two of Hydra 1.3's per-composition costs that the test suite does without (~1,000
compositions a session; distlab's own composition is Hydra's, unchanged):

- `CachingConfigRepository` deep-copies its repository at every composition, and with it
  the whole `ConfigStore` (every registered schema: ~12 ms). Nothing writes to that copy
  (`ConfigStore.load` hands out a deep copy of each node), so the suite shares the store
  (Hydra's `hydra_restore_singletons` fixture, which no test uses, would then not restore it);
- every composition parses each YAML file it reads again: here each text `OmegaConf.load`
  reads (a composition's, or a run record distlab reads back) is parsed once, and a copy of
  the parsed object handed out (a file the test changed is another text).

Together a composition takes ~17% less (0.094 -> 0.078 s, docs/BENCHMARKS.md section 30).
Installed only for the versions checked (`installed()` says whether);
tests/test_config.py composes with and without them and compares.
"""

from __future__ import annotations

import contextlib
import copy
import io
import types
from collections.abc import Iterator

import hydra
import omegaconf
import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import omegaconf as omegaconf_module

CHECKED = hydra.__version__.startswith("1.3.") and omegaconf.__version__.startswith("2.3.")
_parsed: dict[str | bytes, object] = {}


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


def install() -> None:
    if CHECKED:
        ConfigStore.__deepcopy__ = lambda self, memo: self
        omegaconf_module.yaml = _yaml


def uninstall() -> None:
    if "__deepcopy__" in vars(ConfigStore):
        del ConfigStore.__deepcopy__
    omegaconf_module.yaml = yaml


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
