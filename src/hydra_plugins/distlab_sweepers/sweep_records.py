"""What distlab's Optuna sweeper keeps in its sweep directory besides the study: which study
the directory's jobs belong to, and the sweep's command-line overrides."""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


SEARCH_RECORD = "search.yaml"  # in the sweep dir's .distlab/: the study its jobs belong to


def claim_sweep_dir(sweep_dir: str, study_name: str, location: str) -> None:
    """Record which study the sweep dir's jobs belong to; refuse another study there (its
    trials would take over the jobs of this one: trial N is job N)."""
    from distlab.errors import ConfigError

    path = Path(sweep_dir) / ".distlab" / SEARCH_RECORD
    mine = {"study_name": study_name, "storage": location}
    if path.exists():
        held = OmegaConf.to_container(OmegaConf.load(path))
        if held != mine:
            raise ConfigError(
                f"{sweep_dir} holds the jobs of the study {held.get('study_name')!r} "
                f"({held.get('storage')}); this search is {study_name!r} ({location}): use "
                "another hydra.sweep.dir, or that study's hydra.sweeper.study_name and "
                "storage")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(mine), path)


def record_arguments(config: DictConfig, arguments: list[str]) -> None:
    """The sweep's command-line overrides, in the sweep dir, for a tracker to tell the swept
    keys (`distlab.tracking.session.swept_keys`; Hydra's basic sweeper has multirun.yaml)."""
    from distlab.tracking.session import SWEEP_OVERRIDES

    path = Path(str(config.hydra.sweep.dir)) / SWEEP_OVERRIDES
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(OmegaConf.create({"overrides": list(arguments)}), path)
    except OSError as e:
        log.warning("could not record the sweep's overrides in %s (%s): tracker run names "
                    "will not put the swept keys first", path, e)
