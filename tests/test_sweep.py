"""Multirun sweeps: per-job run dirs, the sweep summary (csv, md, png, TensorBoard HParams),
failure isolation, in-process determinism and the Optuna search (the process-per-job
launchers sweeping strategy.cpu_devices: test_sweep_signals.py, with a stop and a rerun).

(The learning-rate scaling rule itself is unit-tested in test_schedules.py; here the
effective rate is checked end to end, in the summary.)
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from conftest import ROOT, fast_overrides, run_cli
from omegaconf import OmegaConf

from distlab.records.run_dir import RunDir
from distlab.reporting.summary import (
    LEADING,
    TRAILING,
    Job,
    SweepSummary,
    override_values,
    parse_value,
    swept_keys,
)

SHORT = ("trainer.epochs=1", "trainer.steps_per_epoch=2", "model=mlp", "model.hidden_units=[8]")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _sweep(data_dir: Path, sweep_dir: Path, *args: str, timeout: float = 300):
    out = run_cli("-m", *fast_overrides(data_dir), *SHORT, *args, f"hydra.sweep.dir={sweep_dir}",
                  timeout=timeout)
    return out, out.stdout + out.stderr


def _summary(sweep_dir: Path) -> list[dict[str, str]]:
    with (sweep_dir / "summary.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def _results(job_dir: Path) -> dict:
    results = RunDir(job_dir).read_results()
    assert results is not None, f"no results.json in {job_dir}"
    return results


def _hparams_events(logdir: Path) -> list:
    """The summary values of our HParams event files in `logdir`."""
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    files = sorted(logdir.glob("events.out.tfevents.*.hparams"))
    assert len(files) == 1, files
    return [v for e in LegacyEventFileLoader(str(files[0])).Load() for v in e.summary.value]


def _session_hparams(values: list) -> dict:
    from tensorboard.plugins.hparams import plugin_data_pb2

    for v in values:
        if v.metadata.plugin_data.plugin_name == "hparams":
            data = plugin_data_pb2.HParamsPluginData.FromString(v.metadata.plugin_data.content)
            if data.HasField("session_start_info"):
                return {k: (x.number_value if x.HasField("number_value") else x.string_value)
                        for k, x in data.session_start_info.hparams.items()}
    raise AssertionError("no HParams session in the events")


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5000, path


# --------------------------------------------------------------------------- fast


def _fake_job(sweep_dir: Path, num: int, overrides: list[str], results: dict | None) -> None:
    job = sweep_dir / str(num)
    (job / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create({"hydra": {"job": {"num": num}}}), job / ".hydra/hydra.yaml")
    OmegaConf.save(OmegaConf.create(overrides), job / ".hydra/overrides.yaml")
    if results is not None:
        RunDir(job).write_results(results)


def test_overrides_and_swept_keys():
    assert override_values(["loop=custom", "+seed=3", "dataset.name=mnist"]) == {
        "loop": "custom", "seed": "3", "dataset.name": "mnist"}
    assert [parse_value(v) for v in ("32", "1e-3", "False", "null", "mnist")] == [
        32, 1e-3, False, None, "mnist"]
    jobs = [Job(n, Path(str(n)), ["loop=custom", f"seed={s}", f"optimizer.learning_rate={lr}"])
            for n, (s, lr) in enumerate([(1, 0.1), (1, 0.01), (2, 0.1)])]
    assert swept_keys(jobs) == ["seed", "optimizer.learning_rate"]
    assert swept_keys(jobs[:1]) == []


def test_regression_summary_uses_the_task_fields_and_ranks_errors_downwards(tmp_path):
    for num, mae in enumerate([0.7, 0.5, 0.9]):
        _fake_job(tmp_path, num, [f"optimizer.learning_rate={num + 1}e-3"],
                  {"status": "completed", "test_loss": mae ** 2, "test_mae": mae,
                   "test_rmse": mae * 1.2, "objective": "test_mae",
                   "objective_direction": "minimize", "train_examples_per_sec": 10.0})
    from distlab.reporting.summary import _maximize, find_jobs

    assert _maximize(find_jobs(tmp_path), "test_mae") is False
    SweepSummary().summarise(tmp_path)
    rows = _summary(tmp_path)
    assert list(rows[0])[len(LEADING):len(LEADING) + 5] == [
        "objective", "objective_value", "test_mae", "test_rmse", "test_loss"]
    # the objective's name and each job's value of it, so nobody has to look the field up
    assert [(r["objective"], float(r["objective_value"])) for r in rows] == [
        ("test_mae", 0.7), ("test_mae", 0.5), ("test_mae", 0.9)]
    md = (tmp_path / "summary.md").read_text()
    assert ("Best configuration (chosen on `test_mae`, minimized): "
            "`optimizer.learning_rate=2e-3` (job 1: test_mae 0.5)") in md and "test mae" in md
    assert "Objective: `test_mae` (minimized)" in md and "| objective value |" in md
    _assert_png(tmp_path / "summary.png")


def test_summary_lists_every_job_and_fails_on_a_failed_one(tmp_path):
    common = ["trainer.epochs=1", "loop=custom"]
    done = {"status": "completed", "batch_size_per_replica": 32, "global_batch_size": 64,
            "num_replicas": 2, "learning_rate": 5e-4, "test_accuracy": 0.9, "test_loss": 0.3,
            "train_examples_per_sec": 1000.0, "wall_time_s": 12.0}
    _fake_job(tmp_path, 0, [*common, "dataset.batch_size_per_replica=32"], done)
    _fake_job(tmp_path, 1, [*common, "dataset.batch_size_per_replica=64"],
              {"status": "failed", "error": "non-finite loss (nan) in epoch 1: lower it",
               "batch_size_per_replica": 64, "wall_time_s": 0.5})
    _fake_job(tmp_path, 2, [*common, "dataset.batch_size_per_replica=128"], None)  # killed

    failed = SweepSummary().summarise(tmp_path)

    assert [j.num for j in failed] == [1, 2]
    rows = _summary(tmp_path)
    assert list(rows[0]) == (LEADING + ["objective", "objective_value", "test_accuracy",
                                        "test_loss"] + TRAILING
                             + ["dataset.batch_size_per_replica"])
    assert [r["status"] for r in rows] == ["completed", "failed", "missing"]
    assert rows[0]["learning_rate"] == "0.0005" and rows[0]["global_batch_size"] == "64"
    assert "non-finite loss" in rows[1]["error"] and "did not finish" in rows[2]["error"]
    assert [r["dataset.batch_size_per_replica"] for r in rows] == ["32", "64", "128"]
    md = (tmp_path / "summary.md").read_text()
    assert "| 1 | dataset.batch_size_per_replica=64 | failed |" in md
    assert "`loop=custom`" in md and "Best configuration (chosen on `test_accuracy`" in md
    _assert_png(tmp_path / "summary.png")
    assert _session_hparams(_hparams_events(tmp_path / "0" / "logs"))["status"] == "completed"
    _hparams_events(tmp_path)  # the experiment config
    SweepSummary().summarise(tmp_path)  # idempotent: still one HParams file per dir
    _hparams_events(tmp_path / "1" / "logs")
    # ranked on a field a failed job writes too: the failed job has no objective value
    SweepSummary(plot=False, tensorboard=False).summarise(tmp_path, objective="wall_time_s")
    assert [r["objective_value"] for r in _summary(tmp_path)] == ["12.0", "", ""]


def test_sweep_configs_compose():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        optuna = compose("config", ["hparams_search=optuna"], return_hydra_config=True)
        assert optuna.hydra.sweeper._target_.endswith("OptunaSweeper")
        assert set(optuna.hydra.sweeper.params) == {"optimizer.learning_rate",
                                                    "dataset.batch_size_per_replica"}
        assert optuna.hydra.sweeper.direction == "auto" and optuna.objective
        for launcher in ("joblib", "submitit_local", "submitit_slurm"):
            cfg = compose("config", [f"hydra/launcher={launcher}"], return_hydra_config=True)
            assert cfg.hydra.launcher._target_.startswith("hydra_plugins."), launcher
        summary = cfg.hydra.callbacks.sweep_summary._target_
        assert summary == "distlab.reporting.summary.SweepSummary"


# --------------------------------------------------------------------------- slow


@pytest.mark.slow
def test_sweep_writes_job_dirs_and_summary(tiny_data_dir, tmp_path, run_inprocess):
    common = ("deterministic=true", "seed=3", "optimizer.lr_scaling=linear",
              "optimizer.base_batch_size=64")
    out, text = _sweep(tiny_data_dir, tmp_path / "s", *common,
                       "dataset.batch_size_per_replica=32,128")
    assert out.returncode == 0, text[-3000:]
    for num, batch in ((0, 32), (1, 128)):
        job = tmp_path / "s" / str(num)
        results = _results(job)
        assert results["status"] == "completed"
        assert results["global_batch_size"] == batch
        assert results["learning_rate"] == pytest.approx(1e-3 * batch / 64)
        for name in (".hydra/config.yaml", "run.log", "history.csv", "checkpoints/checkpoint"):
            assert (job / name).exists(), name
        assert f"dataset.batch_size_per_replica={batch}" in (job / ".hydra/overrides.yaml"
                                                              ).read_text()
        session = _hparams_events(job / "logs")
        assert _session_hparams(session)["dataset.batch_size_per_replica"] == batch
        assert {v.tag: v.simple_value for v in session}["test_accuracy"] == pytest.approx(
            results["test_accuracy"])

    rows = _summary(tmp_path / "s")
    assert [(r["job"], r["status"], r["batch_size_per_replica"]) for r in rows] == [
        ("0", "completed", "32"), ("1", "completed", "128")]
    assert {"test_accuracy", "test_loss", "train_examples_per_sec", "wall_time_s",
            "global_batch_size", "learning_rate", "overrides", "error"} <= set(rows[0])
    assert [float(r["learning_rate"]) for r in rows] == pytest.approx([5e-4, 2e-3])
    assert "dataset.batch_size_per_replica=128 | completed" in (tmp_path / "s" / "summary.md"
                                                                 ).read_text()
    _assert_png(tmp_path / "s" / "summary.png")
    _hparams_events(tmp_path / "s")

    # deterministic=true: job 1 of the in-process sweep equals the same config run alone
    # (here in this process, on one CPU device as run.py's)
    alone = run_inprocess(*SHORT, *common, "dataset.batch_size_per_replica=128",
                          "strategy.cpu_devices=1")
    assert alone["test_loss"] == pytest.approx(_results(tmp_path / "s" / "1")["test_loss"],
                                               abs=1e-6)


@pytest.mark.slow
def test_a_failed_job_fails_the_sweep_but_not_the_other_jobs(tiny_data_dir, tmp_path):
    out, text = _sweep(tiny_data_dir, tmp_path, "loop=custom",
                       "dataset.name=no_such_dataset,mnist")
    assert out.returncode != 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert "sweep failed: 1 job(s) failed (job 0: dataset.name='no_such_dataset'" in text
    assert _results(tmp_path / "1")["status"] == "completed"
    rows = _summary(tmp_path)
    assert [(r["job"], r["status"]) for r in rows] == [("0", "failed"), ("1", "completed")]
    assert "no_such_dataset" in rows[0]["error"] and not rows[1]["error"]
    assert "| 0 | dataset.name=no_such_dataset | failed |" in (tmp_path / "summary.md"
                                                               ).read_text()
    _assert_png(tmp_path / "summary.png")


@pytest.mark.slow
def test_optuna_search_runs_trials(tiny_data_dir, tmp_path):
    out = run_cli(*fast_overrides(tiny_data_dir), *SHORT, "hparams_search=optuna",
                  "hydra.sweeper.n_trials=2", f"hydra.sweep.dir={tmp_path}")  # no -m needed
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    best = OmegaConf.load(tmp_path / "optimization_results.yaml")
    rows = _summary(tmp_path)
    assert len(rows) == 2 and all(r["status"] == "completed" for r in rows)
    for row in rows:
        assert 1e-4 <= float(row["optimizer.learning_rate"]) <= 1e-2
        assert row["dataset.batch_size_per_replica"] in ("32", "64", "128", "256")
    assert best.best_value == pytest.approx(max(float(r["val_accuracy"]) for r in rows))
    results = json.loads((tmp_path / "0" / "results.json").read_text())
    assert results["learning_rate"] == pytest.approx(float(rows[0]["optimizer.learning_rate"]))


@pytest.mark.slow
def test_optuna_search_whose_every_trial_fails(tiny_data_dir, tmp_path):
    out = run_cli(*fast_overrides(tiny_data_dir), "trainer.epochs=1", "hparams_search=optuna",
                  "hydra.sweeper.n_trials=2", "trainer.steps_per_epoch=20",
                  'hydra.sweeper.params={optimizer.learning_rate: "interval(1e11, 1e12)"}',
                  f"hydra.sweep.dir={tmp_path}")
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-3000:]
    assert "Traceback" not in text and "No trials are completed" not in text, text[-3000:]
    assert "sweep failed: 2 job(s) failed" in text
    rows = _summary(tmp_path)
    assert [r["status"] for r in rows] == ["failed", "failed"]
    assert all("non-finite loss" in r["error"] for r in rows)


@pytest.mark.slow
def test_a_refused_job_is_a_failed_job_of_the_sweep(tiny_data_dir, tmp_path, mlflow_store):
    """A sweep rerun into the same sweep dir with job 0's value changed: job 0 is refused (its
    dir holds a run with another learning rate). The sweep exits 1 naming the reason; the
    summary shows job 0 as failed with the asked value and the reason, not the earlier run;
    MLflow has a FAILED run for it and a FAILED parent."""
    store = mlflow_store(tmp_path / "mlflow.db")
    sweep = tmp_path / "sweep"
    args = ("loop=custom", "logger=mlflow", f"logger.tracking_uri={store}")
    out, text = _sweep(tiny_data_dir, sweep, *args, "optimizer.learning_rate=1e-3,5e-3")
    assert out.returncode == 0, text[-3000:]
    out, text = _sweep(tiny_data_dir, sweep, *args, "optimizer.learning_rate=2e-3,5e-3")
    assert out.returncode == 1, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert "sweep failed: 1 job(s) failed (job 0: refused: " in text, text[-3000:]
    rows = _summary(sweep)
    assert [(r["job"], r["status"]) for r in rows] == [("0", "failed"), ("1", "completed")]
    assert float(rows[0]["optimizer.learning_rate"]) == 2e-3, rows[0]  # as asked
    assert "holds a run started with another config" in rows[0]["error"], rows[0]
    assert rows[0]["error"].endswith("or choose a new hydra.sweep.dir (a sweep's job dir "
                                     "holds the job of its number)"), rows[0]
    assert not rows[0]["test_loss"]  # not the earlier run's figures
    assert _results(sweep / "0")["learning_rate"] == pytest.approx(1e-3)  # left as it was
    md = (sweep / "summary.md").read_text()
    assert "2 jobs: 1 completed, 1 failed." in md
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("distlab").experiment_id])
    parent = [r for r in runs if "distlab.sweep_dir" in r.data.tags]
    assert [r.info.status for r in parent] == ["FAILED"]
    refused = [r for r in runs if "distlab.error" in r.data.tags]
    assert len(refused) == 1 and refused[0].info.status == "FAILED"
    assert "another config" in refused[0].data.tags["distlab.error"]
    assert refused[0].data.tags["mlflow.parentRunId"] == parent[0].info.run_id
    # narrowed to job 0's first value: this sweep's one job, not job 1 of the sweeps before
    out, text = _sweep(tiny_data_dir, sweep, *args, "optimizer.learning_rate=1e-3")
    assert out.returncode == 0, text[-3000:]
    assert [(r["job"], r["status"]) for r in _summary(sweep)] == [("0", "completed")]
    assert "1 job: 1 completed, 0 failed." in (sweep / "summary.md").read_text()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_jobs_of_a_killed_joblib_sweep_stop_with_a_checkpoint_and_resume(tiny_data_dir,
                                                                         tmp_path,
                                                                         mlflow_store):
    """kill -9 of a joblib sweep's own process, both jobs mid-epoch (held at a gate): its
    two job processes (joblib's workers) stop at the next step with a checkpoint and
    results.json `interrupted`, releasing their run dirs, so that the rerun of the sweep
    resumes both (they trained on before, unseen, and the rerun was refused as in use),
    each with its own replica count (`strategy.cpu_devices=1,2`), as after a Ctrl-C."""
    import os
    import signal

    from test_sweep_signals import PATHS, Sweep, _args, assert_rerun_resumed_every_job

    sweep_dir, store = tmp_path / "sweep", mlflow_store(tmp_path / "mlflow.db")
    args = _args(tiny_data_dir, sweep_dir, "joblib", store, "strategy.cpu_devices=1,2")
    jobs = [sweep_dir / "0", sweep_dir / "1"]
    with Sweep(args, tmp_path / "gate") as sweep:
        pids = sweep.jobs_at_gate()
        os.kill(sweep.proc.pid, signal.SIGKILL)  # the sweep's process alone
        sweep.finish()
        for pid in pids:  # each job sees its sweep gone, checkpoints and exits
            sweep.wait_gone(pid)
    for job in jobs:
        cut = _results(job)
        assert (cut["status"], cut["epochs_completed"], cut["steps_in_epoch"]) == (
            "interrupted", 0, 3), cut
        assert (job / "checkpoints" / "checkpoint").exists()
    out = run_cli(*args, timeout=300, env=PATHS)  # ungated
    assert_rerun_resumed_every_job(sweep_dir, store, out)


def test_the_plot_is_a_list_of_panels():
    """summary.png draws `panels(jobs)`: the objective, throughput with its spread, and time
    to target only when a job has one."""
    from distlab.reporting.summary import Job, panels

    plain = [Job(0, Path("0"), [], {"status": "completed", "val_mae": 0.3})]
    assert [(p.field, p.spread) for p in panels(plain)] == [
        ("val_mae", None), ("train_examples_per_sec", "train_examples_per_sec_std")]
    targeted = [Job(0, Path("0"), [], {"status": "completed", "time_to_target_s": 2.0})]
    assert [p.field for p in panels(targeted, "wall_time_s")] == [
        "wall_time_s", "train_examples_per_sec", "time_to_target_s"]


def test_interrupted_jobs_are_counted_apart_from_failed_ones_and_long_errors_cut_at_a_word():
    """A sweep stopped by Ctrl-C: its jobs are interrupted, not failed, in the summary's
    count (its status column said interrupted, the headline 'failed'), and those it did not
    start are 'not started' (they were 'missing', failed); a long error in the sweep's one
    line is cut at a word."""
    from distlab.reporting.jobs import Job, tally
    from distlab.reporting.summary import _first_line

    def job(num: int, status: str | None) -> Job:
        return Job(num, Path(f"/s/{num}"), [], {"status": status} if status else {})

    assert tally([job(0, "interrupted"), job(1, "interrupted")]) == (
        "2 jobs: 0 completed, 0 failed, 2 interrupted")
    assert tally([job(0, "completed"), job(1, "failed"), job(2, None)]) == (
        "3 jobs: 1 completed, 2 failed")
    # a job a stopped sweep did not start (its mark in the run dir) is neither
    waiting = Job(2, Path("/s/2"), [], {}, not_started=True)
    assert waiting.status == "not started" and "sweep was stopped" in waiting.error
    assert tally([job(0, "interrupted"), job(1, "interrupted"), waiting]) == (
        "3 jobs: 0 completed, 0 failed, 2 interrupted, 1 not started")
    cut = _first_line("refused: " + "word " * 60 + "choose\nsecond line", limit=60)
    assert cut.endswith("word \u2026") and len(cut) <= 62 and "\n" not in cut
    assert _first_line("short error\nmore") == "short error"


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_sweep_killed_in_its_second_job_resumes_without_retraining_the_first(tiny_data_dir,
                                                                               tmp_path):
    """kill -9 of an in-process sweep while its job 1 is in epoch 1 (held at a gate, its
    epoch-0 checkpoint written): the same command reports job 0 as already completed without
    training it (its results.json untouched), resumes job 1 from its checkpoint and writes a
    complete summary."""
    from conftest import Gated

    sweep = tmp_path / "sweep"
    args = ["-m", *fast_overrides(tiny_data_dir), "trainer.steps_per_epoch=2", "model=mlp",
            "model.hidden_units=[8]", "strategy=default", "seed=1,2",
            f"hydra.sweep.dir={sweep}"]
    with Gated(args, tmp_path / "unused", "step:1:1", tmp_path / "gate",
               env={"DISTLAB_TEST_GATE_NTH": "2"}) as gated:
        gated.wait()  # job 1, epoch 1, step 1: job 0 done, job 1's first checkpoint written
        gated.proc.kill()
        gated.finish()
    first = sweep / "0" / "results.json"
    done_before, stamp = first.read_text(), first.stat().st_mtime_ns
    assert json.loads(done_before)["status"] == "completed"
    assert (sweep / "1" / "checkpoints" / "checkpoint").exists()
    assert not (sweep / "summary.csv").exists()

    out = run_cli(*args, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert (first.read_text(), first.stat().st_mtime_ns) == (done_before, stamp)
    assert "already completed 2 epoch(s); not retraining" in text, text[-3000:]
    resumed = _results(sweep / "1")
    assert (resumed["status"], resumed["epochs_completed"]) == ("completed", 2), resumed
    assert "resuming from" in (sweep / "1" / "run.log").read_text()
    rows = _summary(sweep)
    assert [(r["job"], r["status"]) for r in rows] == [("0", "completed"), ("1", "completed")]
    assert float(rows[0]["test_loss"]) == json.loads(done_before)["test_loss"]
