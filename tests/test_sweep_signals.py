"""Ctrl-C, SIGTERM and kill -9 of sweeps whose jobs run in processes of their own
(hydra/launcher=submitit_local, joblib): each running job checkpoints once, the sweep ends
with one line, and a rerun of the sweep resumes the jobs.

The sweep runs in a session of its own, so that a Ctrl-C is what a terminal sends: SIGINT to
every process of the command. Its two jobs are held at a gate (tests/gate.py, imported by
each job process) until both are mid-epoch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import processes
import pytest
from conftest import ROOT, fast_overrides, run_cli
from test_sweep import _assert_png, _summary

from distlab.records.run_dir import RunDir

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]
EXPIRY_S = 300  # the sweep's processes are killed after this
PATHS = {"PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT / "src")])}  # gate
LAUNCHERS = {"submitit_local": ["hydra.launcher.timeout_min=10"],
             "joblib": ["hydra.launcher.n_jobs=2"],
             "joblib_in_process": ["hydra.launcher.n_jobs=1"],  # the jobs in the sweep's process
             "basic": []}  # Hydra's default launcher: the jobs in the sweep's process too


class Sweep:
    """`python run.py -m ARGS` in a session of its own (tests/processes.py: forked from an
    interpreter that has imported TensorFlow; its job processes are joblib's or submitit's,
    fresh interpreters), its jobs gated at step 3 of epoch 1 (`jobs_at_gate` until both are
    there; a job leaves the gate once it is asked to stop); killed, with every process of
    it, on expiry."""

    def __init__(self, args: list[str], gate: Path) -> None:
        gate.mkdir(parents=True, exist_ok=True)
        self.gate = gate
        env = {**PATHS, "DISTLAB_TEST_GATE": "step:0:3", "DISTLAB_TEST_GATE_DIR": str(gate)}
        self.proc = processes.Process("run.py", *args, env=env, new_session=True)
        self.expiry = time.monotonic() + EXPIRY_S

    def jobs_at_gate(self, count: int = 2) -> list[int]:
        """The pids of the job processes once `count` of them wait at the gate."""
        while len(reached := sorted(self.gate.glob("reached.*"))) < count:
            if self.proc.poll() is not None or time.monotonic() > self.expiry:
                self.kill()
                raise AssertionError("the jobs never reached their gate:\n"
                                     + self.proc.communicate()[0][-3000:])
            time.sleep(0.05)
        return [int(p.name.split(".")[1]) for p in reached]

    def finish(self) -> tuple[int, str]:
        try:
            output = self.proc.communicate(timeout=max(1.0, self.expiry - time.monotonic()))[0]
        except subprocess.TimeoutExpired:
            self.kill()
            output = self.proc.communicate()[0] + "\n<killed: timeout>"
        return self.proc.returncode, output

    def wait_gone(self, pid: int) -> None:
        """Until process `pid` (a job of the sweep) has exited; killed on expiry."""
        from distlab.launch.sweep_parent import alive

        while alive(pid):
            if time.monotonic() > self.expiry:
                self.kill()
                raise AssertionError(f"job process {pid} did not exit")
            time.sleep(0.05)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def __enter__(self) -> Sweep:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        self.proc.wait()


def _args(tiny_data_dir: Path, sweep_dir: Path, launcher: str, store: str,
          *swept: str) -> list[str]:
    """The sweep's command line: 2 jobs, `seed=1,2` (strategy=default) unless `swept` says
    otherwise."""
    return ["-m", *fast_overrides(tiny_data_dir), f"hydra/launcher={launcher.split('_in_')[0]}",
            *LAUNCHERS[launcher], "loop=custom", "model=mlp",
            "model.hidden_units=[8]", "trainer.epochs=1", "trainer.steps_per_epoch=6",
            "imports=[gate]", "logger=mlflow", f"logger.tracking_uri={store}",
            *(swept or ("strategy=default", "seed=1,2")), f"hydra.sweep.dir={sweep_dir}"]


def _results(job: Path) -> dict:
    results = RunDir(job).read_results()
    assert results is not None, f"no results.json in {job}"
    return results


def _mlflow_statuses(store: str) -> tuple[list[str], list[str]]:
    """(the jobs' run statuses, the sweep's parent run statuses)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("distlab").experiment_id])
    parent = [r.info.status for r in runs if "distlab.sweep_dir" in r.data.tags]
    return sorted(r.info.status for r in runs if "distlab.run_dir" in r.data.tags), parent


def _one_line(output: str, text: str) -> str:
    """The one line of `output` with `text`; no traceback, no joblib error anywhere."""
    lines = [ln for ln in output.splitlines() if text in ln]
    assert len(lines) == 1, output[-4000:]
    for noise in ("Traceback", "TerminatedWorkerError", "KeyboardInterrupt"):
        assert noise not in output, output[-4000:]
    return lines[0]


@pytest.mark.parametrize("launcher,signum", [("submitit_local", signal.SIGINT),
                                             ("joblib", signal.SIGINT),
                                             ("joblib", signal.SIGTERM)],
                         ids=["submitit_local-SIGINT", "joblib-SIGINT", "joblib-SIGTERM"])
def test_a_stopped_sweep_checkpoints_every_job_then_its_rerun_resumes_them(
        launcher, signum, tiny_data_dir, tmp_path, mlflow_store):
    """Ctrl-C (SIGINT to every process of the sweep, as a terminal sends it) or SIGTERM to the
    sweep's process alone, both jobs mid-epoch: each job stops once with a checkpoint
    (results.json interrupted at step 3, its MLflow run KILLED; submitit_local sent each job
    SIGINT twice, joblib killed one), the summary is written, the parent MLflow run is
    KILLED and the sweep exits 128+N with one line; the same command then resumes both.

    The jobs are `strategy.cpu_devices=1,2` (MirroredStrategy): strategy.cpu_devices cannot
    change inside one process, so the process-per-job launchers are what sweeps it; the
    completed rerun shows each job's own replica count in its results and the summary."""
    sweep_dir, store = tmp_path / "sweep", mlflow_store(tmp_path / "mlflow.db")
    args = _args(tiny_data_dir, sweep_dir, launcher, store, "strategy.cpu_devices=1,2")
    with Sweep(args, tmp_path / "gate") as sweep:
        sweep.jobs_at_gate()
        if signum == signal.SIGINT:
            os.killpg(sweep.proc.pid, signal.SIGINT)  # Ctrl-C
        else:
            sweep.proc.send_signal(signal.SIGTERM)
        returncode, output = sweep.finish()
    assert returncode == 128 + signum, output[-4000:]
    line = _one_line(output, "sweep stopped by")
    assert "rerun the same command" in line
    assert "second signal" not in output
    jobs = [sweep_dir / "0", sweep_dir / "1"]
    for job in jobs:
        cut = _results(job)
        assert (cut["status"], cut["interrupted_stage"]) == ("interrupted", "training"), cut
        assert (cut["epochs_completed"], cut["steps_in_epoch"]) == (0, 3), cut
        assert (job / "checkpoints" / "checkpoint").exists()
        assert "second signal" not in (job / "run.log").read_text()
    rows = (sweep_dir / "summary.csv").read_text().splitlines()
    assert len(rows) == 3 and all(",interrupted," in r for r in rows[1:]), rows
    assert _mlflow_statuses(store) == (["KILLED", "KILLED"], ["KILLED"])
    if launcher == "joblib":
        return  # the rerun is the same for every way of stopping: joblib's is checked after
        # a kill -9 (test_sweep.py::test_jobs_of_a_killed_joblib_sweep_stop_with_a_...)
    out = run_cli(*args, timeout=EXPIRY_S, env=PATHS)  # ungated
    assert_rerun_resumed_every_job(sweep_dir, store, out)


def assert_rerun_resumed_every_job(sweep_dir: Path, store: str,
                                   out: subprocess.CompletedProcess) -> None:
    """The rerun of a stopped `strategy.cpu_devices=1,2` sweep (`out`) resumed both jobs and
    completed them, each in a process of its own with its own replica count: results, MLflow
    statuses (jobs and parent FINISHED), the summary's rows, table and plot."""
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    jobs = [sweep_dir / "0", sweep_dir / "1"]
    for job in jobs:
        done = _results(job)
        assert (done["status"], done["epochs_completed"]) == ("completed", 1), done
        assert "resuming from" in (job / "run.log").read_text()
    assert _mlflow_statuses(store) == (["FINISHED", "FINISHED"], ["FINISHED"])
    # each job in a process of its own, with its own device count
    assert [_results(job)["num_replicas"] for job in jobs] == [1, 2]
    rows = _summary(sweep_dir)
    assert [(r["num_replicas"], r["global_batch_size"], r["status"]) for r in rows] == [
        ("1", "64", "completed"), ("2", "128", "completed")]
    md = (sweep_dir / "summary.md").read_text()
    for num, devices in ((0, 1), (1, 2)):
        assert f"| {num} | strategy.cpu_devices={devices} | completed |" in md, md
    _assert_png(sweep_dir / "summary.png")


def test_a_killed_joblib_job_stops_its_sibling_with_a_checkpoint(tiny_data_dir, tmp_path,
                                                                 mlflow_store):
    """kill -9 of one joblib job process: joblib would kill the other worker at once; its
    job stops with a checkpoint and a status (or finishes) first, and the sweep exits 1 with
    one line naming the dead job, its summary written."""
    sweep_dir, store = tmp_path / "sweep", mlflow_store(tmp_path / "mlflow.db")
    with Sweep(_args(tiny_data_dir, sweep_dir, "joblib", store), tmp_path / "gate") as sweep:
        victim, _ = sweep.jobs_at_gate()
        os.kill(victim, signal.SIGKILL)
        returncode, output = sweep.finish()
    assert returncode == 1, output[-4000:]
    line = _one_line(output, "sweep failed:")
    assert f"(pid {victim}) died without finishing" in line, line
    killed = [j for j in (sweep_dir / "0", sweep_dir / "1")
              if f"pid {victim}," in (j / ".distlab" / "lock").read_text()]
    [sibling] = {sweep_dir / "0", sweep_dir / "1"} - set(killed)
    cut = _results(sibling)  # asked to stop before joblib killed its process
    assert (cut["status"], cut["steps_in_epoch"]) == ("interrupted", 3), cut
    assert (sibling / "checkpoints" / "checkpoint").exists()
    rows = (sweep_dir / "summary.csv").read_text().splitlines()
    assert len(rows) == 3, rows


@pytest.mark.parametrize("launcher", ["joblib_in_process", "basic"])
def test_ctrl_c_of_a_sweep_in_one_process_starts_no_more_jobs(tiny_data_dir, tmp_path,
                                                              mlflow_store, launcher):
    """joblib's hydra.launcher.n_jobs=1, and Hydra's basic launcher, run the jobs one after
    another in the sweep's own process: Ctrl-C during job 0 stops it with a checkpoint, and
    job 1 is not started; the summary lists both (job 1 `not started`, not failed), and the
    sweep exits 130 with one line. (The basic launcher's sweep used to exit with its job,
    writing no summary.)"""
    sweep_dir, store = tmp_path / "sweep", mlflow_store(tmp_path / "mlflow.db")
    args = _args(tiny_data_dir, sweep_dir, launcher, store)
    with Sweep(args, tmp_path / "gate") as sweep:
        sweep.jobs_at_gate(count=1)
        os.killpg(sweep.proc.pid, signal.SIGINT)
        returncode, output = sweep.finish()
    assert returncode == 128 + signal.SIGINT, output[-4000:]
    _one_line(output, "sweep stopped by")
    cut = _results(sweep_dir / "0")
    assert (cut["status"], cut["steps_in_epoch"]) == ("interrupted", 3), cut
    assert not (sweep_dir / "1" / "results.json").exists()
    assert not (sweep_dir / "1" / "run.log").exists() or "time to first step" not in (
        sweep_dir / "1" / "run.log").read_text()
    rows = (sweep_dir / "summary.csv").read_text().splitlines()
    assert len(rows) == 3 and ",interrupted," in rows[1] and ",not started," in rows[2], rows
    assert "2 jobs: 0 completed, 0 failed, 1 interrupted, 1 not started" in output
    assert _mlflow_statuses(store) == (["KILLED"], ["KILLED"])
