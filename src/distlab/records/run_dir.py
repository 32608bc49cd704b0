"""What a run writes and reads back: checkpoints, history.csv, results.json, saved_model/
(the run directory's layout, at the bottom of the package: tracking, distribute and
training all write into it).

Both loops go through this module, so their run directories are interchangeable.
TensorFlow is imported only by the functions that need it (the sweep summary reads
results without it).
"""

from __future__ import annotations

import csv
import fcntl
import json
import math
import numbers
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from distlab.errors import DistlabError
from distlab.records.results import assemble

HISTORY_COLUMNS = ["epoch", "learning_rate", "loss", "accuracy", "val_loss", "val_accuracy",
                   "seconds", "examples_per_sec"]  # a classification task's history.csv


def figure_columns(metrics: list[str], test: bool = False,
                   validation: bool = True) -> list[str]:
    """history.csv's figures for a task with these metric names: training, validation
    (unless dataset.validation=null) and, with `test` (trainer.test_every > 0), the
    per-epoch test pass."""
    splits = ["", *(["val_"] if validation else []), *(["test_"] if test else [])]
    return [f"{split}{m}" for split in splits for m in ("loss", *metrics)]


def history_columns(metrics: list[str], test: bool = False,
                    validation: bool = True) -> list[str]:
    """history.csv's columns for a task with these metric names."""
    return ["epoch", "learning_rate", *figure_columns(metrics, test, validation), "seconds",
            "examples_per_sec"]


def pattern_problem(path: object) -> str | None:
    """What is wrong with a path that holds `[`, `]`, `*` or `?` (TensorFlow reads checkpoint,
    SavedModel and cache paths as file patterns), or None."""
    found = next((c for c in "[]*?" if c in str(path or "")), None)
    return None if found is None else (
        f"has {found!r} in its path, which TensorFlow reads as a file pattern when it "
        "restores checkpoints, loads the SavedModel or reads a cache: choose a path "
        "without [ ] * ?")


class RunDirBusy(DistlabError):
    """Another live process holds the run directory."""


class RunDir:
    """One run's directory (Hydra's output dir)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._lock_fd: int | None = None
        # the chief's tracker (`distlab.tracking.session.Session`): it gets each history row
        self.tracker: Any = None

    checkpoints = property(lambda self: self.path / "checkpoints")
    best_checkpoints = property(lambda self: self.path / "checkpoints" / "best")
    logs = property(lambda self: self.path / "logs")
    history_csv = property(lambda self: self.path / "history.csv")
    results_json = property(lambda self: self.path / "results.json")
    saved_model = property(lambda self: self.path / "saved_model")
    started_config_yaml = property(lambda self: self.path / ".distlab" / "config.yaml")
    # each tracker's state (its run id), so that a rerun continues the same tracker run
    tracking_json = property(lambda self: self.path / ".distlab" / "tracking.json")
    _hydra_snapshot = property(lambda self: self.path / ".distlab" / "hydra")
    # which rows a training run's splits hold (distlab.data.fingerprint)
    splits_json = property(lambda self: self.path / ".distlab" / "splits.json")
    # how the latest attempt that trained was distributed (replicas, global batch), written
    # as it starts: a resume after a kill -9 or a failure knows it without results.json
    trained_as_json = property(lambda self: self.path / ".distlab" / "trained_as.json")
    # a job of a stopped sweep that did not start (removed when a rerun starts it)
    not_started_mark = property(lambda self: self.path / ".distlab" / "not_started")

    def check_writable(self) -> None:
        if problem := pattern_problem(self.path):
            raise DistlabError(
                f"output directory {self.path} {problem}, with hydra.run.dir=... (in a sweep: "
                "hydra.sweep.dir and hydra.sweep.subdir, whose ${hydra.job.override_dirname} "
                "holds the brackets of a list or slice override)")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.path):
                pass
        except OSError as e:
            raise DistlabError(
                f"output directory {self.path} cannot be written ({e.strerror}): choose another "
                "with hydra.run.dir=... (or hydra.sweep.dir=... for -m)"
            ) from None

    # ---- one job at a time
    lock_file = property(lambda self: self.path / ".distlab" / "lock")

    def lock(self) -> None:
        """Hold the directory for this process, or raise RunDirBusy naming the holder.

        An flock on .distlab/lock: the kernel (or the NFS server's lock manager) releases it
        when the holder dies, kill -9 and node loss included, so no lock outlives its job."""
        self.lock_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 300, 0).decode(errors="replace").strip()
            os.close(fd)
            raise RunDirBusy(
                f"{self.path} is in use by another run ({holder or 'starting up'}): a run "
                "directory holds one job at a time. Wait for it or stop it (a rerun then "
                "resumes it), or choose another hydra.run.dir") from None
        self._lock_fd = fd

    def mark_holder(self) -> None:
        """Write who holds the lock (host, pid, start), for a refused second process."""
        if self._lock_fd is not None:
            note = (f"host {socket.gethostname()}, pid {os.getpid()}, since "
                    f"{time.strftime('%Y-%m-%d %H:%M:%S')}")
            os.ftruncate(self._lock_fd, 0)
            os.pwrite(self._lock_fd, note.encode(), 0)

    def record_not_started(self) -> None:
        """This job of a stopped sweep did not start: the summary counts it apart from a
        failed one (best effort: the sweep is ending)."""
        try:
            self.not_started_mark.parent.mkdir(parents=True, exist_ok=True)
            self.not_started_mark.write_text("")
        except OSError:
            pass

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # ---- the config the run was started with (Hydra rewrites .hydra/ on every rerun)
    def started_config(self) -> dict[str, Any] | None:
        if not self.started_config_yaml.exists():
            return None
        from omegaconf import OmegaConf

        return OmegaConf.to_container(OmegaConf.load(self.started_config_yaml))

    def record_start(self, config: dict[str, Any]) -> None:
        """Keep the first start's config, and a copy of .hydra/ to restore after a refusal."""
        from omegaconf import OmegaConf

        self.started_config_yaml.parent.mkdir(parents=True, exist_ok=True)
        if not self.started_config_yaml.exists():
            OmegaConf.save(OmegaConf.create(config), self.started_config_yaml)
        hydra_dir = self.path / ".hydra"
        if hydra_dir.is_dir():
            shutil.copytree(hydra_dir, self._hydra_snapshot, dirs_exist_ok=True)

    def restore_hydra(self) -> None:
        """Undo Hydra's rewrite of .hydra/ by a refused rerun."""
        if self._hydra_snapshot.is_dir():
            shutil.copytree(self._hydra_snapshot, self.path / ".hydra", dirs_exist_ok=True)

    def has_checkpoints(self) -> bool:
        return any(self.checkpoints.glob("ckpt-*.index"))

    def archive_attempt(self) -> Path:
        """Move an earlier attempt's record (config, results, history, TensorBoard logs, its
        tracker run's id, its splits' rows) to
        .distlab/attempts/<n>/, so a new config can start afresh without losing it."""
        attempts = self.path / ".distlab" / "attempts"
        n = 1 + max((int(p.name) for p in attempts.glob("*") if p.name.isdigit()), default=0)
        target = attempts / str(n)
        target.mkdir(parents=True)
        for source in (self.started_config_yaml, self.results_json, self.history_csv, self.logs,
                       self.best_checkpoints, self.tracking_json, self.splits_json,
                       self.trained_as_json):
            if source.exists():
                shutil.move(str(source), str(target / source.name))
        return target

    # ---- history.csv
    def append_history(self, row: dict[str, Any], columns: list[str]) -> None:
        new = not self.history_csv.exists()
        with self.history_csv.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerow({k: _fmt(row.get(k)) for k in columns})

    def truncate_history(self, epochs: int) -> None:
        """Drop rows after epoch `epochs` (epochs a resumed run trains again)."""
        rows = self.read_history()
        if all(int(r["epoch"]) <= epochs for r in rows):
            return
        tmp = self.history_csv.with_name("history.csv.tmp")
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]), extrasaction="ignore")
            writer.writeheader()
            writer.writerows(r for r in rows if int(r["epoch"]) <= epochs)
        os.replace(tmp, self.history_csv)

    def read_history(self) -> list[dict[str, str]]:
        if not self.history_csv.exists():
            return []
        with self.history_csv.open(newline="") as f:
            return list(csv.DictReader(f))

    # ---- results.json
    def write_results(self, results: dict[str, Any]) -> None:
        """Atomic replace, so a crash never leaves a half-written results.json; its content
        is `results.assemble`'s (every key a field of `FIELDS`, in the list's order)."""
        _write_json_atomic(self.results_json, assemble(results))

    def record_failure(self, failed: dict[str, Any]) -> None:
        """Write a failed results.json, but never over a completed run's (nor raise)."""
        previous = self.read_results()
        if previous and previous.get("status") == "completed":
            return
        try:
            self.write_results(failed)
        except OSError:
            pass

    def read_results(self) -> dict[str, Any] | None:
        return _read_json(self.results_json)

    def record_trained_as(self, how: dict[str, Any]) -> None:
        self.trained_as_json.parent.mkdir(parents=True, exist_ok=True)
        _write_json_atomic(self.trained_as_json, how)

    def trained_as(self) -> dict[str, Any]:
        """The latest training attempt's `record_trained_as` (an older run's results.json's
        fields where it has none)."""
        return _read_json(self.trained_as_json) or self.read_results() or {}


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _fmt(value: Any) -> Any:
    """A history.csv cell: empty for None (not measured, or undefined), a float at full
    precision (its shortest round-trip repr, so `float(cell)` gives the value back)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        return repr(float(value))
    return value


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
             for k, v in data.items()}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(clean, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def _output_dir_arg(argv: list[str]) -> tuple[str, str] | None:
    """(option, value) of the output dir the command line names (Hydra's default outputs/
    when it names none); None when it interpolates (`${...}`: Hydra resolves it)."""
    multirun = any(a in ("-m", "--multirun") for a in argv)
    option = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    target = next((a[len(option) + 1:].strip("'\"") for a in argv
                   if a.startswith(f"{option}=")), "outputs")
    return None if "${" in target else (option, target)


def refused_output_dir_args(argv: list[str]) -> str | None:
    """Why the output dir named on the command line is refused (`refused_output_dir`), or
    None; asked before Hydra creates it."""
    return None if (given := _output_dir_arg(argv)) is None else refused_output_dir(*given)


def refused_output_dir(option: str, target: str) -> str | None:
    """Why output dir `target` (the value of `option`) is refused, or None: empty (Hydra
    would take the current directory), or with a file pattern's characters."""
    if not target.strip():
        return (f"{option} is empty, which Hydra takes as the current directory: give a "
                f"directory ({option}=. if the current one is meant)")
    if problem := pattern_problem(target):
        return f"{option}={target} {problem}"
    return None


def check_output_dir_args(argv: list[str]) -> str | None:
    """Why the output dir named on the command line cannot be created, or None.

    Hydra creates it before distlab runs and fails with a traceback; `run.py` asks first.
    """
    if (given := _output_dir_arg(argv)) is None or not given[1].strip():
        return None
    option, target = given
    path = Path(target).expanduser()
    existing = next((p for p in [path, *path.parents] if p.exists()), Path("."))
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        kind = "is not a directory" if not existing.is_dir() else "is not writable"
        return (f"{option}={target} cannot be created: {existing} {kind}. Choose another with "
                f"{option}=...")
    return None
