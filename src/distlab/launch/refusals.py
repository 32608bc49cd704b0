"""The jobs a sweep's run refused (a run dir that holds another config's run, or that another
live run holds), recorded for the sweep's summary, its tracker and its exit status; and the
jobs it launched, so that its summary leaves out the job dirs of an earlier, other sweep
into the same dir (`.distlab/launched/<sweep id>/`).

A refused job leaves its run dir exactly as it was (its results.json is the earlier run's),
so the refusal is kept in the sweep dir instead: `.distlab/refused/<sweep id>/<n>.json`, one
file per refused job, under the id of the sweep invocation that refused it
(`DISTLAB_SWEEP_ID`, set when the sweep starts and inherited by process launchers' jobs), so
that neither another sweep into the same dir nor a later rerun of it reads it. No TensorFlow.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

SWEEP_ID = "DISTLAB_SWEEP_ID"


def start_sweep() -> str:
    """A new id for this sweep invocation, in the environment its jobs inherit."""
    os.environ[SWEEP_ID] = uuid.uuid4().hex
    return os.environ[SWEEP_ID]


def _folder(sweep_dir: str | Path, sweep_id: str | None, kind: str = "refused") -> Path:
    return Path(sweep_dir) / ".distlab" / kind / (sweep_id or "unknown")


def _name(run_dir: Path) -> str:
    return hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]


def job_path(sweep_dir: str | Path, run_dir: Path) -> str:
    """`run_dir` relative to `sweep_dir` (its job's place, the same on every host), or its
    resolved path where it is not under it."""
    try:
        return str(run_dir.resolve().relative_to(Path(sweep_dir).resolve()))
    except ValueError:
        return str(run_dir.resolve())


def record_launched(sweep_dir: str | Path, run_dir: Path) -> None:
    """Record that this sweep invocation launched the job of `run_dir` (nothing without a
    sweep id: a launcher whose jobs do not inherit it, whose summary then lists every job
    dir)."""
    sweep_id = os.environ.get(SWEEP_ID)
    if not sweep_id:
        return
    folder = _folder(sweep_dir, sweep_id, "launched")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / _name(run_dir)).write_text(job_path(sweep_dir, run_dir) + "\n")
    except OSError:
        pass  # the summary then lists every job dir, as before


def launched(sweep_dir: str | Path) -> set[str]:
    """The job paths (`job_path`) this sweep invocation launched (empty: unknown)."""
    folder = _folder(sweep_dir, os.environ.get(SWEEP_ID), "launched")
    found = set()
    for path in folder.iterdir() if os.environ.get(SWEEP_ID) and folder.is_dir() else ():
        try:
            found.add(path.read_text().strip())
        except OSError:
            continue
    return found


def record(sweep_dir: str | Path, run_dir: Path, error: str) -> None:
    """Record that the job of `run_dir` was refused with `error`; its overrides are the ones
    Hydra wrote for it (read before the run dir's own .hydra/ is put back)."""
    from omegaconf import OmegaConf

    try:
        overrides = [str(o) for o in OmegaConf.load(run_dir / ".hydra" / "overrides.yaml")]
    except (OSError, ValueError, TypeError):
        overrides = None
    path = str(run_dir.resolve())
    folder = _folder(sweep_dir, os.environ.get(SWEEP_ID))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{_name(run_dir)}.json").write_text(json.dumps(
            {"run_dir": path, "overrides": overrides, "error": error}) + "\n")
    except OSError:
        pass  # the job still reports its refusal, and exits 2


def read(sweep_dir: str | Path, sweep_id: str | None = None) -> dict[str, dict[str, Any]]:
    """{resolved run dir: {"overrides", "error"}} of the jobs this sweep invocation refused
    (`sweep_id`: default, the current one)."""
    folder = _folder(sweep_dir, sweep_id or os.environ.get(SWEEP_ID))
    found = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            entry = json.loads(path.read_text())
            found[entry["run_dir"]] = entry
        except (OSError, ValueError, KeyError):
            continue
    return found
