"""A user's loop that breaks the Loop contract, and damaged checkpoints: one line each, naming
what to fix, exit status 2."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow
SMALL = ("strategy=default", "trainer.steps_per_epoch=2", "trainer.epochs=1",
         "dataset.batch_size_per_replica=16", "model=mlp", "model.hidden_units=[8]")


@pytest.mark.parametrize("loop, expected", [
    ("no_step", "loop.name='no_step': NoStep implements no train_step; a Loop implements "
                "train_step(features, labels, weights) returning self.batch_stats("),
    ("returns_dict", "ReturnsDict.train_step returned dict; it must return self.batch_stats("),
    ("returns_float32", "ReturnsFloat32.train_step returned a float32 tensor of shape [3]; it "
                        "must return self.batch_stats("),
    ("returns_none", "ReturnsNone.train_step returned NoneType; it must return"),
    ("state_list", "its state() returned a list; it returns a dict {name: tf.Variable}"),
    ("state_save_counter", "its state() names save_counter, which a checkpoint already uses"),
    ("state_not_trackable", "loop.name='state_not_trackable': its state() cannot be "
                            "checkpointed ("),
    ("not_a_loop", "loop.name='not_a_loop' built a int, not a loop: register a distlab.Loop "
                   "subclass"),
])
def test_a_broken_user_loop_is_one_line(run_inprocess, tmp_path, caplog, loop, expected):
    with pytest.raises(SystemExit) as exit_:
        run_inprocess("imports=[user_loops]", "loop=custom", f"loop.name={loop}", *SMALL,
                      out=tmp_path / "run")
    assert exit_.value.code == 2
    error = json.loads((tmp_path / "run" / "results.json").read_text())["error"]
    assert expected in error and "\n" not in error, error
    logged = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert logged == [error]


def test_a_checkpoint_failing_its_checksum_is_called_damaged(run_inprocess, tmp_path):
    run_inprocess(*SMALL, out=tmp_path / "run")
    (data,) = (tmp_path / "run" / "checkpoints").glob("ckpt-2.data-*")
    raw = bytearray(data.read_bytes())
    for i in range(0, len(raw), 64):  # every variable's bytes, so the model's too
        raw[i] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(SystemExit):
        run_inprocess(*SMALL, "mode=evaluate", f"ckpt_path={tmp_path / 'run'}",
                      out=tmp_path / "eval")
    error = json.loads((tmp_path / "eval" / "results.json").read_text())["error"]
    assert "is truncated or corrupt" in error and "does not match" not in error.split("(")[0]



def test_a_resume_without_a_usable_state_file_takes_the_newest_checkpoint_on_disk(
        run_inprocess, run_once, tmp_path, caplog):
    """checkpoints/checkpoint unreadable or deleted (TensorFlow ignored it and distlab trained
    afresh, saving over the checkpoints), empty (an internal error), or naming a checkpoint
    whose files were moved away or whose data file is gone (called a model mismatch): the
    newest intact ckpt-N on disk is resumed, with a warning; the run ends as the
    uninterrupted one, and trainer.max_checkpoints still holds. A truncated index is
    called damaged, not a mismatch."""
    import logging
    import shutil

    import tensorflow as tf

    three = (*SMALL[:-4], "trainer.epochs=3", *SMALL[-3:], "trainer.max_checkpoints=2")
    whole, _ = run_once(*three)
    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    run_inprocess(*three[:-5], "trainer.epochs=2", *three[-4:], out=run)

    def resumed_from(newest: str, why: str, trained: bool = True) -> None:
        (run / "results.json").unlink()  # (killed before it was written)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="distlab"):
            resumed = run_inprocess(*three, out=run)
        assert f"{ckpts / 'checkpoint'} (TensorFlow's list of checkpoints) {why}: resuming " \
               f"from the newest checkpoint on disk, {ckpts / newest}" in caplog.text
        assert resumed["test_loss"] == pytest.approx(whole["test_loss"], abs=1e-6)
        assert resumed["checkpoint"] == str(ckpts / "ckpt-6")
        kept = sorted(p.name for p in ckpts.glob("ckpt-*.index"))
        assert kept == ["ckpt-4.index", "ckpt-6.index"], kept  # max_checkpoints=2
        if trained:
            assert "2 epoch(s) done, 0 step(s) into the next" in caplog.text
        state = tf.train.get_checkpoint_state(str(ckpts))  # written again, as a save would
        assert state.model_checkpoint_path == str(ckpts / "ckpt-6"), state

    (ckpts / "checkpoint").write_text("garbage ][\n")
    resumed_from("ckpt-4", "is unreadable")
    (ckpts / "checkpoint").unlink()
    resumed_from("ckpt-6", "is missing", trained=False)
    (ckpts / "checkpoint").write_text("")  # a crash's, a full disk's
    resumed_from("ckpt-6", "is unreadable", trained=False)
    assert (ckpts / "checkpoint.unreadable").read_text() == ""  # kept aside
    moved = tmp_path / "moved"
    moved.mkdir()
    for path in ckpts.glob("ckpt-6.*"):
        shutil.move(path, moved / path.name)
    resumed_from("ckpt-4", f"names {ckpts / 'ckpt-6'}, whose files are gone")
    (data,) = ckpts.glob("ckpt-6.data-*")
    data.unlink()
    resumed_from("ckpt-4", f"names {ckpts / 'ckpt-6'}, whose files are gone")

    index = ckpts / "ckpt-6.index"
    index.write_bytes(index.read_bytes()[:20])
    (run / "results.json").unlink()
    with pytest.raises(SystemExit):
        run_inprocess(*three, out=run)
    error = json.loads((run / "results.json").read_text())["error"]
    assert error.startswith(f"cannot resume from checkpoint {ckpts / 'ckpt-6'}: it is "
                            "truncated or corrupt (") and error.endswith(
        "Move its files (ckpt-6.*) out of the folder: the rerun resumes from the newest "
        "intact checkpoint; nothing was deleted"), error


def test_a_stage_after_training_that_fails_keeps_the_figures_measured_before_it(
        run_inprocess, tmp_path):
    """checkpoints/best damaged: the best-checkpoint test (the last stage) fails, and the
    failed results.json keeps the final evaluation's figures (they were only in run.log)."""
    best = ("trainer.best_checkpoint.metric=val_loss", "trainer.best_checkpoint.test=true")
    args = (*SMALL[:-4], "trainer.epochs=2", *SMALL[-3:], *best)
    run = tmp_path / "run"
    whole = run_inprocess(*args, out=run)
    (data,) = (run / "checkpoints" / "best").glob("ckpt-*.data-*")
    raw = bytearray(data.read_bytes())
    for i in range(0, len(raw), 64):
        raw[i] ^= 0xFF
    data.write_bytes(bytes(raw))
    (run / "results.json").unlink()  # (killed as it finished: the stages after training run)
    with pytest.raises(SystemExit) as exit_:
        run_inprocess(*args, out=run)
    assert exit_.value.code == 2
    failed = json.loads((run / "results.json").read_text())
    assert failed["status"] == "failed" and failed["error"].startswith(
        f"trainer.best_checkpoint.test=true cannot test {run / 'checkpoints' / 'best'}/ckpt-")
    assert "it is truncated or corrupt (" in failed["error"] and failed["error"].endswith(
        "Put its files back, or rerun with trainer.best_checkpoint.test=false to complete "
        "the run without that test"), failed["error"]
    assert (failed["test_loss"], failed["val_loss"], failed["epochs_completed"]) == (
        whole["test_loss"], whole["val_loss"], 2)
    assert failed.get("best_test_loss") is None
    completed = run_inprocess(*args[:-1], "trainer.best_checkpoint.test=false", out=run)
    assert completed["status"] == "completed" and completed["test_loss"] == whole["test_loss"]


def test_a_checkpoint_of_another_model_is_one_line_without_tensorflows_list(
        run_inprocess, tiny_data_dir, tmp_path):
    """`python run.py mode=evaluate` of an mlp's checkpoint with another model: the one line
    ends the output, without TensorFlow's warnings naming each value left unrestored (dozens
    of lines, once the run's objects are deleted)."""
    from conftest import fast_overrides, run_cli

    run_inprocess(*SMALL[1:-1], out=tmp_path / "run")  # mirrored, the mlp's own layers
    out = run_cli(*fast_overrides(tiny_data_dir), *SMALL[1:-2], "model=mnist_cnn",
                  "mode=evaluate", f"ckpt_path={tmp_path / 'run'}",
                  f"hydra.run.dir={tmp_path / 'eval'}", timeout=300,
                  fresh=True)  # (a forked one ends by os._exit: no object is deleted)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-3000:]
    assert "it does not match the configured model (cnn" in text, text[-3000:]
    assert "could not be found" not in text and "unrestored values" not in text, text[-3000:]
