"""Stateful Keras metrics (AUC, precision, recall...) and task=binary: exact under 1, 2 and 3
replicas in both loops and evaluation (padding rows never counted), across a mid-epoch resume,
as monitors and objectives with their own direction; config refusals in one line."""

from __future__ import annotations

import csv
import json
import re
import signal
from pathlib import Path

import keras
import numpy as np
import pytest

BINARY_TRAIN, BINARY_TEST = 375, 194  # 569 rows: 194 = 3 x 64 + 2 (a short last batch)


def write_breast_cancer(data_dir: Path) -> None:
    """scikit-learn's bundled breast-cancer data (569 rows, 30 features, 0/1 labels) in tfds'
    on-disk format as `breast_cancer`: features standardised, a seeded 375/194 split."""
    import tensorflow as tf
    import tensorflow_datasets as tfds
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order].astype(np.float32), y[order].astype(np.int64)
    train = slice(0, BINARY_TRAIN)
    x = (x - x[train].mean(0)) / x[train].std(0)

    def split(rows: slice) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices({"features": x[rows], "label": y[rows]})

    features = tfds.features.FeaturesDict({
        "features": tfds.features.Tensor(shape=(30,), dtype=np.float32),
        "label": tfds.features.ClassLabel(num_classes=2),
    })
    tfds.dataset_builders.TfDataBuilder(
        name="breast_cancer", version="1.0.0", features=features, data_dir=str(data_dir),
        split_datasets={"train": split(train), "test": split(slice(BINARY_TRAIN, None))},
    ).download_and_prepare()


# --------------------------------------------------------------------------- no training

def _binary_task(*names: str):
    from conftest import compose_once

    from distlab.components import tasks

    overrides = ["task=binary"] + ([f"task.metrics=[{','.join(names)}]"] if names else [])
    task = tasks.build(compose_once(overrides).task)
    task.from_logits = False  # the model outputs probabilities
    return task


def _scores(n: int = BINARY_TEST, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """0/1 labels and probabilities that rank them imperfectly."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    p = np.clip(0.35 * y + 0.65 * rng.random(n), 0, 1).astype(np.float32)
    return y, p


@pytest.mark.slow  # no training, but 2-3 s of tracing per replica count
@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_stateful_metrics_are_exact_over_replicas_and_padding(replicas):
    """194 rows in global batches of 64 per replica (3 replicas: 192, then 2 rows for 3
    replicas, so one gets a padding row) give the one-device Keras figures exactly."""
    import keras
    import tensorflow as tf
    from sklearn.metrics import precision_score, recall_score, roc_auc_score

    from distlab.data.stream import distribute
    from distlab.training.metrics import StatefulMetrics

    task = _binary_task("accuracy", "auc", "precision", "recall", "f1")
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
    metrics = StatefulMetrics(task, strategy, sample=lambda: (tf.zeros([1], tf.int64),
                                                              tf.zeros([1, 1])))
    y, p = _scores()
    batches = tf.data.Dataset.from_tensor_slices((p[:, None], y)).batch(64 * replicas)

    @tf.function
    def update(dataset):
        for features, labels, weights in dataset:
            strategy.run(metrics.eval.update, args=(labels, features, weights))

    for _ in range(2):  # reset between passes: the second gives the same figures
        metrics.eval.reset()
        update(distribute(strategy, batches))
        figures = dict(zip(["auc", "precision", "recall", "f1"],
                           metrics.results(metrics.eval.read()), strict=True))
    one = {"auc": keras.metrics.AUC(num_thresholds=1000), "precision": keras.metrics.Precision(),
           "recall": keras.metrics.Recall()}
    for name, metric in one.items():
        metric.update_state(y.astype(np.float32), p)
        # distlab reads the counts in float64, Keras divides them in float32
        assert figures[name] == pytest.approx(float(metric.result()), rel=1e-6), name
    assert figures["auc"] == pytest.approx(roc_auc_score(y, p), abs=2e-3)
    assert figures["precision"] == pytest.approx(precision_score(y, p > 0.5), abs=1e-7)
    assert figures["recall"] == pytest.approx(recall_score(y, p > 0.5), abs=1e-7)
    precision, recall = figures["precision"], figures["recall"]
    assert figures["f1"] == pytest.approx(2 * precision * recall / (precision + recall), abs=1e-6)


AT_IMPORT = keras.metrics.AUC(name="auc_at_import")  # made outside any strategy scope


def test_a_metric_made_outside_any_scope_is_copied_into_it():
    import tensorflow as tf

    from distlab.components.tasks import Task
    from distlab.training.metrics import StatefulMetrics

    task = Task(loss=lambda y, p: y, metrics=[AT_IMPORT])
    tasks_build_normalises(task)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    metrics = StatefulMetrics(task, strategy)
    assert [m.name for m in metrics.metrics] == ["auc_at_import"]
    for metric_set in (metrics.train, metrics.eval):
        obj = metric_set.objects[0]
        assert obj is not AT_IMPORT and obj.num_thresholds == AT_IMPORT.num_thresholds
        assert all(type(v.value).__name__ == "SyncOnReadVariable" and v.aggregation == "sum"
                   for v in obj.variables)
    assert metrics.size == 4 * 200  # TP, FP, TN, FN at 200 thresholds
    assert metrics.results(np.zeros(metrics.size)) == [None]  # no rows: AUC is undefined


def tasks_build_normalises(task) -> None:
    """What tasks.build does to a builder's Task: its metrics as Metrics."""
    from distlab.components.tasks import as_metric

    task.metrics = [as_metric(m, "test") for m in task.metrics]


def test_which_way_a_stateful_metric_ranks():
    from distlab.components.tasks import Metric, as_metric

    assert as_metric(keras.metrics.AUC(), "t").higher_is_better is True
    assert as_metric(keras.metrics.Precision(), "t").higher_is_better is True
    # Keras' own direction: losses and errors go down
    assert as_metric(keras.metrics.BinaryCrossentropy(), "t").higher_is_better is False
    assert as_metric(keras.metrics.MeanSquaredError(), "t").higher_is_better is False
    marked = keras.metrics.AUC(name="auc")
    marked.higher_is_better = False  # an attribute overrides it
    assert as_metric(marked, "t").higher_is_better is False
    assert Metric("bce", keras.metrics.BinaryCrossentropy(), higher_is_better=True
                  ).higher_is_better is True  # as does the wrapper
    metric = as_metric(keras.metrics.AUC(name="roc"), "t")
    assert (metric.name, metric.stateful) == ("roc", True)
    assert Metric("acc", keras.metrics.binary_accuracy).stateful is False


class MeanAggregated(keras.metrics.Metric):
    def __init__(self, name="mean_aggregated", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable(shape=(), initializer="zeros", aggregation="mean",
                                       name="total")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.total.assign_add(1.0)

    def result(self):
        return self.total


class NeedsAnArgument(keras.metrics.Metric):
    def __init__(self, cutoff, name="needs_an_argument"):
        super().__init__(name=name)
        self.cutoff = cutoff
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        pass

    def result(self):
        return self.count


class StartsAtOne(NeedsAnArgument):
    def __init__(self, name="starts_at_one", dtype=None):
        super().__init__(0.5, name=name)

    def reset_state(self):
        self.count.assign(1.0)


@pytest.mark.parametrize("metric, message", [
    (MeanAggregated(), "'mean_aggregated' (MeanAggregated): its variable 'total' is aggregated "
                       "by 'mean'"),
    (NeedsAnArgument(0.5), "'needs_an_argument': cannot copy its NeedsAnArgument into the "
                           "strategy's scope"),
    (StartsAtOne(), "'starts_at_one' (StartsAtOne): its variable 'count' is not zero after "
                    "reset_state()"),
    (keras.metrics.F1Score(average=None, name="f1_per_class"),
     "'f1_per_class' (F1Score) gives a result of shape [3]; a task metric is one number"),
])
def test_a_metric_distlab_cannot_sum_is_refused_in_one_line(metric, message):
    import tensorflow as tf

    from distlab.components.tasks import Task
    from distlab.errors import DistlabError
    from distlab.training.metrics import StatefulMetrics

    task = Task(loss=lambda y, p: y, metrics=[metric])
    tasks_build_normalises(task)
    with pytest.raises(DistlabError, match=re.escape(message)) as refused:
        StatefulMetrics(task, tf.distribute.get_strategy(),
                        sample=lambda: (tf.zeros([1, 3]), tf.zeros([1, 3])))
    assert "\n" not in str(refused.value)


# ---- config: task.metrics names, task=binary, refused in one line before training

def test_default_metrics_keep_each_task_s_figures():
    from conftest import compose_once

    from distlab.records.metrics import builtin_task_metrics

    assert list(compose_once([]).task.metrics) == ["accuracy"]
    assert list(compose_once(["task=regression"]).task.metrics) == ["mae", "rmse"]
    binary = compose_once(["task=binary"]).task
    assert list(binary.metrics) == ["accuracy", "auc", "precision", "recall"]
    assert builtin_task_metrics(binary) == {"accuracy": True, "auc": True, "precision": True,
                                            "recall": True}
    assert builtin_task_metrics(compose_once(["task=binary", "task.metrics=[f1,my.pkg:thing]"]
                                             ).task) is None  # a user metric: known once built


@pytest.mark.parametrize("overrides, message", [
    (["task.metrics=[accuracy,auc]"],
     "task.metrics[1]='auc' is not a metric of task=classification (it is one of "
     "task=binary); task=classification's metrics: accuracy"),
    (["task=regression", "task.metrics=[mae,accuracy]"],
     "task.metrics[1]='accuracy' is not a metric of task=regression"),
    (["task=binary", "task.metrics=[auc,auc]"], "task.metrics=['auc', 'auc'] lists 'auc' twice"),
    (["task=binary", "model=mlp", "model.output_activation=softmax"],
     "model.output_activation=softmax does not fit task=binary: use "
     "model.output_activation=sigmoid or null (a logit)"),
    (["task=binary", "trainer.early_stopping.metric=val_aucc"],
     "trainer.early_stopping.metric='val_aucc' is not a per-epoch metric of this task; use one "
     "of loss, accuracy, auc, precision, recall, val_loss, val_accuracy, val_auc"),
    (["task=binary", "objective=val_top5_accuracy"],
     "objective=val_top5_accuracy is not a result of task 'binary'; its validation results: "
     "val_loss, val_accuracy, val_auc, val_precision, val_recall"),
])
def test_a_metric_config_the_task_cannot_report_is_refused_before_tensorflow(overrides, message):
    from conftest import compose_once

    from distlab.config import validate
    from distlab.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(compose_once(overrides))


def test_binary_watched_metrics_and_objectives_rank_their_way():
    from conftest import compose_once

    from distlab.config import validate
    from distlab.launch.objective import task_metrics
    from distlab.records.ranking import direction

    cfg = compose_once(["task=binary", "trainer.early_stopping.metric=val_auc",
                        "trainer.target.metric=val_recall", "trainer.target.value=0.9",
                        "objective=val_auc"])
    validate(cfg)
    assert direction(cfg, task_metrics(cfg)) == "maximize"
    cfg = compose_once(["task=binary", "objective=best_value",
                        "trainer.best_checkpoint.metric=val_auc"])
    assert direction(cfg, task_metrics(cfg)) == "maximize"
    cfg = compose_once(["task=binary"])  # the first metric: val_accuracy
    assert direction(cfg, task_metrics(cfg)) == "maximize"


def test_an_unknown_metric_name_is_one_line_naming_the_key(tmp_path):
    from conftest import ROOT

    import distlab

    results = distlab.train(["task=binary", "task.metrics=[accuracy,aucc]"],
                            config_path=ROOT / "conf", output_dir=tmp_path / "r")
    assert results.exit_code == 2
    assert results.error == ("task.metrics[1]='aucc' is not a known metric; task=binary's: "
                             "accuracy, auc, precision, recall, f1; or a package.module:callable "
                             "import path")
    results = distlab.train(["task.metrics=[no_such_module:metric]"],
                            config_path=ROOT / "conf", output_dir=tmp_path / "s")
    assert results.exit_code == 2
    assert results.error.startswith("task.metrics[0]='no_such_module:metric' does not import: "
                                    "ModuleNotFoundError")


@pytest.mark.slow  # run.py processes forked from a TensorFlow-preloaded server
def test_the_command_refuses_an_unknown_metric_with_exit_2_and_no_traceback(tmp_path):
    from conftest import run_cli

    out = run_cli("task=binary", "task.metrics=[accuracy,aucc]", f"hydra.run.dir={tmp_path}")
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-2000:]
    assert len([ln for ln in text.splitlines() if "'aucc' is not a known metric" in ln]) == 1
    assert "Traceback" not in text and "tensorflow" not in text.lower()  # before TF starts


def test_binary_on_ten_classes_is_refused_in_one_line(run_inprocess, tmp_path):
    out = tmp_path / "ten"
    with pytest.raises(SystemExit) as refused:
        run_inprocess("task=binary", "strategy=default", "dataset.disk_cache=false", out=out)
    assert refused.value.code == 2
    error = json.loads((out / "results.json").read_text())["error"]
    assert error == ("task=binary needs 0/1 labels, but dataset mnist's labels are 10 classes: "
                     "use task=classification")


def test_binary_labels_and_model_outputs_are_checked():
    import tensorflow as tf

    from distlab.components import tasks
    from distlab.errors import DistlabError

    task = _binary_task()
    for classes, outputs, values in ((True, 2, None), (False, 1, [0.0, 1.0, 1.0])):
        tasks.check_labels(task, "binary", "d", classes, outputs,
                           sample=lambda v=values: np.array(v))
    with pytest.raises(DistlabError, match="labels include 0.5: use task=regression"):
        tasks.check_labels(task, "binary", "d", False, 1, sample=lambda: np.array([0, 0.5, 1]))
    with pytest.raises(DistlabError, match="one 0/1 label per example, but dataset d's labels "
                                           "have 3 values"):
        tasks.check_labels(task, "binary", "d", False, 3)

    def model(units: int, outputs: int = 1) -> keras.Model:
        x = keras.Input((4,))
        ys = [keras.layers.Dense(units)(x) for _ in range(outputs)]
        return keras.Model(x, ys if outputs > 1 else ys[0], name=f"m{units}x{outputs}")

    tasks.settle(_binary_task(), model(1))
    for units, outputs, shown in ((2, 1, "(None, 2)"), (1, 2, "(None, 1), (None, 1)")):
        with pytest.raises(DistlabError, match=re.escape(
                f"the task needs a model with one output of 1 unit(s) (task=binary: one logit "
                f"or a sigmoid probability), but model 'm{units}x{outputs}' outputs {shown}")):
            tasks.settle(_binary_task(), model(units, outputs))
    logits, probabilities = _binary_task(), _binary_task()
    logits.from_logits = probabilities.from_logits = None
    tasks.settle(logits, model(1))
    sigmoid = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
    tasks.settle(probabilities, sigmoid)
    assert (logits.from_logits, probabilities.from_logits) == (True, False)
    # the binary accuracy thresholds the probability at 0.5, from logits too
    y, p = tf.constant([1, 0, 1, 0]), tf.constant([[0.7], [0.2], [0.4], [0.6]])
    for task, outputs in ((probabilities, p), (logits, tf.math.log(p / (1 - p)))):
        accuracy = task.metrics[0]
        assert accuracy.per_example(y, outputs).numpy().tolist() == [1, 1, 0, 0]


# --------------------------------------------------------------------------- training runs

BINARY = ("dataset.name=breast_cancer", "dataset.features.input=features",
          "dataset.features.label=label", "dataset.preprocess.rescale=null", "task=binary",
          "model=mlp", "model.hidden_units=[16]", "deterministic=true", "seed=3")
STATEFUL = ("auc", "precision", "recall")


@pytest.fixture(scope="session")
def binary_data(tiny_data_dir) -> Path:
    """tiny_data_dir (the runs' dataset.data_dir) with `breast_cancer` in it too."""
    from conftest import tiny_dataset

    tiny_dataset(tiny_data_dir, "breast_cancer", write_breast_cancer)
    return tiny_data_dir


def _history(run_dir: Path) -> list[dict[str, float]]:
    with open(run_dir / "history.csv", newline="") as f:
        return [{k: float(v) if v else None for k, v in row.items()} for row in csv.DictReader(f)]


def _split(data_dir: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    import tensorflow_datasets as tfds

    rows = list(tfds.builder("breast_cancer", data_dir=str(data_dir)).as_dataset(
        split=split, shuffle_files=False).as_numpy_iterator())
    return (np.stack([r["features"] for r in rows]), np.array([r["label"] for r in rows]))


def _probabilities(run_dir: Path, x: np.ndarray, logits: bool = True) -> np.ndarray:
    """The run's latest checkpoint's predictions on `x`, on one device, as probabilities."""
    import tensorflow as tf
    from conftest import compose_once

    from distlab.components import models

    twin = models.build(compose_once(list(BINARY)).model, (30,), 1)
    latest = tf.train.latest_checkpoint(str(run_dir / "checkpoints"))
    tf.train.Checkpoint(model=twin).restore(latest).expect_partial()
    outputs = twin(x, training=False).numpy()[:, 0]
    return 1 / (1 + np.exp(-outputs.astype(np.float64))) if logits else outputs


def _one_device(y: np.ndarray, p: np.ndarray) -> dict[str, float]:
    """accuracy, AUC, precision, recall as one device's keras.metrics compute them."""
    figures = {"accuracy": float(np.mean((p > 0.5) == (y == 1)))}
    for name, metric in (("auc", keras.metrics.AUC(num_thresholds=1000)),
                         ("precision", keras.metrics.Precision()),
                         ("recall", keras.metrics.Recall())):
        metric.update_state(y.astype(np.float32), p.astype(np.float32))
        figures[name] = float(metric.result())
    return figures


def _tags(events: Path) -> set[str]:
    import tensorflow as tf

    return {value.tag for path in events.glob("events.out.tfevents.*")
            for event in tf.compat.v1.train.summary_iterator(str(path))
            for value in event.summary.value}


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["keras_fit", "custom"])
def test_binary_figures_equal_one_device_keras_and_sklearn_on_1_2_3_replicas(
        loop, binary_data, run_inprocess, tmp_path):
    """A frozen model (learning rate 1e-30: the weights do not move) trained one epoch on 194
    rows and tested on 194, in global batches of 64 per replica: on 3 replicas both end with
    192 rows then 2 (a padding row). The train, validation and test figures are the one-device
    keras.metrics figures of the checkpoint's predictions, and sklearn's (custom also
    evaluates its 1-replica checkpoint on 3)."""
    from sklearn.metrics import precision_score, recall_score, roc_auc_score

    x_train, y_train = _split(binary_data, "train[:194]")
    x_val, y_val = _split(binary_data, "train[194:]")  # 181 rows
    x_test, y_test = _split(binary_data, "test")
    frozen = ("optimizer.learning_rate=1e-30", "trainer.epochs=1",
              "dataset.train_split='train[:194]'", "dataset.validation='train[194:]'",
              "dataset.batch_size_per_replica=64")
    for replicas in (1, 2, 3):
        out = tmp_path / f"r{replicas}"
        results = run_inprocess(*BINARY, *frozen, f"loop={loop}",
                                f"strategy.cpu_devices={replicas}", out=out)
        assert results["num_replicas"] == replicas
        row = _history(out)[0]
        p_train = _probabilities(out, x_train)
        p_val, p_test = _probabilities(out, x_val), _probabilities(out, x_test)
        train, val = _one_device(y_train, p_train), _one_device(y_val, p_val)
        test = _one_device(y_test, p_test)
        for name in ("accuracy", *STATEFUL):
            assert row[name] == pytest.approx(train[name], abs=1e-6), (replicas, name)
            assert row[f"val_{name}"] == pytest.approx(val[name], abs=1e-6), (replicas, name)
            assert results[f"val_{name}"] == pytest.approx(val[name], abs=1e-7), (replicas, name)
            assert results[f"test_{name}"] == pytest.approx(test[name], abs=1e-7), (replicas, name)
        for y, p, figures in ((y_train, p_train, train), (y_val, p_val, val),
                              (y_test, p_test, test)):
            assert figures["auc"] == pytest.approx(roc_auc_score(y, p), abs=2e-3)
            assert figures["precision"] == pytest.approx(precision_score(y, p > 0.5), abs=1e-7)
            assert figures["recall"] == pytest.approx(recall_score(y, p > 0.5), abs=1e-7)
    assert results["objective"] == "val_accuracy"
    assert {f"epoch_{m}" for m in ("loss", "accuracy", *STATEFUL)} <= _tags(out / "logs" / "train")
    assert {f"epoch_{m}" for m in STATEFUL} <= _tags(out / "logs" / "validation")
    if loop == "custom":  # the 1-replica checkpoint, evaluated on 3 replicas
        evaluated = run_inprocess(*BINARY, *frozen[2:4], "mode=evaluate",
                                  f"ckpt_path={tmp_path / 'r1'}",
                                  "strategy.cpu_devices=3", out=tmp_path / "eval")
        for name in ("loss", "accuracy", *STATEFUL):
            assert evaluated[f"test_{name}"] == pytest.approx(
                json.loads((tmp_path / "r1" / "results.json").read_text())[f"test_{name}"],
                abs=1e-7), name


FIGURES = ("loss", "accuracy", *STATEFUL)


@pytest.mark.slow
@pytest.mark.parametrize("loop, options, stop", [
    ("custom", ("strategy=default",), 5),
    ("keras_fit", ("strategy=default",), 5),
    ("keras_fit", ("strategy.cpu_devices=2",), 4),
    ("custom", ("strategy.cpu_devices=3", "loop.steps_per_loop=2"), 2),  # 4 steps an epoch
], ids=["custom", "keras_fit", "keras_fit-2replicas", "custom-3replicas-steps_per_loop"])
def test_a_binary_run_resumed_mid_epoch_records_the_uninterrupted_rows(
        loop, options, stop, binary_data, run_inprocess, monkeypatch, tmp_path):
    """Stopped (as by SIGTERM) mid-epoch 2 and rerun: every row, train and validation, AUC,
    precision and recall included, is the uninterrupted run's; so are the test figures.
    (loop=keras_fit: fit resets its metrics when the resumed epoch starts, so the checkpoint's
    state is added to the resumed steps'; the real signal in `python run.py` is
    test_reliability's test_sigterm_checkpoints_then_resumes.)"""
    from conftest import stop_at

    args = (*BINARY, f"loop={loop}", *options, "trainer.epochs=2",
            "dataset.batch_size_per_replica=32", "optimizer.learning_rate=0.003",
            "trainer.best_checkpoint.metric=val_auc")
    whole = run_inprocess(*args, out=tmp_path / "a")
    stop_at(monkeypatch, epoch=1, step=stop)
    with pytest.raises(SystemExit) as stopped:
        run_inprocess(*args, out=tmp_path / "b")
    assert stopped.value.code == 128 + signal.SIGTERM
    assert json.loads((tmp_path / "b" / "results.json").read_text())["steps_in_epoch"] == stop
    monkeypatch.undo()
    resumed = run_inprocess(*args, out=tmp_path / "b")

    rows, wanted = _history(tmp_path / "b"), _history(tmp_path / "a")
    assert [r["epoch"] for r in rows] == [1, 2]
    for row, want in zip(rows, wanted, strict=True):
        for key in (*FIGURES, *(f"val_{m}" for m in FIGURES)):
            assert row[key] == pytest.approx(want[key], abs=1e-6), (row["epoch"], key)
    for key in (*(f"test_{m}" for m in FIGURES), "best_value", "best_epoch"):
        assert resumed[key] == pytest.approx(whole[key], abs=1e-6), key


def log_loss(cfg, task):
    """A user's stateful metric that ranks down (Keras' BinaryCrossentropy: its own direction),
    by import path: task.metrics=[..., test_binary_metrics:log_loss]; its [batch] labels shaped
    like the model's [batch, 1] outputs."""
    import tensorflow as tf

    from distlab import Metric
    from distlab.components.tasks import aligned

    def prepare(y, p):  # a Python `if` on a tensor: autograph still converts a user's metric
        y, p = aligned(y, p)
        if tf.reduce_any(p > 1.0):  # never, for the sigmoid model it is used with
            p = tf.sigmoid(p)
        return y, p

    return Metric("log_loss", keras.metrics.BinaryCrossentropy(), prepare=prepare)


@pytest.mark.slow
def test_monitors_and_objective_follow_each_stateful_metric_s_direction(binary_data,
                                                                         run_inprocess, tmp_path):
    """Early stopping and a target on val_auc (up), the best checkpoint on a user's val_log_loss
    (down, Keras' own direction), the objective val_log_loss (minimised); a sigmoid model."""
    out = tmp_path / "run"
    results = run_inprocess(
        *BINARY, "loop=custom", "strategy=default", "model.output_activation=sigmoid",
        "task.metrics=[accuracy,auc,test_binary_metrics:log_loss]", "trainer.epochs=6",
        "optimizer.learning_rate=0.003", "dataset.batch_size_per_replica=32",
        "trainer.early_stopping.metric=val_auc", "trainer.early_stopping.patience=1",
        "trainer.target.metric=val_auc", "trainer.target.value=0.95",
        "trainer.best_checkpoint.metric=val_log_loss", "objective=val_log_loss", out=out)
    rows = _history(out)
    val_auc = [r["val_auc"] for r in rows]
    val_log_loss = [r["val_log_loss"] for r in rows]
    assert len(set(val_log_loss)) > 1 and len(set(val_auc)) > 1
    assert (results["objective"], results["objective_direction"]) == ("val_log_loss", "minimize")
    assert results["test_log_loss"] == pytest.approx(results["test_loss"], rel=1e-4)
    assert results["best_metric"] == "val_log_loss"
    assert results["best_epoch"] == 1 + int(np.argmin(val_log_loss))
    steps = results["best_epoch"] * results["steps_per_epoch"]  # ckpt-<steps taken>
    assert results["best_checkpoint"] == str(out / "checkpoints" / "best" / f"ckpt-{steps}")
    assert (out / "checkpoints" / "best" / f"ckpt-{steps}.index").exists()
    reached = [i + 1 for i, v in enumerate(val_auc) if v >= 0.95]
    assert results["epochs_to_target"] == (reached[0] if reached else None)
    # early stopping on val_auc going up, patience 1: the first epoch that does not beat the best
    best, stop = -1.0, None
    for epoch, value in enumerate(val_auc, 1):
        if value > best:
            best = value
        else:
            stop = epoch
            break
    assert (results.get("stopped_early") or {}).get("epoch") == stop
    assert len(rows) == (stop or 6)


def test_a_registered_metric_is_named_by_its_registered_name():
    import tensorflow as tf
    from conftest import compose_once

    import distlab
    from distlab.components import tasks
    from distlab.config.checks import check_metric_names
    from distlab.registry import METRICS
    from distlab.training.metrics import StatefulMetrics

    @distlab.register("metric", "iou")
    def iou(cfg, task):  # a stateful Keras metric, as the builder returns it
        return keras.metrics.MeanIoU(num_classes=10, sparse_y_pred=False)

    try:
        cfg = compose_once(["task.metrics=[accuracy,iou]"])
        check_metric_names(cfg)
        task = tasks.build(cfg.task)
        assert [(m.name, m.stateful, m.higher_is_better) for m in task.metrics] == [
            ("accuracy", False, True), ("iou", True, True)]
        metrics = StatefulMetrics(task, tf.distribute.get_strategy())
        assert metrics.size == 100  # its 10 x 10 confusion matrix
    finally:
        METRICS._items.pop("iou", None)
        METRICS._origin.pop("iou", None)


def test_a_run_started_before_a_task_key_existed_is_not_refused_on_rerun():
    from conftest import compose_once
    from omegaconf import OmegaConf

    from distlab.config import training_diff

    for task in ("classification", "regression"):
        now = OmegaConf.to_container(compose_once([f"task={task}"]), resolve=True)
        started = OmegaConf.to_container(compose_once([f"task={task}"]), resolve=True)
        del started["task"]["metrics"]  # .distlab/config.yaml of an earlier distlab
        started["task"].pop("label_smoothing", None)  # (classification's, since 0.2.0)
        assert training_diff(started, now) == []
        now["task"]["metrics"] = ["accuracy"] if task == "regression" else ["accuracy", "auc"]
        assert training_diff(started, now) == ["task.metrics"]  # other metrics: a new run


def bare_auc(cfg, task):
    """A user's bare Keras metric, by import path (test_binary_metrics:bare_auc)."""
    return keras.metrics.AUC(num_thresholds=1000)


def test_a_bare_keras_metric_under_binary_sees_probabilities_and_labels_like_them():
    """task=binary feeds a user's bare Keras metric what its built-ins get: a logit model's
    outputs through a sigmoid, float labels of the same [batch, 1] shape."""
    import tensorflow as tf
    from conftest import compose_once

    from distlab.components import tasks

    keras.backend.clear_session()  # as a job starts: Keras names the metric auc, not auc_<n>
    task = tasks.build(compose_once(["task=binary",
                                     "task.metrics=[accuracy,test_binary_metrics:bare_auc]"]
                                    ).task)
    task.from_logits = True  # settled from the model (a logit output)
    metric = task.metrics[1]
    assert metric.stateful and metric.name == "auc"
    y, p = metric.inputs(tf.constant([0, 1]), tf.constant([[0.0], [2.0]]))
    np.testing.assert_allclose(p.numpy(), [[0.5], [1 / (1 + np.exp(-2.0))]], rtol=1e-6)
    assert y.shape == (2, 1) and y.dtype == tf.float32


def test_a_stateful_metric_that_cannot_take_the_outputs_is_one_line_naming_it():
    import tensorflow as tf
    from conftest import compose_once

    from distlab import Metric
    from distlab.components import tasks
    from distlab.errors import DistlabError
    from distlab.training.metrics import StatefulMetrics

    task = tasks.build(compose_once([]).task)  # classification: 10-class outputs
    task.metrics.append(Metric("my_auc", keras.metrics.AUC()))
    ten_classes = (tf.zeros([1], tf.int64), tf.zeros([1, 10]))
    with pytest.raises(DistlabError, match="task metric 'my_auc' \\(AUC\\) cannot take this "
                       "task's labels and model outputs"):
        StatefulMetrics(task, tf.distribute.get_strategy(), sample=lambda: ten_classes)
