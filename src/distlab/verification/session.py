"""One `distlab verify`: the run's overrides composed as the `distlab` command composes them,
verify's options, the scratch directory, and the probes and runs the checks ask for (each
built from the same overrides plus the check's own)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from distlab.verification.options import Options, brief, without_logger

log = logging.getLogger("distlab")
DEVICES = 3  # logical CPU devices verify's process splits the host into (replicas 1, 2, 3)


@dataclass
class Session:
    overrides: list[str]
    options: Options
    scratch: Path | None  # set once the run's config is accepted
    config_dir: str | Path | None = None
    config_path: str | Path | None = None
    _count: dict[str, int] = field(default_factory=dict)
    _composed: dict[tuple[str, ...], DictConfig] = field(default_factory=dict)
    _trained: object = None

    @property
    def brief_overrides(self) -> list[str]:
        """The run's overrides a brief run starts from: without the `logger` group's (a brief
        run logs to its run dir only, never into the user's tracking store)."""
        return without_logger(self.overrides)

    def compose(self, *extra: str) -> DictConfig:
        """The config of the run's overrides plus `extra` (with `extra`: a brief run's, from
        `brief_overrides`), validated and its user code imported (as a run checks it before
        training), without Hydra's node."""
        from distlab import plugins
        from distlab.components import precision
        from distlab.config import validate
        from distlab.launch.api import _compose
        from distlab.launch.job import _check_interpolations

        key = tuple(extra)
        if key not in self._composed:  # (Hydra's composition takes a second or so)
            overrides = self.brief_overrides if extra else self.overrides
            composed = _compose([*overrides, *extra], self.config_dir, self.config_path)
            cfg = OmegaConf.masked_copy(composed, [k for k in composed if k != "hydra"])
            _check_interpolations(cfg)
            validate(cfg)
            plugins.check(cfg)
            precision.resolve(cfg)  # auto: this machine's policy (the checks' tolerances)
            self._composed[key] = cfg
        return self._composed[key].copy()

    @property
    def run_config(self) -> DictConfig:
        """The config verified, as the user's command composes it."""
        if not hasattr(self, "_run_config"):
            self._run_config = self.compose()
        return self._run_config

    def strategy(self, replicas: int | None = None) -> list[str]:
        """Overrides for `replicas` mirrored replicas; None: the run's own strategy, on one
        machine (a multi-worker or unset mirrored strategy: mirrored over its CPU devices,
        1 when unset, at most DEVICES)."""
        if replicas is not None:
            return ["strategy.name=mirrored", f"strategy.cpu_devices={replicas}"]
        strategy = self.run_config.strategy
        if strategy.name in ("default", "one_device"):
            return []
        devices = min(strategy.get("cpu_devices") or 1, DEVICES)
        return ["strategy.name=mirrored", f"strategy.cpu_devices={devices}"]

    def where(self, name: str) -> Path:
        """A fresh folder of the scratch directory for `name`."""
        n = self._count[name] = self._count.get(name, 0) + 1
        path = self.scratch / (name if n == 1 else f"{name}-{n}")
        path.mkdir(parents=True, exist_ok=True)
        return path

    def brief_config(self, *extra: str, replicas: int | None = None,
                     batch: int | None = None) -> DictConfig:
        buffer = self.run_config.dataset.shuffle_buffer
        return self.compose(*brief(self.options, batch, buffer), *self.strategy(replicas),
                            *self.without_validation(), *extra)

    def without_validation(self) -> list[str]:
        """No validation split (nor its held-out rows) where nothing of the run watches one:
        a brief run's checks compare training and test figures only."""
        from distlab.config.figures import WATCHED

        cfg = self.run_config
        watched = [OmegaConf.select(cfg.trainer, f"{key}.metric", default=None)
                   for key in WATCHED] + [cfg.get("objective")]
        if any(str(m).startswith("val_") for m in watched if m is not None) \
                or cfg.get("callbacks"):
            return []
        return ["dataset.validation=null", "trainer.validate_every=0"]

    def probe(self, name: str, *extra: str, replicas: int | None = None,
              batch: int | None = None, loop=None):
        """A probe (`verify.probe.Probe`) of the run, brief, under `replicas` replicas (None:
        its own strategy), with `extra` overrides and `loop` (a Loop class) if given."""
        from distlab.verification import probe

        cfg = self.brief_config(*extra, replicas=replicas, batch=batch)
        return probe.build(cfg, self.where(name), self.options.rows, loop)


    def test_rows(self) -> int:
        """The rows of the run's test split (read once)."""
        if not hasattr(self, "_test_rows"):
            from distlab.data import pipeline

            dataset = self.run_config.dataset
            self._test_rows = pipeline.source_for(dataset.name).splits(dataset).num_test
        return self._test_rows

    def trained(self):
        """The run's probe (its own strategy and loop) trained `options.steps` steps, built
        once and shared by the checks that read it (its `start`, `losses` and `weights`
        attributes: before and after)."""
        if self._trained is None:
            run = self.probe("run")
            run.start = run.weights()
            run.losses = run.train(self.options.steps)
            run.end = run.weights()
            self._trained = run
        return self._trained


def configure_devices() -> bool:
    """Split the host's CPU into DEVICES logical devices and start TensorFlow's runtime with
    them (False: it had started with fewer, and the replica counts above them cannot run)."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(DEVICES)])
    except RuntimeError:
        pass
    # start the runtime now, with the split: a probe's job would otherwise set its own
    # strategy.cpu_devices (1 for the run's own strategy) before the first op, and the
    # replica counts above it could not run
    return len(tf.config.list_logical_devices("CPU")) >= DEVICES
