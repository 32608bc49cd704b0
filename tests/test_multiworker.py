"""MultiWorkerMirroredStrategy with two local worker processes (TF_CONFIG on 127.0.0.1, or the
environment srun sets), in both loops: training, a worker's death, coordinated preemption,
resume from the chief's disk, the cluster-formation timeout. Every process has a hard kill.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import processes
import pytest
from conftest import ROOT, fast_overrides

from distlab.distribute.cluster import free_ports

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]
TIMEOUT = 240  # seconds before a worker process is killed


def _start(index: int, workers: list[str], *args: str, env: dict | None = None,
           entry: str = "run.py", terminal: bool = False) -> processes.Process:
    """Worker `index`: `python ENTRY` (run.py, or tests/gate.py to hold it at a gate), its
    output on a pseudo-terminal when `terminal`."""
    tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
    return processes.Process(entry, "strategy=multi_worker_mirrored", *args,
                             env={"TF_CONFIG": json.dumps(tf_config), **(env or {})},
                             terminal=terminal)


def _finish(proc: processes.Process, timeout: float = TIMEOUT) -> str:
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        proc.kill()  # TF ignores SIGTERM while waiting for peers
        return proc.communicate()[0] + "\n<killed: timeout>"


def _cluster(run_dir: Path, *args: str) -> tuple[list[processes.Process], list[str]]:
    """Start worker 0 (chief) and worker 1, with run dirs run_dir/W0 and run_dir/W1."""
    workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    return [_start(i, workers, *args, f"hydra.run.dir={run_dir / f'W{i}'}")
            for i in range(2)], workers


def _held_cluster(run_dir: Path, gate: str, *args: str, held: int = 1
                  ) -> tuple[list[processes.Process], list[str], Path]:
    """As `_cluster`, with worker `held` held at `gate` (tests/gate.py: `step:E:S`); returns
    once it is held (an event, whatever the machine's speed): (processes, workers, gate
    folder, where `released` lets it go on)."""
    workers, folder = [f"127.0.0.1:{p}" for p in free_ports(2)], run_dir / "gate"
    folder.mkdir(parents=True)
    gated = {"entry": str(Path("tests") / "gate.py"),
             "env": {"DISTLAB_TEST_GATE": gate, "DISTLAB_TEST_GATE_DIR": str(folder)}}
    procs = [_start(i, workers, *args, f"hydra.run.dir={run_dir / f'W{i}'}",
                    **(gated if i == held else {})) for i in range(2)]
    expiry = time.monotonic() + TIMEOUT
    while not (folder / "reached").exists():
        if time.monotonic() > expiry or any(p.poll() is not None for p in procs):
            for p in procs:
                p.kill()
            pytest.fail(f"worker {held} never reached its gate: "
                        + "\n".join(p.communicate()[0][-2000:] for p in procs))
        time.sleep(0.05)
    return procs, workers, folder


def _rows(run_dir: Path) -> int:
    history = run_dir / "history.csv"
    return max(0, len(history.read_text().splitlines()) - 1) if history.exists() else 0


def _run_cluster(run_dir: Path, *args: str) -> list[str]:
    procs, _ = _cluster(run_dir, *args)
    outputs = [_finish(p) for p in procs]
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out[-3000:]
    return outputs


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


# 2 epochs of 20 steps; deterministic=true, so fit and custom, 2 workers and 1 process with
# 2 replicas, resumed and uninterrupted runs all end with the same test loss
RUN = ("trainer.epochs=2", "trainer.steps_per_epoch=20", "trainer.checkpoint_every=1",
       "deterministic=true", "seed=5")


@pytest.fixture
def reference(run_once):
    """reference(loop): the same training in one process with 2 replicas (the multi-worker
    runs' target), trained once per session, in a test process (what is compared is its
    figures)."""
    return lambda loop: run_once(*RUN, f"loop={loop}", "strategy.cpu_devices=2")[0]


@pytest.mark.parametrize("loop", ["keras_fit", "custom"])
def test_two_workers_train_like_one_process_and_only_the_chief_writes(loop, tiny_data_dir,
                                                                      tmp_path, reference,
                                                                      monkeypatch, mlflow_store):
    store = mlflow_store(tmp_path / "mlflow.db")  # logger=mlflow: the chief only records
    tracked = ("logger=mlflow", f"logger.tracking_uri={store}") if loop == "keras_fit" else ()
    # keras_fit: a callback on every worker, and a chief-only one that asks to stop after
    # step 2 of the last epoch (across workers a stop counts at the epoch's end, so the
    # training is the reference's)
    every, boss = tmp_path / "every.jsonl", tmp_path / "chief.jsonl"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), str(ROOT / "src")]))
    callbacks = ("+callbacks.rec._target_=callback_recorder.Recorder",
                 f"+callbacks.rec.path={every}",
                 "+callbacks.boss._target_=callback_recorder.Recorder",
                 f"+callbacks.boss.path={boss}", "+callbacks.boss._chief_only_=true",
                 "+callbacks.boss.stop_epoch=1", "+callbacks.boss.stop_step=2"
                 ) if loop == "keras_fit" else ()
    _run_cluster(tmp_path, *fast_overrides(tiny_data_dir), *RUN, f"loop={loop}",
                 "trainer.export=true", *tracked, *callbacks)
    chief = _results(tmp_path / "W0")
    assert (chief["num_replicas"], chief["global_batch_size"]) == (2, 128)
    assert chief["strategy"] == "MultiWorkerMirroredStrategy" and chief["loop"] == loop
    assert chief["test_loss"] == pytest.approx(reference(loop)["test_loss"], abs=1e-6)
    assert chief["export_max_abs_diff"] < 1e-4
    for name in ("checkpoints/checkpoint", "history.csv", "saved_model/saved_model.pb"):
        assert (tmp_path / "W0" / name).exists(), name
    assert list((tmp_path / "W0" / "logs" / "train").glob("events.out.tfevents.*"))
    assert not (tmp_path / "W1").exists()  # worker 1 wrote only what Hydra writes, in its own
    assert {p.name for p in (tmp_path / "W1-worker1").iterdir()} == {".hydra", "run.log"}
    if tracked:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(store)
        [run] = client.search_runs([client.get_experiment_by_name("distlab").experiment_id])
        assert run.data.tags["distlab.run_dir"] == str(tmp_path / "W0")
        assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2]
    if callbacks:
        from test_callbacks import _calls

        assert chief["stopped_early"] == {"epoch": 2, "reason": "callback"}
        by_pid: dict[int, list] = {}
        for hook, index, _, pid in _calls(every):
            by_pid.setdefault(pid, []).append((hook, index))
        assert len(by_pid) == 2 and len({pid for *_, pid in _calls(boss)}) == 1
        first, second = by_pid.values()
        assert first == second  # the same calls on both workers; the epoch ran to its end
        assert first[-4:] == [("batch_begin", 19), ("batch_end", 19), ("epoch_end", 1),
                              ("train_end", None)]

    if loop == "custom":  # evaluate across the workers: only the chief's disk has the
        # checkpoint; another loop and optimizer (adam's slots are not restored)
        _run_cluster(tmp_path / "eval", *fast_overrides(tiny_data_dir), "loop=keras_fit",
                     "optimizer=sgd", "mode=evaluate", f"ckpt_path={tmp_path / 'W0'}")
        evaluated = _results(tmp_path / "eval" / "W0")
        assert evaluated["num_replicas"] == 2
        assert evaluated["test_loss"] == pytest.approx(chief["test_loss"], abs=1e-6)


def test_a_dead_worker_ends_the_run_and_a_restart_resumes_it(tiny_data_dir, tmp_path,
                                                             reference, monkeypatch):
    # keras_fit on workers started by hand (the custom loop's dead worker, with a user's
    # loop and its checkpoint item: test_worker_launchers.py's killed worker, exhaustive tier)
    loop = "keras_fit"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), str(ROOT / "src")]))
    args = (*fast_overrides(tiny_data_dir), *RUN, f"loop={loop}")
    procs, workers, _ = _held_cluster(tmp_path, "step:1:10", *args)  # mid-epoch 2
    procs[1].kill()
    out = _finish(procs[0])  # the chief ends by itself (else it is killed on expiry)
    assert "<killed: timeout>" not in out, out[-3000:]
    assert procs[0].returncode == 3, out[-3000:]  # a lost worker's own status
    failed = _results(tmp_path / "W0")
    assert failed["status"] == "failed"
    assert f"lost worker {workers[1]}" in failed["error"]
    assert "rerun all workers to resume" in failed["error"]
    lines = [ln for ln in out.splitlines() if "lost worker" in ln]
    assert len(lines) == 1 and "Traceback" not in out, out[-3000:]
    latest = (tmp_path / "W0" / "checkpoints" / "checkpoint").read_text()
    assert "ckpt-20" in latest or "ckpt-40" in latest

    _run_cluster(tmp_path, *args)
    resumed = _results(tmp_path / "W0")
    assert resumed["status"] == "completed" and resumed["epochs_completed"] == 2
    assert resumed["test_loss"] == pytest.approx(reference(loop)["test_loss"], abs=1e-6)
    history = [int(r.split(",")[0]) for r in
               (tmp_path / "W0" / "history.csv").read_text().splitlines()[1:]]
    assert history == [1, 2]


def test_sigterm_to_one_worker_checkpoints_all_at_one_step(tiny_data_dir, tmp_path, run_once):
    """keras_fit across 2 workers: a SIGTERM to worker 1 mid-epoch 2 stops both at one step
    with a checkpoint; the preemption save reads the epoch's metric sums on every worker, so
    the resumed run's rows equal one process's with 2 replicas."""
    from test_resumed_epochs_and_evaluation import _same_rows

    run = ("trainer.epochs=2", "trainer.steps_per_epoch=40", *RUN[2:], "loop=keras_fit")
    _, one = run_once(*run, "strategy.cpu_devices=2")
    args = (*fast_overrides(tiny_data_dir), *run)
    # worker 1 is held after step 10 of epoch 2 (tests/gate.py) and gets its SIGTERM there;
    # the workers agree on the next step (or the one after), long before the epoch's 40th
    procs, _, gate = _held_cluster(tmp_path, "step:1:10", *args)
    procs[1].send_signal(signal.SIGTERM)
    (gate / "released").write_text("")
    outputs = [_finish(p) for p in procs]
    stops = []
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
        stops += re.findall(r"preemption signal \(SIGTERM to a worker\) at (epoch \d+, step \d+)",
                            out)
    assert len(stops) == 2 and stops[0] == stops[1], stops  # both at the same step
    interrupted = _results(tmp_path / "W0")
    assert interrupted["status"] == "interrupted"
    assert interrupted["steps_in_epoch"] > 0, "not stopped mid-epoch 2"

    _run_cluster(tmp_path, *args)
    resumed = _results(tmp_path / "W0")
    assert resumed["epochs_completed"] == 2
    assert resumed["test_loss"] == pytest.approx(_results(one)["test_loss"], abs=1e-6)
    _same_rows(tmp_path / "W0", one)


def test_lone_worker_gives_up_naming_the_missing_peer(tiny_data_dir, tmp_path):
    workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    proc = _start(0, workers, *fast_overrides(tiny_data_dir), "strategy.connect_timeout_s=5",
                  f"hydra.run.dir={tmp_path}")
    out = _finish(proc, timeout=120)
    assert proc.returncode == 1, out[-3000:]  # ended by distlab, not SIGKILLed on expiry
    assert "did not form" in out and workers[1] in out, out[-3000:]
    assert "Traceback" not in out
    failed = _results(tmp_path)
    assert failed["status"] == "failed" and workers[1] in failed["error"]


def _consecutive_free_ports(n: int) -> int:
    for base in range(20000 + os.getpid() % 5000, 60000, 11):
        try:
            sockets = [socket.socket() for _ in range(n)]
            for i, s in enumerate(sockets):
                s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError("no free ports")


def test_slurm_resolver_with_two_local_tasks(tiny_data_dir, tmp_path):
    # the environment srun gives each task; TF's SlurmClusterResolver reads it (it expands
    # the node list itself and asks nvidia-smi only on nodes with GPUs, so no scontrol)
    base = _consecutive_free_ports(2)
    slurm = {"SLURM_STEP_NODELIST": "localhost", "SLURM_STEP_TASKS_PER_NODE": "2",
             "SLURM_STEP_NUM_TASKS": "2", "SLURM_JOB_ID": "1"}
    procs = [processes.Process(
        "run.py", "strategy=multi_worker_mirrored",
        "strategy.cluster_resolver=slurm", f"strategy.slurm_port_base={base}",
        *fast_overrides(tiny_data_dir), "trainer.epochs=1", "trainer.steps_per_epoch=4",
        f"hydra.run.dir={tmp_path / f'T{i}'}",
        env={"TF_CONFIG": None, **slurm, "SLURM_PROCID": str(i)}) for i in range(2)]
    outputs = [_finish(p) for p in procs]
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out[-3000:]
    chief = _results(tmp_path / "T0")
    assert chief["num_replicas"] == 2 and chief["strategy"] == "MultiWorkerMirroredStrategy"
    assert not (tmp_path / "T1" / "results.json").exists()


def test_workers_started_with_other_configs_all_stop_before_the_first_step(tiny_data_dir,
                                                                          tmp_path):
    """Worker 1 with another seed and learning rate (and its own connect timeout, a
    per-machine key): both workers stop at start-up with the same one line naming both keys
    and both values; nothing is trained or checkpointed."""
    workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    common = (*fast_overrides(tiny_data_dir), "loop=custom", "trainer.epochs=1",
              "trainer.steps_per_epoch=3")
    own = [("seed=1",), ("seed=2", "optimizer.learning_rate=0.01",
                         "strategy.connect_timeout_s=100")]
    procs = [_start(i, workers, *common, *own[i], f"hydra.run.dir={tmp_path / f'W{i}'}")
             for i in range(2)]
    outputs = [_finish(p) for p in procs]
    lines = []
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 2, out[-3000:]
        assert "Traceback" not in out, out[-3000:]
        lines += [ln for ln in out.splitlines() if "started with another config" in ln]
    assert len(lines) == 2 and lines[0].split(" - ")[-1] == lines[1].split(" - ")[-1], lines
    line = lines[0]
    assert f"worker 1 ({workers[1]})" in line and f"chief ({workers[0]})" in line, line
    assert "seed (1 on the chief, 2 on worker 1)" in line, line
    assert "optimizer.learning_rate (0.001 on the chief, 0.01 on worker 1)" in line, line
    assert "connect_timeout_s (" not in line, line
    failed = _results(tmp_path / "W0")
    assert failed["status"] == "failed" and "seed (1 on the chief" in failed["error"]
    assert not (tmp_path / "W0" / "checkpoints").exists()
    assert _rows(tmp_path / "W0") == 0


@pytest.mark.parametrize("loop", ["keras_fit", "custom"])
def test_the_chiefs_progress_bar_and_batch_callback_add_no_collective_and_one_run_dir_is_the_chiefs(
        loop, tiny_data_dir, tmp_path, monkeypatch):
    """The chief draws a progress bar on a terminal (loop.verbose=auto) and runs a chief-only
    callback that reads every batch's logs; worker 1 does neither. Both train to the end.
    Both workers get the same hydra.run.dir (the README's commands on one machine): worker
    1's .hydra/ and run.log go to <dir>-worker1; the chief's run.log has each epoch line
    once, and its .hydra/ is the chief's."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), str(ROOT / "src")]))
    workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    boss, run_dir = tmp_path / "chief.jsonl", tmp_path / "mw"
    args = (*fast_overrides(tiny_data_dir), f"loop={loop}", "trainer.epochs=1",
            "trainer.steps_per_epoch=3", "loop.verbose=auto",  # a bar on a terminal
            "+callbacks.boss._target_=callback_recorder.Recorder", f"+callbacks.boss.path={boss}",
            "+callbacks.boss._chief_only_=true", f"hydra.run.dir={run_dir}")
    chief = _start(0, workers, *args, terminal=True)  # as in a user's shell: the bar
    other = _start(1, workers, *args)  # redrawn at every block, its figures read each time
    out0, out1 = _finish(chief), _finish(other)
    assert chief.returncode == 0, out0[-3000:]
    assert other.returncode == 0, out1[-3000:]
    assert "3/3" in out0 and "loss:" in out0, out0[-3000:]  # the bar was drawn
    assert "3/3" not in out1
    from test_callbacks import _calls

    ends = [logs for hook, _, logs, _ in _calls(boss) if hook == "batch_end"]
    assert len(ends) == 3 and all("loss" in logs for logs in ends), ends
    assert _results(run_dir)["status"] == "completed"
    log = (run_dir / "run.log").read_text()
    assert log.count("epoch 1/1") == 1, log[-3000:]
    own = tmp_path / "mw-worker1"
    assert (own / ".hydra" / "config.yaml").exists() and (own / "run.log").exists()
    assert "epoch 1/1" in (own / "run.log").read_text()


def test_a_worker_that_lost_the_chief_names_the_chiefs_checkpoint(tiny_data_dir, tmp_path):
    """kill -9 of the chief after its first checkpoint: worker 1 ends with status 3 and one
    line naming the checkpoint in the chief's run dir (its own copy is in a temporary
    directory, deleted on exit)."""
    procs, workers, _ = _held_cluster(tmp_path, "step:1:5", *fast_overrides(tiny_data_dir),
                                      *RUN, "loop=custom", held=0)  # mid-epoch 2
    procs[0].kill()
    out = _finish(procs[1])
    assert procs[1].returncode == 3, out[-3000:]
    lines = [ln for ln in out.splitlines() if "lost worker" in ln]
    assert len(lines) == 1 and "Traceback" not in out, out[-3000:]
    assert f"lost worker {workers[0]}" in lines[0], lines[0]
    assert re.search(re.escape(str(tmp_path / "W0" / "checkpoints" / "ckpt-")) + r"\d+, in the "
                     r"chief's run dir\)", lines[0]), lines[0]
    assert "distlab-worker" not in lines[0], lines[0]
