"""Any input structure a Keras model takes (one tensor, a tuple, a dict; numbers,
integer ids, strings; variable length), and preprocessing adapted on the training split
(a model builder's own `adapt`, and `dataset.preprocess.standardize`)."""

from __future__ import annotations

import csv
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import user_inputs
from conftest import ROOT, Gated, compose_once, fast_overrides, refusal_in_process, run_cli, stop_at

from distlab.data import pipeline, structure, transforms
from distlab.data.stream import Data, replica_rows
from distlab.errors import DistlabError

USER = ("imports=[user_inputs]", "dataset.preprocess.rescale=null")
# a dict of floats (standardized), a string category (StringLookup in the model) and
# variable-length ids (padded per batch), on 2 replicas
MIXED = (*USER, "dataset.name=mixed_data", "model.name=mixed_net",
         "dataset.preprocess.standardize=true", "strategy.cpu_devices=2",
         "dataset.batch_size_per_replica=16", "trainer.epochs=4", "optimizer.learning_rate=1e-2",
         "deterministic=true", "seed=3", "trainer.export=true", "trainer.checkpoint_every=1")
TEXT = (*USER, "dataset.name=text_data", "model.name=text_net", "strategy.cpu_devices=2",
        "dataset.batch_size_per_replica=16", "trainer.epochs=2", "optimizer.learning_rate=1e-2",
        "deterministic=true", "trainer.export=true")


def _load(*overrides: str, replicas: int = 2) -> Data:
    """The data, unshuffled and (unless overridden) without a validation split held out, so
    that the train stream is the builder's rows in order."""
    cfg = compose_once(["dataset.shuffle_buffer=0", "dataset.validation=null", *overrides]).dataset
    return pipeline.load(cfg, num_replicas=replicas, seed=0, steps_per_epoch=None)


# ---- loading, batching and splitting structures (no training)
def test_user_structures_load_pad_per_batch_and_split_over_replicas():
    data = _load(*USER, "dataset.name=mixed_data", "dataset.batch_size_per_replica=4")
    assert {k: (s.dtype.name, tuple(s.shape), s.name) for k, s in data.input_spec.items()} == {
        "num": ("float32", (3,), "num"), "color": ("string", (), "color"),
        "ids": ("int64", (None,), "ids")}
    assert data.input_shape == {"num": (3,), "color": (), "ids": (None,)}
    x, y = user_inputs.mixed_arrays(256, 0)
    features, labels = next(iter(data.train_epochs(0, 1)))  # unshuffled: the first 8 rows
    longest = max(len(row) for row in x["ids"][:8])
    assert features["ids"].shape == (8, longest)  # padded to this batch's longest row, with 0
    for row, padded in zip(x["ids"][:8], features["ids"].numpy(), strict=True):
        np.testing.assert_array_equal(padded, np.pad(row, (0, longest - len(row))))
    assert features["color"].dtype == tf.string and list(features["color"].numpy()) == [
        c.encode() for c in x["color"][:8]]
    np.testing.assert_array_equal(features["num"], x["num"][:8])
    np.testing.assert_array_equal(labels, y[:8])

    # a validation split held out of structured inputs keeps their structure and dtypes
    held = _load(*USER, "dataset.name=mixed_data", "dataset.validation=0.25")
    assert held.num_train + held.num_validation == 256 and held.num_validation == 64
    assert held.validation.element_spec[0]["color"].dtype == tf.string
    assert sum(int(b[1].shape[0]) for b in held.validation) == 64

    # a short batch of 3 rows over 2 replicas, and of 1 row (a padding row of weight 0)
    for rows, sizes, weights in ((3, [2, 1], [4 / 3, 2 / 3]), (1, [1, 1], [2.0, 0.0])):
        batch = tf.nest.map_structure(lambda t, n=rows: t[:n], (features, labels))
        parts = [replica_rows(batch, tf.constant(k, tf.int64), 2) for k in (0, 1)]
        assert [int(p[2].shape[0]) for p in parts] == sizes
        assert [float(p[2][0]) for p in parts] == pytest.approx(weights)
        assert all(p[0]["ids"].shape[1] == longest for p in parts)  # the batch's padding
        if rows == 3:
            np.testing.assert_array_equal(
                np.concatenate([p[0]["color"].numpy() for p in parts]),
                features["color"].numpy()[:3])

    stream = _load(*USER, "dataset.name=mixed_stream")  # a tf.data.Dataset of (dict, label)
    assert sorted(stream.input_spec) == ["color", "num"]
    pair = _load(*USER, "dataset.name=tuple_data")  # a tuple of inputs: named by position
    assert structure.input_names(pair.input_spec) == ["input_0", "input_1"]
    assert [s.dtype for s in pair.input_spec] == [tf.float32, tf.float32]  # float64 -> 32


def test_input_names_are_those_the_saved_models_signatures_take(caplog, monkeypatch):
    """TensorFlow renames a signature argument that is not a Python name (`0` -> `arg_0`,
    `a/b` -> `a_b`): distlab names inputs so that it keeps them, and refuses two inputs that
    would share one name; the old names still work in dataset.preprocess.inputs (once
    warned)."""
    t = tf.TensorSpec([2], tf.float32)
    assert structure.input_names(t) == ["inputs"]
    assert structure.input_names((t, t)) == ["input_0", "input_1"]
    assert structure.input_names({"a": {"b": t}, "c": (t, (t,))}) == ["a_b", "c_0", "c_1_0"]
    assert structure.input_names({"bill length (mm)": t, "1st": t, "Über": t}) == [
        "input_1st", "bill_length__mm_", "input__ber"]
    with pytest.raises(DistlabError, match="the inputs 'a/b' and 'a_b' would both be named "
                       "'a_b'.*rename one of the dict keys"):
        structure.input_names({"a": {"b": t}, "a_b": t})
    monkeypatch.setattr(transforms, "_WARNED_RENAMED", set())  # this test's own "once"
    for _ in range(2):
        data = _load(*USER, "dataset.name=tuple_data", "dataset.preprocess.rescale=2",
                     "dataset.preprocess.inputs=['1']")
    features, _ = next(iter(data.train_epochs(0, 1)))
    np.testing.assert_allclose(features[1], user_inputs.tuple_arrays()[1][:80] / 2, rtol=1e-6)
    warned = [r.getMessage() for r in caplog.records if "deprecated alias" in r.getMessage()]
    assert len(warned) == 1 and "names '1'" in warned[0] and "now 'input_1'" in warned[0]


def test_preprocess_applies_to_float_inputs_or_the_named_ones():
    x, _ = user_inputs.mixed_arrays(256, 0)
    halved = _load(*USER, "dataset.name=mixed_data", "dataset.preprocess.rescale=2")
    features, _ = next(iter(halved.train_epochs(0, 1)))
    np.testing.assert_allclose(features["num"], x["num"][:128] / 2)
    assert (features["ids"].dtype, features["color"].dtype) == (tf.int64, tf.string)
    named = _load(*USER, "dataset.name=mixed_data", "dataset.preprocess.rescale=2",
                  "dataset.preprocess.inputs=[ids]")
    features, _ = next(iter(named.train_epochs(0, 1)))
    assert features["ids"].dtype == tf.float32 and features["num"].dtype == tf.float32
    np.testing.assert_array_equal(features["num"], x["num"][:128])  # not named: untouched
    text = _load(*USER, "dataset.name=text_data")  # one string input: untouched
    assert text.input_spec.dtype == tf.string and text.input_spec.name == "inputs"


def test_a_rescale_of_float_inputs_warns_that_it_may_be_mnist_s(caplog):
    """dataset.name alone changed keeps mnist's rescale: 255; on float features that is
    almost surely wrong, so distlab says so (and still applies it)."""
    x_train = user_inputs.breast_cancer_split()[0]
    data = _load("dataset.name=raw_breast_cancer", replicas=1)  # mnist's rescale: 255
    features, _ = next(iter(data.train_epochs(0, 1)))
    np.testing.assert_allclose(features[:4], x_train[:4] / 255, rtol=1e-6)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("dataset.preprocess.rescale=255 divides float input(s) inputs" in w
               and "dataset.preprocess.rescale=null" in w for w in warned), warned
    caplog.clear()
    _load(*USER, "dataset.name=raw_breast_cancer", replicas=1)
    assert not [r for r in caplog.records if "rescale" in r.getMessage()]


@pytest.fixture(scope="module")
def reviews_dir(tmp_path_factory) -> Path:
    """A tfds dataset with a text, a float and a variable-length feature."""
    import tensorflow_datasets as tfds

    rng = np.random.default_rng(3)

    def split(n: int) -> tf.data.Dataset:
        stars = rng.uniform(0, 5, n).astype(np.float32)
        tokens = [rng.integers(1, 9, rng.integers(1, 5)) for _ in range(n)]

        def rows():
            for i in range(n):
                yield {"text": f"{'good' if stars[i] > 2.5 else 'bad'} film {i}",
                       "stars": stars[i], "tokens": tokens[i], "label": int(stars[i] > 2.5)}

        return tf.data.Dataset.from_generator(rows, output_signature={
            "text": tf.TensorSpec((), tf.string), "stars": tf.TensorSpec((), tf.float32),
            "tokens": tf.TensorSpec((None,), tf.int64), "label": tf.TensorSpec((), tf.int64)})

    features = tfds.features.FeaturesDict({
        "text": tfds.features.Text(), "stars": tfds.features.Scalar(np.float32),
        "tokens": tfds.features.Sequence(np.int64),
        "label": tfds.features.ClassLabel(num_classes=2)})
    data_dir = tmp_path_factory.mktemp("reviews")
    tfds.dataset_builders.TfDataBuilder(
        name="tiny_reviews", version="1.0.0", features=features, data_dir=str(data_dir),
        split_datasets={"train": split(40), "test": split(16)}).download_and_prepare()
    return data_dir


def test_tfds_feature_list_gives_a_dict_and_the_disk_cache_keeps_it(reviews_dir, tmp_path):
    args = ("dataset.name=tiny_reviews", f"dataset.data_dir={reviews_dir}",
            "dataset.features.input=[text,stars,tokens]", "dataset.features.label=label",
            f"dataset.cache_dir={tmp_path}", "dataset.cache=false",
            "dataset.batch_size_per_replica=8")
    first = _load(*args)  # writes the cache entries
    assert len(list(tmp_path.glob("tiny_reviews-*/distlab-manifest.json"))) == 2
    second = _load(*args)  # reads them back
    assert {k: s.dtype.name for k, s in second.input_spec.items()} == {
        "text": "string", "stars": "float32", "tokens": "int64"}
    assert second.input_shape == {"text": (), "stars": (1,), "tokens": (None,)}
    for a, b in zip(first.train_epochs(0, 1), second.train_epochs(0, 1), strict=True):
        for got, want in zip(tf.nest.flatten(b), tf.nest.flatten(a), strict=True):
            np.testing.assert_array_equal(got, want)
    batch = next(iter(second.test))[0]
    assert batch["text"].numpy()[0].startswith((b"good film", b"bad film"))
    with pytest.raises(DistlabError, match=r"dataset.features.input='nope' is not a feature "
                                           r"of tiny_reviews; its features: label, stars"):
        _load(*args[:2], "dataset.features.input=[text,nope]", "dataset.features.label=label")
    for given in ("label", "[text,label]"):  # the label as an input: refused, named
        with pytest.raises(DistlabError, match=r"^dataset.features.label='label' is also in "
                                               r"dataset.features.input: the model would"):
            _load(*args[:2], f"dataset.features.input={given}", "dataset.features.label=label")


def test_adapted_statistics_are_deterministic_and_follow_a_restore(tmp_path):
    """Same data, same statistics; a checkpoint's restored mean and variance are used once
    `refresh_adapted` ran (Keras keeps a copy made by adapt)."""
    import keras

    from distlab.components import models

    data = _load(*USER, "dataset.name=raw_breast_cancer", "dataset.preprocess.standardize=true")
    a, b = models.standardization(data)["inputs"], models.standardization(data)["inputs"]
    np.testing.assert_array_equal(a.adapt_mean.numpy(), b.adapt_mean.numpy())
    x_train = user_inputs.breast_cancer_split()[0]
    np.testing.assert_allclose(a.adapt_mean.numpy(), x_train.mean(0), rtol=1e-5)
    np.testing.assert_allclose(np.sqrt(a.adapt_variance.numpy()), x_train.std(0), rtol=1e-4)

    def model(layer):
        inputs = keras.Input((30,))
        return keras.Model(inputs, layer(inputs))

    saved = tf.train.Checkpoint(model=model(a)).save(str(tmp_path / "ckpt"))
    other = keras.layers.Normalization()
    other.adapt(x_train[:50] * 3)
    restored = model(other)
    tf.train.Checkpoint(model=restored).restore(saved).assert_existing_objects_matched()
    assert not np.allclose(restored(x_train[:4]), a(x_train[:4]))  # adapt's stale copy
    models.refresh_adapted(restored)
    np.testing.assert_array_equal(restored(x_train[:4]), a(x_train[:4]))


@pytest.mark.parametrize("name, inputs", [
    ("raw_breast_cancer", {"inputs": 30}), ("tuple_data", {"input_0": 2, "input_1": 4}),
    ("dict_floats", {"x": 3, "z": 1}), ("nested_floats", {"a_b": 3, "c": 1})])
def test_standardize_adapts_each_input_of_any_structure(name, inputs):
    """dataset.preprocess.standardize on one tensor, a tuple (it failed: tf.data's map passed
    the tuple's second input as an index), a dict and a nested dict: one Normalization layer
    per input, holding that input's per-feature mean and variance on the training split,
    in front of a model that takes the raw structure."""
    from distlab.components import models

    data = _load(*USER, f"dataset.name={name}", "dataset.preprocess.standardize=true",
                 replicas=1)
    model = models.build_for(compose_once(["model.name=flat_net", *USER]).model, data)
    layers = models.standardization(data)
    assert {k: int(layer.adapt_mean.shape[-1]) for k, layer in layers.items()} == inputs
    rows = [tf.nest.flatten(x) for x, _ in data.train.as_numpy_iterator()]
    for i, (input_name, layer) in enumerate(layers.items()):
        values = np.stack([r[i] for r in rows]).reshape(len(rows), -1)
        np.testing.assert_allclose(layer.adapt_mean.numpy().ravel(), values.mean(0), rtol=1e-4,
                                   atol=1e-5, err_msg=input_name)
        np.testing.assert_allclose(np.sqrt(layer.adapt_variance.numpy().ravel()), values.std(0),
                                   rtol=1e-3, err_msg=input_name)
    batch = next(iter(data.train_inputs(8)))
    assert model(batch).shape == (8, 2)
    assert sum(isinstance(layer, type(next(iter(layers.values()))))
               for layer in model._flatten_layers()) == len(inputs)


def readme_block(marker: str) -> str:
    """The docs' code block that contains `marker`, as pasted."""
    from readme_snippets import block_with

    return block_with(marker).text


@pytest.fixture
def readme_tabular(monkeypatch):
    """The docs' my_tabular snippet (the inputs guide), executed as pasted (its registrations
    undone after the test)."""
    from distlab.registry import DATASETS, MODELS

    for registry in (DATASETS, MODELS):
        monkeypatch.setattr(registry, "_items", dict(registry._items))
        monkeypatch.setattr(registry, "_origin", dict(registry._origin))
    code = readme_block('@distlab.register("model", "my_tabular")')
    assert code.startswith("# my_project/my_tabular.py\nimport keras")
    exec(compile(code, "docs/guides/inputs.md", "exec"), {"__name__": "my_tabular"})
    return ("dataset.name=my_people", "model.name=my_tabular", "dataset.preprocess.rescale=null",
            "dataset.preprocess.standardize=true")


def test_the_readmes_tabular_snippet_builds_on_the_data_it_describes(readme_tabular):
    """A 1-D float column is an input of shape (1,) (it was (), and the snippet's
    Concatenate refused [(None,), (None, 4)]), as the README's line says."""
    from distlab.components import models

    data = _load(*readme_tabular, replicas=1)
    assert structure.describe_inputs(data.raw_input) == "age: float32 (1,), city: string ()"
    guide = (ROOT / "docs" / "guides" / "inputs.md").read_text()
    assert "age: float32 (1,), city: string ()" in guide
    model = models.build_for(compose_once(list(readme_tabular)).model, data)
    assert model(next(iter(data.train_inputs(8)))).shape == (8, 2)


# ---- mistakes: one line naming the key, exit status 2
@pytest.mark.parametrize("overrides,message", [
    (("dataset.features.input=[image,nope]", "dataset.features.label=label"),
     "dataset.features.input='nope' is not a feature of mnist"),
    ((*USER, "dataset.name=mixed_data", "dataset.augment.flip=horizontal"),
     "dataset.augment works on images (one input of shape (height, width, channels)); this "
     "dataset's inputs are color: string (), ids: int64 (None,), num: float32 (3,)"),
    (("imports=[user_inputs]", "dataset.name=text_data"),  # mnist's rescale: 255.0
     "dataset.preprocess.rescale=255.0 cannot apply to this dataset's string input"),
    ((*USER, "dataset.name=text_data", "dataset.preprocess.standardize=true"),
     "dataset.preprocess.standardize=true cannot apply to this dataset's string input"),
    ((*USER, "dataset.name=mixed_data", "dataset.preprocess.inputs=[color]"),
     "dataset.preprocess.inputs names 'color', a string input"),
    ((*USER, "dataset.name=mixed_data", "model=mlp"),
     "model.name=mlp takes one numeric input tensor; this dataset's inputs are color: string"),
    (("dataset.preprocess.standardize=true", "dataset.preprocess.mean=[0.5]"),
     "dataset.preprocess.standardize=true computes the mean and std from the training split: "
     "unset dataset.preprocess.mean"),
    (("imports=[user_inputs]", "task.metrics=[accuracy,user_inputs:not_a_metric]"),
     "task.metrics[1]='user_inputs:not_a_metric': a task's metrics are distlab Metric(name, "
     "per_example) or keras.metrics.Metric objects, not str"),
], ids=["feature", "augment", "string-rescale", "string-standardize", "string-named",
        "builtin-model", "standardize-and-mean", "metric-builder-returns-neither-kind"])
def test_input_mistakes_are_one_line_naming_the_key(overrides, message, run_inprocess,
                                                    tmp_path, caplog):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as stopped:
        run_inprocess(*overrides, out=out)
    assert stopped.value.code == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    error = (json.loads((out / "results.json").read_text())["error"]
             if (out / "results.json").exists() else errors[-1])
    assert message in error and "\n" not in error


@pytest.mark.slow  # a run.py process that starts TensorFlow (the refusal comes after)
def test_a_string_input_with_rescale_exits_2_without_a_traceback(tiny_data_dir, tmp_path):
    out = run_cli("imports=[user_inputs]", "dataset.name=text_data",
                  f"dataset.data_dir={tiny_data_dir}", f"hydra.run.dir={tmp_path}",
                  env={"PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT / "src")])},
                  timeout=180)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stdout + out.stderr
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if "rescale=255.0" in ln]
    assert len(lines) == 1 and "string input" in lines[0]


@pytest.mark.parametrize("case", ["input-structure", "metric-neither-kind",
                                  "validation-fraction", "missing-split", "test-objective",
                                  "test-monitor", "test-best-checkpoint"])
def test_each_listed_mistake_is_one_line_exit_2_before_tensorflow(case, reviews_dir,
                                                                   tiny_data_dir, tmp_path):
    """Input mistakes, run as `python run.py` runs them (in this process): one line
    naming the key, exit status 2, no traceback, refused before distlab's TensorFlow side."""
    args, needle = {
        "input-structure": ((f"dataset.data_dir={reviews_dir}", "dataset.name=tiny_reviews",
                             "dataset.features.input=[text,stars]",
                             "dataset.features.label=label", "model=mlp"),
                            "model.name=mlp takes one numeric input tensor, and "
                            "dataset.features.input=['text', 'stars'] gives a dict of inputs"),
        "metric-neither-kind": (("task.metrics=[accuracy,distlab.registry:BUILTIN_TASKS]",),
                                "task.metrics[1]='distlab.registry:BUILTIN_TASKS' is a tuple, "
                                "not a callable"),
        "validation-fraction": (("dataset.validation=1.5",),
                                "dataset.validation='1.5' is invalid: must be auto, a fraction"),
        "missing-split": ((f"dataset.data_dir={tiny_data_dir}", "dataset.validation=valid"),
                          "dataset.validation='valid' names split 'valid', which mnist does not "
                          "have (its splits: train, test"),
        "test-objective": (("objective=test_accuracy",),
                           "test_* fields are not objectives"),
        "test-monitor": (("trainer.early_stopping.metric=test_accuracy",),
                         "trainer.early_stopping.metric=test_accuracy would choose on the test "
                         "split"),
        "test-best-checkpoint": (("trainer.best_checkpoint.metric=test_loss",),
                                 "trainer.best_checkpoint.metric=test_loss would choose on the "
                                 "test split"),
    }[case]
    assert needle in refusal_in_process(tmp_path, *args)


# ---- training: both loops, 2 replicas, exact resume, serving raw inputs
def _padded(rows: list) -> np.ndarray:
    longest = max(len(r) for r in rows)
    return np.stack([np.pad(r, (0, longest - len(r))) for r in rows]).astype(np.int64)


def raw_test_inputs(kind: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The test split's raw inputs by serving name, as a client sends them (the ids padded
    with 0, strings and floats as they are), and its labels."""
    if kind == "mixed":
        x, y = user_inputs.mixed_arrays(96, 1)
        return {**x, "ids": _padded(x["ids"])}, y
    texts, y = user_inputs.sentences(96, 1)
    return {"inputs": texts}, y


def saved_model_cli_accuracy(run_dir: Path, inputs: dict[str, np.ndarray], labels: np.ndarray,
                             tmp_path: Path) -> float:
    """The accuracy of the logits TensorFlow's own `saved_model_cli run` computes from the
    run's SavedModel (serving_default) on these raw inputs (given as .npy files)."""
    for name, values in inputs.items():
        np.save(tmp_path / f"{name}.npy", values)
    cli = Path(sys.executable).with_name("saved_model_cli")
    out = subprocess.run(
        [str(cli), "run", "--dir", str(run_dir / "saved_model"), "--tag_set", "serve",
         "--signature_def", "serving_default", "--outdir", str(tmp_path / "served"),
         "--inputs", ";".join(f"{name}={tmp_path / name}.npy" for name in inputs)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert out.returncode == 0, out.stderr[-3000:]
    logits = np.load(tmp_path / "served" / "output_0.npy")
    assert logits.shape == (len(labels), 2)
    return float(np.mean(logits.argmax(-1) == labels))


def served_accuracy(run_dir: Path, inputs: dict[str, np.ndarray], labels: np.ndarray) -> float:
    """As saved_model_cli_accuracy, with the SavedModel loaded in this process (the kill
    tests below serve through `saved_model_cli` itself, mixed and text inputs)."""
    signature = tf.saved_model.load(str(run_dir / "saved_model")).signatures["serving_default"]
    logits = signature(**{name: tf.constant(v) for name, v in inputs.items()})["output_0"]
    assert logits.shape == (len(labels), 2)
    return float(np.mean(logits.numpy().argmax(-1) == labels))


# the kill tests' runs: 3 epochs of 10 steps (the data repeated), killed inside epoch 2
KILLED = {("mixed", "keras_fit"), ("text", "custom")}


def _args(kind: str, loop: str) -> tuple[str, ...]:
    """The overrides of the `kind` run in `loop`; the same run (run_once) in every test."""
    base = MIXED if kind == "mixed" else TEXT
    if (kind, loop) not in KILLED:
        return (*base, f"loop={loop}")
    return (*(a for a in base if not a.startswith("trainer.epochs")), f"loop={loop}",
            "trainer.epochs=3", "trainer.steps_per_epoch=10")


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["keras_fit", "custom"])
@pytest.mark.parametrize("kind", ["mixed", "text"])
def test_structured_models_train_in_both_loops_and_serve_raw_inputs(kind, loop, run_once):
    results, run_dir = run_once(*_args(kind, loop))
    assert (results["status"], results["num_replicas"]) == ("completed", 2)
    assert results["export_max_abs_diff"] < 1e-4
    assert results["test_accuracy"] > (0.75 if kind == "mixed" else 0.6)
    served = served_accuracy(run_dir, *raw_test_inputs(kind))
    assert served == pytest.approx(results["test_accuracy"], abs=1e-9)


def _rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "history.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_stopped_mid_epoch_then_rerun_equals_the_uninterrupted_run(run_once, run_inprocess,
                                                                   monkeypatch, tmp_path):
    """Adapted state (StringLookup re-adapted, Normalization restored) resumes exactly."""
    args = _args("mixed", "custom")
    whole, whole_dir = run_once(*args)
    out = tmp_path / "stopped"
    stop_at(monkeypatch, epoch=1, step=3)
    with pytest.raises(SystemExit) as stopped:
        run_inprocess(*args, out=out)
    assert stopped.value.code == 128 + signal.SIGTERM
    monkeypatch.undo()
    prefix = tf.train.latest_checkpoint(str(out / "checkpoints"))
    held_out = _load(*USER, "dataset.name=mixed_data", "dataset.validation=auto")
    rows = held_out.train.map(lambda x, y: x["num"]).batch(256).as_numpy_iterator()
    mean = np.concatenate(list(rows)).mean(0)  # over the training split, validation held out
    saved = [tf.train.load_variable(prefix, name) for name, shape in
             tf.train.list_variables(prefix) if name.startswith("model/") and shape == [3]]
    assert any(np.allclose(v, mean, rtol=1e-5) for v in saved)  # standardize's mean is in it
    resumed = run_inprocess(*args, out=out)
    for row, want in zip(_rows(out), _rows(whole_dir), strict=True):
        for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
            assert float(row[key]) == pytest.approx(float(want[key]), abs=1e-6), (row, key)
    assert resumed["test_loss"] == pytest.approx(whole["test_loss"], abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("kind, loop", [("mixed", "keras_fit"), ("text", "custom")])
def test_killed_mid_epoch_then_rerun_equals_the_uninterrupted_run(kind, loop, run_once,
                                                                  run_inprocess, tiny_data_dir,
                                                                  tmp_path, caplog):
    """kill -9 of a `python run.py` in epoch 2 (after epoch 1's checkpoint, before epoch 2's
    row), then the same run again (in this process: what is under test is the run directory
    the kill left): every history row and the test figures equal the uninterrupted run's
    within 1e-6 (the adapted StringLookup / TextVectorization / Normalization state comes
    back from the checkpoint), and so does the model `saved_model_cli` serves."""
    args = _args(kind, loop)
    whole, whole_dir = run_once(*args)
    run_dir = tmp_path / "killed"
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT / "src")])}
    # killed after step 5 of epoch 2 (10 steps): after epoch 1's checkpoint, before its row
    with Gated([*fast_overrides(tiny_data_dir), *args], run_dir, "step:1:5",
               tmp_path / "gate", env=env) as killed:
        killed.wait()
        killed.signal(signal.SIGKILL)  # no handler, no final checkpoint
        returncode = killed.finish()[0]
    assert returncode == -signal.SIGKILL
    assert len(_rows(run_dir)) == 1  # killed in epoch 2, after epoch 1's checkpoint
    caplog.set_level(logging.INFO, logger="distlab")
    resumed = run_inprocess(*args, out=run_dir)
    assert any(r.getMessage().startswith("resuming from") for r in caplog.records)
    rows, want = _rows(run_dir), _rows(whole_dir)
    assert [r["epoch"] for r in rows] == ["1", "2", "3"]
    for row, expected in zip(rows, want, strict=True):
        for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
            assert float(row[key]) == pytest.approx(float(expected[key]), abs=1e-6), (row, key)
    for key in ("test_loss", "test_accuracy", "val_loss"):
        assert resumed[key] == pytest.approx(whole[key], abs=1e-6), key
    served = saved_model_cli_accuracy(run_dir, *raw_test_inputs(kind), tmp_path)
    assert served == pytest.approx(whole["test_accuracy"], abs=1e-9)


@pytest.mark.slow
def test_standardize_reaches_the_accuracy_of_pasted_statistics(run_inprocess):
    x_train = user_inputs.breast_cancer_split()[0].astype(np.float64)
    listed = {k: "[" + ",".join(f"{v:.9g}" for v in values) + "]"
              for k, values in (("mean", x_train.mean(0)), ("std", x_train.std(0)))}
    common = (*USER, "dataset.name=raw_breast_cancer", "model=mlp", "model.hidden_units=[32]",
              "strategy=default", "dataset.batch_size_per_replica=32", "trainer.epochs=10",
              "optimizer.learning_rate=3e-3", "deterministic=true", "trainer.validate_every=0")
    learned = run_inprocess(*common, "dataset.preprocess.standardize=true")
    pasted = run_inprocess(*common, *(f"dataset.preprocess.{k}={v}" for k, v in listed.items()))
    assert pasted["test_accuracy"] > 0.9
    assert learned["test_accuracy"] == pytest.approx(pasted["test_accuracy"], abs=0.005)


@pytest.mark.slow
def test_the_readmes_tabular_snippet_trains_and_serves(readme_tabular, run_inprocess, tmp_path):
    run_dir = tmp_path / "run"
    results = run_inprocess(*readme_tabular, "strategy=default", "trainer.epochs=8",
                            "optimizer.learning_rate=0.02", "trainer.export=true", out=run_dir)
    assert results["test_accuracy"] > 0.8  # (age > 50) xor (city == "Oslo"): both inputs count
    signature = tf.saved_model.load(str(run_dir / "saved_model")).signatures["serving_default"]
    logits = signature(age=tf.constant([[30.0], [70.0]]), city=tf.constant(["Oslo", "Oslo"]))
    assert logits["output_0"].shape == (2, 2)


def test_the_docs_say_a_lookup_vocabulary_is_adapted_again_not_checkpointed(tmp_path):
    """TensorFlow checkpoints a StringLookup's vocabulary as an empty `token_counts` table, so
    it is adapted again at every start: the example projects' READMEs say so, as distlab's
    does, and none says the vocabulary is in every checkpoint."""
    import keras

    lookup = keras.layers.StringLookup()
    lookup.adapt(["small", "huge", "huge"])
    prefix = tf.train.Checkpoint(layer=lookup).save(str(tmp_path / "ckpt"))
    tables = {name: shape for name, shape in tf.train.list_variables(prefix)
              if "token_counts" in name}
    assert tables and all(shape == [0] for shape in tables.values()), tables
    from readme_snippets import DOCS

    readmes = DOCS
    for readme in readmes:
        text = " ".join(readme.read_text().split())
        claims = [s for s in text.split(". ") if "vocabular" in s and "every checkpoint" in s]
        assert not claims, (readme, claims)
        if "vocabular" in text and "examples" in readme.relative_to(ROOT).parts:
            assert "not in the checkpoints" in text and "adapt it again" in text, readme
