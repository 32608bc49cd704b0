"""How a job drives its tracker: built before TensorFlow (a tracker that cannot run is a
config error), started on the chief once the run directory is its own, every later call
guarded: a tracker's failure is one warning, and training goes on without it."""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from distlab.errors import described
from distlab.records.run_dir import RunDir
from distlab.registry import TRACKERS
from distlab.tracking.tracker import RunInfo, Tracker

log = logging.getLogger("distlab")
FINISHED = "finished"  # a tracker's state key: it recorded the completed run's end


def build(cfg: DictConfig) -> Tracker:
    """The tracker `cfg.logger` names (none: the base Tracker, which tracks nothing)."""
    node = cfg.get("logger")
    if node is None or node.get("name") is None:
        return Tracker(OmegaConf.create({"name": "tensorboard"}))
    return TRACKERS.get(str(node.name))(node)


def tracks(tracker: Tracker) -> bool:
    """Whether `tracker` records anything (logger=tensorboard's does not)."""
    return type(tracker) is not Tracker


class Session:
    """One job's use of its tracker, on the chief. `start` opens (or continues) its run and
    sends it the rows history.csv already has (a rerun that resumes, or a tracker added on a
    rerun: the tracker logs those it lacks); `log_epoch` gets each new row; `finish` the
    results."""

    def __init__(self, tracker: Tracker, run_dir: RunDir, config: dict[str, Any],
                 sweep_dir: str | Path | None = None) -> None:
        self.tracker, self.run_dir, self.config = tracker, run_dir, config
        self.sweep_dir = Path(sweep_dir).resolve() if sweep_dir is not None else None
        self.name = str(tracker.cfg.get("name"))
        self.active = tracks(tracker)

    def start(self) -> None:
        states = self._states()
        run = RunInfo(self.run_dir.path.resolve(),
                      run_name(self.run_dir.path, self.sweep_dir),
                      states.get(self.name, {}), self.sweep_dir,
                      job_overrides(self.run_dir.path))
        if not self._call("start", self.tracker.start, run, self.config):
            return
        for row in self.run_dir.read_history():  # an earlier attempt's rows it may not have
            self.log_epoch({k: None if v == "" else int(v) if k == "epoch" else float(v)
                            for k, v in row.items()})
        run.state.pop(FINISHED, None)  # training again: its end is not recorded yet
        states[self.name] = run.state
        self._save(states)
        with tempfile.TemporaryDirectory(prefix="distlab-config-") as scratch:
            config_yaml = Path(scratch) / "config.yaml"  # the composed config, resolved
            OmegaConf.save(OmegaConf.create(self.config), config_yaml)
            self._call("log_artifacts", self.tracker.log_artifacts, [config_yaml])

    def log_epoch(self, row: dict[str, Any]) -> None:
        self._call("log_epoch", self.tracker.log_epoch, row)

    def finish(self, results: dict[str, Any]) -> None:
        files = [p for p in (self.run_dir.history_csv, self.run_dir.results_json) if p.exists()]
        self._call("log_artifacts", self.tracker.log_artifacts, files)
        if self._call("finish", self.tracker.finish, results) and (
                results.get("status") == "completed"):
            states = self._states()
            states.setdefault(self.name, {})[FINISHED] = True
            self._save(states)

    def catch_up(self, results: dict[str, Any]) -> None:
        """A completed run rerun (not retrained): a tracker that has not recorded its end
        (added on this rerun, or it failed before the end) gets its rows and results now."""
        if not self._states().get(self.name, {}).get(FINISHED):
            self.start()
            self.finish(results)

    def _save(self, states: dict[str, Any]) -> None:
        state_file = self.run_dir.tracking_json
        state_file.parent.mkdir(parents=True, exist_ok=True)
        state_file.write_text(json.dumps(states, indent=2) + "\n")

    def _states(self) -> dict[str, Any]:
        try:
            return json.loads(self.run_dir.tracking_json.read_text())
        except (OSError, ValueError):
            return {}

    def _call(self, what: str, method: Any, *args: Any) -> bool:
        """`method(*args)`; a failure is one warning and ends this job's tracking."""
        if not self.active:
            return False
        try:
            method(*args)
            return True
        except Exception as e:  # noqa: BLE001 - a tracker never fails the run
            self.active = False
            log.warning("logger=%s: %s failed (%s); training goes on without it (the run "
                        "directory keeps every figure)", self.name, what, described(e))
            return False


def job_overrides(run_dir: Path) -> list[str]:
    """The job's command-line overrides (Hydra's .hydra/overrides.yaml), in order."""
    try:
        return [str(o) for o in OmegaConf.load(run_dir / ".hydra" / "overrides.yaml")]
    except (OSError, ValueError, TypeError):
        return []


def run_name(run_dir: Path, sweep_dir: Path | None = None) -> str:
    """The job's command-line overrides but the logger's and a search's trial (`search.*`),
    a sweep's swept keys first (so a tracker that cuts names keeps what tells its jobs
    apart), else the last two parts of its directory (outputs/<date>/<time>)."""
    given = [o for o in job_overrides(run_dir)
             if not _key(o).startswith(("logger", "search."))]
    swept = swept_keys(run_dir, sweep_dir) if sweep_dir is not None else set()
    first = [o for o in given if _key(o) in swept]
    return (" ".join(first + [o for o in given if o not in first])
            or "/".join(run_dir.resolve().parts[-2:]))


def swept_keys(run_dir: Path, sweep_dir: Path) -> set[str]:
    """The keys a sweep varies: its sweep overrides (`key=a,b`, `choice(...)`,
    `interval(...)`: Hydra's multirun.yaml, or what distlab's Optuna sweeper recorded) and
    its `hydra.sweeper.params`."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    def load(path: Path, key: str) -> Any:
        try:
            return OmegaConf.select(OmegaConf.load(path), key, default=None)
        except (OSError, ValueError, TypeError):
            return None

    keys: set[str] = set()
    params = load(run_dir / ".hydra" / "hydra.yaml", "hydra.sweeper.params")
    if params is not None:
        keys.update(str(k) for k in params)
    for path, key in ((sweep_dir / "multirun.yaml", "hydra.overrides.task"),
                      (sweep_dir / SWEEP_OVERRIDES, "overrides")):
        for override in load(path, key) or []:
            try:
                [parsed] = OverridesParser.create().parse_overrides([str(override)])
            except Exception:  # noqa: BLE001 - an override Hydra itself would refuse
                continue
            if parsed.is_sweep_override():
                keys.add(parsed.key_or_group)
    return keys


SWEEP_OVERRIDES = ".distlab/sweep_overrides.yaml"  # distlab's Optuna sweeper's arguments


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def finish_sweep(cfg: DictConfig, sweep_dir: Path, failed: int, files: list[Path],
                 refused: list[tuple[Path, str, str]] = (), interrupted: bool = False) -> None:
    """The sweep's tracker records the jobs it refused ((run dir, name, reason): a failed
    run each) and closes its parent run (guarded as a job's calls are); `interrupted`: a
    signal stopped the sweep."""
    try:
        tracker = build(cfg)
        if tracks(tracker):
            for run_dir, name, reason in refused:
                tracker.refused(RunInfo(Path(run_dir).resolve(), name,
                                        sweep_dir=Path(sweep_dir).resolve()), reason)
            # only when true: a tracker written before the argument existed still closes the run
            stopped = {"interrupted": True} if interrupted else {}
            tracker.finish_sweep(Path(sweep_dir).resolve(), failed, files, **stopped)
    except Exception as e:  # noqa: BLE001 - never fails the sweep's summary
        log.warning("logger=%s: closing the sweep's run failed (%s)",
                    OmegaConf.select(cfg, "logger.name"), described(e))
