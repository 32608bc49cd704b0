"""Plug-in packages' configs on distlab's config search path (a Hydra SearchPathPlugin).

An installed package ships YAMLs as a package (a folder with an `__init__.py`, e.g.
`my_project/conf/`) and names it in a `distlab.configs` entry point:

    [project.entry-points."distlab.configs"]
    my_project = "my_project.conf"

When the app composes distlab's config (`distlab`, `python run.py`, `distlab.train`), each
such package is appended to the search path as `pkg://my_project.conf`, after distlab's own
configs: its files become more options of distlab's groups, with no `--config-dir`.
"""

from __future__ import annotations

import importlib.util
import sys
from importlib.metadata import entry_points

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.config_store import ConfigStore
from hydra.errors import SearchPathException
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf

ENTRY_POINT_GROUP = "distlab.configs"


class DistlabPackageConfigs(SearchPathPlugin):
    """Appends `pkg://<package>` for every `distlab.configs` entry point, in distlab only."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        if not _composing_distlab():
            return  # another Hydra app in this environment: leave its search path alone
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            package, why = ep.module, None
            try:
                spec = importlib.util.find_spec(package)
            except ModuleNotFoundError:
                spec = None
            except Exception as e:  # noqa: BLE001 - a parent package that fails to import
                why = f"importing it raised {type(e).__name__}: {e}"
            if why is None and (spec is None or not spec.submodule_search_locations):
                why = "no such package (a folder of YAMLs with an __init__.py)"
            if why is not None:
                raise SearchPathException(f"{ENTRY_POINT_GROUP} entry point {ep.name} = "
                                          f"{ep.value}: {why}; fix or uninstall that package")
            search_path.append(provider=f"{ENTRY_POINT_GROUP} {ep.name}",
                               path=f"pkg://{package}")


def _composing_distlab() -> bool:
    """distlab registered its schemas in this process, as it does before it composes."""
    store = sys.modules.get("distlab.config.store")
    node = ConfigStore.instance().repo.get("config_schema.yaml")
    return (store is not None and node is not None
            and OmegaConf.get_type(node.node) is store.Config)
