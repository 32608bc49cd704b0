"""logger=mlflow: each job an MLflow run, each sweep a parent run with a child per job.

The run gets the composed config as params (dotted keys; strings as they are, other values
as JSON: null, true, [32, 64]), each history.csv column as a metric per epoch (step: the
epoch), results.json's numeric fields as `results/<field>` metrics, and config.yaml,
history.csv and results.json as artifacts. Its id is kept in the run directory, so a rerun
that resumes continues it (epochs already logged are not logged again; params are fixed
once logged, so a rerun's changed keys, e.g. trainer.epochs, become `rerun.<key>` tags).
A sweep's parent run id is kept in the sweep directory (under a lock: parallel launchers).
MLflow is imported only when a run starts.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import math
import numbers
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from distlab.config.checks import flatten
from distlab.errors import ConfigError
from distlab.records.locks import locked
from distlab.tracking.tracker import RunInfo, Tracker

log = logging.getLogger("distlab")
INSTALL = 'pip install "distlab[mlflow]"'
STATUS = {"completed": "FINISHED", "pruned": "FINISHED", "interrupted": "KILLED"}  # else FAILED
MAX_NAME, MAX_VALUE = 250, 6000  # MLflow's longest run name, and param or tag value
CONNECT_TIMEOUT_S = 10  # for an http(s) tracking server to accept a connection


class MlflowTracker(Tracker):
    """An MLflow run per job in `logger.tracking_uri`, experiment `logger.experiment_name`."""

    def __init__(self, cfg: DictConfig) -> None:
        super().__init__(cfg)
        if importlib.util.find_spec("mlflow") is None:
            raise ConfigError(f"logger=mlflow needs MLflow, which is not installed: {INSTALL}")
        self.uri = store_uri(str(cfg.tracking_uri))
        if "://" not in self.uri.replace("file:", "file://", 1) or self.uri.startswith("file:"):
            if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("true", "1"):
                raise ConfigError(
                    f"logger.tracking_uri={cfg.tracking_uri} is a file store, which MLflow 3 "
                    "refuses unless MLFLOW_ALLOW_FILE_STORE=true is set; use a SQLite file "
                    "(logger.tracking_uri=sqlite:///path/mlflow.db) or set that variable")
        self.run_id = ""
        self.logged = 0  # the last epoch the run has
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            for noisy in ("mlflow", "alembic"):  # the store's schema creation, per process
                logging.getLogger(noisy).setLevel(logging.WARNING)
            from mlflow.tracking import MlflowClient

            if not self.uri.startswith("sqlite:///"):
                server_answers(self.uri)  # else MLflow retries for minutes before it fails
                self._client = MlflowClient(self.uri)
                return self._client
            db = Path(self.uri[len("sqlite:///"):])
            db.parent.mkdir(parents=True, exist_ok=True)
            with locked(db.with_name(db.name + ".lock")):  # one process makes the schema
                client = MlflowClient(self.uri)
                client.search_experiments(max_results=1)  # opens (creates) the store
            self._client = client
        return self._client

    # ---- a job
    def start(self, run: RunInfo, config: dict[str, Any]) -> None:
        params = {k: param_value(v)[:MAX_VALUE] for k, v in flatten(config).items()}
        known = run.state.get(self.uri, {}).get("run_id")
        if known and self._continue(known, params):
            return
        tags = {"distlab.run_dir": str(run.run_dir)}
        if run.overrides:  # the name may be cut: every override, in the command's order
            tags["distlab.overrides"] = " ".join(run.overrides)[:MAX_VALUE]
        experiment_id = self._experiment()
        if run.sweep_dir is not None:
            tags["mlflow.parentRunId"] = self._parent(run.sweep_dir, experiment_id)
        created = self.client.create_run(experiment_id, run_name=run.name[:MAX_NAME], tags=tags)
        self.run_id = created.info.run_id
        run.state[self.uri] = {"run_id": self.run_id}
        self._log(params=params)
        log.info("mlflow: run %s in %s (mlflow ui --backend-store-uri %s)", self.run_id,
                 self.uri, self.uri)

    def _continue(self, run_id: str, params: dict[str, str]) -> bool:
        """Continue the run a previous start of this job opened (False: it is gone)."""
        from mlflow.exceptions import MlflowException

        try:
            previous = self.client.get_run(run_id)
        except MlflowException:
            return False
        if previous.info.lifecycle_stage != "active":
            return False  # deleted in the UI: a new run
        self.run_id = run_id
        self.client.update_run(run_id, status="RUNNING")
        logged = self.client.get_metric_history(run_id, "epoch")
        self.logged = int(max((m.value for m in logged), default=0))
        had = previous.data.params
        self._log(params={k: v for k, v in params.items() if k not in had},
                  tags={f"rerun.{k}": v for k, v in params.items() if had.get(k, v) != v})
        log.info("mlflow: continuing run %s in %s (%d epoch(s) logged)", run_id, self.uri,
                 self.logged)
        return True

    def log_epoch(self, row: dict[str, Any]) -> None:
        epoch = int(row["epoch"])
        if epoch <= self.logged:  # trained again after a resume from an earlier checkpoint
            return
        self._log(metrics=figures(row), step=epoch)
        self.logged = epoch

    def log_artifacts(self, paths: list[Path]) -> None:
        for path in paths:
            self.client.log_artifact(self.run_id, str(path))

    def finish(self, results: dict[str, Any]) -> None:
        status = results.get("status")
        if status == "pruned":  # the search's pruner stopped it: a finished run, tagged
            pruned = results.get("pruned") or {}
            self._log(tags={"pruned": "true", "distlab.pruned_epoch": str(pruned.get("epoch"))})
        if status in ("completed", "pruned"):
            final = {f"results/{k}": v for k, v in figures(results).items()}
            self._log(metrics=final, step=int(results.get("epochs_completed") or 0))
        elif status != "interrupted" and results.get("error"):
            self.client.set_tag(self.run_id, "distlab.error", str(results["error"])[:MAX_VALUE])
        self.client.set_terminated(self.run_id, STATUS.get(str(status), "FAILED"))

    def _log(self, params: dict[str, str] | None = None, tags: dict[str, str] | None = None,
             metrics: dict[str, float] | None = None, step: int = 0) -> None:
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        self.client.log_batch(
            self.run_id,
            metrics=[Metric(k, v, now, step) for k, v in (metrics or {}).items()],
            params=[Param(k, v) for k, v in (params or {}).items()],
            tags=[RunTag(k, v) for k, v in (tags or {}).items()])

    def _experiment(self) -> str:
        """The id of `logger.experiment_name`, created if new (a sqlite store's artifacts in
        mlartifacts/ beside its file)."""
        from mlflow.exceptions import MlflowException

        name = str(self.cfg.experiment_name)
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        location = None
        if self.uri.startswith("sqlite:///"):
            location = (Path(self.uri[len("sqlite:///"):]).parent / "mlartifacts").as_uri()
        try:
            return self.client.create_experiment(name, artifact_location=location)
        except MlflowException:  # another job created it meanwhile
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    # ---- a sweep
    def _parent(self, sweep_dir: Path, experiment_id: str) -> str:
        """The sweep's parent run in this store: the first job creates it."""
        with _sweep_state(sweep_dir) as state:
            known = state.get(self.uri, {}).get("run_id")
            if known:
                self.client.update_run(known, status="RUNNING")  # a sweep run again
                return known
            parent = self.client.create_run(
                experiment_id, run_name=f"sweep {'/'.join(sweep_dir.parts[-2:])}"[:MAX_NAME],
                tags={"distlab.sweep_dir": str(sweep_dir)})
            state[self.uri] = {"run_id": parent.info.run_id}
            return parent.info.run_id

    def refused(self, run: RunInfo, reason: str) -> None:
        experiment_id = self._experiment()
        tags = {"distlab.run_dir": str(run.run_dir), "distlab.error": reason[:MAX_VALUE]}
        if run.sweep_dir is not None:
            tags["mlflow.parentRunId"] = self._parent(run.sweep_dir, experiment_id)
        created = self.client.create_run(experiment_id, run_name=run.name[:MAX_NAME], tags=tags)
        self.client.set_terminated(created.info.run_id, "FAILED")

    def finish_sweep(self, sweep_dir: Path, failed: int, files: list[Path],
                     interrupted: bool = False) -> None:
        with _sweep_state(sweep_dir) as state:
            parent = state.get(self.uri, {}).get("run_id")
        if not parent:
            return  # no job started a run (tracking failed)
        for path in files:
            self.client.log_artifact(parent, str(path))
        # every job has ended when the sweep does: a child still RUNNING is a job whose
        # process died (kill -9, out of memory) before it could end its run
        experiment = self.client.get_run(parent).info.experiment_id
        for child in self.client.search_runs(
                [experiment], f"tags.mlflow.parentRunId = '{parent}' "
                              "and attributes.status = 'RUNNING'"):
            self.client.set_tag(child.info.run_id, "distlab.error",
                                "the job's process died before it ended its run")
            self.client.set_terminated(child.info.run_id, "FAILED")
        if failed:
            self.client.set_tag(parent, "distlab.failed_jobs", str(failed))
        self.client.set_terminated(parent, "KILLED" if interrupted else
                                   "FAILED" if failed else "FINISHED")


@contextlib.contextmanager
def _sweep_state(sweep_dir: Path) -> Iterator[dict[str, Any]]:
    """The sweep's parent runs ({store: {run_id}}), read and written under an flock."""
    state_dir = sweep_dir / ".distlab"
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "mlflow.json"
    with locked(state_dir / "mlflow.lock"):
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            state = {}
        before = dict(state)
        yield state
        if state != before:
            path.write_text(json.dumps(state, indent=2) + "\n")


def store_uri(uri: str) -> str:
    """`uri` with a relative sqlite:/// path made absolute (from the current directory), so
    that every job, and the log line's `mlflow ui` command, name the same file."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str(Path(uri[len(prefix):]).resolve())
    return uri


def server_answers(uri: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Raise ConnectionError, naming `uri`, if its http(s) server accepts no connection within
    about `timeout` seconds (MLflow's client retries 7 times with backoff: minutes); other
    stores, and a server behind a proxy (HTTP(S)_PROXY), pass."""
    import socket
    from urllib.parse import urlsplit
    from urllib.request import getproxies, proxy_bypass

    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    if getproxies().get(parts.scheme) and not proxy_bypass(parts.hostname):
        return  # reached through a proxy, as MLflow's client reaches it: not probed
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout):
            return
    except OSError as e:
        raise ConnectionError(f"no MLflow server answers at {uri} within {timeout:g} s "
                              f"({e.strerror or type(e).__name__})") from None


def param_value(value: Any) -> str:
    """A config leaf as a param: a string as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def figures(fields: dict[str, Any]) -> dict[str, float]:
    """The finite numeric fields (NumPy's too; not booleans) as floats."""
    return {k: float(v) for k, v in fields.items()
            if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)}
