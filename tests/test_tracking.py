"""logger=mlflow (README "Tracking"): a run, a resumed run and a sweep read back through
MLflow's own API; a rerun logs each epoch once; MLflow missing is one line before TensorFlow.
(No `mlflow ui` server is started.)"""

from __future__ import annotations

import json
import numbers
import os
import subprocess
import sys

import mlflow
import pytest
from conftest import ROOT, compose, fast_overrides, run_cli, stop_at
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from distlab.config.checks import flatten
from distlab.tracking import RunInfo
from distlab.tracking.mlflow_tracker import MlflowTracker


@pytest.fixture(scope="module")
def store(tmp_path_factory, mlflow_store) -> str:
    """One SQLite store per module (its schema made once per session: conftest); tests use
    their own experiments."""
    return mlflow_store(tmp_path_factory.mktemp("mlflow") / "mlflow.db")


def _runs(uri: str, experiment: str) -> list:
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment}"
    return client.search_runs([found.experiment_id], order_by=["attributes.start_time"])


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


@pytest.mark.slow
def test_a_resumed_run_is_one_mlflow_run_equal_to_its_run_dir(run_inprocess, tiny_data_dir,
                                                              tmp_path, monkeypatch, store):
    args = ["logger=mlflow", f"logger.tracking_uri={store}", "logger.experiment_name=resumed",
            "trainer.steps_per_epoch=4"]
    out = tmp_path / "run"
    stop_at(monkeypatch, 1, 2)  # as a SIGTERM in epoch 2: a checkpoint, status interrupted
    with pytest.raises(SystemExit):
        run_inprocess(*args, out=out)
    client = MlflowClient(store)
    [killed] = _runs(store, "resumed")
    assert killed.info.status == "KILLED"
    assert _history(client, killed.info.run_id, "epoch") == [(1, 1.0)]
    monkeypatch.undo()
    results = run_inprocess(*args, out=out)  # the same command again: it resumes

    [run] = _runs(store, "resumed")  # the same run, continued
    assert run.info.run_id == killed.info.run_id and run.info.status == "FINISHED"
    config = OmegaConf.to_container(compose(fast_overrides(tiny_data_dir) + args), resolve=True)
    assert run.data.params == {k: v if isinstance(v, str) else json.dumps(v)
                               for k, v in flatten(config).items()}
    rows = (out / "history.csv").read_text().splitlines()
    columns = rows[0].split(",")
    assert [r.split(",")[0] for r in rows[1:]] == ["1", "2"]
    for i, column in enumerate(columns):  # every column, each epoch once
        expected = [(int(r.split(",")[0]), float(r.split(",")[i])) for r in rows[1:]
                    if r.split(",")[i]]
        got = _history(client, run.info.run_id, column)
        assert [s for s, _ in got] == [s for s, _ in expected], column
        assert [v for _, v in got] == pytest.approx([v for _, v in expected], rel=1e-5), column
    final = {k: v for k, v in results.items()
             if isinstance(v, numbers.Real) and not isinstance(v, bool)}
    assert {k.removeprefix("results/"): v for k, v in run.data.metrics.items()
            if k.startswith("results/")} == final
    # the same through the fluent API's table, as `mlflow ui` lists runs
    mlflow.set_tracking_uri(store)
    table = mlflow.search_runs(experiment_names=["resumed"])
    assert len(table) == 1 and table["metrics.results/test_loss"][0] == results["test_loss"]
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {
        "config.yaml", "history.csv", "results.json"}
    copy = mlflow.artifacts.download_artifacts(run_id=run.info.run_id,
                                               artifact_path="history.csv", dst_path=tmp_path)
    assert open(copy).read() == (out / "history.csv").read_text()


def test_a_rerun_continues_the_run_and_logs_each_epoch_once(tmp_path, store):
    """A kill -9 after epoch 2's row but before its checkpoint: the rerun trains epoch 2
    again; the tracker keeps the run and the epoch it has, and a changed key is a tag."""
    cfg = OmegaConf.create({"name": "mlflow", "tracking_uri": store,
                            "experiment_name": "rerun"})
    state: dict = {}
    first = MlflowTracker(cfg)
    first.start(RunInfo(tmp_path, "job", state), {"trainer": {"epochs": 2}, "imports": []})
    for epoch in (1, 2):
        first.log_epoch({"epoch": epoch, "loss": 1.0 / epoch, "val_loss": None})
    again = MlflowTracker(cfg)
    again.start(RunInfo(tmp_path, "job", state), {"trainer": {"epochs": 3}, "imports": []})
    for epoch in (2, 3):
        again.log_epoch({"epoch": epoch, "loss": 1.0 / epoch, "val_loss": None})
    again.finish({"status": "completed", "epochs_completed": 3, "test_loss": 0.25,
                  "stopped_early": False, "strategy": "default"})

    [run] = _runs(store, "rerun")
    client = MlflowClient(store)
    assert _history(client, run.info.run_id, "loss") == [(1, 1.0), (2, 0.5), (3, 1 / 3)]
    assert client.get_metric_history(run.info.run_id, "val_loss") == []
    assert run.data.params == {"trainer.epochs": "2", "imports": "[]"}
    assert run.data.tags["rerun.trainer.epochs"] == "3"
    assert {k: v for k, v in run.data.metrics.items() if k.startswith("results/")} == {
        "results/epochs_completed": 3.0, "results/test_loss": 0.25}
    assert run.info.status == "FINISHED"


@pytest.mark.slow
def test_a_sweep_is_a_parent_run_with_a_child_per_job(tiny_data_dir, tmp_path, store):
    sweep = tmp_path / "sweep"
    args = [f"dataset.data_dir={tiny_data_dir}", "loop.verbose=0", "trainer.export=false",
            "trainer.epochs=1", "trainer.steps_per_epoch=2", "logger=mlflow",
            f"logger.tracking_uri={store}", "logger.experiment_name=sweep"]
    out = run_cli("-m", *args, "optimizer.learning_rate=0.001,0.002",
                  f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]

    runs = _runs(store, "sweep")
    [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r is not parent]
    assert [r.data.tags["mlflow.parentRunId"] for r in children] == [parent.info.run_id] * 2
    assert sorted(r.data.tags["distlab.run_dir"] for r in children) == [
        str(sweep / "0"), str(sweep / "1")]
    assert sorted(r.data.params["optimizer.learning_rate"] for r in children) == [
        "0.001", "0.002"]
    assert all(r.info.status == "FINISHED" for r in runs)
    assert {a.path for a in MlflowClient(store).list_artifacts(parent.info.run_id)} >= {
        "summary.csv", "summary.md"}


def _sweep_job(sweep, num: int, overrides: list[str], swept: list[str],
               params: dict | None = None):
    """A job directory as Hydra's basic sweeper leaves it: the sweep's command-line
    overrides in multirun.yaml, the job's own in .hydra/overrides.yaml."""
    from distlab.records.run_dir import RunDir

    sweep.mkdir(exist_ok=True)
    OmegaConf.save(OmegaConf.create({"hydra": {"overrides": {"task": swept}}}),
                   sweep / "multirun.yaml")
    job = sweep / str(num)
    (job / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(overrides), job / ".hydra" / "overrides.yaml")
    OmegaConf.save(OmegaConf.create({"hydra": {"sweeper": {"params": params or {}}}}),
                   job / ".hydra" / "hydra.yaml")
    return RunDir(job)


def test_a_sweep_s_child_run_is_named_by_its_swept_keys_first(tmp_path, store):
    """Overrides longer than MLflow's 250-character run name: the child's name starts with
    the swept values, whole, and every override is in the tag distlab.overrides."""
    from distlab.tracking.session import Session

    long_dir = f"dataset.data_dir={tmp_path / ('d' * 200)}"
    common = [long_dir, "loop.verbose=0", "trainer.export=false", "trainer.epochs=1"]
    cfg = OmegaConf.create({"name": "mlflow", "tracking_uri": store,
                            "experiment_name": "named"})
    sweep = tmp_path / "sweep"
    given = {0: "0.001", 1: "0.0025"}
    for num, rate in given.items():
        overrides = [*common, f"optimizer.learning_rate={rate}",
                     "dataset.batch_size_per_replica=32", f"logger.tracking_uri={store}"]
        run_dir = _sweep_job(sweep, num, overrides,
                             [*common, "optimizer.learning_rate=0.001,0.0025",
                              f"logger.tracking_uri={store}"],
                             params={"dataset.batch_size_per_replica": "32,64"})
        session = Session(MlflowTracker(cfg), run_dir, {"job": num}, sweep_dir=sweep)
        session.start()
        session.finish({"status": "completed"})
    children = [r for r in _runs(store, "named") if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 2
    for run, rate in zip(sorted(children, key=lambda r: r.data.tags["distlab.run_dir"]),
                         given.values(), strict=True):
        name = run.info.run_name
        assert len(name) == 250  # MLflow's longest
        assert name.startswith(f"optimizer.learning_rate={rate} "
                               "dataset.batch_size_per_replica=32 dataset.data_dir="), name
        assert run.data.tags["distlab.overrides"] == " ".join(
            [*common, f"optimizer.learning_rate={rate}", "dataset.batch_size_per_replica=32",
             f"logger.tracking_uri={store}"])



def test_a_job_whose_process_died_has_its_run_failed_when_the_sweep_ends(tmp_path, store):
    """kill -9 of a job: its MLflow run never ends; the sweep's end (every job ended) marks
    it FAILED, with the reason, beside the finished one."""
    from distlab.tracking.session import Session

    cfg = OmegaConf.create({"name": "mlflow", "tracking_uri": store, "experiment_name": "died"})
    sweep = tmp_path / "sweep"
    for num in (0, 1):
        run_dir = _sweep_job(sweep, num, [f"seed={num}"], ["seed=0,1"])
        session = Session(MlflowTracker(cfg), run_dir, {"job": num}, sweep_dir=sweep)
        session.start()
        if num == 1:  # job 0 died (kill -9) before it could end its run
            session.finish({"status": "completed"})
    MlflowTracker(cfg).finish_sweep(sweep, 1, [])
    runs = {r.data.tags.get("distlab.run_dir", "parent"): r for r in _runs(store, "died")}
    assert runs[str(sweep / "0")].info.status == "FAILED"
    assert "died" in runs[str(sweep / "0")].data.tags["distlab.error"]
    assert runs[str(sweep / "1")].info.status == "FINISHED"
    assert runs["parent"].info.status == "FAILED"


JOB = """
import sys
from pathlib import Path
from omegaconf import OmegaConf
from distlab.tracking import RunInfo
from distlab.tracking.mlflow_tracker import MlflowTracker
uri, sweep, num = sys.argv[1:]
tracker = MlflowTracker(OmegaConf.create({"name": "mlflow", "tracking_uri": uri,
                                          "experiment_name": "parallel"}))
tracker.start(RunInfo(Path(sweep) / num, num, {}, Path(sweep)), {"job": int(num)})
tracker.finish({"status": "completed"})
"""


@pytest.mark.slow
def test_parallel_jobs_share_a_new_store_and_one_parent_run(tmp_path):
    """A process-per-job launcher (joblib): jobs that start at once on a new SQLite file
    (whose schema one of them makes) under one sweep parent."""
    uri = f"sqlite:///{tmp_path / 'new.db'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    jobs = [subprocess.Popen([sys.executable, "-c", JOB, uri, str(tmp_path / "sweep"), str(i)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for i in range(3)]
    for job in jobs:
        output = job.communicate(timeout=180)[0]
        assert job.returncode == 0, output[-3000:]
    runs = _runs(uri, "parallel")
    [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert sorted(r.data.params.get("job") for r in runs if r is not parent) == ["0", "1", "2"]
    assert {r.data.tags.get("mlflow.parentRunId") for r in runs if r is not parent} == {
        parent.info.run_id}


@pytest.mark.slow  # run.py processes forked from a TensorFlow-preloaded server
def test_mlflow_missing_is_one_line_before_tensorflow(tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()  # neither MLflow nor TensorFlow can be imported in the subprocess
    (shim / "sitecustomize.py").write_text(
        "import sys\nsys.modules['mlflow'] = sys.modules['tensorflow'] = None\n")
    path = os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")]))
    out = run_cli("logger=mlflow", f"hydra.run.dir={tmp_path / 'run'}", timeout=120,
                  env={"PYTHONPATH": path}, fresh=True)  # the shim works at start-up
    assert out.returncode == 2
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(
        'logger=mlflow needs MLflow, which is not installed: pip install "distlab[mlflow]"'), lines


@pytest.fixture
def recording_tracker():
    """A plug-in's tracker, registered as logger.name=recording; its log_epoch fails at
    epoch 2."""
    from dataclasses import dataclass

    from distlab import register
    from distlab.registry import TRACKERS
    from distlab.tracking import Tracker

    @dataclass
    class RecordingConfig:
        fail_at: int = 2

    class Recording(Tracker):
        calls: list = []

        def start(self, run, config):
            self.calls.append(("start", run.state.get("id")))
            run.state["id"] = "run-1"

        def log_epoch(self, row):
            if row["epoch"] == self.cfg.fail_at:
                raise ConnectionError("tracking server gone")
            self.calls.append(("epoch", row["epoch"], row["loss"]))

        def finish(self, results):
            self.calls.append(("finish", results["status"]))

    register("logger", "recording", Recording, schema=RecordingConfig)
    yield Recording
    TRACKERS._items.pop("recording")
    TRACKERS.schemas.pop("recording")


def test_a_plugin_tracker_gets_the_rows_and_its_failure_is_one_warning(
        recording_tracker, tmp_path, caplog):
    from distlab import plugins
    from distlab.records.run_dir import RunDir
    from distlab.tracking import session

    cfg = compose(["logger.name=recording"])
    plugins.check(cfg)  # the registered schema's defaults filled in
    assert cfg.logger == {"fail_at": 2, "name": "recording"}
    run_dir = RunDir(tmp_path)
    run_dir.append_history({"epoch": 1, "loss": 0.5}, ["epoch", "loss"])  # an earlier attempt
    job = session.Session(session.build(cfg), run_dir, {"seed": 1})
    job.start()  # gets the earlier row
    for epoch in (2, 3):
        job.log_epoch({"epoch": epoch, "loss": 0.1})  # fails at 2: no more calls after it
    job.finish({"status": "completed"})
    assert recording_tracker.calls == [("start", None), ("epoch", 1, 0.5)]
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "logger=recording: log_epoch failed (ConnectionError: tracking server gone); training "
        "goes on without it (the run directory keeps every figure)"]
    assert json.loads(run_dir.tracking_json.read_text()) == {"recording": {"id": "run-1"}}


def test_a_rerun_may_add_or_change_the_logger():
    from distlab.config import training_diff

    started = {"seed": 1, "trainer": {"epochs": 2}}  # a run from before the logger group
    assert training_diff(started, {**started, "logger": {"name": "mlflow",
                                                         "tracking_uri": "sqlite:///x.db"}}) == []
    assert training_diff(started, {"seed": 2, "logger": {"name": "mlflow"}}) == ["seed"]


@pytest.mark.slow
def test_a_tracker_added_to_a_completed_run_gets_it_once(run_inprocess, tmp_path, store):
    """Rerunning a completed run with logger=mlflow does not retrain it: the tracker gets its
    rows and results once (a third rerun logs nothing more)."""
    args = ["trainer.steps_per_epoch=2", "model=mlp", "model.hidden_units=[8]"]
    tracked = ["logger=mlflow", f"logger.tracking_uri={store}", "logger.experiment_name=added"]
    out = tmp_path / "run"
    results = run_inprocess(*args, out=out)
    for _ in range(2):
        assert run_inprocess(*args, *tracked, out=out) == results  # not retrained
    [run] = _runs(store, "added")
    client = MlflowClient(store)
    assert run.info.status == "FINISHED"
    assert _history(client, run.info.run_id, "epoch") == [(1, 1.0), (2, 2.0)]
    history = client.get_metric_history(run.info.run_id, "results/test_loss")
    assert [m.value for m in history] == [results["test_loss"]]


def test_a_file_store_is_refused_unless_mlflow_allows_it(tmp_path, monkeypatch):
    from distlab.errors import ConfigError

    for uri in (f"file://{tmp_path}/mlruns", str(tmp_path / "mlruns")):
        cfg = OmegaConf.create({"name": "mlflow", "tracking_uri": uri, "experiment_name": "x"})
        monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
        with pytest.raises(ConfigError, match="MLFLOW_ALLOW_FILE_STORE=true"):
            MlflowTracker(cfg)
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        assert MlflowTracker(cfg).uri == uri


def test_a_tracking_server_that_does_not_answer_is_one_warning_within_seconds(
        tmp_path, caplog):
    """logger.tracking_uri=http://host:port where nothing listens: one warning naming the URI
    at the start (MLflow's own client would retry for minutes), and the run goes on."""
    import socket

    from distlab.records.run_dir import RunDir
    from distlab.tracking import session
    from distlab.tracking.mlflow_tracker import server_answers

    with socket.socket() as probe:  # a port nothing listens on (bound, never listening)
        probe.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{probe.getsockname()[1]}"
        cfg = compose(["logger=mlflow", f"logger.tracking_uri={uri}"])
        job = session.Session(session.build(cfg), RunDir(tmp_path), {"seed": 1})
        job.start()
        job.log_epoch({"epoch": 1, "loss": 0.5})
        job.finish({"status": "completed"})
    [warned] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned.startswith(f"logger=mlflow: start failed (ConnectionError: no MLflow server "
                             f"answers at {uri} within 10 s"), warned
    assert "training goes on without it" in warned
    server_answers("sqlite:///x.db")  # other stores: nothing to probe
    with pytest.MonkeyPatch.context() as mp:  # behind a proxy, as MLflow's client reaches it
        mp.setenv("http_proxy", "http://proxy.invalid:3128")
        mp.delenv("no_proxy", raising=False)
        mp.delenv("NO_PROXY", raising=False)
        server_answers(uri)
    with socket.socket() as server:  # a server that accepts: passes
        server.bind(("127.0.0.1", 0))
        server.listen()
        server_answers(f"http://127.0.0.1:{server.getsockname()[1]}/", timeout=5)
