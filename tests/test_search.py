"""distlab's Optuna sweeper (`hparams_search=optuna`): the search space, the study stored in
the sweep dir, a search killed mid-trial and resumed, and pruning in both loops with the
basic and a process launcher. (test_sweep.py has the plain search and the all-failed one.)

The pruning tests make pruning certain whatever the machine: the study is started with five
finished trials whose every epoch scored val_accuracy 1.0 (Optuna's add_trial), so the
median pruner (five startup trials) prunes the first real trial after its first epoch.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import ROOT, fast_overrides, run_cli
from omegaconf import OmegaConf

from distlab.errors import ConfigError

SHORT = ("trainer.epochs=2", "trainer.steps_per_epoch=2", "model=mlp", "model.hidden_units=[8]")
SPACE = {"optimizer.learning_rate": (1e-4, 1e-2), "dataset.batch_size_per_replica": [32, 64]}


def _study(sweep_dir: Path):
    import optuna

    from distlab.search import open_storage, storage_location

    return optuna.load_study(study_name="distlab",
                             storage=open_storage(storage_location(None, sweep_dir)))


def _seed_study(sweep_dir: Path, trials: int = 5, epochs: int = 2) -> None:
    """A study whose `trials` finished trials scored 1.0 at every epoch."""
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    from distlab.search import open_storage, storage_location

    study = optuna.create_study(study_name="distlab", direction="maximize",
                                storage=open_storage(storage_location(None, sweep_dir)))
    space = {"optimizer.learning_rate": FloatDistribution(1e-4, 1e-2, log=True),
             "dataset.batch_size_per_replica": CategoricalDistribution([32, 64])}
    for _ in range(trials):
        study.add_trial(optuna.trial.create_trial(
            params={"optimizer.learning_rate": 1e-3, "dataset.batch_size_per_replica": 64},
            distributions=space, value=1.0,
            intermediate_values={e: 1.0 for e in range(1, epochs + 1)}))


def _results(job: Path) -> dict:
    return json.loads((job / "results.json").read_text())


def _search(data_dir: Path, sweep_dir: Path, *args: str):
    space = 'hydra.sweeper.params={optimizer.learning_rate: "tag(log, interval(1e-4, 1e-2))",' \
            ' dataset.batch_size_per_replica: "choice(32, 64)"}'
    return run_cli(*fast_overrides(data_dir), *SHORT, "hparams_search=optuna", space,
                   f"hydra.sweep.dir={sweep_dir}", *args, timeout=600)


def _assert_pruned(job: Path) -> None:
    results = _results(job)
    assert results["status"] == "pruned", results
    assert results["epochs_completed"] == 1 and results["stopped_early"] == {
        "epoch": 1, "reason": "pruned"}, results
    assert results["pruned"]["epoch"] == 1 and results["pruned"]["metric"] == "val_accuracy"
    history = (job / "history.csv").read_text().splitlines()
    assert len(history) == 2, history  # header + epoch 1: stopped at that epoch's end
    assert results["pruned"]["value"] == pytest.approx(
        float(history[1].split(",")[history[0].split(",").index("val_accuracy")]))
    assert (job / "checkpoints" / "checkpoint").exists()


# --------------------------------------------------------------------------- fast


def test_a_refused_space_is_described_in_hydras_grammar():
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    from hydra_plugins.distlab_sweepers.search_space import described

    assert described(CategoricalDistribution([32, 64])) == "choice(32,64)"
    assert described(FloatDistribution(1e-4, 0.1)) == "interval(0.0001, 0.1)"
    assert described(FloatDistribution(1e-4, 0.1, log=True)) == "tag(log, interval(0.0001, 0.1))"
    assert described(IntDistribution(1, 9, step=2)) == "range(1, 9, 2)"


def test_search_space_in_hydras_override_grammar():
    """What users write under hydra.sweeper.params, as Optuna distributions."""
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    from hydra_plugins.distlab_sweepers.search_space import search_space

    space, fixed = search_space(
        {"optimizer.learning_rate": "tag(log, interval(0.0001, 0.01))",
         "dataset.batch_size_per_replica": "choice(32, 64, 128)",
         "model.hidden_units": "range(8, 33, 8)", "trainer.epochs": "interval(1, 4)",
         "optimizer.momentum": "interval(0.5, 0.9)", "schedule.name": "constant,cosine"},
        ["seed=3", "loop.steps_per_call=1,2"])
    assert space["optimizer.learning_rate"] == FloatDistribution(1e-4, 1e-2, log=True)
    assert space["dataset.batch_size_per_replica"] == CategoricalDistribution([32, 64, 128])
    assert space["model.hidden_units"] == IntDistribution(8, 32, step=8)
    assert space["trainer.epochs"] == FloatDistribution(1, 4)  # Hydra: an interval is float
    assert space["optimizer.momentum"] == FloatDistribution(0.5, 0.9)
    assert space["schedule.name"] == CategoricalDistribution(["constant", "cosine"])
    assert space["loop.steps_per_call"] == CategoricalDistribution([1, 2])
    assert fixed == {"seed": "3"}
    for params, arguments in (({"objective": "choice(val_loss, val_accuracy)"}, []),
                              ({}, ["objective=val_loss,val_accuracy"])):
        with pytest.raises(ConfigError, match=r"sweeps the objective, but a sweep ranks"):
            search_space(params, arguments)
    assert search_space({}, ["objective=val_loss"]) == ({}, {"objective": "val_loss"})


def test_probes_give_every_choice_of_every_key_once():
    """The trial parameters composed before a search starts (a choice a key cannot take is
    refused before the study records a trial)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    from hydra_plugins.distlab_sweepers.search_space import probes

    space = {"a": CategoricalDistribution([1, 2, 3]), "lr": FloatDistribution(0.1, 0.2),
             "b": CategoricalDistribution(["x", "y"])}
    assert list(probes(space)) == [{"a": 1, "lr": 0.1, "b": "x"}, {"a": 2, "lr": 0.1, "b": "x"},
                                   {"a": 3, "lr": 0.1, "b": "x"}, {"a": 1, "lr": 0.1, "b": "y"}]


def test_a_signal_another_thread_took_is_handled_while_the_trial_threads_run():
    """With hydra.sweeper.n_jobs=2 the sweep's main thread waits for its trial threads. A
    signal the kernel gives to another thread (OpenBLAS starts one, SIGINT unblocked, before
    the sweep blocks SIGINT) runs its handler in the main thread, the one that stops the
    jobs: while it waits (`sweep_signals.join`), not once the trials end (an untimed join)."""
    import signal
    import threading

    from distlab.launch import sweep_signals

    assert threading.current_thread() is threading.main_thread()
    handled = threading.Event()
    bystander = threading.Thread(target=handled.wait, args=(60,), daemon=True)
    ended_by_handler: list[bool] = []
    trial = threading.Thread(target=lambda: ended_by_handler.append(handled.wait(60)),
                             daemon=True)  # a trial that runs until the signal is handled
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: handled.set())
    try:
        bystander.start()
        trial.start()
        signal.pthread_kill(bystander.ident, signal.SIGUSR1)
        sweep_signals.join([trial])
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert ended_by_handler == [True]


def test_search_config_and_pruners():
    from conftest import compose_once

    from distlab.errors import ConfigError
    from distlab.search import JOURNAL, build_pruner, storage_location

    cfg = compose_once([])
    assert cfg.search.trial is None and cfg.search.pruner == "none"  # outside a search
    assert storage_location(None, "/s") == f"/s/{JOURNAL}"
    # a relative file, journal or SQLite, is in the sweep dir (two sweeps never share it)
    assert storage_location("sqlite:///x.db", "/s") == "sqlite:////s/x.db"
    assert storage_location("sqlite:////abs/x.db", "/s") == "sqlite:////abs/x.db"
    assert storage_location("mine.journal", "/s") == "/s/mine.journal"
    assert storage_location("postgresql://h/db", "/s") == "postgresql://h/db"
    assert type(build_pruner("median")).__name__ == "MedianPruner"
    assert type(build_pruner("hyperband")).__name__ == "HyperbandPruner"
    with pytest.raises(ConfigError, match="hydra.sweeper.pruner='mean' is not a pruner"):
        build_pruner("mean")


def test_a_pruned_run_is_finished_for_the_rerun_rules():
    from conftest import compose_once

    from distlab.config import training_diff
    from distlab.launch.rerun import already_completed

    cfg = compose_once(["trainer.epochs=3"])
    pruned = {"mode": "train", "status": "pruned", "epochs_completed": 1,
              "stopped_early": {"epoch": 1, "reason": "pruned"}}
    assert already_completed(pruned, cfg)
    assert not already_completed({**pruned, "status": "interrupted"}, cfg)
    # the trial's storage is not what trains: a job resumes wherever the study is kept
    before = OmegaConf.to_container(compose_once(["search.trial=2", "search.storage=/a"]))
    after = OmegaConf.to_container(compose_once(["search.trial=2", "search.storage=/b"]))
    assert training_diff(before, after) == []


def test_the_search_config_selects_distlabs_sweeper():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", ["hparams_search=optuna"], return_hydra_config=True)
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_ == "hydra_plugins.distlab_sweepers.optuna.DistlabOptunaSweeper"
    assert (sweeper.pruner, sweeper.storage, sweeper.n_jobs) == ("median", None, 1)


@pytest.mark.slow  # run.py processes forked from a TensorFlow-preloaded server
def test_a_search_refuses_what_would_mix_studies_or_rank_on_test(tiny_data_dir, tmp_path):
    """Each refused in one line before any trial: another study in a sweep dir that holds a
    study's jobs; another objective for a stored study; a test figure as the objective; a
    journal that cannot be read (named)."""
    import optuna

    from distlab.search import open_storage, storage_location

    cases = {}
    held = tmp_path / "held"  # a search of study "distlab" ran here
    (held / ".distlab").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create({"study_name": "distlab",
                                     "storage": storage_location(None, held)}),
                   held / ".distlab" / "search.yaml")
    cases["held"] = (["hydra.sweeper.study_name=other"], "holds the jobs of the study 'distlab'")
    ranked = tmp_path / "ranked"
    optuna.create_study(study_name="distlab", direction="maximize", storage=open_storage(
        storage_location(None, ranked))).set_user_attr("objective", "val_accuracy")
    cases["ranked"] = (["objective=train_examples_per_sec"],
                       "ranks its trials by val_accuracy")
    cases["test"] = (["objective=test_accuracy"], "would choose on the test split")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "optuna.journal").write_text('{"op_code": 0, "worker_id": "x"}\n{garbage\n')
    cases["broken"] = ([], f"the study in {broken / 'optuna.journal'} cannot be read")
    spaced = tmp_path / "spaced"  # its trial searched the batch size over other choices
    _seed_study(spaced, trials=1)
    cases["spaced"] = (['hydra.sweeper.params={dataset.batch_size_per_replica: '
                        '"choice(16, 128)"}'], "searched dataset.batch_size_per_replica over "
                       "choice(32,64); this search over choice(16,128)")
    cases["no trials"] = (["hydra.sweeper.n_trials=0"], "hydra.sweeper.n_trials=0: give 1 or more")
    cases["target"] = (["objective=time_to_target_s"], "objective=time_to_target_s needs "
                       "trainer.target, and none is configured")  # no trial could measure it
    cases["inverted"] = (["optimizer.learning_rate=interval(0.01,0.001)"],
                         "optimizer.learning_rate=interval(0.01,0.001): Optuna cannot search it")
    cases["misspelt"] = (["optimizer.no_such=interval(0.1,0.2)"],  # no trial could set it
                         "optimizer.no_such is not a key of optimizer")
    # a choice no trial could set: recorded as trial 0, running, which every rerun relaunched
    cases["bad choice"] = (["optimizer.learning_rate=choice(0.001,abc)"],
                           "Value 'abc' of type 'str' could not be converted to Float")
    for name, (extra, expected) in cases.items():
        out = run_cli(*fast_overrides(tiny_data_dir), "hparams_search=optuna",
                      "hydra.sweeper.n_trials=1", f"hydra.sweep.dir={tmp_path / name}", *extra,
                      timeout=120)
        text = out.stdout + out.stderr
        assert out.returncode == 2 and expected in text, (name, text[-2000:])
        assert "Traceback" not in text and not (tmp_path / name / "0").exists(), name
    assert len(_study(spaced).trials) == 1  # the study left as it was: no trial asked
    for name in ("misspelt", "bad choice"):
        assert not (tmp_path / name / "optuna.journal").exists()  # no study, no trial


# --------------------------------------------------------------------------- slow


@pytest.mark.slow
def test_a_search_killed_in_its_third_trial_resumes(tiny_data_dir, tmp_path):
    """Killed (SIGKILL) during trial 2's second epoch, then rerun: 4 trials in all, trials 0
    and 1 untouched, trial 2 resumed in its own job dir with its parameters from its
    checkpoint (each epoch trained once), trial 3 new."""
    from conftest import processes

    sweep, gate = tmp_path / "search", tmp_path / "gate"
    gate.mkdir()
    args = [*fast_overrides(tiny_data_dir), "trainer.epochs=2", "trainer.steps_per_epoch=3",
            "model=mlp", "model.hidden_units=[8]", "hparams_search=optuna",
            "hydra.sweeper.n_trials=4", "hydra.sweeper.pruner=none", f"hydra.sweep.dir={sweep}"]
    # the trials run in the sweep's process: the 3rd step:1:1 is trial 2's, in its epoch 2
    proc = processes.Process(ROOT / "tests" / "gate.py", *args, env={
        "DISTLAB_TEST_GATE": "step:1:1", "DISTLAB_TEST_GATE_NTH": "3",
        "DISTLAB_TEST_GATE_DIR": str(gate)})
    try:
        deadline = time.monotonic() + 540
        while not (gate / "reached").exists():
            assert proc.poll() is None, proc.output_so_far()[-3000:]
            assert time.monotonic() < deadline, proc.output_so_far()[-3000:]
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait(60)
    assert (sweep / "2" / "checkpoints" / "checkpoint").exists()  # trial 2's epoch 1, saved
    assert not (sweep / "2" / "results.json").exists() or \
        _results(sweep / "2")["status"] != "completed"
    params = OmegaConf.load(sweep / "2" / ".hydra" / "overrides.yaml")
    untouched = {n: (sweep / str(n) / "results.json").stat().st_mtime_ns for n in (0, 1)}

    out = run_cli(*args, timeout=600)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "trial 2: relaunched with its parameters" in text, text[-3000:]
    study = _study(sweep)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4
    assert OmegaConf.load(sweep / "2" / ".hydra" / "overrides.yaml") == params
    assert f"optimizer.learning_rate={study.trials[2].params['optimizer.learning_rate']}" \
        in params
    for n in range(4):
        results = _results(sweep / str(n))
        assert results["status"] == "completed" and results["epochs_completed"] == 2
        epochs = [line.split(",")[0] for line in
                  (sweep / str(n) / "history.csv").read_text().splitlines()[1:]]
        assert epochs == ["1", "2"], (n, epochs)  # no epoch trained twice
    assert {n: (sweep / str(n) / "results.json").stat().st_mtime_ns for n in (0, 1)} == untouched
    assert not (sweep / "4").exists()
    # the resumed sampler does not start its draws over (trial 3 is no copy of trial 0)
    drawn = [tuple(sorted(t.params.items())) for t in study.trials]
    assert len(set(drawn)) == 4, drawn


@pytest.mark.slow
def test_pruning_keras_fit_basic_launcher_with_mlflow(tiny_data_dir, tmp_path):
    """keras_fit, in-process trials: the first real trial is pruned after epoch 1 (checkpoint,
    results.json pruned), Optuna has it PRUNED, the summary lists it, MLflow tags it."""
    sweep = tmp_path / "search"
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _seed_study(sweep)
    out = _search(tiny_data_dir, sweep, "loop=keras_fit", "hydra.sweeper.n_trials=6",
                  "hydra.sweeper.pruner=median", "logger=mlflow", f"logger.tracking_uri={store}")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "trial 5 pruned at epoch 1" in text and "Traceback" not in text, text[-3000:]
    _assert_pruned(sweep / "5")
    assert [t.state.name for t in _study(sweep).trials] == ["COMPLETE"] * 5 + ["PRUNED"]
    assert "| pruned |" in (sweep / "summary.md").read_text()
    assert "0 completed, 0 failed, 1 pruned" in text, text[-3000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("distlab").experiment_id])
    job = [r for r in runs if "distlab.sweep_dir" not in r.data.tags]
    assert len(job) == 1 and job[0].data.tags.get("pruned") == "true", job
    assert job[0].info.status == "FINISHED"


@pytest.mark.slow
def test_pruning_custom_loop_joblib_two_trials_at_once(tiny_data_dir, tmp_path):
    """The custom loop in joblib's processes, two trials at once (n_jobs=2): both pruned
    after epoch 1, each by its own job reporting to the journal in the sweep dir."""
    sweep = tmp_path / "search"
    _seed_study(sweep)
    out = _search(tiny_data_dir, sweep, "loop=custom", "hydra/launcher=joblib",
                  "hydra.launcher.n_jobs=2", "hydra.sweeper.n_jobs=2",
                  "hydra.sweeper.n_trials=7", "hydra.sweeper.pruner=median")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    for n in (5, 6):
        _assert_pruned(sweep / str(n))
    assert [t.state.name for t in _study(sweep).trials] == ["COMPLETE"] * 5 + ["PRUNED"] * 2
    assert "2 jobs: 0 completed, 0 failed, 2 pruned" in (sweep / "summary.md").read_text()


@pytest.mark.slow
def test_repeats_run_each_trial_with_its_seeds_and_tell_optuna_the_mean(tiny_data_dir,
                                                                        tmp_path):
    """`hydra.sweeper.repeats=2`: trial N runs as jobs 2N and 2N+1 with seeds 7 and 8 (the
    command's seed=7 the first), Optuna gets the mean of their val_accuracy, the summary
    groups each trial's two jobs, and a pruner is off (one line)."""
    sweep = tmp_path / "search"
    out = _search(tiny_data_dir, sweep, "loop=custom", "seed=7", "hydra.sweeper.n_trials=2",
                  "hydra.sweeper.repeats=2", "hydra.sweeper.pruner=median")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "pruning is off with hydra.sweeper.repeats=2" in text, text[-3000:]
    trials = _study(sweep).trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 2
    for trial in trials:
        jobs = [sweep / str(2 * trial.number + k) for k in range(2)]
        seeds = [OmegaConf.load(j / ".hydra/config.yaml").seed for j in jobs]
        assert seeds == [7, 8], seeds
        values = [_results(j)["val_accuracy"] for j in jobs]
        assert trial.value == pytest.approx(sum(values) / 2), (trial.value, values)
        assert {_results(j)["status"] for j in jobs} == {"completed"}
        params = [OmegaConf.load(j / ".hydra/config.yaml").optimizer.learning_rate
                  for j in jobs]
        assert params[0] == params[1] == pytest.approx(
            trials[trial.number].params["optimizer.learning_rate"])
    groups = (sweep / "summary_groups.csv").read_text().splitlines()
    assert len(groups) == 3 and all(",2,7 8," in g for g in groups[1:]), groups


@pytest.mark.slow  # a run.py process forked from a TensorFlow-preloaded server
def test_a_running_trial_without_this_searchs_values_is_failed_and_asked_anew(tiny_data_dir,
                                                                              tmp_path):
    """A trial left running without a value for a searched key (a search stopped while
    asking, or a key searched since) is not relaunched on the config's defaults, nor one with
    a value for a key the search no longer searches: each is failed, and a new trial of the
    search's space takes its place."""
    import optuna

    from distlab.search import open_storage, storage_location

    sweep = tmp_path / "search"
    study = optuna.create_study(study_name="distlab", direction="maximize",
                                storage=open_storage(storage_location(None, sweep)))
    study.ask()  # trial 0: running, without parameters
    study.ask({"optimizer.learning_rate": optuna.distributions.CategoricalDistribution(
        [0.02, 0.03]), "optimizer.no_such": optuna.distributions.FloatDistribution(0.1, 0.2)})
    out = run_cli(*fast_overrides(tiny_data_dir), "trainer.epochs=1", "trainer.steps_per_epoch=2",
                  "model=mlp", "model.hidden_units=[8]", "hparams_search=optuna",
                  "hydra.sweeper.n_trials=1", 'hydra.sweeper.params={optimizer.learning_rate: '
                  '"choice(0.02, 0.03)"}', f"hydra.sweep.dir={sweep}", timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    [said] = [line for line in text.splitlines() if "trial 0: has no value for" in line]
    assert "optimizer.learning_rate" in said and "a new trial is asked in its place" in said
    [said] = [line for line in text.splitlines() if "trial 1: has" in line]
    assert "has a value for optimizer.no_such, which this search does not search" in said
    study = _study(sweep)
    assert [t.state.name for t in study.trials] == ["FAIL", "FAIL", "COMPLETE"]
    assert study.trials[2].params["optimizer.learning_rate"] in (0.02, 0.03)
    assert _results(sweep / "2")["learning_rate"] == study.trials[2].params[
        "optimizer.learning_rate"]
    assert not (sweep / "0").exists() and not (sweep / "1").exists()  # never launched


@pytest.mark.slow  # run.py processes forked from a TensorFlow-preloaded server
def test_repeats_refuse_a_searched_seed_and_a_bad_count(tmp_path):
    seeds = "seed=choice(1,2)"
    for i, bad in enumerate((["hydra.sweeper.repeats=0"], ["hydra.sweeper.repeats=two"],
                             ["hydra.sweeper.repeats=2", seeds])):
        out = run_cli("hparams_search=optuna", *bad, "hydra.sweeper.n_trials=1",
                      f"hydra.sweep.dir={tmp_path / str(i)}", timeout=120)
        text = out.stdout + out.stderr
        assert out.returncode == 2 and "hydra.sweeper.repeats" in text, text[-2000:]
        assert "Traceback" not in text and not (tmp_path / str(i) / "0").exists(), text[-2000:]
