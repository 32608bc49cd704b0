"""A user's Loop implements its steps only; the Controller gives it everything else, and an
item it adds to the checkpoint is saved and resumed (and broadcast to every worker:
test_worker_launchers.py's rerun after a killed worker runs the same `counting`
loop)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import stop_at

pytestmark = pytest.mark.slow
TESTS = Path(__file__).resolve().parent
CLIP = ("imports=[user_loops]", "loop=custom", "loop.name=clip_per_replica")
COUNTING = ("imports=[user_loops]", "loop=custom", "loop.name=counting")
SMALL = ("trainer.steps_per_epoch=6", "dataset.batch_size_per_replica=16", "deterministic=true",
         "seed=3")


def _rows(run_dir: Path) -> list[dict]:
    import csv

    with (run_dir / "history.csv").open() as f:
        return list(csv.DictReader(f))


def _weights(run_dir: Path) -> list[np.ndarray]:
    prefix = tf.train.latest_checkpoint(str(run_dir / "checkpoints"))
    return [tf.train.load_variable(prefix, name) for name, _ in tf.train.list_variables(prefix)
            if name.startswith("model/") and "OPTIMIZER_SLOT" not in name]


def test_a_step_only_loop_gets_history_checkpoints_tensorboard_and_resume(
        run_inprocess, monkeypatch, tmp_path):
    args = (*CLIP, "strategy.cpu_devices=2", *SMALL, "model=mlp", "trainer.epochs=2",
            "trainer.checkpoint_every=1")
    whole = run_inprocess(*args, out=tmp_path / "whole")
    run = tmp_path / "whole"
    assert (whole["status"], whole["loop"], whole["epochs_completed"]) == (
        "completed", "clip_per_replica", 2)
    assert [r["epoch"] for r in _rows(run)] == ["1", "2"]
    rows = _rows(run)
    assert float(rows[-1]["loss"]) < float(rows[0]["loss"])  # it learns
    # the last row's validation figure is the final model's, as results.json reports it
    assert float(rows[-1]["val_accuracy"]) == pytest.approx(whole["val_accuracy"], abs=1e-6)
    assert sorted(p.name for p in (run / "checkpoints").glob("ckpt-*.index")) == [
        "ckpt-12.index", "ckpt-6.index"]
    tags = {v.tag for path in (run / "logs" / "train").glob("events.out.tfevents.*")
            for event in tf.compat.v1.train.summary_iterator(str(path))
            for v in event.summary.value}
    assert {"epoch_loss", "epoch_accuracy", "epoch_learning_rate"} <= tags

    # its own step ran: clipping each replica's gradient trains otherwise than loop=custom
    plain = run_inprocess("loop=custom", "strategy.cpu_devices=2", *SMALL, "model=mlp",
                          "trainer.epochs=2", out=tmp_path / "plain")
    assert plain["test_loss"] != pytest.approx(whole["test_loss"], abs=1e-6)

    # stopped mid-epoch (as by SIGTERM), then rerun: the uninterrupted run's figures
    stop_at(monkeypatch, epoch=1, step=3)
    with pytest.raises(SystemExit):
        run_inprocess(*args, out=tmp_path / "resumed")
    monkeypatch.undo()
    resumed = run_inprocess(*args, out=tmp_path / "resumed")
    assert resumed["test_loss"] == pytest.approx(whole["test_loss"], abs=1e-6)
    for a, b in zip(_rows(run), _rows(tmp_path / "resumed"), strict=True):
        assert float(a["loss"]) == pytest.approx(float(b["loss"]), abs=1e-6)
    for a, b in zip(_weights(run), _weights(tmp_path / "resumed"), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_a_step_only_loop_gets_early_stopping_and_the_nan_guard(run_inprocess, tmp_path):
    stopped = run_inprocess(*CLIP, "strategy=default", *SMALL, "trainer.epochs=5",
                            "trainer.early_stopping.metric=loss",
                            "trainer.early_stopping.min_delta=100",
                            "trainer.early_stopping.patience=1", out=tmp_path / "stopped")
    assert stopped["epochs_completed"] == 2
    assert stopped["stopped_early"] == {"epoch": 2, "reason": "early_stopping"}

    with pytest.raises(SystemExit) as exit_:
        run_inprocess(*CLIP, "strategy=default", *SMALL, "optimizer.learning_rate=1e30",
                      out=tmp_path / "nan")
    assert exit_.value.code == 2
    failed = json.loads((tmp_path / "nan" / "results.json").read_text())
    assert failed["status"] == "failed" and "non-finite loss" in failed["error"]


def _seen(out: Path, worker: int = 0) -> float:
    return float((out / f"seen-{worker}").read_text())


def test_a_loop_state_item_is_checkpointed_and_resumed(run_inprocess, monkeypatch, tmp_path):
    args = (*COUNTING, "strategy=default", *SMALL, "trainer.epochs=2")
    whole_out, resumed_out = tmp_path / "whole_seen", tmp_path / "resumed_seen"
    whole_out.mkdir(), resumed_out.mkdir()
    monkeypatch.setenv("USER_LOOP_OUT", str(whole_out))
    run_inprocess(*args, out=tmp_path / "whole")
    assert _seen(whole_out) == 2 * 6 * 16  # 2 epochs of 6 batches of 16
    prefix = tf.train.latest_checkpoint(str(tmp_path / "whole" / "checkpoints"))
    assert tf.train.load_variable(prefix, "examples_seen/.ATTRIBUTES/VARIABLE_VALUE") == 192

    monkeypatch.setenv("USER_LOOP_OUT", str(resumed_out))
    stop_at(monkeypatch, epoch=1, step=2)
    with pytest.raises(SystemExit):
        run_inprocess(*args, out=tmp_path / "resumed")
    monkeypatch.undo()
    monkeypatch.setenv("USER_LOOP_OUT", str(resumed_out))
    run_inprocess(*args, out=tmp_path / "resumed")  # restores examples_seen, then counts on
    assert _seen(resumed_out) == _seen(whole_out)


def test_a_block_written_before_epoch_sums_still_trains_with_a_warning(run_inprocess,
                                                                       tmp_path):
    # train_steps that indexes its sums and returns the vector: deprecated, the same figures
    args = ("strategy=default", *SMALL, "trainer.epochs=1")
    with pytest.warns(FutureWarning) as warned:
        old = run_inprocess("imports=[user_loops]", "loop=custom", "loop.name=vector_block",
                            *args, out=tmp_path / "old")
    said = [str(w.message) for w in warned]
    assert any("indexing a loop's train_steps result is deprecated" in m for m in said)
    assert any("its train_steps returned 'ndarray', not an EpochSums" in m for m in said)
    plain = run_inprocess("loop=custom", *args, out=tmp_path / "plain")
    timing = ("seconds", "examples_per_sec")
    assert ([{k: v for k, v in r.items() if k not in timing} for r in _rows(tmp_path / "old")]
            == [{k: v for k, v in r.items() if k not in timing}
                for r in _rows(tmp_path / "plain")])
    assert old["test_loss"] == plain["test_loss"]


def _readme_loop() -> type:
    """The docs' ClipPerReplica (the training guide), registered as `clip_per_replica` (the
    caller's sandbox undoes it), clipping at 2**60: never, and exactly (the scale is
    2**60 / 2**60 = 1)."""
    from readme_snippets import block_with

    from distlab.registry import LOOPS

    block = block_with("class ClipPerReplica")
    code = next(iter(block.files.values())) if block.kind == "files" else block.text
    LOOPS._items.pop("clip_per_replica", None)  # tests/user_loops.py's, if imported
    namespace: dict = {"__name__": "readme_loop"}
    exec(compile(code, block.where, "exec"), namespace)  # noqa: S102 - the README's code
    loop = namespace["ClipPerReplica"]
    loop.clip_norm = 2.0**60
    return loop


@pytest.mark.parametrize("precision", ["float32", "mixed_float16"])
def test_the_readmes_loop_keeps_regularisation_and_loss_scaling(run_inprocess, tmp_path,
                                                                 precision):
    """A step written as the README shows (Loop.compute_loss, gradients, apply_gradients)
    equals loop=custom after 20 steps, with an L2 penalty (model.losses) and with
    mixed_float16's loss scale; without them its updates would differ."""
    from readme_snippets import user_code_sandbox

    args = ("model=mlp", "model.l2=0.01", "strategy.cpu_devices=2", f"precision={precision}",
            "trainer.epochs=1", "trainer.steps_per_epoch=20", "dataset.validation=null",
            "dataset.batch_size_per_replica=16", "deterministic=true", "seed=3")
    custom = run_inprocess("loop=custom", *args, out=tmp_path / "custom")
    with user_code_sandbox(tmp_path):
        _readme_loop()
        readme = run_inprocess("loop=custom", "loop.name=clip_per_replica", *args,
                               out=tmp_path / "readme")
    assert readme["loop"] == "clip_per_replica"
    assert readme["test_loss"] == pytest.approx(custom["test_loss"], abs=1e-6)
    for a, b in zip(_weights(tmp_path / "custom"), _weights(tmp_path / "readme"), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert float(_rows(tmp_path / "readme")[0]["loss"]) == pytest.approx(
        float(_rows(tmp_path / "custom")[0]["loss"]), abs=1e-6)


def test_a_step_without_compute_loss_is_told_what_it_leaves_out(run_inprocess, tmp_path,
                                                                  caplog):
    import logging

    args = ("imports=[user_loops]", "loop=custom", "model=mlp", "model.l2=0.01",
            "strategy=default", "trainer.epochs=1", "trainer.steps_per_epoch=2",
            "dataset.validation=null")
    with caplog.at_level(logging.WARNING, logger="distlab"):
        run_inprocess(*args, "loop.name=own_loss", out=tmp_path / "own")
    warned = [r.getMessage() for r in caplog.records if "compute_loss" in r.getMessage()]
    assert len(warned) == 1 and re.search(
        r"OwnLoss.train_step does not call self.compute_loss, which adds the model's \d+ "
        r"regularisation loss\(es\) \(model.losses\)", warned[0]), warned

    with pytest.raises(SystemExit) as refused:
        run_inprocess(*args, "loop.name=gradients_of_a_pair", out=tmp_path / "pair")
    assert refused.value.code == 2
    error = json.loads((tmp_path / "pair" / "results.json").read_text())["error"]
    assert error == ("loop.name='gradients_of_a_pair': GradientsOfAPair passed gradients() a "
                     "tuple; pass the scalar loss, the first value of self.compute_loss(...)")
