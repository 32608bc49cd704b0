"""examples/tabular_project: a user's own datasets, model and task, run through `run.py`.

Real `python run.py --config-dir conf ...` subprocesses from the example's directory (as its
README says), on data that ships inside scikit-learn (a dev dependency).
"""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import processes
import pytest
from conftest import ROOT

from distlab.records.run_dir import history_columns

pytestmark = pytest.mark.slow
EXAMPLE = ROOT / "examples" / "tabular_project"
QUIET = ["loop.verbose=0"]


@pytest.fixture(autouse=True)
def _scikit_learn() -> None:
    if importlib.util.find_spec("sklearn") is None:
        pytest.fail("scikit-learn is not installed; the example project's datasets need it: "
                    "pip install -e '.[dev]' (or pip install scikit-learn)")


def run_example(*args: str, timeout: float = 120,
                example: Path = EXAMPLE) -> subprocess.CompletedProcess:
    """`python <repo>/run.py --config-dir conf ARGS` from the example project's directory."""
    out = processes.run(ROOT / "run.py", "--config-dir", "conf", *args, cwd=example,
                        timeout=timeout, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def check_run_dir(path: Path, metrics: list[str], epochs: int, export: bool) -> dict:
    """The files every distlab run writes; its completed results.json."""
    for name in (".hydra/config.yaml", ".hydra/overrides.yaml", ".hydra/hydra.yaml", "run.log",
                 "checkpoints/checkpoint"):
        assert (path / name).exists(), name
    for kind in ("train", "validation"):
        assert list((path / "logs" / kind).glob("events.out.tfevents.*")), kind
    assert (path / "saved_model" / "saved_model.pb").exists() == export
    with open(path / "history.csv", newline="") as f:
        history = list(csv.DictReader(f))
    assert list(history[0]) == history_columns(metrics)
    assert [int(row["epoch"]) for row in history] == list(range(1, epochs + 1))
    results = json.loads((path / "results.json").read_text())
    assert results["status"] == "completed", results
    assert results["epochs_completed"] == epochs
    return results


def test_digits_keras_fit_on_two_replicas(tmp_path):
    # 2 epochs (of the example's 10): test accuracy 0.91
    run_example("experiment=digits", "loop=keras_fit", "strategy.cpu_devices=2",
                "trainer.epochs=2", f"hydra.run.dir={tmp_path}", *QUIET)
    results = check_run_dir(tmp_path, ["accuracy"], epochs=2, export=True)
    assert (results["dataset"], results["loop"]) == ("digits", "keras_fit")
    assert (results["num_replicas"], results["global_batch_size"]) == (2, 64)
    # 1347 train images (test_fraction 0.25), 0.1 of them held out for validation, by 64
    assert results["num_validation"] == 136 and results["steps_per_epoch"] == 19  # 1211 by 64
    assert results["export_max_abs_diff"] < 1e-4
    assert results["test_accuracy"] > 0.85


def test_diabetes_sweep_over_both_loops_reports_the_tasks_metrics(tmp_path):
    """One sweep process over the example, custom loop then keras_fit: each job's run
    directory, the task's metrics, and the summary's figures are the job's."""
    run_example("-m", "experiment=diabetes", "strategy=default", "trainer.epochs=3",
                "trainer.export=false", "loop=custom,keras_fit",
                f"hydra.sweep.dir={tmp_path}", *QUIET, timeout=240)
    with open(tmp_path / "summary.csv", newline="") as f:
        jobs = list(csv.DictReader(f))
    assert [(job["status"], job["loop"]) for job in jobs] == [
        ("completed", "custom"), ("completed", "keras_fit")]
    metrics = ["mae", "rmse", "within_tolerance"]
    for num, loop in enumerate(("custom", "keras_fit")):
        run_dir = tmp_path / str(num)
        results = check_run_dir(run_dir, metrics, epochs=3, export=False)
        assert (results["dataset"], results["loop"], results["num_replicas"]) == (
            "diabetes", loop, 1)
        assert results["objective"] == "val_mae"  # the task's first metric, on validation
        assert "test_accuracy" not in results
        mae, rmse, hits = (results[f"test_{m}"] for m in metrics)
        assert 0 < mae <= rmse < 1.5  # standardised target: a fit beats predicting the mean
        assert 0 < hits < 1  # some, not all, predictions within task.tolerance (0.5)
        # the loss is Huber's (delta 1): per example at most e**2 / 2 and at most delta * |e|
        assert 0 < results["test_loss"] <= min(rmse ** 2 / 2, 1.0 * mae) + 1e-6
        assert "target standardised with the train split's mean" in (
            run_dir / "run.log").read_text()
        for metric in ("test_mae", "test_rmse", "test_loss"):  # the summary's are the job's
            assert float(jobs[num][metric]) == pytest.approx(results[metric], rel=1e-9), metric


def test_the_readmes_search_runs_on_the_examples_dataset_and_its_own_keys(tmp_path):
    """The example README's Optuna search on the project's own dataset (a node with keys of
    its own, test_fraction): the sweeper's composition of one trial before the study passes,
    and the trial completes, ranked on val_mae."""
    run_example("experiment=diabetes", "hparams_search=optuna", "objective=val_mae",
                "hydra.sweeper.direction=minimize", "hydra.sweeper.n_trials=1",
                "strategy=default", "trainer.epochs=1", "trainer.export=false",
                f"hydra.sweep.dir={tmp_path}", *QUIET, timeout=240)
    with open(tmp_path / "summary.csv", newline="") as f:
        [job] = list(csv.DictReader(f))
    assert (job["status"], job["objective"]) == ("completed", "val_mae")


def check_breast_cancer_served(run_dir: Path, replicas: int) -> None:
    """task=binary on raw features standardised inside the model: the SavedModel, served raw
    test features, gives the run's test_auc (scikit-learn's ROC AUC, within 2e-3), and its
    test_precision and test_recall exactly at probability 0.5."""
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_breast_cancer
    from sklearn.metrics import precision_score, recall_score, roc_auc_score
    from sklearn.model_selection import train_test_split

    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "completed" and results["num_replicas"] == replicas
    x, y = load_breast_cancer(return_X_y=True)  # the example's split (test_fraction 0.25)
    _, x_test, _, y_test = train_test_split(x.astype(np.float32), y, test_size=0.25,
                                            random_state=0, stratify=y)
    served = tf.saved_model.load(str(run_dir / "saved_model")).signatures["serving_default"]
    p = served(inputs=tf.constant(x_test))["output_0"].numpy()[:, 0]  # raw features in
    assert results["test_auc"] == pytest.approx(roc_auc_score(y_test, p), abs=2e-3)
    assert results["test_precision"] == pytest.approx(precision_score(y_test, p > 0.5), abs=1e-7)
    assert results["test_recall"] == pytest.approx(recall_score(y_test, p > 0.5), abs=1e-7)
    assert results["test_accuracy"] == pytest.approx(np.mean((p > 0.5) == y_test), abs=1e-7)
    assert results["test_accuracy"] > 0.9 and results["num_validation"] == 43


def check_string_input_served(example: str, experiment: str, run_dir: Path,
                              monkeypatch) -> None:
    """The SavedModel of a string-input example's run, served the raw test inputs (strings
    included), gives the run's test_accuracy."""
    import numpy as np
    import tensorflow as tf
    from omegaconf import OmegaConf

    where = ROOT / "examples" / example
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "completed" and results["num_replicas"] == 2
    # the builder module, loaded without registering its names in this process (tabular's
    # `breast_cancer` would shadow tfds' for other tests in this worker)
    import distlab

    monkeypatch.setattr(distlab, "register", lambda *a, **k: (lambda fn: fn))
    spec = importlib.util.spec_from_file_location(f"_{example}_data",
                                                  where / example / "data.py")
    data = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, data)  # its dataclasses look it up
    spec.loader.exec_module(data)
    node = OmegaConf.load(run_dir / ".hydra" / "config.yaml").dataset
    builder = {"breast_cancer_two_inputs": "breast_cancer_two_inputs",
               "reviews": "reviews_dataset"}[experiment]
    x, y = getattr(data, builder)(node).test
    served = tf.saved_model.load(str(run_dir / "saved_model")).signatures["serving_default"]
    inputs = x if isinstance(x, dict) else {"inputs": x}
    out = served(**{k: tf.constant(v) for k, v in inputs.items()})["output_0"].numpy()
    predicted = out[:, 0] > 0.5 if out.shape[-1] == 1 else out.argmax(-1)
    assert results["test_accuracy"] == pytest.approx(np.mean(predicted == y), abs=1e-7)


def test_breast_cancer_keras_fit_on_one_replica_serves_its_binary_figures(tmp_path):
    # 4 epochs (of the example's 20): test accuracy 0.92 after 3 (0.97 AUC)
    run_example("experiment=breast_cancer", "loop=keras_fit", "strategy.cpu_devices=1",
                "trainer.epochs=4", f"hydra.run.dir={tmp_path}", *QUIET)
    check_breast_cancer_served(tmp_path, replicas=1)


def test_tabular_binary_examples_in_the_custom_loop_on_two_replicas_serve_raw_inputs(
        tmp_path, monkeypatch):
    """One sweep process, custom loop on 2 replicas: breast_cancer (raw features) and the
    two-input example (floats + a string category). 6 epochs (of the example's 20):
    breast_cancer's test accuracy was 0.90 after 2 and after 3, at the check's edge."""
    run_example("-m", "experiment=breast_cancer,breast_cancer_two_inputs", "loop=custom",
                "strategy.cpu_devices=2", "trainer.epochs=6", f"hydra.sweep.dir={tmp_path}",
                *QUIET, timeout=240)
    check_breast_cancer_served(tmp_path / "0", replicas=2)
    check_string_input_served("tabular_project", "breast_cancer_two_inputs", tmp_path / "1",
                              monkeypatch)


def test_text_example_in_the_custom_loop_on_two_replicas_serves_raw_strings(tmp_path,
                                                                             monkeypatch):
    # one epoch: the served model is checked against the run's own figure, whatever it is
    run_example("experiment=reviews", "loop=custom", "strategy.cpu_devices=2",
                "trainer.epochs=1", f"hydra.run.dir={tmp_path}", *QUIET,
                example=ROOT / "examples" / "text_project")
    check_string_input_served("text_project", "reviews", tmp_path, monkeypatch)
