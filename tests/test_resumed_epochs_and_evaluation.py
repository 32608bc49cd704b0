"""A run resumed mid-epoch records the whole epoch (history row, monitors); the
profiler after a resume; evaluation restores the model only, whatever it was trained with."""

from __future__ import annotations

import csv
import json
import logging
import signal
from pathlib import Path

import pytest
from conftest import stop_at

pytestmark = pytest.mark.slow  # every test here trains

# the per-epoch figures; seconds, examples_per_sec etc. are this process's own
FIGURES = ("learning_rate", "loss", "accuracy", "val_loss", "val_accuracy")
SMALL = ("model=mlp", "model.hidden_units=[32]", "model.dropout=0.2", "deterministic=true",
         "seed=7", "trainer.checkpoint_every=1")


def _history(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "history.csv", newline="") as f:
        return list(csv.DictReader(f))


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def _same_rows(resumed: Path, uninterrupted: Path) -> None:
    rows, wanted = _history(resumed), _history(uninterrupted)
    assert [r["epoch"] for r in rows] == [r["epoch"] for r in wanted]
    for row, want in zip(rows, wanted, strict=True):
        for key in FIGURES:  # to 1e-6, and to 6 digits (small losses, 6-digit csv)
            value, expected = float(row[key]), float(want[key])
            assert value == pytest.approx(expected, abs=1e-6), (row, key)
            assert value == pytest.approx(expected, rel=2e-6, abs=1e-12), (row, key)


def _record_rows(monkeypatch) -> list[dict]:
    """The rows the Controller records from now on (with the fields history.csv leaves
    out)."""
    from distlab.training.actions.history import History

    rows: list[dict] = []
    original = History.record

    def record(self, row):
        rows.append(row)
        return original(self, row)

    monkeypatch.setattr(History, "record", record)
    return rows


# ---- item 2: the resumed epoch's row covers the whole epoch
# (one device, one step per block: test_reliability.py's real SIGTERM test, in both loops)
@pytest.mark.parametrize("loop,options,stop", [
    ("custom", ("strategy=default", "loop.steps_per_loop=3"), 6),  # stops at block ends
    ("keras_fit", ("strategy=default", "loop.steps_per_execution=3"), 6),
    pytest.param("keras_fit", ("strategy.cpu_devices=2",), 5, marks=pytest.mark.slow),
    pytest.param("custom", ("strategy.cpu_devices=2",), 5, marks=pytest.mark.slow),
], ids=["custom-steps_per_loop", "keras_fit-steps_per_execution", "keras_fit-2replicas",
        "custom-2replicas"])
def test_resumed_epoch_row_equals_the_uninterrupted_one(loop, options, stop, run_inprocess,
                                                        monkeypatch, tmp_path, caplog):
    args = (f"loop={loop}", *options, *SMALL, "trainer.steps_per_epoch=12",
            "trainer.best_checkpoint.metric=accuracy")
    whole = run_inprocess(*args, out=tmp_path / "a")

    stop_at(monkeypatch, epoch=1, step=stop)
    with pytest.raises(SystemExit) as stopped:
        run_inprocess(*args, out=tmp_path / "b")
    assert stopped.value.code == 128 + signal.SIGTERM
    assert _results(tmp_path / "b")["steps_in_epoch"] == stop
    monkeypatch.undo()
    rows = _record_rows(monkeypatch)
    with caplog.at_level(logging.INFO, logger="distlab"):
        resumed = run_inprocess(*args, out=tmp_path / "b")

    assert f"{stop} step(s) into the next" in caplog.text
    _same_rows(tmp_path / "b", tmp_path / "a")
    for key in ("test_loss", "best_value", "best_epoch"):
        assert resumed[key] == pytest.approx(whole[key], abs=1e-6), key
    # its throughput still counts only the steps this process ran: the rest of epoch 2
    assert [r["epoch"] for r in rows] == [2]
    assert rows[0]["examples"] == (12 - stop) * resumed["global_batch_size"]
    assert rows[0]["examples_per_sec"] == pytest.approx(
        rows[0]["examples"] / rows[0]["train_seconds"])


def test_checkpoint_without_epoch_sums_still_resumes(run_inprocess, monkeypatch, tmp_path,
                                                     caplog):
    """A mid-epoch checkpoint written before checkpoints kept the epoch's sums resumes, with
    one warning that its epoch's row covers only the steps after the resume."""
    from distlab.training import checkpoints

    args = ("loop=custom", "strategy=default", *SMALL, "trainer.steps_per_epoch=6")
    monkeypatch.setattr(checkpoints, "EPOCH_SUMS", "some_other_name")  # not saved as epoch_sums
    stop_at(monkeypatch, epoch=1, step=2)
    with pytest.raises(SystemExit):
        run_inprocess(*args, out=tmp_path / "r")
    monkeypatch.undo()
    with caplog.at_level(logging.WARNING, logger="distlab"):
        assert run_inprocess(*args, out=tmp_path / "r")["epochs_completed"] == 2
    warned = [r.getMessage() for r in caplog.records if "predates" in r.getMessage()]
    assert len(warned) == 1 and "epoch 2" in warned[0] and "after step 2" in warned[0]


# ---- item 15: the profiler after a resume
@pytest.mark.parametrize("loop", ["keras_fit", "custom"])
def test_profile_steps_before_the_resume_point_are_not_reported_missed(loop, run_inprocess,
                                                                       tmp_path, caplog):
    args = (f"loop={loop}", "strategy=default", "trainer.steps_per_epoch=4",
            "trainer.validate_every=0", "trainer.profile_steps=[2,3]")
    run_inprocess(*args, "trainer.epochs=1", out=tmp_path / "r")
    with caplog.at_level(logging.INFO, logger="distlab"):
        run_inprocess(*args, "trainer.epochs=2", out=tmp_path / "r")  # resumes at step 4
    messages = [r.getMessage() for r in caplog.records
                if r.getMessage().startswith("trainer.profile_steps")]
    assert not [m for m in messages if "training ended before" in m], messages
    assert len(messages) == 1 and "before this process resumed" in messages[0], messages


def test_profile_steps_never_reached_still_warn(run_inprocess, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="distlab"):
        run_inprocess("loop=custom", "strategy=default", "trainer.epochs=1",
                      "trainer.steps_per_epoch=3", "trainer.validate_every=0",
                      "trainer.profile_steps=[5,6]", out=tmp_path / "r")
    assert any("training ended before those steps" in r.getMessage() for r in caplog.records)


# ---- item 7: evaluation restores the model only
EVAL = ("strategy=default", "trainer.epochs=1", "trainer.validate_every=0")


@pytest.mark.parametrize("trained_with,steps,loop,evaluated_with,tolerance", [
    ("optimizer=sgd", 3, "keras_fit", "optimizer=adam", 1e-6),
    ("optimizer=sgd", 3, "custom", "optimizer=adam", 1e-6),
    ("trainer.grad_accum_steps=4", 6, "keras_fit", "trainer.grad_accum_steps=1", 1e-6),
    # float16 kernels are slow on CPUs: 2 steps. Evaluated in float32, the loss moves by
    # float16's rounding (~1e-3 relative)
    ("precision=mixed_float16", 2, "keras_fit", "precision=float32", 3e-3),
    ("precision=mixed_float16", 2, "keras_fit", "precision=mixed_float16", 1e-6),
    # another loss: test_loss is not reproduced (the accuracy is), and the warning says so
    ("task.label_smoothing=0.1", 3, "custom", "task.label_smoothing=0", None),
])
def test_evaluate_restores_only_the_model(trained_with, steps, loop, evaluated_with, tolerance,
                                          run_once, run_inprocess, tmp_path, caplog):
    # one training per trained_with, shared by the cases that evaluate it
    trained, train_dir = run_once("loop=keras_fit", *EVAL, trained_with,
                                  f"trainer.steps_per_epoch={steps}")
    caplog.clear()
    evaluated = run_inprocess(f"loop={loop}", *EVAL, "mode=evaluate", evaluated_with,
                              f"ckpt_path={train_dir}", out=tmp_path / "eval")
    assert evaluated["trained"]["epochs_completed"] == 1
    differ = [r.getMessage() for r in caplog.records if "and is evaluated with" in r.getMessage()]
    if evaluated_with in ("precision=float32", "task.label_smoothing=0"):  # says so, with the
        assert len(differ) == 1 and f"add {trained_with}" in differ[0], differ  # override
    else:
        assert not differ
    if tolerance is None:
        assert evaluated["test_accuracy"] == trained["test_accuracy"]
        assert evaluated["test_loss"] < trained["test_loss"]  # unsmoothed: nearer its targets
        return
    for key in ("test_loss", "test_accuracy"):
        assert evaluated[key] == pytest.approx(trained[key], rel=tolerance, abs=1e-6), key
