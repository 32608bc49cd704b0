"""`distlab.train`: the command's composition and job in this process; Results, never exits."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, fast_overrides


@pytest.mark.slow
def test_train_twice_in_one_process_deterministic_then_not(tiny_data_dir, tmp_path):
    from tensorflow.python.framework import config as tf_config

    import distlab

    common = [*fast_overrides(tiny_data_dir), "strategy=default", "trainer.epochs=1",
              "trainer.steps_per_epoch=2", "trainer.validate_every=0"]
    first = distlab.train([*common, "deterministic=true"], config_path=ROOT / "conf",
                          output_dir=tmp_path / "a")
    assert first.ok and first["status"] == "completed", first
    assert first.objective == first["test_accuracy"] and first.run_dir == tmp_path / "a"
    assert tf_config.is_op_determinism_enabled()
    second = distlab.train([*common, "deterministic=false"], config_path=ROOT / "conf",
                           output_dir=tmp_path / "b")
    assert second.ok and second["status"] == "completed", second
    assert not tf_config.is_op_determinism_enabled()  # was left on by the first job before
    assert "results: " in (tmp_path / "b" / "run.log").read_text()  # its log, as the command's

    bad_value = distlab.train(["trainer.epochs=0"], config_path=ROOT / "conf",
                              output_dir=tmp_path / "c")
    assert bad_value.exit_code == 2 and "trainer.epochs=0" in bad_value.error
    failed = json.loads((tmp_path / "c" / "results.json").read_text())
    # the strategy as a completed run names it (its class), not the option (mirrored)
    assert (failed["status"], failed["strategy"]) == ("failed", "MirroredStrategy")
    bad_type = distlab.train(["trainer.epochs=abc"], config_path=ROOT / "conf",
                             output_dir=tmp_path / "d")
    assert bad_type.exit_code == 2 and "trainer.epochs=abc" in bad_type.error
    assert "\n" not in bad_type.error


def test_train_reports_errors_instead_of_raising(tmp_path):
    """No training: bad paths and an already initialised Hydra are Results, not exceptions;
    a refused run leaves its directory as it was."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import distlab

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    unwritable = distlab.train(["trainer.epochs=1"], config_path=ROOT / "conf",
                               output_dir=blocker / "run")
    assert unwritable.exit_code == 2 and str(blocker) in unwritable.error

    default_configs = distlab.train(["trainer.epochs=abc"])  # the installed distlab.conf
    assert default_configs.exit_code == 2 and "trainer.epochs=abc" in default_configs.error

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):  # e.g. a notebook's
        inside = distlab.train(["trainer.epochs=0"], config_path=ROOT / "conf",
                               output_dir=tmp_path / "inside")
        assert GlobalHydra.instance().is_initialized()  # put back as it was
    assert inside.exit_code == 2 and "trainer.epochs=0" in inside.error

    # ${hydra:...} has no value outside the command: one line naming the key
    unresolved = distlab.train(["+callbacks.csv._target_=keras.callbacks.CSVLogger",
                                "+callbacks.csv.filename=${hydra:runtime.output_dir}/e.csv"],
                               config_path=ROOT / "conf", output_dir=tmp_path / "unresolved")
    assert unresolved.exit_code == 2 and "\n" not in unresolved.error
    assert unresolved.error.startswith("callbacks.csv.filename cannot be resolved")
    assert "distlab.train has no Hydra runtime" in unresolved.error

    from conftest import compose
    from omegaconf import OmegaConf

    run_dir = tmp_path / "held"
    (run_dir / ".distlab").mkdir(parents=True)
    OmegaConf.save(compose(["trainer.epochs=1", "seed=1"]), run_dir / ".distlab" / "config.yaml")
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "ckpt-1.index").write_text("")
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    refused = distlab.train(["trainer.epochs=1"], config_path=ROOT / "conf", output_dir=run_dir)
    assert refused.exit_code == 2 and "seed (1 -> 42)" in refused.error
    after = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")
                   if p.name != "lock")  # (the lock file stays, released, as for the command)
    assert after == before and not (run_dir / "run.log").exists()


def test_a_users_model_builder_that_raises_is_named_by_key_with_its_traceback_in_run_log(
        tiny_data_dir, tmp_path, monkeypatch):
    """No training: the builder raises before the model exists."""
    import distlab

    (tmp_path / "broken_parts.py").write_text(
        "def net(cfg, input_shape, outputs):\n"
        "    raise ValueError('units must be positive, got -3')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    failed = distlab.train([*fast_overrides(tiny_data_dir), "model.name=broken_parts:net"],
                           config_path=ROOT / "conf", output_dir=tmp_path / "run")
    assert failed.exit_code == 2 and failed.error == (
        "model.name='broken_parts:net' failed: ValueError: units must be positive, got -3")
    log = (tmp_path / "run" / "run.log").read_text()
    assert f"{failed.error} (traceback in run.log)" in log
    assert "broken_parts.py\", line 2, in net" in log  # the user's frame, for the fix


def test_a_failure_before_the_log_file_opens_promises_no_traceback_in_it(
        tmp_path, monkeypatch, caplog):
    """An `imports:` module that raises, through the API: the job fails before its run.log
    exists, so its one line does not send the user there."""
    import logging

    import distlab

    (tmp_path / "raises_on_import.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with caplog.at_level(logging.ERROR, logger="distlab"):
        failed = distlab.train(["imports=[raises_on_import]"], config_path=ROOT / "conf",
                               output_dir=tmp_path / "run")
    assert failed.exit_code == 2 and failed.error == (
        "imports[0]='raises_on_import' raised RuntimeError: boom")
    assert not (tmp_path / "run" / "run.log").exists()
    assert [r.getMessage() for r in caplog.records if r.name == "distlab"] == [failed.error]


def test_config_dir_adds_the_users_configs_as_the_commands_config_dir(tmp_path, monkeypatch):
    """`config_dir` is the command's `--config-dir`: the user's YAMLs join distlab's groups
    (it used to replace distlab's configs: "Cannot find primary config 'config'")."""
    import distlab
    from distlab.launch.api import _compose

    project = tmp_path / "my_project"
    (project / "conf" / "model").mkdir(parents=True)
    (project / "conf" / "model" / "wide_mlp.yaml").write_text(
        "defaults:\n  - mlp\n  - _self_\nhidden_units: [7]\n")
    monkeypatch.chdir(project)  # a relative config_dir is from here, as --config-dir's
    refused = distlab.train(["model=wide_mlp", "trainer.epochs=0"], config_dir="conf",
                            output_dir=tmp_path / "run")
    assert refused.exit_code == 2 and refused.error == "trainer.epochs=0 is invalid: must be > 0"
    composed = _compose(["model=wide_mlp"], "conf", ROOT / "conf")
    assert (composed.model.name, list(composed.model.hidden_units)) == ("mlp", [7])
    # a hydra.searchpath of the user's own is kept beside it (Hydra reads only one)
    other = tmp_path / "other"
    (other / "optimizer").mkdir(parents=True)
    (other / "optimizer" / "slow.yaml").write_text(
        "defaults:\n  - sgd\n  - _self_\nlearning_rate: 0.0001\n")
    both = _compose(["model=wide_mlp", "optimizer=slow", f"hydra.searchpath=[file://{other}]"],
                    "conf", ROOT / "conf")
    assert (both.model.hidden_units[0], both.optimizer.learning_rate) == (7, 0.0001)

    missing = distlab.train(["trainer.epochs=1"], config_dir="nope", output_dir=tmp_path / "x")
    assert missing.exit_code == 2 and missing.error.startswith(
        f"config_dir nope: no directory {project / 'nope'} (a relative config_dir is taken "
        "from the current directory")
    # the old meaning (a primary config dir) is config_path; a config.yaml in config_dir
    # would be shadowed by distlab's, so that call says so
    with pytest.warns(FutureWarning, match=r"pass config_path="):
        old = distlab.train(["trainer.epochs=0"], config_dir=ROOT / "conf",
                            output_dir=tmp_path / "y")
    assert old.exit_code == 2 and "trainer.epochs=0" in old.error


def test_the_commands_flags_given_as_overrides_are_one_line(tmp_path):
    import distlab

    given = distlab.train(["--config-dir", "conf", "experiment=mine"], output_dir=tmp_path)
    assert given.exit_code == 2 and given.error.startswith(
        "distlab.train takes overrides, not the command's flags (--config-dir): --config-dir "
        "DIR is config_dir=DIR")
