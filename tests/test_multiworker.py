"""MultiWorkerMirroredStrategy with two local worker processes (TF_CONFIG on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from conftest import ROOT, fast_overrides

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _worker(index: int, workers: list[str], *args: str) -> subprocess.Popen:
    tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
    return subprocess.Popen([sys.executable, "run.py", "strategy=multi_worker_mirrored", *args],
                            cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "TF_CONFIG": json.dumps(tf_config)})


def _finish(proc: subprocess.Popen, timeout: float) -> str:
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        proc.kill()  # TF ignores SIGTERM while waiting for peers
        return proc.communicate()[0] + "\n<killed: timeout>"


def test_two_workers_train_together_and_only_the_chief_writes(tiny_data_dir, tmp_path,
                                                                run_inprocess):
    common = [*fast_overrides(tiny_data_dir), "loop=custom", "trainer.epochs=1",
              "trainer.steps_per_epoch=6", "deterministic=true", "seed=5",
              "trainer.export=true"]
    workers = [f"127.0.0.1:{p}" for p in _free_ports(2)]
    procs = [_worker(i, workers, *common, f"hydra.run.dir={tmp_path / f'W{i}'}")
             for i in range(2)]
    outputs = [_finish(p, timeout=240) for p in procs]
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out[-3000:]

    chief = json.loads((tmp_path / "W0" / "results.json").read_text())
    assert chief["num_replicas"] == 2 and chief["global_batch_size"] == 128
    assert chief["strategy"] == "MultiWorkerMirroredStrategy"
    assert (tmp_path / "W0" / "checkpoints" / "checkpoint").exists()
    assert (tmp_path / "W0" / "saved_model" / "saved_model.pb").exists()
    w1 = tmp_path / "W1"
    assert not (w1 / "results.json").exists() and not (w1 / "checkpoints").exists()
    assert not (w1 / "history.csv").exists() and not (w1 / "saved_model").exists()

    # the same global batch in one process with two replicas trains the same model
    single = run_inprocess(*common[1:], "strategy.cpu_devices=2", "trainer.export=false")
    assert single["num_replicas"] == 2
    assert chief["test_loss"] == pytest.approx(single["test_loss"], abs=1e-3)


def test_lone_worker_gives_up_naming_the_missing_peer(tiny_data_dir, tmp_path):
    workers = [f"127.0.0.1:{p}" for p in _free_ports(2)]
    start = time.time()
    proc = _worker(0, workers, *fast_overrides(tiny_data_dir), "loop=custom",
                   "strategy.connect_timeout_s=5", f"hydra.run.dir={tmp_path}")
    out = _finish(proc, timeout=120)
    assert proc.returncode != 0
    assert time.time() - start < 100
    assert "did not form" in out and workers[1] in out, out[-3000:]
    assert "Traceback" not in out
