"""Hydra's ConfigStore entries: the schemas the YAMLs under conf/ extend. No TensorFlow."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from distlab.config.schema import GROUP_SCHEMAS, Config


def register_configs() -> None:
    """Put the schemas in Hydra's ConfigStore (YAML files extend them via `defaults`).

    They are stored as top-level configs named `config_schema` and `schema_<group>[_<option>]`
    (e.g. `schema_model_resnet`), not as groups, so `--help` lists only the real option groups.
    """
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    for name, node in schema_names().items():
        cs.store(name=name, node=node)


def schema_names() -> dict[str, type]:
    """{`schema_<group>[_<option>]`: its dataclass}, as conf/<group>/*.yaml name them."""
    return {"_".join(filter(None, ("schema", group, option))): node
            for group, options in GROUP_SCHEMAS.items() for option, node in options.items()}
