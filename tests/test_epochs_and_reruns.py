"""Exact epochs with any fit block size, and reruns after kills and failures (real
`python run.py` processes where one is killed, fails or is refused; the reruns after them
in this process, on one CPU device as run.py's)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from conftest import Gated, fast_overrides, run_cli
from omegaconf import OmegaConf

pytestmark = pytest.mark.slow


def _epochs(run_dir: Path) -> list[int]:
    history = run_dir / "history.csv"
    if not history.exists():
        return []
    return [int(line.split(",")[0]) for line in history.read_text().splitlines()[1:]]


def _kill_at(args: list[str], run_dir: Path, gate: str) -> None:
    """`python run.py ARGS`, killed (SIGKILL) when it reaches `gate` (tests/gate.py)."""
    with Gated(args, run_dir, gate, run_dir.parent / f"{run_dir.name}-gate") as killed:
        killed.wait()
        killed.signal(signal.SIGKILL)
        assert killed.finish()[0] == -signal.SIGKILL


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def _checkpoints(run_dir: Path) -> list[str]:
    return sorted((p.name.removesuffix(".index") for p in
                   (run_dir / "checkpoints").glob("ckpt-*.index")),
                  key=lambda n: int(n.split("-")[1]))


def test_fit_blocks_never_cross_an_epoch_and_resume_exactly(tiny_data_dir, tmp_path,
                                                            run_inprocess):
    training = ["strategy=default", "loop.steps_per_execution=4", "trainer.steps_per_epoch=10",
                "trainer.epochs=3", "trainer.validate_every=0", "deterministic=true", "seed=3"]
    args = [*fast_overrides(tiny_data_dir), *training]
    a, b = tmp_path / "a", tmp_path / "b"
    run_inprocess(*training, out=a)  # the uninterrupted run; the killed one is a process
    assert _checkpoints(a) == ["ckpt-10", "ckpt-20", "ckpt-30"]  # not 12/24/30
    assert _epochs(a) == [1, 2, 3]

    _kill_at(args, b, "step:1:8")  # mid-epoch 2, after its second block of 4
    assert _epochs(b) == [1]
    assert run_inprocess(*training, out=b)["status"] == "completed"
    assert _epochs(b) == [1, 2, 3]
    assert _results(b)["test_loss"] == pytest.approx(_results(a)["test_loss"], abs=1e-6)


def _old_numbering(monkeypatch) -> None:
    """Checkpoints as distlab wrote them before they held their training steps: without
    `trained_steps`, numbered epochs x steps_per_epoch + steps into the next epoch."""
    import tensorflow as tf

    from distlab.training import checkpoints

    original = checkpoints.Checkpoints.__init__

    def init(self, exp, extra=None):
        original(self, exp, extra)
        self.state.pop(checkpoints.TRAINED_STEPS)
        self.checkpoint = tf.train.Checkpoint(**self.state)
        self.manager = tf.train.CheckpointManager(self.checkpoint, str(exp.run_dir.checkpoints),
                                                  max_to_keep=exp.cfg.trainer.max_checkpoints)

    monkeypatch.setattr(checkpoints.Checkpoints, "__init__", init)
    monkeypatch.setattr(checkpoints.Checkpoints, "steps_taken", property(
        lambda self: self.position[0] * self.exp.data.steps_per_epoch + self.position[1]))


def test_checkpoints_are_numbered_by_training_steps_and_old_ones_resume(
        run_inprocess, tmp_path, monkeypatch, caplog):
    """ckpt-N holds the model after N training steps. A run dir whose checkpoints have the
    old numbering (no trained_steps in them) resumes, mid-epoch, and goes on counting from
    its last number; it ends where an uninterrupted run does."""
    import logging

    from conftest import stop_at

    args = ("strategy=default", "trainer.steps_per_epoch=5", "trainer.epochs=3",
            "deterministic=true", "seed=3", "trainer.validate_every=0")
    whole = run_inprocess(*args, out=tmp_path / "a")
    assert _checkpoints(tmp_path / "a") == ["ckpt-5", "ckpt-10", "ckpt-15"]
    _old_numbering(monkeypatch)
    stop_at(monkeypatch, epoch=1, step=3)  # as a SIGTERM: saved at step 3 of epoch 2
    with pytest.raises(SystemExit):
        run_inprocess(*args, out=tmp_path / "b")
    assert _checkpoints(tmp_path / "b") == ["ckpt-5", "ckpt-8"]
    monkeypatch.undo()
    with caplog.at_level(logging.INFO, logger="distlab"):
        resumed = run_inprocess(*args, out=tmp_path / "b")
    assert "ckpt-8: 1 epoch(s) done, 3 step(s) into the next" in caplog.text
    assert resumed["status"] == "completed" and resumed["checkpoint"].endswith("/ckpt-15")
    assert _checkpoints(tmp_path / "b")[-2:] == ["ckpt-10", "ckpt-15"]
    assert resumed["test_loss"] == pytest.approx(whole["test_loss"], abs=1e-6)
    assert "trains differently from an uninterrupted run" not in caplog.text


def test_a_resume_on_another_replica_count_says_it_trains_differently(run_inprocess, tmp_path,
                                                                      caplog):
    """As a run dir moved to a machine with other GPUs (or resumed on other workers) would:
    the earlier attempt trained on 2 replicas, a global batch of 128; this one has 1. Its
    record is .distlab/trained_as.json, written as an attempt starts to train, so a resume
    after a failed attempt (results.json without those fields) or a kill -9 warns too; a run
    dir without it (an older distlab's) has them in results.json."""
    import json
    import logging

    args = ("strategy=default", "trainer.steps_per_epoch=3", "trainer.validate_every=0")
    warning = ("resuming on 1 replica(s), a global batch of 64: the run trained on 2 "
               "replica(s), a global batch of 128, so from here it trains differently")
    first = run_inprocess(*args, "trainer.epochs=1", out=tmp_path / "run")
    assert (first["num_replicas"], first["global_batch_size"]) == (1, 64)
    trained_as = tmp_path / "run" / ".distlab" / "trained_as.json"
    assert json.loads(trained_as.read_text()) == {"num_replicas": 1, "global_batch_size": 64}
    trained_as.unlink()  # an older distlab's run dir: results.json says how it trained
    moved = {**first, "num_replicas": 2, "global_batch_size": 128}
    (tmp_path / "run" / "results.json").write_text(json.dumps(moved))
    with caplog.at_level(logging.WARNING, logger="distlab"):
        resumed = run_inprocess(*args, "trainer.epochs=2", out=tmp_path / "run")
    assert resumed["status"] == "completed" and resumed["epochs_completed"] == 2
    assert warning in caplog.text
    # the attempt on 2 replicas then failed (a NaN loss): its results.json has no such field
    trained_as.write_text(json.dumps({"num_replicas": 2, "global_batch_size": 128}))
    (tmp_path / "run" / "results.json").write_text(json.dumps(
        {"status": "failed", "error": "loss is NaN at epoch 3", "batch_size_per_replica": 64}))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="distlab"):
        resumed = run_inprocess(*args, "trainer.epochs=3", out=tmp_path / "run")
    assert resumed["status"] == "completed" and resumed["epochs_completed"] == 3
    assert warning in caplog.text
    # a rerun that trains nothing (an export asked since) warns of nothing, and keeps how the
    # run trained, not how this process would have
    moved = {**resumed, "num_replicas": 2, "global_batch_size": 128}
    (tmp_path / "run" / "results.json").write_text(json.dumps(moved))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="distlab"):
        exported = run_inprocess(*args, "trainer.epochs=3", "trainer.export=true",
                                 out=tmp_path / "run")
    assert "trains differently" not in caplog.text
    assert (exported["num_replicas"], exported["global_batch_size"]) == (2, 128)
    assert exported["saved_model"] == "saved_model"


def test_a_block_longer_than_the_epoch(run_inprocess, tmp_path):
    run_inprocess("strategy=default", "loop.steps_per_execution=50",
                  "trainer.steps_per_epoch=20", out=tmp_path / "r")
    assert _checkpoints(tmp_path / "r") == ["ckpt-20", "ckpt-40"]
    rows = (tmp_path / "r" / "history.csv").read_text().splitlines()[1:]
    assert all(float(row.split(",")[2]) > 0 for row in rows)  # epoch 2 got data too


def test_kill_before_the_first_checkpoint_then_rerun(tiny_data_dir, tmp_path, run_inprocess):
    # killed as epoch 3 (5 steps) starts: no checkpoint yet (the first would be its last)
    training = ["loop=custom", "trainer.epochs=3", "trainer.steps_per_epoch=5",
                "trainer.checkpoint_every=5", "strategy.cpu_devices=1"]
    _kill_at([*fast_overrides(tiny_data_dir), *training], tmp_path, "step:2:2")
    assert _epochs(tmp_path) == [1, 2]
    assert not _checkpoints(tmp_path)
    assert run_inprocess(*training, out=tmp_path)["status"] == "completed"
    assert _epochs(tmp_path) == [1, 2, 3]


def test_a_failed_run_without_checkpoint_accepts_a_new_config(tmp_path, run_inprocess):
    # both in this process (the failed run's exit status and line as a command:
    # test_reliability.py's test_nan_loss_stops_with_a_clear_message)
    training = ["trainer.steps_per_epoch=20", "strategy.cpu_devices=1"]
    with pytest.raises(SystemExit) as failed:
        run_inprocess(*training, "optimizer.learning_rate=1e12", out=tmp_path)
    assert failed.value.code != 0
    assert "Lower optimizer.learning_rate" in _results(tmp_path)["error"]
    run_inprocess(*training, "optimizer.learning_rate=1e-3", out=tmp_path)
    assert _results(tmp_path)["status"] == "completed"
    kept = tmp_path / ".distlab" / "attempts" / "1"
    assert json.loads((kept / "results.json").read_text())["status"] == "failed"
    assert OmegaConf.load(kept / "config.yaml").optimizer.learning_rate == 1e12
    assert _epochs(tmp_path) == [1, 2]


def test_steps_per_execution_with_replicas_equals_one_step_at_a_time(tiny_data_dir, tmp_path):
    # keras#19246 is corrected; with oneDNN's kernels off the block size changes no digit
    # (with them, rounding differs between the two graphs: README "Keras corrections").
    # One run.py process (oneDNN is chosen when TensorFlow loads) runs both as a sweep.
    out = run_cli("-m", *fast_overrides(tiny_data_dir), "strategy.cpu_devices=2",
                  "loop.steps_per_execution=1,5", "trainer.steps_per_epoch=12",
                  "deterministic=true", "seed=2", f"hydra.sweep.dir={tmp_path}",
                  env={"TF_ENABLE_ONEDNN_OPTS": "0"}, fresh=True)  # read as TF loads
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    losses = []
    for job, block in ((0, 1), (1, 5)):
        results = _results(tmp_path / str(job))
        assert (results["num_replicas"], results["epochs_completed"]) == (2, 2)
        assert f"loop.steps_per_execution={block}" in (
            tmp_path / str(job) / ".hydra" / "overrides.yaml").read_text()
        losses.append(results["test_loss"])
    assert losses[1] == pytest.approx(losses[0], abs=1e-6)


def test_one_job_per_run_directory(tiny_data_dir, tmp_path, run_inprocess):
    """A second `python run.py` into a directory a running one holds (held at a step by
    tests/gate.py) is refused at once; a holder killed with -9 leaves no lock behind."""
    training = ["trainer.steps_per_epoch=3", "strategy.cpu_devices=1"]
    args = [*fast_overrides(tiny_data_dir), *training]
    lock = tmp_path / "run" / ".distlab" / "lock"
    with Gated(args, tmp_path / "run", "step:0:1", tmp_path / "gate") as first:
        first.wait()  # the first run holds the directory
        assert lock.read_text()
        second = run_cli(*args, f"hydra.run.dir={tmp_path / 'run'}", timeout=60)
        text = second.stdout + second.stderr  # refused at once: it does not wait for the lock
        assert second.returncode != 0 and f"pid {first.proc.pid}" in text
        assert str(tmp_path / "run") in text and "Traceback" not in text
        (tmp_path / "gate" / "released").write_text("")
        returncode, output = first.finish()
        assert returncode == 0, output[-3000:]
    assert _epochs(tmp_path / "run") == [1, 2]
    assert _results(tmp_path / "run")["status"] == "completed"

    # a holder killed with -9 leaves no lock behind: the rerun goes ahead at once
    with Gated([*args, "trainer.epochs=3"], tmp_path / "run", "step:2:1",
               tmp_path / "gate") as holder:
        holder.wait()
        assert f"pid {holder.proc.pid}," in lock.read_text()
        holder.signal(signal.SIGKILL)
        assert holder.finish()[0] == -signal.SIGKILL
    assert run_inprocess(*training, "trainer.epochs=3",
                         out=tmp_path / "run")["status"] == "completed"
    assert _epochs(tmp_path / "run") == [1, 2, 3]
