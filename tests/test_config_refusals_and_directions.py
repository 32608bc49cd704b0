"""Config-time refusals, rerun messages, objective directions and the Optuna sweeper's
direction and messages. The fast ones start no training."""

from __future__ import annotations

import json
import re

import pytest
from conftest import compose_once, fast_overrides, run_cli, run_command
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from distlab.config import validate
from distlab.config.checks import composition_problem
from distlab.errors import ConfigError


def _one_line_refusal(tmp_path, *overrides: str) -> str:
    """`python run.py OVERRIDES`: exit 2, one error line, no traceback, before TensorFlow
    (and so before the data load) is imported."""
    out, tensorflow = run_command(*overrides, f"hydra.run.dir={tmp_path / 'run'}",
                                  f"hydra.sweep.dir={tmp_path / 'sweep'}")  # not outputs/
    text = out.stdout + out.stderr
    errors = [line for line in text.splitlines() if "error" in line.lower()]
    assert out.returncode == 2, text[-2000:]
    assert len(errors) == 1 and "Traceback" not in text and "HYDRA_FULL_ERROR" not in text, text
    assert not tensorflow, f"refused only after TensorFlow was imported: {text}"
    return errors[0]


@pytest.mark.parametrize("overrides, needle", [
    # item 16: wrong types are Hydra's errors, now one line naming the key
    (["trainer.grad_accum_steps=abc"], "trainer.grad_accum_steps=abc"),
    (["trainer.epochs=abc"], "trainer.epochs=abc"),
    # strategy.workers / strategy.launcher / strategy.ray.* (issue 32)
    (["strategy=mirrored", "strategy.workers=2"], "strategy.workers=2"),
    (["strategy=multi_worker_mirrored", "strategy.launcher=ray"], "strategy.launcher=ray"),
    (["strategy=multi_worker_mirrored", "strategy.workers=0"], "strategy.workers=0"),
    (["strategy=multi_worker_mirrored", "strategy.workers=2", "strategy.ray.placement=x"],
     "strategy.ray.placement='x'"),
    (["trainer.nope=1"], "trainer.nope"),
    (["dataset=nope"], "Available options in 'dataset': cifar10, fashion_mnist, mnist"),
    # item 10: integers beyond int32
    (["trainer.grad_accum_steps=99999999999999999999"], "trainer.grad_accum_steps"),
    (["trainer.epochs=4294967296"], "trainer.epochs=4294967296 is out of range"),
    # item 12: monitor names checked at config time (was after TF and the data loaded)
    (["trainer.early_stopping.metric=val_acc"], "trainer.early_stopping.metric='val_acc'"),
    (["trainer.best_checkpoint.metric=val_acc"], "use one of loss, accuracy, val_loss"),
    (["trainer.target.metric=acc", "trainer.target.value=0.9"], "trainer.target.metric='acc'"),
    (["task=regression", "trainer.target.metric=val_accuracy",
      "trainer.target.value=0.9"], "val_mae, val_rmse"),
    # item 14: accepted values that then did nothing
    (["trainer.target.metric=val_accuracy", "trainer.target.value=nan"],
     "trainer.target.value=nan is invalid"),
    (["trainer.best_checkpoint.metric=''"], "trainer.best_checkpoint.metric=''"),
    (["trainer.early_stopping.metric=val_loss", "trainer.early_stopping.min_delta=inf"],
     "trainer.early_stopping.min_delta=inf"),
    (["trainer.validate_every=5", "trainer.epochs=3", "trainer.best_checkpoint.metric=val_loss"],
     "trainer.validate_every=5 exceeds trainer.epochs=3"),
    (["trainer.validate_every=5", "trainer.epochs=3", "trainer.target.metric=val_accuracy",
      "trainer.target.value=0.9"], "would never be measured"),
    # paths TensorFlow would read as file patterns (it trained, then could not export)
    (["dataset.cache_dir='/tmp/c[1]'"], "dataset.cache_dir=/tmp/c[1] has '[' in its path"),
    (["mode=evaluate", "ckpt_path='/runs/b*'"], "ckpt_path=/runs/b* has '*' in its path"),
])
def test_bad_values_are_one_line_naming_the_key(overrides, needle):
    """Checked in this process (Hydra's composition, then distlab's validation, as the
    command does); the command's one line, exit 2, before TensorFlow: the test below."""
    try:
        validate(compose_once(overrides))
    except ConfigError as e:
        line = str(e)
    except (HydraException, OmegaConfBaseException) as e:
        line = composition_problem(e)
    else:
        raise AssertionError(f"{overrides} accepted")
    assert needle in line and "\n" not in line, line


@pytest.mark.parametrize("overrides, needle", [
    (["trainer.epochs=abc"], "trainer.epochs=abc"),  # a composition (Hydra) error
    (["-m", "trainer.epochs=1,abc"], "trainer.epochs=abc"),  # in a sweep's overrides
    (["trainer.validate_every=5", "trainer.epochs=3", "trainer.best_checkpoint.metric=val_loss"],
     "trainer.validate_every=5 exceeds trainer.epochs=3"),  # distlab's validation
    (["strategy=multi_worker_mirrored", "strategy.workers=2", "strategy.ray.num_cpus=0"],
     "strategy.ray.num_cpus=0"),  # refused by the workers' launcher, before any starts
    # one objective ranks a sweep (it used to rank both jobs by the default's, and write
    # two objective columns)
    (["-m", "objective=val_accuracy,val_loss"], "objective=val_accuracy,val_loss sweeps the "
     "objective, but a sweep ranks its jobs (and a search chooses) by one objective"),
], ids=["composition", "sweep-override", "validation", "workers-launcher", "swept-objective"])
def test_bad_values_are_one_line_before_tensorflow(tmp_path, overrides, needle):
    assert needle in _one_line_refusal(tmp_path, *overrides)


def test_monitor_rules_accept_what_a_run_measures():
    for overrides in (["trainer.validate_every=3", "trainer.epochs=3",
                       "trainer.best_checkpoint.metric=val_loss"],
                      ["trainer.validate_every=0", "trainer.early_stopping.metric=loss"],
                      ["task.top_k=3", "trainer.target.metric=val_top3_accuracy",
                       "trainer.target.value=0.5"]):
        validate(compose_once(overrides))  # no error
    with pytest.raises(ConfigError, match="validate_every=0"):
        validate(compose_once(["trainer.validate_every=0", "trainer.target.metric=val_accuracy",
                               "trainer.target.value=0.5"]))


def test_builtin_task_metric_table_matches_the_tasks():
    """The TF-free table used at config time lists exactly what the tasks build."""
    from distlab.components import tasks
    from distlab.records.metrics import builtin_task_metrics

    for overrides in ([], ["task.top_k=5"], ["task=regression"], ["task=binary"],
                      ["task=binary", "task.metrics=[f1,accuracy]"],
                      ["task=regression", "task.metrics=[rmse]"]):
        task_cfg = compose_once(overrides).task
        built = tasks.build(task_cfg)
        assert builtin_task_metrics(task_cfg) == {m.name: m.higher_is_better
                                                  for m in built.metrics}


TARGET = ("trainer.target.metric=val_accuracy", "trainer.target.value=0.9")


@pytest.mark.parametrize("overrides, expected", [
    ([], "maximize"),  # the task's first validation metric: val_accuracy
    (["objective=val_loss"], "minimize"),
    (["objective=time_to_target_s", *TARGET], "minimize"),  # item 4
    (["objective=epochs_to_target", *TARGET], "minimize"),
    (["objective=wall_time_s"], "minimize"),
    (["objective=train_examples_per_sec"], "maximize"),
    (["task=regression"], "minimize"),  # val_mae
    (["objective=best_value", "trainer.best_checkpoint.metric=val_loss"], "minimize"),
    (["objective=best_value", "trainer.best_checkpoint.metric=val_accuracy"], "maximize"),
    (["objective=best_value", "trainer.early_stopping.metric=val_loss",
      "trainer.early_stopping.mode=max"], "maximize"),
    (["dataset.validation=null"], None),  # the jobs write objective: null (was val_accuracy's)
    (["dataset.validation=null", "objective=train_examples_per_sec"], "maximize"),
])
def test_objective_direction_from_the_config(overrides, expected):
    from distlab.launch.objective import task_metrics
    from distlab.records.ranking import direction

    cfg = compose_once(overrides)
    validate(cfg)  # an objective the schema refuses has no direction to check
    assert direction(cfg, task_metrics(cfg)) == expected


def test_a_test_split_objective_is_refused_before_any_direction():
    with pytest.raises(ConfigError, match="objective"):
        validate(compose_once(["objective=test_loss"]))


def test_optuna_direction_auto_follows_the_objective_and_a_set_one_is_kept(monkeypatch):
    """Item 4: the sweeper's study direction, set in its setup before the launcher is built
    (which needs a real Hydra context: here it stops the setup, and nothing else may fail)."""
    from hydra.core.plugins import Plugins

    class Stop(Exception):
        pass

    def no_launcher(self, **kwargs):
        raise Stop

    monkeypatch.setattr(Plugins, "instantiate_launcher", no_launcher)

    def study_direction(*overrides: str) -> str:
        from conftest import ROOT
        from hydra import compose as hydra_compose
        from hydra import initialize_config_dir
        from hydra.utils import instantiate

        with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
            cfg = hydra_compose("config", overrides=["hparams_search=optuna", *overrides],
                                return_hydra_config=True)
        sweeper = instantiate(cfg.hydra.sweeper)  # (no global HydraConfig: jobs would read it)
        assert type(sweeper).__name__ == "DistlabOptunaSweeper"

        class Context:
            config_loader = None
            callbacks = None

        with pytest.raises(Stop):
            sweeper.setup(hydra_context=Context(), task_function=lambda c: None, config=cfg)
        return sweeper.direction

    assert study_direction() == "maximize"
    assert study_direction("objective=time_to_target_s", *TARGET) == "minimize"
    assert study_direction("objective=val_loss") == "minimize"
    assert study_direction("task=regression", "objective=val_mae") == "minimize"
    assert study_direction("objective=time_to_target_s", *TARGET,
                           "hydra.sweeper.direction=maximize") == "maximize"
    # no validation split: the objective is the one the jobs write, and there must be one
    assert study_direction("objective=train_examples_per_sec",
                           "dataset.validation=null") == "maximize"
    with pytest.raises(ConfigError, match="dataset.validation=null and no objective="):
        study_direction("objective=null", "dataset.validation=null")
    with pytest.raises(ConfigError, match="objective=val_accuracy needs a validation split"):
        study_direction("dataset.validation=null")


def test_a_search_without_an_objective_is_one_line_before_any_trial(tmp_path):
    """No objective= and dataset.validation=null: the jobs would report no objective, so
    every trial would fail; the search is refused before the first (and before TensorFlow)."""
    line = _one_line_refusal(tmp_path, "hparams_search=optuna", "objective=null",
                             "dataset.validation=null", "hydra.sweeper.n_trials=1",
                             f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert "objective=" in line and "dataset.validation" in line, line
    assert not (tmp_path / "sweep").exists()


def test_extending_a_cosine_run_names_decay_epochs(tmp_path):
    """Item 13: the refusal names schedule.decay_epochs and what to do; doing so works, and a
    schedule that decayed to 0 is not offered as a way to train more."""
    from distlab.launch.rerun import rerun_refusal
    from distlab.records.run_dir import RunDir

    def config(*overrides: str) -> dict:
        return OmegaConf.to_container(compose_once(["schedule=cosine", *overrides]), resolve=True)

    for alpha in ("0.1", "0.0"):
        run_dir = RunDir(tmp_path / alpha)
        run_dir.record_start(config("trainer.epochs=1", f"schedule.alpha={alpha}"))
        run_dir.checkpoints.mkdir(parents=True)
        (run_dir.checkpoints / "ckpt-1.index").write_bytes(b"")
        refusal = rerun_refusal(run_dir, config("trainer.epochs=2", f"schedule.alpha={alpha}"))
        assert "schedule.decay_epochs (1 -> 2)" in refusal, refusal
        assert "only trainer.epochs" not in refusal
        if alpha == "0.1":
            assert "add schedule.decay_epochs=1" in refusal
        else:
            assert "decayed to 0" in refusal and "trainer.epochs=2 in another hydra.run.dir" \
                in refusal and "add schedule.decay_epochs" not in refusal
        assert rerun_refusal(run_dir, config("trainer.epochs=2", "schedule.decay_epochs=1",
                                             f"schedule.alpha={alpha}")) is None
        assert rerun_refusal(run_dir, config("trainer.epochs=1", f"schedule.alpha={alpha}")) \
            is None


@pytest.mark.slow
def test_sweep_time_to_target_leaves_out_the_import(tiny_data_dir, tmp_path):
    """Item 3: identical jobs report comparable times to target, within their wall time."""
    out = run_cli("-m", *fast_overrides(tiny_data_dir), "loop.verbose=0,2", "deterministic=true",
                  "model=mlp", "model.hidden_units=[8]",
                  "trainer.target.metric=val_accuracy", "trainer.target.value=0.0",
                  "trainer.epochs=1", "trainer.steps_per_epoch=4", "strategy=default",
                  f"hydra.sweep.dir={tmp_path}", timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    jobs = [json.loads((tmp_path / str(n) / "results.json").read_text()) for n in (0, 1)]
    for job in jobs:
        assert job["epochs_to_target"] == 1
        assert 0 < job["time_to_target_s"] <= job["wall_time_s"], job


@pytest.mark.slow
def test_optuna_search_whose_trials_never_reach_the_target(tiny_data_dir, tmp_path):
    """Items 4 and 11: minimised time objective; no value is one line per trial and a reason."""
    out = run_cli(*fast_overrides(tiny_data_dir), "hparams_search=optuna", "model=mlp",
                  "model.hidden_units=[8]", "hydra.sweeper.n_trials=2", "trainer.epochs=1",
                  "trainer.steps_per_epoch=3",
                  "objective=time_to_target_s", "trainer.target.metric=val_accuracy",
                  "trainer.target.value=1.5", "strategy=default", f"hydra.sweep.dir={tmp_path}",
                  timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-3000:]
    assert "Directions: ['minimize']" in text, text[-3000:]
    assert "float-castable" not in text and "Traceback" not in text, text[-3000:]
    assert text.count("results.json has no time_to_target_s") == 2, text[-3000:]
    assert "no trial gave a value for time_to_target_s" in text, text[-3000:]
    assert "val_accuracy >= 1.5 was never reached: lower trainer.target.value" in text


@pytest.mark.slow
def test_jit_with_determinism_on_an_op_xla_cannot_do_deterministically(tiny_data_dir, tmp_path):
    """Item 9: the custom loop's XLA step of a CNN under op determinism is one line."""
    out = run_cli(*fast_overrides(tiny_data_dir), "loop=custom", "loop.jit_compile=true",
                  "deterministic=true", "strategy=default", "trainer.epochs=1",
                  "trainer.steps_per_epoch=2", f"hydra.run.dir={tmp_path}", timeout=300)
    text = out.stdout + out.stderr
    errors = [line for line in text.splitlines() if "[ERROR]" in line]
    assert out.returncode == 2, text[-3000:]
    assert len(errors) == 1 and "loop.jit_compile=true with deterministic=true" in errors[0]
    assert "MaxPool" in errors[0] and "Traceback" not in text, text[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["status"] == "failed" and "deterministic=false" in results["error"]


def test_optuna_advice_follows_the_target_direction():
    from distlab.launch.objective import task_metrics
    from hydra_plugins.distlab_sweepers.optuna import _advice

    for overrides, advice in ((["trainer.target.metric=loss"], "loss <= 0.5 was never reached: "
                               "raise trainer.target.value"),
                              (["trainer.target.metric=val_accuracy"], "lower"),
                              (["trainer.target.metric=val_accuracy", "trainer.target.mode=min"],
                               "raise")):
        cfg = compose_once([*overrides, "trainer.target.value=0.5"])
        assert advice in _advice(cfg, task_metrics(cfg))


@pytest.mark.slow
def test_extending_a_schedule_that_reached_zero_warns(run_inprocess, tmp_path, caplog):
    """Item 13: epochs trained at learning rate 0 are said to change nothing."""
    common = ("schedule=cosine", "schedule.decay_epochs=1", "strategy=default",
              "trainer.steps_per_epoch=2", "trainer.validate_every=0")
    run_inprocess(*common, "trainer.epochs=1", out=tmp_path / "r")
    assert not [r for r in caplog.records if "learning rate is 0" in r.getMessage()]
    extended = run_inprocess(*common, "trainer.epochs=2", out=tmp_path / "r")
    warned = [r.getMessage() for r in caplog.records if "learning rate is 0" in r.getMessage()]
    assert extended["epochs_completed"] == 2 and len(warned) == 1, warned
    assert "from step 3 to the end (schedule=cosine)" in warned[0]


def test_sweep_summary_ranks_old_jobs_by_the_same_rule():
    """Jobs that report no objective_direction (older run dirs) rank by the field's name with
    distlab.records.ranking's rule; a direction set on the sweeper wins."""
    from distlab.reporting.summary import _maximize, _set_direction

    def config(direction: str | None = None):
        return OmegaConf.create({"hydra": {"sweeper": {"direction": direction}}})

    assert _maximize([], "test_accuracy") is True
    assert _maximize([], "test_loss") is False
    assert _maximize([], "time_to_target_s") is False  # was ranked as if larger is better
    assert _set_direction(config("maximize")) is True
    assert _set_direction(config("minimize")) is False
    assert _set_direction(config("auto")) is None and _set_direction(config()) is None


def test_sweep_summary_of_old_regression_jobs_without_an_objective_ranks_mae_down(
        tmp_path, monkeypatch):
    """No `objective=` and jobs that report no objective_direction (older run dirs): the
    summary ranks the objective it picks from the jobs (val_mae) by that field's direction
    (it ranked by the empty name's, upwards)."""
    import hydra.core.utils

    from distlab.records.run_dir import RunDir
    from distlab.reporting import summary

    for num, mae in enumerate([1.0, 2.0]):
        job = tmp_path / str(num)
        (job / ".hydra").mkdir(parents=True)
        OmegaConf.save(OmegaConf.create({"hydra": {"job": {"num": num}}}),
                       job / ".hydra/hydra.yaml")
        OmegaConf.save(OmegaConf.create([f"optimizer.learning_rate={num + 1}e-3"]),
                       job / ".hydra/overrides.yaml")
        RunDir(job).write_results({"status": "completed", "val_mae": mae, "val_loss": mae ** 2,
                                   "test_mae": mae, "test_loss": mae ** 2})
    monkeypatch.setattr(hydra.core.utils, "configure_log", lambda *a, **k: None)
    monkeypatch.setattr(summary.tracking, "finish_sweep", lambda *a, **k: None)
    config = OmegaConf.create({"objective": None, "hydra": {
        "sweep": {"dir": str(tmp_path)}, "sweeper": {"direction": None},
        "hydra_logging": None, "verbose": False}})
    summary.SweepSummary(plot=False, tensorboard=False).on_multirun_end(config)
    md = (tmp_path / "summary.md").read_text()
    assert "Objective: `val_mae` (minimized)" in md, md
    assert ("Best configuration (chosen on `val_mae`, minimized): "
            "`optimizer.learning_rate=1e-3` (job 0: val_mae 1)") in md, md


@pytest.mark.parametrize("argv, option", [
    (["hydra.run.dir="], "hydra.run.dir"), (["hydra.run.dir=''"], "hydra.run.dir"),
    (["-m", "seed=1,2", "hydra.sweep.dir=' '"], "hydra.sweep.dir")])
def test_an_empty_output_dir_is_refused_before_hydra_writes_into_the_current_one(argv, option):
    from distlab.records.run_dir import check_output_dir_args, refused_output_dir_args

    assert refused_output_dir_args(argv) == (
        f"{option} is empty, which Hydra takes as the current directory: give a directory "
        f"({option}=. if the current one is meant)")
    assert check_output_dir_args(argv) is None
    assert refused_output_dir_args([*argv[:-1], f"{option}=."]) is None
    assert refused_output_dir_args([*argv[:-1], f"{option}='/runs/a[1]'"]).startswith(
        f"{option}=/runs/a[1] has '[' in its path, which TensorFlow reads as a file pattern")


def test_a_data_dir_tfds_would_read_as_a_pattern_is_refused():
    """tfds did not find the dataset prepared there: "not prepared ... unreachable"."""
    with pytest.raises(ConfigError, match=re.escape(
            "dataset.data_dir=/data/d[1] has one of [ ] * ? in its path, which tfds reads")):
        validate(compose_once(["dataset.data_dir='/data/d[1]'"]))


def test_ckpt_path_in_a_training_run_is_refused_not_ignored():
    with pytest.raises(ConfigError, match=r"^ckpt_path=/runs/a is read by mode=evaluate only: "
                                          r"a training run resumes from its own run dir's"):
        validate(compose_once(["ckpt_path=/runs/a"]))
    validate(compose_once(["ckpt_path=/runs/a", "mode=evaluate"]))


@pytest.mark.parametrize("value", ["''", "' '"])
def test_an_empty_data_dir_is_refused_not_taken_as_the_current_one(value):
    key = "dataset.data_dir"
    with pytest.raises(ConfigError, match=rf"^{key} is empty, which would be the current "
                                          rf"directory: give a directory, or null for the "
                                          rf"default \({key}=null\)$"):
        validate(compose_once([f"{key}={value}"]))
    validate(compose_once([f"{key}=null"]))  # the default
    validate(compose_once([f"dataset.cache_dir={value}"]))  # $DISTLAB_CACHE_DIR or ~/.cache


@pytest.mark.parametrize("hook, hydra, says", [
    ("on_run_start", {"run": {"dir": ""}}, "hydra.run.dir is empty, which Hydra takes as"),
    ("on_run_start", {"run": {"dir": "/runs/x?"}}, "hydra.run.dir=/runs/x? has '?' in its"),
    ("on_multirun_start", {"sweep": {"dir": "/s/[1]", "subdir": "${hydra.job.num}"}},
     "hydra.sweep.dir=/s/[1] has '[' in its path"),
    ("on_multirun_start", {"sweep": {"dir": "/s", "subdir": ""}},
     "hydra.sweep.subdir is empty, so every job would write into the sweep dir itself"),
    ("on_multirun_start", {"sweep": {"dir": "/s", "subdir": "${hydra.job.num}"},
                           "sweeper": {"params": {"objective": "val_accuracy,val_loss"}}},
     "objective=val_accuracy,val_loss sweeps the objective"),
    # a multirun by its YAML's hydra.mode (hparams_search=optuna): no -m on the command line
    ("on_multirun_start", {"sweep": {"dir": "/s", "subdir": "${hydra.job.num}"},
                           "overrides": {"task": ["objective=val_accuracy,val_loss"]}},
     "objective=val_accuracy,val_loss sweeps the objective"),
])
def test_output_dirs_and_sweep_settings_from_a_yaml_are_refused_before_hydra_makes_them(
        hook, hydra, says, capsys):
    """What the command line's checks cannot see (a YAML's or an interpolation's value):
    refused by the callback, before Hydra creates the directory (it trained in the current
    directory, or made a directory it then refused, or ranked a swept objective)."""
    from distlab.launch.output_dir import CheckedOutputDir

    with pytest.raises(SystemExit) as exit_:
        getattr(CheckedOutputDir(), hook)(OmegaConf.create({"hydra": hydra}))
    assert exit_.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: {says}")
    fine = {"run": {"dir": "/runs/a"}, "sweep": {"dir": "/s", "subdir": "${hydra.job.num}"}}
    getattr(CheckedOutputDir(), hook)(OmegaConf.create({"hydra": fine}))  # no exit


def test_the_api_refuses_an_empty_run_dir_instead_of_the_current_one(tmp_path, monkeypatch):
    from conftest import ROOT

    import distlab

    monkeypatch.chdir(tmp_path)
    for kwargs, overrides, option in (({}, ["hydra.run.dir="], "hydra.run.dir"),
                                      ({"output_dir": ""}, [], "output_dir")):
        refused = distlab.train(["trainer.epochs=1", *overrides], config_path=ROOT / "conf",
                                **kwargs)
        assert refused.exit_code == 2 and refused.error.startswith(
            f"{option} is empty, which Hydra takes as the current directory"), refused.error
    assert list(tmp_path.iterdir()) == []
