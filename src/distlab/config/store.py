"""Hydra's ConfigStore entries: the schemas the YAMLs under conf/ extend; a user's config
dir on the search path (`--config-dir`, `distlab.train(config_dir=...)`). No TensorFlow."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from distlab.config.schema import GROUP_SCHEMAS, Config, DatasetConfig

PACKAGE_CONFIG_PATH = "pkg://distlab.conf"  # the configs installed with the package


def register_configs() -> None:
    """Put the schemas in Hydra's ConfigStore (YAML files extend them via `defaults`).

    They are stored as top-level configs named `config_schema` and `schema_<group>[_<option>]`
    (e.g. `schema_model_resnet`), not as groups, so `--help` lists only the real option groups.
    """
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    for name, node in schema_names().items():
        cs.store(name=name, node=node)
    # a user dataset's YAML (its own keys checked later against its registered schema):
    # DatasetConfig's keys and defaults in a node open to more keys, so every common key
    # (dataset.validation, dataset.cache, ...) can be overridden without a `+`
    cs.store(name="schema_dataset_common",
             node=OmegaConf.create(OmegaConf.to_container(OmegaConf.structured(DatasetConfig))))
    _expose_hydra_plugins()


def _expose_hydra_plugins() -> None:
    """Let Hydra find distlab's own plugins (`hydra_plugins.distlab_*`: the plug-in packages'
    search path, the Optuna sweeper). Hydra lists the folders of the `hydra_plugins`
    namespace; an editable install (`pip install -e`, PEP 660) maps distlab's through an
    import hook it cannot list, so their parent folder goes on sys.path, as a regular
    install's site-packages already is."""
    import hydra_plugins

    parent = Path(__file__).resolve().parents[2]  # holds distlab/ and hydra_plugins/
    ours = parent / "hydra_plugins"
    if ours.is_dir() and str(ours) not in list(hydra_plugins.__path__):
        sys.path.append(str(parent))


def schema_names() -> dict[str, type]:
    """{`schema_<group>[_<option>]`: its dataclass}, as conf/<group>/*.yaml name them."""
    return {"_".join(filter(None, ("schema", group, option))): node
            for group, options in GROUP_SCHEMAS.items() for option, node in options.items()}


def config_dirs_problem(config_dir: str | os.PathLike | None,
                        config_path: str | os.PathLike | None) -> str | None:
    """Why an API call's `config_dir` or `config_path` (distlab.train, distlab.verify) is no
    directory, or None."""
    for value, flag in ((config_dir, "config_dir"), (config_path, "config_path")):
        if value is not None and (problem := config_dir_problem(value, flag)):
            return problem
    return None


def config_dir_problem(value: str | os.PathLike, flag: str = "--config-dir") -> str | None:
    """Why a user config dir (`--config-dir`, `distlab.train(config_dir=...)`: `flag`) is
    no directory, or None. A relative one is taken from the current directory, as Hydra
    does."""
    value = os.fspath(value)
    path = os.path.abspath(os.path.expanduser(value))
    if os.path.isdir(path):
        return None
    fix = ("check the path" if os.path.isabs(os.path.expanduser(value)) else
           f"a relative {flag} is taken from the current directory, {os.getcwd()}: run "
           "from the directory that holds it or give its absolute path")
    tail = ("; configs shipped in an installed package (a distlab.configs entry point) need "
            "none" if "config_path" not in flag else "")
    return f"{flag} {value}: no directory {path} ({fix}){tail}"
