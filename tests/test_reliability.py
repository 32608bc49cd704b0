"""Resume, preemption, NaN guard and reruns, through real `python run.py` processes."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
from pathlib import Path

import pytest
from conftest import Gated, fast_overrides, run_cli, signal_at

pytestmark = pytest.mark.slow


def _rows(run_dir: Path) -> int:
    history = run_dir / "history.csv"
    return max(0, len(history.read_text().splitlines()) - 1) if history.exists() else 0


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def _column(run_dir: Path, name: str) -> int:
    return (run_dir / "history.csv").read_text().splitlines()[0].split(",").index(name)


def _digest(run_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def _training(loop: str, *extra: str) -> list[str]:
    return [f"loop={loop}", "trainer.epochs=3", "trainer.checkpoint_every=1",
            "deterministic=true", "seed=11", *extra]


def _args(tiny_data_dir, loop: str, run_dir: Path, *extra: str) -> list[str]:
    return [*fast_overrides(tiny_data_dir), f"hydra.run.dir={run_dir}",
            *_training(loop, *extra)]


@pytest.mark.parametrize("loop,option", [("keras_fit", "trainer.grad_accum_steps=4"),
                                         ("custom", "precision=mixed_bfloat16")])
def test_sigkill_then_rerun_resumes_exactly(loop, option, tiny_data_dir, tmp_path,
                                            run_inprocess, caplog, mlflow_store):
    # 10 steps per epoch, killed at step 5 of epoch 2; dropout (its RNG state is
    # checkpointed), batch norm and seeded augmentation must resume exactly, and so must
    # gradient accumulation (10 steps: epoch 1 ends mid-accumulation), mixed precision and the
    # best checkpoint (its state is in the checkpoint). The killed run is a run.py process
    # (kill -9 is the subject); the uninterrupted run, the rerun and the evaluation of the best
    # checkpoint run in this process, on one CPU device as run.py's (strategy.cpu_devices=1)
    model = ("model=mlp", "model.hidden_units=[32]", "model.dropout=0.3",
             "model.batch_norm=true", "dataset.augment.crop_padding=2",
             "dataset.augment.flip=horizontal")
    extra = ("trainer.steps_per_epoch=10", *model, "trainer.best_checkpoint.metric=val_loss",
             "strategy.cpu_devices=1", option)
    a, c = tmp_path / "a", tmp_path / "c"
    # keras_fit: with a user's callback (tests/callback_recorder.py), which the rerun restarts
    # at epoch 2, and logger=mlflow, whose run the rerun continues (each epoch logged once)
    calls, store = tmp_path / "calls.jsonl", mlflow_store(tmp_path / "mlflow.db")
    callback = ("+callbacks.rec._target_=callback_recorder.Recorder",
                f"+callbacks.rec.path={calls}", "logger=mlflow",
                f"logger.tracking_uri={store}") if loop == "keras_fit" else ()
    uninterrupted = run_inprocess(*_training(loop, *extra), *callback[:2], out=a)
    calls.unlink(missing_ok=True)

    run_dir = c  # killed at step 5 of epoch 2 (the rerun retrains epoch 2)
    scratch = tmp_path / "tmp"  # the killed process's TMPDIR
    scratch.mkdir()
    with Gated([*fast_overrides(tiny_data_dir), *_training(loop, *extra), *callback],
               run_dir, "step:1:5", tmp_path / "gate", env={"TMPDIR": str(scratch)}) as killed:
        killed.wait()
        killed.signal(signal.SIGKILL)
        assert killed.finish()[0] == -signal.SIGKILL
    assert _rows(run_dir) == 1
    assert not list(scratch.glob("distlab-*")), list(scratch.iterdir())  # nothing left behind
    caplog.set_level(logging.INFO, logger="distlab")
    resumed = run_inprocess(*_training(loop, *extra), *callback, out=run_dir)
    if callback:
        rerun = [(hook, index) for hook, index, *_ in map(json.loads,
                                                          calls.read_text().splitlines())]
        second = len(rerun) - rerun[::-1].index(("train_begin", None)) - 1
        assert second > 0 and rerun[second + 1] == ("epoch_begin", 1)
        from mlflow.tracking import MlflowClient

        client = MlflowClient(store)
        [run] = client.search_runs([client.get_experiment_by_name("distlab").experiment_id])
        assert run.info.status == "FINISHED"
        history = client.get_metric_history(run.info.run_id, "val_loss")
        assert [m.step for m in history] == [1, 2, 3]
        assert [m.value for m in history] == pytest.approx(
            [float(r.split(",")[_column(run_dir, "val_loss")]) for r in
             (run_dir / "history.csv").read_text().splitlines()[1:]], rel=1e-5)
    assert resumed["epochs_completed"] == 3
    assert resumed["test_loss"] == pytest.approx(uninterrupted["test_loss"], abs=1e-6)
    assert resumed["test_accuracy"] == pytest.approx(uninterrupted["test_accuracy"], abs=1e-6)
    history = [int(r.split(",")[0]) for r in
               (run_dir / "history.csv").read_text().splitlines()[1:]]
    assert history == [1, 2, 3]
    assert any(r.getMessage().startswith("resuming from") for r in caplog.records)
    for key in ("best_value", "best_epoch"):
        assert resumed[key] == pytest.approx(uninterrupted[key], abs=1e-6), key
    if option.startswith("precision="):  # the model's own dtype policy
        assert resumed["precision"] == option.split("=")[1]
    # the best checkpoint evaluates to the val_loss recorded for it
    evaluated = run_inprocess("mode=evaluate", f"loop={loop}", option, *model,
                              "strategy.cpu_devices=1", f"ckpt_path={c}/checkpoints/best",
                              out=tmp_path / "best")
    assert evaluated["val_loss"] == pytest.approx(resumed["best_value"], abs=1e-6)
    assert evaluated["trained"]["epochs_completed"] == 3  # the run's record, best is epoch N


# a machine that trains fast (tiny steps) and one that trains slowly (every step sleeps)
SPEEDS = {"fast": 0.0, "slow": 0.05}


@pytest.mark.parametrize("speed", sorted(SPEEDS))
@pytest.mark.parametrize("loop", ["custom", "keras_fit"])
def test_sigterm_mid_epoch_checkpoints_then_the_rerun_matches_the_uninterrupted_run(
        loop, speed, tiny_data_dir, tmp_path, run_once, run_inprocess):
    """A real SIGTERM mid-epoch 2 (sent when step 5 of epoch 2 has run: tests/gate.py): exit
    143, one line, status interrupted, a mid-epoch checkpoint; the rerun's rows (the resumed
    epoch whole), test loss and time to target equal an uninterrupted run's (in this process,
    on the same default strategy; one run shared by both speeds). The rerun after the fast
    machine's signal is a `python run.py` too (its epoch lines: only the resumed epoch's, no
    progress bar), the slow one's in this process (the rerun itself is not slowed)."""
    from test_resumed_epochs_and_evaluation import SMALL, _same_rows

    training = [f"loop={loop}", "strategy=default", *SMALL, "trainer.steps_per_epoch=12",
                "trainer.target.metric=accuracy", "trainer.target.value=0.5"]
    # loop.verbose left at auto: in a pipe, only the epoch lines (no progress bar)
    args = [*(a for a in fast_overrides(tiny_data_dir) if not a.startswith("loop.verbose")),
            *training]
    whole, whole_dir = run_once(*training)

    returncode, output = signal_at(args, tmp_path / "b", "step:1:5", step_sleep=SPEEDS[speed])
    assert returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "Traceback" not in output
    stopped = [ln for ln in output.splitlines() if "stopped by signal" in ln]
    assert len(stopped) == 1 and "Rerun the same command to resume" in stopped[0], output[-3000:]
    assert "epoch 2, step 5" in stopped[0]
    interrupted = _results(tmp_path / "b")
    assert interrupted["status"] == "interrupted"
    assert interrupted["interrupted_stage"] == "training"
    assert interrupted["epochs_completed"] == 1
    assert interrupted["steps_in_epoch"] == 5
    assert (tmp_path / "b" / "checkpoints" / "checkpoint").exists()

    outputs = [(output, ["epoch 1/2"])]
    if speed == "fast":
        out = run_cli(*args, f"hydra.run.dir={tmp_path / 'b'}")
        assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
        outputs.append((out.stdout, ["epoch 2/2"]))
    else:
        run_inprocess(*training, out=tmp_path / "b")
    for text, epochs in outputs:
        assert [ln.split(" - ")[1] for ln in text.splitlines() if " - epoch " in ln] == epochs
        assert "\r" not in text and "\b" not in text and "━" not in text, text[-3000:]
        assert "Epoch 1" not in text and "example_loss" not in text
    done = _results(tmp_path / "b")
    assert done["status"] == "completed" and done["epochs_completed"] == 2
    _same_rows(tmp_path / "b", whole_dir)
    for key in ("test_loss", "epochs_to_target"):
        assert done[key] == pytest.approx(whole[key], abs=1e-6), key


# (stage, the keys that make the run have it)
STAGES = {"final evaluation": (), "export": ("trainer.export=true",),
          "best-checkpoint test": ("trainer.best_checkpoint.metric=val_loss",
                                   "trainer.best_checkpoint.test=true")}


def test_an_export_asked_of_a_completed_run_and_cut_short_keeps_the_completed_record(
        tiny_data_dir, tmp_path, run_inprocess):
    """A completed run rerun with trainer.export=true runs its stages after training again; a
    SIGTERM in its export leaves results.json the completed run's. The rerun that exports
    keeps the epoch that reached the target, not the time (measured from the zero of the
    process that reached it, and wall_time_s is this process's: as any resumed run's)."""
    training = ["strategy=default", "trainer.steps_per_epoch=3", "model=mlp",
                "model.hidden_units=[16]", "trainer.target.metric=val_loss",
                "trainer.target.value=1000"]  # reached at the first epoch
    run_dir = tmp_path / "run"
    first = run_inprocess(*training, out=run_dir)
    assert (first["status"], first["epochs_to_target"]) == ("completed", 1)
    assert first["time_to_target_s"] > 0 and "saved_model" not in first
    args = [*fast_overrides(tiny_data_dir), *training, "trainer.export=true"]
    returncode, output = signal_at(args, run_dir, "stage:export")
    assert returncode == 128 + signal.SIGTERM, output[-3000:]
    assert _results(run_dir) == first  # not downgraded to interrupted, no figure lost
    exported = run_inprocess(*training, "trainer.export=true", out=run_dir)
    assert (exported["status"], exported["saved_model"]) == ("completed", "saved_model")
    for key in ("epochs_to_target", "test_loss", "num_replicas"):
        assert exported[key] == first[key], key
    assert exported["time_to_target_s"] is None


@pytest.mark.parametrize("stage", list(STAGES))
@pytest.mark.parametrize("loop", ["custom", "keras_fit"])
def test_a_signal_after_training_ends_the_stage_and_the_rerun_completes_it(
        loop, stage, tiny_data_dir, tmp_path, run_inprocess, caplog):
    """SIGTERM (SIGINT in the custom loop) once a stage after training has begun: exit
    128+N, one line naming the stage, results.json interrupted in that stage with the
    figures measured before it, no half-written SavedModel; the rerun trains nothing and
    completes the run (the final figures as an uninterrupted run's)."""
    signum = signal.SIGINT if loop == "custom" else signal.SIGTERM
    training = [f"loop={loop}", "strategy=default", "trainer.steps_per_epoch=3", "seed=3",
                "deterministic=true", "model=mlp", "model.hidden_units=[16]", *STAGES[stage]]
    args = [*fast_overrides(tiny_data_dir), *training]
    run_dir = tmp_path / "run"
    returncode, output = signal_at(args, run_dir, f"stage:{stage}", signum=signum)
    assert returncode == 128 + signum, output[-3000:]
    lines = [ln for ln in output.splitlines() if "stopped by signal" in ln]
    assert len(lines) == 1 and f"during the {stage}" in lines[0], output[-3000:]
    assert "Traceback" not in output
    cut = _results(run_dir)
    assert (cut["status"], cut["interrupted_stage"]) == ("interrupted", stage)
    assert cut["epochs_completed"] == 2
    assert not list(run_dir.glob("saved_model*")), "an export cut short leaves nothing"
    if stage != "final evaluation":  # measured before the stage: kept
        assert cut["test_loss"] is not None and cut["train_examples_per_sec"] is not None
    history = (run_dir / "history.csv").read_text()

    caplog.set_level(logging.INFO, logger="distlab")
    done = run_inprocess(*training, out=run_dir)
    assert done["status"] == "completed" and done["epochs_completed"] == 2
    assert "interrupted_stage" not in done
    assert any("training is done" in r.getMessage() for r in caplog.records)
    assert (run_dir / "history.csv").read_text() == history  # nothing trained again
    assert done["train_examples_per_sec"] is not None  # the training attempt's figures kept
    if stage != "final evaluation":
        assert done["test_loss"] == pytest.approx(cut["test_loss"], abs=1e-6)
    if stage == "export":
        assert (run_dir / "saved_model" / "saved_model.pb").exists()
    if stage == "best-checkpoint test":
        assert done["best_test_loss"] is not None


def test_a_signal_after_the_last_training_step_says_training_is_kept():
    """A signal noted after the loop's last poll (the training stage's end: leftover
    gradients, closing the loop) ends the job saying that training is done and kept, not
    that nothing was trained (a sweep's Ctrl-C reaching a job as its epochs ended)."""
    from distlab.distribute.preemption import TRAINING, Interrupted, StopRequest

    stop = StopRequest()
    stop.begin(TRAINING, polled=True)
    stop.signum = signal.SIGTERM  # what the handler notes in a polled stage
    with pytest.raises(Interrupted) as stopped:
        stop.check()  # runner._train_epochs, once the loop has returned
    line = str(stopped.value)
    assert "after the training's last step; training is done and kept" in line, line
    assert "before anything was trained" not in line and stopped.value.stage == TRAINING


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the point
def test_a_signal_whose_exception_python_swallowed_is_told_in_the_stage_it_came_in():
    """A signal in the set-up whose Signalled Python ignored (raised inside a weakref callback
    or __del__, which only prints "Exception ignored") ends the job at the training's begin
    as a set-up stop, not as one after the training's last step."""
    import gc
    import weakref

    from distlab.distribute.preemption import SETUP, TRAINING, Interrupted, stop_on_signals

    class Held:
        pass

    with stop_on_signals() as stop:
        held = Held()
        weakref.finalize(held, os.kill, os.getpid(), signal.SIGTERM)  # handled in there
        del held
        gc.collect()
        assert stop.signum == signal.SIGTERM  # noted; its Signalled went nowhere
        with pytest.raises(Interrupted) as stopped:
            stop.begin(TRAINING, polled=True)
    line = str(stopped.value)
    assert stopped.value.stage == SETUP and "during the set-up, before anything" in line, line


@pytest.mark.parametrize("loop", ["custom", "keras_fit"])
def test_nan_loss_stops_with_a_clear_message(loop, tiny_data_dir, tmp_path, run_inprocess,
                                             caplog):
    """keras_fit: `python run.py` (its exit status and its line); custom: in this process
    (the same message, in results.json and the log)."""
    training = (f"loop={loop}", "optimizer.learning_rate=1e12", "trainer.steps_per_epoch=20")
    if loop == "keras_fit":
        out = run_cli(*fast_overrides(tiny_data_dir), *training, f"hydra.run.dir={tmp_path}")
        text = out.stdout + out.stderr
        assert out.returncode != 0
    else:
        with pytest.raises(SystemExit) as exit_:
            run_inprocess(*training, out=tmp_path)
        assert exit_.value.code != 0
        text = "\n".join(r.getMessage() for r in caplog.records if r.levelname == "ERROR")
        assert _results(tmp_path)["error"] in text
    assert "non-finite loss" in text and "epoch 1, step" in text, text[-3000:]
    assert "Lower optimizer.learning_rate" in text, text[-3000:]
    assert "Traceback" not in text
    assert _results(tmp_path)["status"] == "failed"
    assert not (tmp_path / "checkpoints" / "checkpoint").exists()  # no NaN weights saved


def test_reruns_completed_refused_and_extended(tiny_data_dir, tmp_path, run_inprocess):
    """The first run, the rerun of the completed run and the refused one are `python run.py`
    (their exit status and line; the run dir's .hydra/ is the first command's); the refused
    evaluation and the extension run in this process."""
    base = [*fast_overrides(tiny_data_dir), "trainer.steps_per_epoch=3",
            f"hydra.run.dir={tmp_path}"]
    assert run_cli(*base).returncode == 0
    first = _results(tmp_path)
    before = _digest(tmp_path)

    # a completed run is not retrained
    again = run_cli(*base)
    assert again.returncode == 0 and "already completed" in again.stdout + again.stderr
    assert _results(tmp_path) == first

    # a config that changes the training is refused, and nothing in the dir changes
    before = _digest(tmp_path)
    refused = run_cli(*base, "optimizer.learning_rate=0.01", "model=fashion_cnn")
    text = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert "optimizer.learning_rate" in text and "model.conv_filters" in text, text
    assert "Traceback" not in text
    assert _digest(tmp_path) == before

    # evaluate into a training run dir would overwrite its results: refused too
    with pytest.raises(SystemExit) as exit_:
        run_inprocess("trainer.steps_per_epoch=3", "mode=evaluate", f"ckpt_path={tmp_path}",
                      out=tmp_path)
    assert exit_.value.code != 0
    assert _digest(tmp_path) == before

    # raising trainer.epochs extends the run from its last checkpoint
    extended = run_inprocess("trainer.steps_per_epoch=3", "trainer.epochs=3", out=tmp_path)
    assert extended["epochs_completed"] == 3 == _results(tmp_path)["epochs_completed"]
    epochs = [int(r.split(",")[0]) for r in
              (tmp_path / "history.csv").read_text().splitlines()[1:]]
    assert epochs == [1, 2, 3]


def test_corrupt_checkpoint_is_reported_and_kept(tiny_data_dir, tmp_path, run_inprocess,
                                                 caplog):
    train = tmp_path / "train"  # trained in this process, on one device as run.py's
    run_inprocess("trainer.steps_per_epoch=2", "strategy.cpu_devices=1", out=train)
    data_files = sorted((train / "checkpoints").glob("ckpt-*.data-*"))
    latest = data_files[-1]
    latest.write_bytes(latest.read_bytes()[:100])  # truncate
    before = _digest(train)

    out = run_cli(*fast_overrides(tiny_data_dir), "mode=evaluate", f"ckpt_path={train}",
                  f"hydra.run.dir={tmp_path / 'eval'}")
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "truncated or corrupt" in text, text[-3000:]
    assert "Traceback" not in text

    # resuming (extending) from it is refused the same way (in this process); nothing is
    # deleted
    caplog.clear()
    with pytest.raises(SystemExit) as exit_:
        run_inprocess("trainer.steps_per_epoch=2", "trainer.epochs=3", "strategy.cpu_devices=1",
                      out=train)
    assert exit_.value.code != 0
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors and "truncated or corrupt" in errors[-1], errors
    after = _digest(train)
    for name, digest in before.items():
        if name.startswith(("checkpoints/", "history.csv", "saved_model/", "results.json")):
            assert after.get(name) == digest, name


def test_unwritable_output_dir_and_bad_data_dir(tiny_data_dir, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    out = run_cli(f"hydra.run.dir={blocker}/run", timeout=60)
    assert out.returncode != 0 and "hydra.run.dir" in out.stderr and "Traceback" not in out.stderr
    # a folder nobody can create (/proc refuses even root, whom os.access lets through)
    for args in (["hydra.run.dir=/proc/distlab-test"],
                 ["-m", "seed=1,2", "hydra.sweep.dir=/proc/distlab-test"]):
        out = run_cli(*args, timeout=60)
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
        [line] = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
        assert "/proc/distlab-test" in line and "hydra." in line, line
    # brackets (a sweep's ${hydra.job.override_dirname} of a slice): refused before training,
    # where it trained and then could not export, resume or evaluate
    bracketed = tmp_path / "split=train[:64]"
    out = run_cli(*fast_overrides(tiny_data_dir), f"hydra.run.dir='{bracketed}'", timeout=60)
    text = out.stdout + out.stderr
    assert out.returncode == 2 and "Traceback" not in text, text[-3000:]
    assert f"hydra.run.dir={bracketed} has '[' in its path" in text, text[-3000:]
    assert not bracketed.exists()  # refused before Hydra created it

    out = run_cli(f"dataset.data_dir={blocker}", f"hydra.run.dir={tmp_path / 'r'}", timeout=60)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "dataset.data_dir" in text and "Traceback" not in text


def test_a_signal_while_the_run_finishes_marks_its_tracker_run_killed_then_the_rerun_ends_it(
        tiny_data_dir, tmp_path, run_inprocess, mlflow_store):
    """SIGTERM as the finish begins (results.json, then the tracker's close): the MLflow run
    is KILLED, results.json interrupted at `finish` with every figure; the rerun trains
    nothing and ends the MLflow run FINISHED."""
    from mlflow.tracking import MlflowClient

    store = mlflow_store(tmp_path / "mlflow.db")
    training = ["strategy=default", "trainer.steps_per_epoch=3", "model=mlp",
                "model.hidden_units=[16]", "logger=mlflow", f"logger.tracking_uri={store}"]
    run_dir = tmp_path / "run"
    returncode, output = signal_at([*fast_overrides(tiny_data_dir), *training], run_dir,
                                   "stage:finish")
    assert returncode == 128 + signal.SIGTERM, output[-3000:]
    cut = _results(run_dir)
    assert (cut["status"], cut["interrupted_stage"]) == ("interrupted", "finish")
    assert cut["test_loss"] is not None and cut["epochs_completed"] == 2
    client = MlflowClient(store)
    [run] = client.search_runs([client.get_experiment_by_name("distlab").experiment_id])
    assert run.info.status == "KILLED"

    done = run_inprocess(*training, out=run_dir)
    assert done["status"] == "completed"
    assert done["test_loss"] == pytest.approx(cut["test_loss"], abs=1e-6)
    [run] = client.search_runs([client.get_experiment_by_name("distlab").experiment_id])
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2]


def test_a_second_signal_stops_at_once_in_one_line(tiny_data_dir, tmp_path):
    """SIGINT and SIGTERM together mid-epoch: the second stops the run at once, without a
    checkpoint: one line, no traceback, results.json interrupted, exit 128+signal."""
    run_dir = tmp_path / "run"
    args = [*fast_overrides(tiny_data_dir), "loop=custom", "strategy=default", "model=mlp",
            "model.hidden_units=[16]", "trainer.steps_per_epoch=5"]
    with Gated(args, run_dir, "step:0:2", tmp_path / "gate") as gated:
        gated.wait()
        gated.proc.send_signal(signal.SIGINT)
        gated.signal(signal.SIGTERM)
        returncode, output = gated.finish()
    assert returncode in (128 + signal.SIGINT, 128 + signal.SIGTERM), output[-3000:]
    assert "Traceback" not in output
    lines = [ln for ln in output.splitlines() if "[distlab][ERROR]" in ln]
    assert len(lines) == 1 and "a second signal" in lines[0], output[-3000:]
    cut = _results(run_dir)
    assert (cut["status"], cut["interrupted_stage"]) == ("interrupted", "training")


def test_a_signal_in_the_last_step_then_in_the_reruns_set_up_loses_nothing(
        tiny_data_dir, tmp_path, run_inprocess):
    """SIGTERM at the last step: the epoch is saved ("after epoch 2"), with its throughput;
    SIGTERM again as the rerun sets up: the record is kept (marked interrupted at set-up);
    the next rerun trains nothing and completes with the training attempt's throughput."""
    training = ["loop=custom", "strategy=default", "model=mlp", "model.hidden_units=[16]",
                "trainer.steps_per_epoch=3"]
    args, run_dir = [*fast_overrides(tiny_data_dir), *training], tmp_path / "run"
    returncode, output = signal_at(args, run_dir, "step:1:3")
    assert returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "after epoch 2;" in output, output[-3000:]
    cut = _results(run_dir)
    assert cut["epochs_completed"] == 2 and cut["train_examples_per_sec"] > 0

    returncode, output = signal_at(args, run_dir, "stage:set-up")
    assert returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "during the set-up" in output and "Traceback" not in output
    kept = _results(run_dir)
    assert kept["interrupted_stage"] == "set-up"
    assert kept["train_examples_per_sec"] == cut["train_examples_per_sec"]

    done = run_inprocess(*training, out=run_dir)
    assert done["status"] == "completed" and done["epochs_completed"] == 2
    assert done["train_examples_per_sec"] == cut["train_examples_per_sec"]
