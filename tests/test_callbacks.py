"""User Keras callbacks (`callbacks:`) in both loops, and the progress display. (Resume after
kill -9 with a callback present: test_reliability.py; callbacks across two workers:
test_multiworker.py.)"""

from __future__ import annotations

import csv
import json
import logging
import os
import re
from pathlib import Path

import pytest
from conftest import ROOT, compose_once, fast_overrides
from omegaconf import OmegaConf

TESTS = Path(__file__).resolve().parent
RECORDER = "+callbacks.rec._target_=callback_recorder.Recorder"
SMALL = ("trainer.steps_per_epoch=5", "dataset.batch_size_per_replica=16", "deterministic=true",
         "seed=5")


def _calls(path: Path) -> list[list]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _history(run_dir: Path) -> list[dict]:
    with (run_dir / "history.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_both_loops_make_the_same_hook_calls_with_the_history_columns(run_inprocess, tmp_path,
                                                                      caplog):
    calls, warned = {}, {}
    for loop, block in (("custom", "loop.steps_per_loop=2"),
                        ("keras_fit", "loop.steps_per_execution=2")):
        path = tmp_path / f"{loop}.jsonl"
        # and an EarlyStopping with mode auto on val_accuracy (distlab ranks it: Keras can't)
        # a builder that compiled its model with an SGD of its own (the run's: Adam)
        run_inprocess(f"loop={loop}", block, *SMALL, "strategy.cpu_devices=2", RECORDER,
                      "imports=[callback_recorder]", "model.name=compiled_mlp",
                      f"+callbacks.rec.path={path}", "+callbacks.es._target_=keras.callbacks."
                      "EarlyStopping", "+callbacks.es.monitor=val_accuracy",
                      "+callbacks.es.patience=5", out=tmp_path / loop)
        calls[loop] = _calls(path)
        warned[loop] = [r.getMessage() for r in caplog.records if "compiled its" in r.getMessage()]
        caplog.clear()
    hooks = {loop: [(hook, index, sorted(logs or {})) for hook, index, logs, _ in c]
             for loop, c in calls.items()}
    assert hooks["custom"] == hooks["keras_fit"]
    # batch begin and end once per block of 2 steps (5 steps: 2, 2, 1), the logs running figures
    epoch = [(hook, index) for hook, index, _ in hooks["custom"][1:14]]
    assert epoch == [("epoch_begin", 0), ("batch_begin", 0), ("batch_end", 1), ("batch_begin", 2),
                     ("batch_end", 3), ("batch_begin", 4), ("batch_end", 4), ("epoch_end", 0),
                     ("epoch_begin", 1), ("batch_begin", 0), ("batch_end", 1),
                     ("batch_begin", 2), ("batch_end", 3)]
    assert hooks["custom"][0][0] == "train_begin" and hooks["custom"][-1][0] == "train_end"
    for loop, made in calls.items():  # README's table: empty logs; no test or predict hook
        assert all(logs == {} for hook, _, logs, _ in made
                   if hook in ("train_begin", "epoch_begin", "batch_begin")), loop
        assert not [hook for hook, *_ in made if hook.startswith(("test_", "predict_"))]
    assert hooks["custom"][3][2] == ["accuracy", "loss"]
    # the epoch's logs: its history.csv row's columns (but epoch), with the row's values
    for loop in calls:
        rows = _history(tmp_path / loop)
        ends = [logs for hook, _, logs, _ in calls[loop] if hook == "epoch_end"]
        assert all(sorted(logs) == sorted(k for k in rows[0] if k != "epoch") for logs in ends)
        for logs, row in zip(ends, rows, strict=True):
            assert logs["val_loss"] == pytest.approx(float(row["val_loss"]), abs=1e-5)  # csv
    # self.model.optimizer, as compile sets it, in both loops (the tutorial's PrintLR): the
    # run's, not the one the builder compiled with, which is named in one warning
    rates = {loop: [float(r) for r in (tmp_path / f"{loop}.jsonl.lr").read_text().split()]
             for loop in calls}
    assert rates["custom"] == rates["keras_fit"] == pytest.approx(
        [float(r["learning_rate"]) for r in _history(tmp_path / "custom")], rel=1e-6)
    for loop, lines in warned.items():
        assert len(lines) == 1 and "(optimizer SGD)" in lines[0], (loop, lines)


@pytest.mark.slow
@pytest.mark.parametrize("loop,stop_step", [("keras_fit", 2), ("custom", None)])
def test_a_callback_that_stops_training(loop, stop_step, run_inprocess, tmp_path, caplog):
    # a registered callback; keras_fit: stopped after step 2 of epoch 2 (its row covers the
    # steps it ran, as model.fit's), custom: at the end of epoch 2
    path, out = tmp_path / "calls.jsonl", tmp_path / "run"
    args = (f"loop={loop}", *SMALL, "trainer.epochs=4", "imports=[callback_recorder]",
            "+callbacks.rec.name=recorder", f"+callbacks.rec.path={path}",
            "+callbacks.rec.stop_epoch=1",
            *([f"+callbacks.rec.stop_step={stop_step}"] if stop_step else []))
    with caplog.at_level(logging.INFO, logger="distlab"):
        results = run_inprocess(*args, out=out)
    assert "a callback stopped training at epoch 2 (model.stop_training)" in caplog.text
    assert results["status"] == "completed" and results["epochs_completed"] == 2
    assert results["stopped_early"] == {"epoch": 2, "reason": "callback"}
    # numbered by the training steps the model took: keras_fit 5 + 2 (not 2 x 5), custom 10
    import tensorflow as tf

    steps = 5 + (stop_step or 5)
    assert results["checkpoint"].endswith(f"/ckpt-{steps}")
    reader = tf.train.load_checkpoint(results["checkpoint"])
    iterations = [k for k in reader.get_variable_to_shape_map()
                  if k.startswith("optimizer/") and "iterations" in k]
    assert [int(reader.get_tensor(k)) for k in iterations] == [steps]  # the optimizer's step
    assert [r["epoch"] for r in _history(out)] == ["1", "2"]
    calls = [(hook, index) for hook, index, *_ in _calls(path)]
    last_batch = (stop_step or 5) - 1
    assert calls[-4:] == [("batch_begin", last_batch), ("batch_end", last_batch),
                          ("epoch_end", 1), ("train_end", None)]
    assert run_inprocess(*args, out=out)["stopped_early"]["reason"] == "callback"  # not retrained
    assert len(_calls(path)) == len(calls)


@pytest.mark.parametrize("entry,says", [
    ("_target_=callback_recorder.Nope", "callbacks.bad._target_=callback_recorder.Nope does "
     "not import"),
    ("_target_=callback_recorder.NotACallback", "callbacks.bad._target_=callback_recorder."
     "NotACallback built a NotACallback, not a keras.callbacks.Callback"),
    ("_target_=callback_recorder.Raises", "callbacks.bad._target_=callback_recorder.Raises "
     "could not be built: ValueError: no notification service configured"),
    ("_target_=callback_recorder.Exits", "callbacks.bad._target_=callback_recorder.Exits "
     "could not be built: SystemExit: 4"),
    ("name=nope", "unknown callbacks.bad.name='nope'"),
    ("name=odd", "callbacks.bad.name=odd built a NoneType, not a keras.callbacks.Callback"),
    # Keras callbacks that fight distlab's own resume, learning rate or progress bar
    ("_target_=keras.callbacks.BackupAndRestore", "callbacks.bad._target_=keras.callbacks."
     "BackupAndRestore: keras.callbacks.BackupAndRestore cannot resume a distlab run: "
     "distlab's own checkpoints resume it (rerun the same command); remove callbacks.bad"),
    ("_target_=callback_recorder.Backup", "Backup (a keras.callbacks.BackupAndRestore) cannot"),
    ("_target_=keras.callbacks.ReduceLROnPlateau", "keras.callbacks.ReduceLROnPlateau sets the "
     "optimizer's learning rate, and distlab's is the `schedule` group's"),
    ("_target_=keras.callbacks.LearningRateScheduler", "LearningRateScheduler sets the"),
    ("_target_=keras.callbacks.ProgbarLogger", "ProgbarLogger is not needed: distlab draws the "
     "progress bar itself (loop.verbose=1"),
    ("_target_=keras.callbacks.EarlyStopping restore_best_weights=true",
     "callbacks.bad._target_=keras.callbacks.EarlyStopping with restore_best_weights=true would "
     "report the restored weights' figures while the checkpoint holds the last epoch's"),
    # a monitor: a figure of this run, never a test one (as trainer.early_stopping.metric)
    ("_target_=keras.callbacks.EarlyStopping monitor=test_accuracy", "callbacks.bad.monitor="
     "test_accuracy would choose on the test split, which only reports: watch val_accuracy"),
    ("_target_=keras.callbacks.ModelCheckpoint filepath=m.keras monitor=val_acc",
     "callbacks.bad.monitor='val_acc' is not a per-epoch figure of this run; use one of loss, "
     "accuracy, val_loss, val_accuracy"),
    # an exception in a callback's hook (here before the first step)
    ("_target_=keras.callbacks.CSVLogger filename=/nonexistent_dir/a.csv",
     "callbacks.bad (CSVLogger.on_train_begin) raised FileNotFoundError: [Errno 2] No such "
     "file or directory: '/nonexistent_dir/a.csv'"),
])
def test_a_bad_callback_is_one_line_before_training(entry, says, tiny_data_dir, tmp_path):
    import distlab

    entries = [f"+callbacks.bad.{e}" for e in entry.split()]
    results = distlab.run(compose_once([*fast_overrides(tiny_data_dir),
                                        "imports=[callback_recorder]", *entries]),
                          output_dir=tmp_path)
    assert results.exit_code == 2
    assert says in results.error and "\n" not in results.error
    assert not (tmp_path / "history.csv").exists()


def test_a_monitor_with_mode_auto_ranks_as_distlab_does(tmp_path):
    import keras

    from distlab.training.callbacks import check_monitors

    named = {"callbacks.a": keras.callbacks.EarlyStopping(monitor="val_accuracy"),
             "callbacks.b": keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras")),
             "callbacks.c": keras.callbacks.EarlyStopping(monitor="mae"),
             "callbacks.d": keras.callbacks.EarlyStopping(monitor="val_accuracy", mode="min")}
    check_monitors(named, {"accuracy": True, "mae": False})
    assert [c.mode for c in named.values()] == ["max", "min", "min", "min"]


def test_a_val_monitor_without_validation_and_a_resumed_stateful_callback_are_said(
        tmp_path, caplog):
    import keras

    from distlab.errors import ConfigError
    from distlab.training.callbacks import check_monitors, warn_resumed

    with pytest.raises(ConfigError, match=r"^callbacks.es.monitor=val_loss needs a validation "
                                          r"split, and dataset.validation=null"):
        check_monitors({"callbacks.es": keras.callbacks.EarlyStopping(monitor="val_loss")},
                       {"accuracy": True}, validation=False)
    # as trainer.early_stopping.metric: a val_ figure that no epoch measures
    for every, epochs, says in ((0, 2, "is measured only on epochs that validate, and "
                                       "trainer.validate_every=0"),
                                (3, 2, "would never be measured: trainer.validate_every=3 "
                                       "exceeds trainer.epochs=2")):
        trainer = OmegaConf.create({"validate_every": every, "epochs": epochs})
        with pytest.raises(ConfigError, match=rf"^callbacks.es.monitor=val_loss {says}"):
            check_monitors({"callbacks.es": keras.callbacks.EarlyStopping(monitor="val_loss")},
                           {"accuracy": True}, trainer=trainer)
    check_monitors({"callbacks.es": keras.callbacks.EarlyStopping(monitor="val_loss"),
                    "callbacks.t": keras.callbacks.EarlyStopping(monitor="loss")},
                   {"accuracy": True}, trainer=OmegaConf.create({"validate_every": 2,
                                                                 "epochs": 4}))
    check_monitors({"callbacks.t": keras.callbacks.EarlyStopping(monitor="loss")},
                   {"accuracy": True}, trainer=OmegaConf.create({"validate_every": 0,
                                                                 "epochs": 4}))
    # a ModelCheckpoint saving every epoch never reads its default monitor (val_loss)
    every = {"callbacks.mc": keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras"))}
    check_monitors(every, {"accuracy": True}, validation=False)
    check_monitors(every, {"accuracy": True}, trainer=OmegaConf.create({"validate_every": 0,
                                                                        "epochs": 4}))
    named_by_val = {"callbacks.mc": keras.callbacks.ModelCheckpoint(  # names its val_loss
        str(tmp_path / "m-{val_loss:.2f}.keras"))}
    with pytest.raises(ConfigError, match=r"^callbacks.mc.monitor=val_loss needs a"):
        check_monitors(named_by_val, {"accuracy": True}, validation=False)
    with pytest.raises(ConfigError, match=r"^callbacks.best.monitor=val_loss needs a"):
        check_monitors({"callbacks.best": keras.callbacks.ModelCheckpoint(
            str(tmp_path / "m.keras"), save_best_only=True)}, {"accuracy": True},
            validation=False)
    named = {"callbacks.es": keras.callbacks.EarlyStopping(monitor="val_loss"),
             "callbacks.best": keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras"),
                                                               save_best_only=True),
             "callbacks.every": keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras")),
             "callbacks.csv": keras.callbacks.CSVLogger(str(tmp_path / "e.csv"))}
    with caplog.at_level(logging.WARNING, logger="distlab"):
        warn_resumed(named, epoch=2)
    warned = [r.getMessage() for r in caplog.records]
    assert [w.split(" ")[0] for w in warned] == ["callbacks.es", "callbacks.best"]
    assert "starts afresh at epoch 3 of this resumed run" in warned[0]


def test_batch_hooks_set_on_the_instance_count():
    import keras

    from distlab.training.callbacks import has_batch_hooks

    assert has_batch_hooks([keras.callbacks.LambdaCallback(on_train_batch_end=print)])
    assert not has_batch_hooks([keras.callbacks.LambdaCallback(on_epoch_end=print)])


def _on_a_terminal(args: list[str]) -> str:
    """`python run.py ARGS` with stdout on a pseudo-terminal (stderr to /dev/null): what it
    wrote there. The process is forked from the preloaded interpreter of tests/processes.py
    (its own stdout opened on the terminal, as a command started there has)."""
    import select

    import processes

    master, child = os.openpty()
    proc = processes._forkserver().Process(  # (processes.Process captures to a file)
        target=processes._child, args=("run.py", list(args), str(ROOT), dict(os.environ),
                                       os.ttyname(child), os.devnull))
    proc.start()
    out = b""
    try:  # our end of the terminal stays open until the process ended: no early EOF
        while True:
            ended = proc.exitcode is not None
            while select.select([master], [], [], 0.05)[0] and (chunk := _read(master)):
                out += chunk
            if ended:
                break
            proc.join(0.05)
        assert proc.exitcode == 0, out.decode()[-3000:]
    finally:
        os.close(child)
        os.close(master)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
    return out.decode()


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError:  # the terminal closed: the process ended
        return b""


@pytest.mark.slow
def test_a_progress_bar_per_epoch_on_a_terminal(tiny_data_dir, tmp_path):
    """One `python run.py -m` process on a terminal, both loops (a job each). (In a pipe, only
    the epoch lines: test_reliability.py's SIGTERM test, both loops.)"""
    args = [a for a in fast_overrides(tiny_data_dir) if not a.startswith("loop.verbose")]
    args += ["trainer.steps_per_epoch=3", "strategy=default"]
    shown = _on_a_terminal(["-m", *args, "loop=custom,keras_fit",
                            f"hydra.sweep.dir={tmp_path / 'tty'}"])
    assert "example_loss" not in shown
    jobs = re.split(r"#1 : ", shown)
    assert len(jobs) == 2 and "#0 : " in jobs[0], shown[-3000:]
    for loop, job in zip(("custom", "keras_fit"), jobs, strict=True):
        for epoch in (1, 2):  # the bar, finished, then distlab's epoch line on a line of its own
            bar = job.split(f"Epoch {epoch}/2\r\n")[1].split(f"] - epoch {epoch}/2 - ")[0]
            assert "3/3" in bar and "━" in bar and "loss:" in bar, (loop, bar)
            assert "examples/sec:" in bar, (loop, bar)
            assert "\r" in bar, loop  # redrawn in place
            assert re.search(r"3/3[^\r\n]*\r\n\[[^\]\n]+\]\[distlab\]\[INFO$", bar), (loop, bar)
    for num, loop in enumerate(("custom", "keras_fit")):
        results = json.loads((tmp_path / "tty" / str(num) / "results.json").read_text())
        assert (results["loop"], results["status"]) == (loop, "completed")


def test_the_readme_says_what_each_hook_gets():
    """The Callbacks guide's hooks table as the calls above are: empty logs for the begin
    hooks, no on_test_*/on_predict_* call, and hook epochs 0-based against stopped_early's
    1-based."""
    text = (ROOT / "docs" / "guides" / "callbacks.md").read_text()
    table = text[text.index("| hook | when | logs |"):]
    rows = {row.split("|")[1].strip(): row for row in table[:table.index("\n\n")].splitlines()}
    for hook in ("`on_train_begin`", "`on_epoch_begin(epoch)`", "`on_train_batch_begin(step)`"):
        assert rows[hook].rstrip(" |").endswith("empty (`{}`)"), hook
    assert "never" in rows["`on_test_*`, `on_predict_*`"]
    section = text[text.index("| hook | when | logs |"):text.index("## Monitors")]
    assert "from 0 in the hooks" in section and "on_epoch_end(1)" in section
    assert '`stopped_early: {"epoch": 2, ...}`' in section
