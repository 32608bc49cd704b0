"""Whole runs on tiny prepared data: run-dir contract, both loops, strategies, evaluate mode."""

from __future__ import annotations

import json

import pytest
from conftest import compose, fast_overrides, refusal_in_process, run_cli

from distlab.records.fields import COMPLETED, is_field
from distlab.records.run_dir import HISTORY_COLUMNS, RunDir

pytestmark = pytest.mark.slow
MLP = ("model=mlp", "model.hidden_units=[32]")  # where the model is not the point


def assert_run_dir(path, epochs: int, export: bool = True) -> dict:
    results = json.loads((path / "results.json").read_text())
    assert results["status"] == "completed", results
    for field in COMPLETED:
        assert field in results, field
    assert all(is_field(key) for key in results), [k for k in results if not is_field(k)]
    assert results["epochs_completed"] == epochs
    assert results["global_batch_size"] == (results["batch_size_per_replica"]
                                            * results["num_replicas"])
    for name in (".hydra/config.yaml", ".hydra/overrides.yaml", "run.log", "history.csv",
                 "checkpoints/checkpoint"):
        assert (path / name).exists(), name
    assert list((path / "logs" / "train").glob("events.out.tfevents.*"))
    assert list((path / "logs" / "validation").glob("events.out.tfevents.*"))
    assert (path / "saved_model" / "saved_model.pb").exists() == export
    history = RunDir(path).read_history()
    assert [int(r["epoch"]) for r in history] == list(range(1, epochs + 1))
    assert list(history[0]) == HISTORY_COLUMNS
    assert all(float(r["examples_per_sec"]) > 0 and r["val_accuracy"] for r in history)
    return results


def test_cli_run_writes_the_whole_run_dir_and_restores_without_a_strategy(
        tiny_data_dir, tmp_path, run_inprocess):
    """`python run.py` (keras_fit, 2 replicas, exported): its exit status and output, the whole
    run dir; restored in this process without a strategy, to the same figures. (The custom
    loop's whole run dir: the seed sweep below, also a command, in the exhaustive tier.)"""
    train_dir, eval_dir = tmp_path / "train", tmp_path / "eval"
    out = run_cli(*fast_overrides(tiny_data_dir), "loop=keras_fit", "strategy.cpu_devices=2",
                  "trainer.export=true", f"hydra.run.dir={train_dir}")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    trained = assert_run_dir(train_dir, epochs=2)
    assert trained["loop"] == "keras_fit" and trained["strategy"] == "MirroredStrategy"
    assert (trained["num_replicas"], trained["global_batch_size"]) == (2, 128)
    assert trained["export_max_abs_diff"] < 1e-4
    assert trained["test_accuracy"] > 0.3  # the tiny data is learnable
    assert "epoch 2/2 - learning_rate" in (train_dir / "run.log").read_text()
    assert "preserve tf.data options" not in out.stdout + out.stderr  # no tf.data warning

    # restored in this process (test_reliability evaluates through run.py)
    evaluated = run_inprocess("mode=evaluate", f"ckpt_path={train_dir}", "strategy=default",
                              out=eval_dir)
    assert evaluated["num_replicas"] == 1 and evaluated["mode"] == "evaluate"
    assert evaluated["epochs_completed"] == 2
    # (the figures do not depend on the replica count: test_replicas.py)
    assert evaluated["test_accuracy"] == pytest.approx(trained["test_accuracy"], abs=1e-6)
    assert evaluated["test_loss"] == pytest.approx(trained["test_loss"], abs=1e-6)


def _custom_default_seed_zero(run_once) -> dict:
    """The custom loop without a strategy, seed 0 and no augmentation (2 epochs of 2 steps,
    an MLP): read by the strategy and the seed tests."""
    return run_once(*MLP, "loop=custom", "strategy=default", "seed=0",
                    "dataset.augment.flip=none", "trainer.steps_per_epoch=2")[0]


def _one_device_cpu1(run_once) -> dict:
    """The custom loop under strategy=one_device on /cpu:1 (2 epochs of 2 steps, an MLP)."""
    return run_once(*MLP, "loop=custom", "strategy=one_device", "strategy.device=/cpu:1",
                    "trainer.steps_per_epoch=2")[0]


def test_custom_loop_under_each_strategy(run_once):
    runs = {"strategy=default": _custom_default_seed_zero(run_once),
            "strategy=one_device": _one_device_cpu1(run_once),
            "strategy.cpu_devices=2": _trained(run_once, "custom", 2)[0]}  # (6 steps)
    for strategy, results in runs.items():
        assert results["status"] == "completed" and results["epochs_completed"] == 2, strategy
        assert results["loop"] == "custom", strategy
        assert results["num_replicas"] == (2 if "cpu_devices=2" in strategy else 1), strategy


def test_partial_last_loop_runs_every_step_once(run_inprocess, tmp_path):
    # 11 steps per epoch in loops of 4: 4 + 4 + 3, no dropped or repeated batch
    results = run_inprocess("loop=custom", "loop.steps_per_loop=4", "trainer.steps_per_epoch=11",
                            *MLP, out=tmp_path / "r")
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(tmp_path / "r" / "checkpoints" / "ckpt-22"))
    iterations = [k for k in reader.get_variable_to_shape_map() if "iteration" in k]
    assert iterations and int(reader.get_tensor(iterations[0])) == 22
    assert results["steps_per_epoch"] == 11


def _trained(run_once, loop: str, replicas: int) -> tuple[dict, object]:
    """A deterministic run (2 epochs of 6 steps, an MLP with an L2 penalty) on a global batch
    of 128 in `replicas` replicas, trained once for the tests of this file (which only read
    it)."""
    return run_once(f"loop={loop}", "deterministic=true", "seed=3", "trainer.steps_per_epoch=6",
                    *MLP, "model.l2=0.01",
                    f"strategy.cpu_devices={replicas}",
                    f"dataset.batch_size_per_replica={128 // replicas}")


@pytest.mark.parametrize("loop", ["keras_fit", "custom"])
def test_replica_equivalence_same_global_batch(loop, run_once):
    one, _ = _trained(run_once, loop, 1)
    two, _ = _trained(run_once, loop, 2)
    assert (one["num_replicas"], two["num_replicas"]) == (1, 2)
    assert one["global_batch_size"] == two["global_batch_size"] == 128
    assert two["test_loss"] == pytest.approx(one["test_loss"], abs=1e-3)


def test_fit_and_custom_agree(run_once):
    fit, _ = _trained(run_once, "keras_fit", 2)
    custom, _ = _trained(run_once, "custom", 2)
    assert custom["test_accuracy"] == pytest.approx(fit["test_accuracy"], abs=0.01)
    assert custom["test_accuracy"] > 0.3  # the tiny data is learnable in the custom loop too
    assert custom["test_loss"] == pytest.approx(fit["test_loss"], abs=1e-3)


def _evaluated(run_once, train_loop: str, eval_loop: str) -> dict:
    """`_trained(train_loop, 2)` evaluated by `eval_loop` without a strategy (once)."""
    _, run_dir = _trained(run_once, train_loop, 2)
    return run_once(f"loop={eval_loop}", "mode=evaluate", f"ckpt_path={run_dir}",
                    "strategy=default", *MLP)[0]


@pytest.mark.parametrize("train_loop,eval_loop", [("keras_fit", "custom"),
                                                  ("custom", "keras_fit")])
def test_checkpoint_from_one_loop_restores_in_the_other(train_loop, eval_loop, run_once):
    trained, _ = _trained(run_once, train_loop, 2)
    restored = _evaluated(run_once, train_loop, eval_loop)
    assert restored["test_accuracy"] == pytest.approx(trained["test_accuracy"], abs=1e-6)
    assert restored["test_loss"] == pytest.approx(trained["test_loss"], abs=1e-5)


def test_keras_fit_runs_the_models_train_function_in_blocks_without_fit(run_inprocess,
                                                                        monkeypatch, tmp_path):
    # the Controller runs the epochs: Keras' compiled train function on blocks of 3 steps
    # (7 steps an epoch: 3, 3, 1), never model.fit; the model's own train_step runs each step
    import keras

    def fit(*args, **kwargs):
        raise AssertionError("model.fit called")

    monkeypatch.setattr(keras.Model, "fit", fit)
    results = run_inprocess("imports=[user_loops]", "model.name=step_counting", "loop=keras_fit",
                            "loop.steps_per_execution=3", "trainer.steps_per_epoch=7",
                            "strategy=default", out=tmp_path / "r")
    assert results["status"] == "completed" and results["epochs_completed"] == 2
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(tmp_path / "r" / "checkpoints" / "ckpt-14"))
    counted = [k for k in reader.get_variable_to_shape_map() if "steps_taken" in k]
    iterations = [k for k in reader.get_variable_to_shape_map()
                  if k.startswith("optimizer/") and "iteration" in k]
    assert [int(reader.get_tensor(k)) for k in counted + iterations] == [14, 14]


def test_checkpoint_cadence(run_inprocess, tmp_path):
    # (keras_fit under strategy=one_device on a device other than the first: it trains;
    # the custom loop's: test_custom_loop_under_each_strategy)
    results = run_inprocess("trainer.epochs=5", "trainer.checkpoint_every=2",
                            "trainer.max_checkpoints=5", "trainer.steps_per_epoch=2",
                            "trainer.validate_every=0", "strategy=one_device",
                            "strategy.device=/cpu:1", *MLP, out=tmp_path / "c")
    assert (results["status"], results["loop"]) == ("completed", "keras_fit")
    names = sorted(p.name for p in (tmp_path / "c" / "checkpoints").glob("ckpt-*.index"))
    # numbered by optimizer step: after epochs 2 and 4 (every 2) and 5 (the last), 2 steps each
    assert names == ["ckpt-10.index", "ckpt-4.index", "ckpt-8.index"]


def test_evaluate_rejects_a_checkpoint_of_another_model(run_inprocess, run_once, tmp_path):
    _, trained = _trained(run_once, "keras_fit", 2)  # model=mlp
    with pytest.raises(SystemExit) as e:
        run_inprocess("model=fashion_cnn", "mode=evaluate", f"ckpt_path={trained}",
                      out=tmp_path / "e")
    assert e.value.code == 2
    results = json.loads((tmp_path / "e" / "results.json").read_text())
    assert results["status"] == "failed" and "does not match" in results["error"]
    assert "value=" not in results["error"]  # no variable values in the one line


def test_evaluate_with_missing_checkpoint(run_inprocess, tmp_path):
    with pytest.raises(SystemExit):
        run_inprocess("mode=evaluate", f"ckpt_path={tmp_path / 'nothing'}", out=tmp_path / "e")
    results = json.loads((tmp_path / "e" / "results.json").read_text())
    assert "ckpt_path" in results["error"]


def test_auto_strategy_mirrors_only_with_several_devices(run_inprocess):
    one = run_inprocess("strategy=auto", "strategy.cpu_devices=1", "trainer.steps_per_epoch=2",
                        "trainer.epochs=1", *MLP)
    two = run_inprocess("strategy=auto", "strategy.cpu_devices=2", "trainer.steps_per_epoch=2",
                        "trainer.epochs=1", *MLP)
    assert (one["strategy"], one["num_replicas"]) == ("DefaultStrategy", 1)
    assert (two["strategy"], two["num_replicas"]) == ("MirroredStrategy", 2)


def test_a_device_that_does_not_exist_is_refused(run_inprocess, run_once, tmp_path):
    for device in ("/gpu:0", "/cpu:5"):
        with pytest.raises(SystemExit) as e:
            run_inprocess("strategy=one_device", f"strategy.device={device}",
                          out=tmp_path / device[1:4])
        assert e.value.code == 2
        error = json.loads((tmp_path / device[1:4] / "results.json").read_text())["error"]
        assert f"strategy.device='{device}' does not exist" in error and "/cpu:0" in error
    assert _one_device_cpu1(run_once)["status"] == "completed"  # (keras_fit's: the cadence)


def test_jit_compile_over_several_logical_cpus_is_refused(tmp_path):
    error = refusal_in_process(tmp_path / "j", "loop.jit_compile=true", "strategy.cpu_devices=3")
    assert "loop.jit_compile=true" in error and "strategy.cpu_devices=1" in error


def test_jit_compile_on_a_strategy_passed_in_over_several_cpus_is_refused(tiny_data_dir,
                                                                            tmp_path):
    """The runner's own check, for what the config cannot see: a strategy handed to it."""
    import tensorflow as tf

    from distlab.config.checks import JIT_ON_LOGICAL_CPUS
    from distlab.errors import DistlabError
    from distlab.records.run_dir import RunDir
    from distlab.training import runner

    cfg = compose([*fast_overrides(tiny_data_dir), "loop.jit_compile=true"])
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"],
                                              tf.distribute.ReductionToOneDevice())
    with pytest.raises(DistlabError, match="loop.jit_compile=true cannot run") as refused:
        runner.execute(cfg, RunDir(tmp_path / "run"), strategy=strategy)
    assert str(refused.value) == JIT_ON_LOGICAL_CPUS


def test_mirrored_without_cpu_devices_has_one_replica_in_a_process_already_split(run_once):
    """strategy.cpu_devices=null is the one CPU device a fresh process has, also in a process
    whose CPU an earlier job (or this test session: 3 logical CPUs) split: a later in-process
    job (a basic-launcher sweep, distlab.train called again) trains as it would alone."""
    results, _ = run_once()
    assert (results["strategy"], results["num_replicas"]) == ("MirroredStrategy", 1)


def test_history_loss_has_one_definition_in_both_loops(run_once):
    # model.l2 adds a penalty to the objective; history's loss is the data loss in both loops
    losses = []
    for loop in ("keras_fit", "custom"):
        _, run_dir = _trained(run_once, loop, 2)  # model.l2=0.01 on 2 replicas
        losses.append(float(RunDir(run_dir).read_history()[0]["loss"]))
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)


def test_evaluate_mode_says_which_figures_are_the_training_runs(run_once):
    # _trained(custom, 2): 2 x 64 rows, 6 steps per epoch; evaluated by keras_fit (the default)
    evaluated = _evaluated(run_once, "custom", "keras_fit")
    assert evaluated["learning_rate"] is None and evaluated["steps_per_epoch"] is None
    assert evaluated["global_batch_size"] == 64  # the evaluation's own batch
    assert evaluated["trained"]["global_batch_size"] == 128
    assert evaluated["trained"]["steps_per_epoch"] == 6


@pytest.mark.parametrize("loop", ["keras_fit", "custom"])
def test_seed_zero_and_the_largest_seed_train(loop, run_inprocess, run_once):
    """seed=0 failed every run (tf.data's shuffle seed); every seed in [0, 2**32) trains, with
    augmentation on and off (the sweep of seeds 0, 1, 2: test_a_sweep_over_seeds_from_zero).
    (The custom loop's seed 0: the run without a strategy of the strategy test, 2 epochs.)"""
    for seed, flip in ((0, "none"), (2**32 - 1, "horizontal")):
        if (loop, seed) == ("custom", 0):
            results, epochs = _custom_default_seed_zero(run_once), 2
        else:
            results, epochs = run_inprocess(*MLP, f"loop={loop}", f"seed={seed}",
                                            f"dataset.augment.flip={flip}", "trainer.epochs=1",
                                            "trainer.steps_per_epoch=3"), 1
        assert (results["status"], results["epochs_completed"]) == ("completed", epochs), seed
        assert results["test_loss"] > 0 and results["val_loss"] > 0


def test_a_sweep_over_seeds_from_zero(tiny_data_dir, tmp_path):
    """`python run.py -m` in the custom loop, exported: its exit status and output, and each
    job's whole run dir (keras_fit's: the single run above)."""
    out = run_cli("-m", *fast_overrides(tiny_data_dir), "seed=0,1,2", "trainer.epochs=1",
                  "trainer.steps_per_epoch=3", "dataset.augment.crop_padding=2", *MLP,
                  "loop=custom", "trainer.export=true", f"hydra.sweep.dir={tmp_path}")
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "preserve tf.data options" not in out.stdout + out.stderr  # no tf.data warning
    losses = []
    for job in range(3):
        results = assert_run_dir(tmp_path / str(job), epochs=1)
        assert (results["status"], results["epochs_completed"]) == ("completed", 1), job
        assert results["loop"] == "custom" and results["strategy"] == "MirroredStrategy", job
        assert results["export_max_abs_diff"] < 1e-4, job
        assert "epoch 1/1 - learning_rate" in (tmp_path / str(job) / "run.log").read_text()
        losses.append(results["test_loss"])
    assert len(set(losses)) == 3  # three seeds, three runs


def test_steps_that_gather_their_rows_train_as_on_streamed_batches(run_once, run_inprocess,
                                                                   monkeypatch, tmp_path):
    """Under the default strategy with the train split in memory, loop=custom's steps take
    row numbers from the stream and gather their batch; keras_fit's (its own train_steps),
    and any loop with dataset.cache=false, get tf.data's batches: the same history and test
    figures, digit for digit, in blocks with a short last one; stopped mid-epoch and rerun,
    the same rows again."""
    import signal

    from conftest import stop_at

    common = ("strategy=default", "trainer.validate_every=1")
    custom = ("loop=custom", "loop.steps_per_loop=3")
    runs = {name: run_once(*common, *extra) for name, extra in [
        ("gathered", custom), ("fit", ("loop=keras_fit", "loop.steps_per_execution=3")),
        ("streamed", (*custom, "dataset.cache=false"))]}
    figures = ("loss", "accuracy", "val_loss", "val_accuracy")
    rows = {name: [[row[k] for k in figures] for row in RunDir(run_dir).read_history()]
            for name, (_, run_dir) in runs.items()}
    assert len(rows["gathered"]) == 2 and rows["gathered"] == rows["fit"] == rows["streamed"]
    tests = {name: results["test_loss"] for name, (results, _) in runs.items()}
    assert len(set(tests.values())) == 1, tests
    out = tmp_path / "stopped"
    stop_at(monkeypatch, epoch=1, step=3)  # after the first block of epoch 2
    with pytest.raises(SystemExit) as stopped:
        run_inprocess(*common, *custom, out=out)
    assert stopped.value.code == 128 + signal.SIGTERM
    monkeypatch.undo()
    resumed = run_inprocess(*common, *custom, out=out)
    assert [[row[k] for k in figures] for row in RunDir(out).read_history()] == rows["fit"]
    assert resumed["test_loss"] == tests["fit"]
