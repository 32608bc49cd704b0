"""The interface of an experiment tracker (the `logger` group's registry, `TRACKERS`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig


@dataclass
class RunInfo:
    """The job a tracker records."""

    run_dir: Path  # absolute
    # the job's command-line overrides, a sweep's swept ones first (so a name cut to a
    # tracker's length keeps them), else its directory's name
    name: str
    # the tracker's own state, kept in the run directory (.distlab/tracking.json) from one
    # start to the next: empty at a run's first start; a rerun gets what start() left (its
    # run id), to continue that run
    state: dict[str, Any] = field(default_factory=dict)
    sweep_dir: Path | None = None  # a sweep's job: the sweep's directory (its parent run)
    overrides: list[str] = field(default_factory=list)  # every command-line override, in order


class Tracker:
    """A tracker of runs; this base class tracks nothing (logger=tensorboard: TensorBoard,
    which every run writes, only).

    It is built as `cls(cfg.logger)` before TensorFlow starts, on every worker: raise a
    `distlab.errors.ConfigError` there if it cannot run (e.g. its package is missing). Then,
    on the chief only: `start`, `log_epoch` for each history.csv row, `log_artifacts`,
    `finish`. An exception from any of them is logged as one warning and the tracker is not
    called again for that job: training goes on, and the run directory keeps every figure.
    """

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg

    def start(self, run: RunInfo, config: dict[str, Any]) -> None:
        """Open the job's run (or continue the one `run.state` names) and record `config`,
        the composed config. Keep what a rerun needs in `run.state`."""

    def log_epoch(self, row: dict[str, Any]) -> None:
        """One epoch's history.csv row ({column: value}, None where not measured; `epoch` is
        1-based). After a resume, epochs already logged may come again: log each once."""

    def log_artifacts(self, paths: list[Path]) -> None:
        """Copy these files of the run (config.yaml, history.csv, results.json) to the run."""

    def finish(self, results: dict[str, Any]) -> None:
        """The job ended: `results` is its results.json (`status`: completed, interrupted (a
        rerun resumes it) or failed, with `error`)."""

    def refused(self, run: RunInfo, reason: str) -> None:
        """A sweep's job was refused (its run dir holds another config's run, or another
        live run): record it as a failed run with `reason` (called in the sweep's own
        process, before `finish_sweep`; `run.state` is empty)."""

    def finish_sweep(self, sweep_dir: Path, failed: int, files: list[Path],
                     interrupted: bool = False) -> None:
        """A sweep ended (in the sweep's own process, after its jobs and its summary):
        `failed` jobs failed; `files` are its summary files; `interrupted`: a signal
        (Ctrl-C, SIGTERM) stopped it (passed only when true)."""
