"""Multi-worker runs whose workers distlab starts itself: `strategy.workers=N` (local worker
processes; `strategy.launcher=ray`: Ray actors). Training like one process with as many
replicas, a worker's death, a signal to the launcher, and the reruns that resume. Every
process has a hard kill on expiry; the tests wait on events (a gate reached), never on time.
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
from conftest import ROOT, fast_overrides, run_cli, run_command

TIMEOUT = 300  # seconds before a launcher (and so its workers) is killed
LAUNCH = ("strategy=multi_worker_mirrored", "strategy.workers=2")
# as tests/test_multiworker.py's runs (the same reference run, trained once per session)
RUN = ("trainer.epochs=2", "trainer.steps_per_epoch=20", "trainer.checkpoint_every=1",
       "deterministic=true", "seed=5")
GATED = ("imports=[gate]",)  # tests/gate.py, imported by every worker (a no-op ungated)


@pytest.fixture
def reference(run_once):
    """reference(loop): the test loss of the same training in one process with 2 replicas."""
    return lambda loop: run_once(*RUN, f"loop={loop}", "strategy.cpu_devices=2")[0]["test_loss"]


def _launch(run_dir: Path, *args: str, gate: Path | None = None, where: str = "step:1:10",
            env: dict[str, str] | None = None) -> processes.Process:
    """`python run.py strategy=multi_worker_mirrored strategy.workers=2 ARGS` into `run_dir`
    (with `env` added to the environment); with `gate`, every worker holds at `where`
    (tests/gate.py) until the test releases it."""
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT / "src")]),
           "DISTLAB_TEST_GATE": None, "DISTLAB_TEST_GATE_DIR": None, **(env or {})}
    if gate is not None:
        gate.mkdir(parents=True, exist_ok=True)
        env.update(DISTLAB_TEST_GATE=where, DISTLAB_TEST_GATE_DIR=str(gate))
    return processes.Process("run.py", *LAUNCH, *args, f"hydra.run.dir={run_dir}", env=env)


def _finish(proc: processes.Process, timeout: float = TIMEOUT) -> str:
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()[0] + "\n<killed: timeout>"


def _held(proc: processes.Process, gate: Path, n: int = 2) -> list[int]:
    """Once `n` workers hold at the gate (an event): their pids, worker 0's first."""
    expiry = time.monotonic() + TIMEOUT
    while len(reached := list(gate.glob("reached.*"))) < n:
        if time.monotonic() > expiry or proc.poll() is not None:
            proc.kill()
            pytest.fail("the workers never reached their gate: " + _finish(proc)[-3000:])
        time.sleep(0.05)
    pids = [int(p.suffix[1:]) for p in reached]
    return sorted(pids, key=_worker_index)


def _worker_index(pid: int) -> int:
    """The task index in process `pid`'s TF_CONFIG."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    raw = next(e for e in environ if e.startswith(b"TF_CONFIG="))
    return json.loads(raw.partition(b"=")[2])["task"]["index"]


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def test_a_launcher_without_tensorflow_ends_with_its_chiefs_refusal(tmp_path):
    """The launcher imports no TensorFlow; both workers refuse the same bad config (before
    TensorFlow too), each with its log in the run dir; the command ends with the chief's
    status."""
    out, tensorflow = run_command(*LAUNCH, "imports=[no_such_module_here]",
                                  f"hydra.run.dir={tmp_path / 'run'}", timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert not tensorflow
    logs = [tmp_path / "run" / "workers" / f"worker{i}.log" for i in range(2)]
    for log in logs:
        assert "no_such_module_here" in log.read_text(), log.read_text()
    assert "no_such_module_here" in out.stdout  # the chief's line, echoed


@pytest.mark.parametrize("run_dir", ["/tmp/plain-1/x", "/tmp/a b", "/tmp/it's,x=[1]",
                                     "C:\\a b\\"])
def test_each_worker_gets_the_command_with_the_chiefs_run_dir(run_dir):
    """The command's arguments, its own run dir replaced by the chief's (quoted for Hydra);
    a non-chief's Hydra files under the chief's workers/."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from distlab.launch.workers import worker_arguments

    argv = ["strategy.workers=2", "hydra.run.dir=elsewhere", "seed=3"]
    parser = OverridesParser.create()
    for index, expected in ((0, run_dir), (1, str(Path(run_dir) / "workers" / "worker"))):
        *kept, last = worker_arguments(Path(run_dir), index, argv)
        assert kept == ["strategy.workers=2", "seed=3"]
        override = parser.parse_override(last)
        assert override.key_or_group == "hydra.run.dir" and override.value() == expected


def test_strategy_workers_must_match_tf_config(monkeypatch, run_inprocess):
    """Hand-written TF_CONFIG with another strategy.workers: one line, nothing trained."""
    from conftest import runner_refused

    from distlab.distribute.local_workers import local_cluster, tf_config

    monkeypatch.setenv("TF_CONFIG", tf_config(local_cluster(2), 1))
    with runner_refused() as guard, pytest.raises(SystemExit) as ended:
        run_inprocess("strategy=multi_worker_mirrored", "strategy.workers=3")
    assert ended.value.code == 2 and not guard.asked


def test_the_python_api_leaves_starting_workers_to_the_command(monkeypatch, run_inprocess):
    """distlab.train/run with strategy.workers=2 and no TF_CONFIG: one line (it would
    otherwise train a single worker), nothing trained."""
    from conftest import runner_refused

    monkeypatch.delenv("TF_CONFIG", raising=False)
    with runner_refused() as guard, pytest.raises(SystemExit) as ended:
        run_inprocess("strategy=multi_worker_mirrored", "strategy.workers=2")
    assert ended.value.code == 2 and not guard.asked


def _assert_trained_like_one_process(run_dir: Path, loop: str, reference,
                                     echoed: str | None = None) -> None:
    """A launch of 2 workers that ended 0: every worker's log in the run dir, the test loss
    of 1 process with 2 replicas; `echoed`: the launcher's output, with the chief's lines
    (local workers echo them on the terminal)."""
    results = _results(run_dir)
    assert results["status"] == "completed" and results["epochs_completed"] == 2, results
    assert results["num_replicas"] == 2 and results["strategy"] == "MultiWorkerMirroredStrategy"
    assert results["test_loss"] == pytest.approx(reference(loop), abs=1e-6)
    assert echoed is None or "test_loss" in echoed
    logs = run_dir / "workers"
    assert "test_loss" in (logs / "worker0.log").read_text()
    assert "2 replica(s)" in (logs / "worker1.log").read_text()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_killed_worker_ends_the_launch_and_the_rerun_resumes(tiny_data_dir, tmp_path,
                                                               reference):
    """Worker 1 killed mid-epoch 2: the chief ends within seconds (status 3, one line each
    from the chief and the launcher), the epoch-1 checkpoint intact; the same command then
    resumes and ends where one process with 2 replicas does, as a launch that was never
    interrupted (the chief's output on the terminal, each worker's log in the run dir).

    The loop is a user's that trains as loop=custom and adds an item of its own to the
    checkpoint (tests/user_loops.py: `counting`, the examples it trained on). Worker 1's
    run dir has no checkpoint: the chief restores and broadcasts every item, the loop's
    included, so both workers count on from the checkpoint's value."""
    run_dir, gate, seen = tmp_path / "run", tmp_path / "gate", tmp_path / "seen"
    seen.mkdir()
    args = (*fast_overrides(tiny_data_dir), *RUN, "loop=custom", "imports=[gate,user_loops]",
            "loop.name=counting")
    launcher = _launch(run_dir, *args, gate=gate, env={"USER_LOOP_OUT": str(seen)})
    _, worker1 = _held(launcher, gate)
    os.kill(worker1, signal.SIGKILL)
    (gate / "released").write_text("")
    out = _finish(launcher)
    assert launcher.returncode == 3, out[-3000:]  # the chief's: a lost worker
    assert "Traceback" not in out, out[-3000:]
    assert len([ln for ln in out.splitlines() if "lost worker" in ln]) == 1, out[-3000:]
    [line] = [ln for ln in out.splitlines() if "worker 1 (127.0.0.1:" in ln]
    assert "SIGKILL" in line and "Rerun the same command" in line
    failed = _results(run_dir)
    assert failed["status"] == "failed"
    address = re.search(r"worker 1 \((127\.0\.0\.1:\d+)\)", line)[1]
    assert f"lost worker {address}" in failed["error"], (address, failed["error"])
    assert "rerun all workers to resume" in failed["error"]
    assert "ckpt-20" in (run_dir / "checkpoints" / "checkpoint").read_text()

    rerun = _launch(run_dir, *args, env={"USER_LOOP_OUT": str(seen)})
    out = _finish(rerun)
    assert rerun.returncode == 0, out[-3000:]
    _assert_trained_like_one_process(run_dir, "custom", reference, echoed=out)
    history = [int(r.split(",")[0]) for r in
               (run_dir / "history.csv").read_text().splitlines()[1:]]
    assert history == [1, 2]
    counted = [float((seen / f"seen-{i}").read_text()) for i in range(2)]
    assert counted == [2 * 20 * 128] * 2, counted  # 2 epochs of 20 batches of 2 x 64


# ---- strategy.launcher=ray, and sweeps on hydra/launcher=ray, on one local Ray instance


@pytest.fixture(scope="module")
def ray_address():
    """A local Ray instance (2 CPUs, no token) shared by this module's Ray tests: its
    address, which each launcher joins (strategy.ray.address)."""
    ray = pytest.importorskip("ray")
    # Ray's processes (a sweep's tasks) import this checkout's distlab, as the tests do
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"),
                            *filter(None, [os.environ.get("PYTHONPATH")])])
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_AUTH_MODE", "disabled")
        env.setenv("PYTHONPATH", path)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            yield ray.get_runtime_context().gcs_address
        finally:
            ray.shutdown()


@pytest.fixture
def ray_or_local(request) -> str | None:
    """ray_address where Ray is installed, else None (the test then stays on local workers)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return None
    return request.getfixturevalue("ray_address")


def _on_ray(address: str) -> tuple[str, ...]:
    return ("strategy.launcher=ray", f"strategy.ray.address={address}")


def test_ray_missing_is_one_line_naming_the_extra(tmp_path):
    """Without Ray (a `ray` module that cannot be imported): one line, before TensorFlow."""
    fake = tmp_path / "no_ray"
    (fake / "ray").mkdir(parents=True)
    (fake / "ray" / "__init__.py").write_text("raise ImportError('no ray here')\n")
    code = (f"import sys; sys.path.insert(0, {str(fake)!r}); import runpy; "
            f"sys.argv = ['run.py', *{list(LAUNCH)!r}, 'strategy.launcher=ray', "
            f"'hydra.run.dir={tmp_path / 'run'}']\n"
            "try:\n    runpy.run_path('run.py', run_name='__main__')\n"
            "except SystemExit as e:\n    status = e.code\n"
            "print('TF' if 'tensorflow' in sys.modules else 'NO_TF', file=sys.stderr)\n"
            "sys.exit(status)\n")
    out = subprocess.run([processes.sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert lines[-1] == "NO_TF" and len(lines) == 2, out.stderr
    assert "distlab[ray]" in lines[0] and lines[0].startswith("error: ")


def test_worker_ports_lie_below_the_kernels_ephemeral_range():
    """A worker's port is chosen before its TensorFlow server binds it (seconds later): below
    the range connect() takes ports from, no outgoing connection can take it meanwhile."""
    from distlab.distribute import cluster

    start = cluster._ephemeral_start()
    ports = cluster.free_ports(8) + cluster.free_ports(2, host="")
    assert len(set(ports[:8])) == 8
    if start > cluster.LOWEST + 100:  # Linux, its default range (32768-60999) or alike
        assert all(cluster.LOWEST <= p < start for p in ports), (start, ports)
    for port in ports[:8]:  # each one free: it binds
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    with pytest.raises(OSError):  # an address this machine does not have: no endless draw
        cluster.free_ports(1, host="192.0.2.1")


def test_a_non_chief_workers_preemption_files_stay_in_its_own_scratch_dir(tmp_path,
                                                                          monkeypatch):
    """TensorFlow's PreemptionCheckpointHandler on a non-chief worker writes, then deletes
    on stopping, `workertemp_<i>/` beside the directory it is given: inside this run's
    scratch dir, never in the temp folder every run on the machine shares (two runs that
    stopped together deleted each other's: "/tmp/workertemp_1 not found")."""
    from types import SimpleNamespace

    import tensorflow as tf
    from tensorflow.python.distribute.failure_handling import failure_handling

    from distlab.distribute import multi_worker

    given = []
    monkeypatch.setattr(tf.distribute.experimental, "PreemptionCheckpointHandler",
                        lambda resolver, checkpoint, directory, config: given.append(directory))
    exp = SimpleNamespace(worker=SimpleNamespace(is_chief=False),
                          strategy=SimpleNamespace(cluster_resolver=None))
    scratch = tmp_path / "distlab-preemption-x"
    multi_worker.preemption_handler(exp, scratch, save=lambda: "", stop=lambda path: None)
    [directory] = given
    written = Path(failure_handling._non_chief_checkpoint_dir(directory, 1))
    assert written.parent.parent == scratch, written  # workertemp_1/, deleted on stopping


@pytest.mark.parametrize("text", ["1024 65535", "0 0", "70000 80000", "garbage", ""])
def test_worker_ports_with_any_ephemeral_range(text, tmp_path, monkeypatch):
    """Whatever the kernel's range file says (or a missing one): distinct free ports."""
    from distlab.distribute import cluster

    (tmp_path / "range").write_text(text)
    monkeypatch.setattr(cluster, "EPHEMERAL_RANGE_FILE", str(tmp_path / "range"))
    ports = cluster.free_ports(5)
    assert len(set(ports)) == 5 and all(0 < p < 65536 for p in ports), ports


@pytest.mark.slow  # run.py processes forked from a TensorFlow-preloaded server
def test_a_ray_address_where_nothing_answers_is_one_line(tmp_path):
    """strategy.ray.address=host:port with nothing listening: one line naming the key within
    strategy.connect_timeout_s (ray.init would retry it without end)."""
    pytest.importorskip("ray")
    from distlab.distribute.cluster import free_ports

    address = f"127.0.0.1:{free_ports(1)[0]}"
    out = run_cli(*LAUNCH, "strategy.launcher=ray", f"strategy.ray.address={address}",
                  "strategy.connect_timeout_s=5", f"hydra.run.dir={tmp_path / 'run'}",
                  timeout=120)
    text = out.stdout + out.stderr
    assert out.returncode == 2 and "Traceback" not in text, text[-2000:]
    assert f"cannot reach Ray at strategy.ray.address={address}" in text, text[-2000:]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.xdist_group("ray")  # one worker: one Ray instance (ray_address)
def test_sigterm_to_the_launcher_checkpoints_every_worker_and_ray_actors_resume(
        tiny_data_dir, tmp_path, reference, ray_or_local):
    """SIGTERM to the launcher of local workers reaches every worker (TensorFlow's
    coordinated preemption): the chief checkpoints mid-epoch 2 and the command ends 143.
    The rerun, on 2 Ray actors (how workers are started may change between a run and its
    rerun; on local workers again where Ray is not installed), resumes from that checkpoint
    exactly: keras_fit ends as one process with 2 replicas (the killed-worker test above is
    the custom loop's local launch, the killed-actor test below its Ray one)."""
    run_dir, gate = tmp_path / "run", tmp_path / "gate"
    args = (*fast_overrides(tiny_data_dir), *RUN, "loop=keras_fit", *GATED)
    launcher = _launch(run_dir, *args, gate=gate)
    _held(launcher, gate)
    launcher.send_signal(signal.SIGTERM)
    (gate / "released").write_text("")
    out = _finish(launcher)
    assert launcher.returncode == 128 + signal.SIGTERM, out[-3000:]
    interrupted = _results(run_dir)
    assert interrupted["status"] == "interrupted", interrupted
    assert interrupted["epochs_completed"] == 1 and interrupted["steps_in_epoch"] > 0, \
        interrupted
    for i in range(2):
        assert "preemption signal" in (run_dir / "workers" / f"worker{i}.log").read_text()

    rerun = _launch(run_dir, *args, *(_on_ray(ray_or_local) if ray_or_local else ()))
    out = _finish(rerun)
    assert rerun.returncode == 0, out[-3000:]
    resumed = f"1 epoch(s) done, {interrupted['steps_in_epoch']} step(s) into the next"
    assert resumed in (run_dir / "run.log").read_text()  # from the preemption checkpoint
    _assert_trained_like_one_process(run_dir, "keras_fit", reference,
                                     echoed=None if ray_or_local else out)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.xdist_group("ray")  # one worker: one Ray instance (ray_address)
def test_a_killed_ray_actor_ends_the_run_and_the_rerun_resumes(tiny_data_dir, tmp_path,
                                                               reference, ray_address):
    """Worker 1's actor killed mid-epoch 2 (its process dies with it): the chief stops
    within seconds, one line from the driver naming the actor; the rerun resumes exactly,
    the custom loop on 2 Ray actors ending as one process with 2 replicas."""
    run_dir, gate = tmp_path / "run", tmp_path / "gate"
    args = (*fast_overrides(tiny_data_dir), *RUN, "loop=custom", *GATED, *_on_ray(ray_address))
    launcher = _launch(run_dir, *args, gate=gate)
    _, worker1 = _held(launcher, gate)
    actor = int(Path(f"/proc/{worker1}/stat").read_text().rsplit(")", 1)[1].split()[1])
    os.kill(actor, signal.SIGKILL)  # the actor's process (its parent)
    (gate / "released").write_text("")
    out = _finish(launcher)
    assert launcher.returncode == 3, out[-3000:]  # the chief's: a lost worker
    [line] = [ln for ln in out.splitlines() if "died with its Ray actor" in ln]
    assert line.startswith("error: worker 1 (") and "Rerun the same command" in line
    assert "ckpt-20" in (run_dir / "checkpoints" / "checkpoint").read_text()

    rerun = _launch(run_dir, *args)
    out = _finish(rerun)
    assert rerun.returncode == 0, out[-3000:]
    _assert_trained_like_one_process(run_dir, "custom", reference)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.xdist_group("ray")  # one worker: one Ray instance (ray_address)
def test_a_sweep_on_the_ray_launcher_with_its_summary(tiny_data_dir, tmp_path, ray_address):
    """hydra/launcher=ray: each job a Ray task (one CPU each), the sweep's summary."""
    sweep = tmp_path / "sweep"
    proc = processes.Process(
        "run.py", "-m", "hydra/launcher=ray", f"hydra.launcher.ray.init.address={ray_address}",
        "+hydra.launcher.ray.init.object_store_memory=null",
        "+hydra.launcher.ray.remote.num_cpus=1", "seed=1,2", "strategy=default",
        "trainer.epochs=1", "trainer.steps_per_epoch=3", *fast_overrides(tiny_data_dir)[2:],
        f"dataset.data_dir={tiny_data_dir}", f"hydra.sweep.dir={sweep}")
    out = _finish(proc)
    assert proc.returncode == 0, out[-3000:]
    summary = (sweep / "summary.csv").read_text().splitlines()
    assert len(summary) == 3, summary  # a header and one row per job
    for job in ("0", "1"):
        assert _results(sweep / job)["status"] == "completed"
