"""Hydra composition of every group option, schema type checks and value validation."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, compose_once, refusal_in_process, run_command
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ValidationError

from distlab.config import validate
from distlab.config.checks import flatten
from distlab.config.schema import Config
from distlab.config.store import schema_names
from distlab.errors import ConfigError

GROUPS = ["strategy", "dataset", "model", "task", "optimizer", "schedule", "loop", "logger",
          "experiment", "hparams_search"]
# options that only compose with another choice
NEEDS: dict[tuple[str, str], list[str]] = {}


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in _options(g)])
def test_every_option_composes_and_validates(group, option):
    from distlab.registry import REGISTRIES

    cfg = compose_once([f"{group}={option}", *NEEDS.get((group, option), [])])
    validate(cfg)
    if group not in ("experiment", "hparams_search"):
        assert cfg[group].name  # every group node names its registry entry
    if group in REGISTRIES and group != "dataset":  # (dataset: tfds names) a builder that imports
        name = cfg[group].name
        assert name in REGISTRIES[group], f"{group}={option} names unregistered {name!r}"
        assert callable(REGISTRIES[group].get(name))
    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)


SCHEMA_GROUPS = [g for g in GROUPS if g not in ("experiment", "hparams_search")]  # presets


def _stated_defaults(path: Path, base: DictConfig) -> list[str]:
    """The keys the YAML at `path` sets to the value they have without it (in `base`)."""
    stated = flatten(OmegaConf.to_container(OmegaConf.load(path)))
    before = flatten(OmegaConf.to_container(base))  # a missing value: "???"
    return [f"{key}: {value}" for key, value in stated.items()
            if key != "defaults" and key in before and before[key] == value]


def _base(group: str, option: str) -> DictConfig:
    """What the option's YAML extends: its schema, or another option of its group."""
    defaults = OmegaConf.load(ROOT / "conf" / group / f"{option}.yaml").get("defaults", [])
    extends = [d for d in defaults if d != "_self_"]
    assert len(extends) == 1 and isinstance(extends[0], str), (group, option, defaults)
    name = extends[0].lstrip("/").removesuffix("@_here_")
    if name.startswith("schema_"):
        return OmegaConf.structured(schema_names()[name])
    values = OmegaConf.load(ROOT / "conf" / group / f"{name}.yaml")
    values.pop("defaults", None)
    return OmegaConf.merge(_base(group, name), values)


@pytest.mark.parametrize("group,option", [(g, o) for g in SCHEMA_GROUPS for o in _options(g)])
def test_a_group_option_states_only_what_differs_from_its_schema(group, option):
    # defaults live in distlab.config.schema alone; experiment presets may restate them
    path = ROOT / "conf" / group / f"{option}.yaml"
    restated = _stated_defaults(path, _base(group, option))
    assert not restated, f"conf/{group}/{option}.yaml restates its schema's defaults: {restated}"


def test_config_yaml_states_no_default_of_the_schema():
    assert not _stated_defaults(ROOT / "conf" / "config.yaml", OmegaConf.structured(Config))


def test_defaults_are_the_first_reference_workload():
    cfg = compose_once([])
    assert (cfg.loop.name, cfg.dataset.name, cfg.strategy.name) == ("keras_fit", "mnist",
                                                                     "mirrored")
    assert cfg.trainer.epochs == 12 and cfg.dataset.batch_size_per_replica == 64
    # model=mnist_cnn is the cnn schema's defaults: the tutorial's Conv32-MaxPool-Dense64
    assert (list(cfg.model.conv_filters), list(cfg.model.dense_units)) == ([32], [64])
    assert cfg.model.output_activation is None and cfg.model.l2 == 0
    assert (cfg.deterministic, cfg.mode, cfg.ckpt_path) == (False, "train", None)
    assert list(cfg.schedule.boundaries) == [3, 7]


def test_every_registered_builder_imports():
    """(each group option's registered builder: test_every_option_composes_and_validates)"""
    from distlab.registry import REGISTRIES

    assert all(g in GROUPS for g in REGISTRIES if (ROOT / "conf" / g).is_dir())
    for registry in REGISTRIES.values():
        for name in registry.names():  # every built-in import path resolves
            assert callable(registry.get(name)), name


def test_presets():
    fit = compose_once(["experiment=tutorial_keras_mnist"])
    assert (fit.loop.name, fit.dataset.name, fit.trainer.epochs) == ("keras_fit", "mnist", 12)
    assert fit.schedule.name == "step_decay" and list(fit.schedule.factors) == [1.0, 0.1, 0.01]
    tuned = compose_once(["experiment=tutorial_keras_mnist_tuned"])
    assert (tuned.loop.name, tuned.loop.steps_per_loop, tuned.strategy.name) == (
        "custom", 50, "default")
    assert list(tuned.schedule.boundaries) == [3, 7] and tuned.trainer.validate_every == 0
    custom = compose_once(["experiment=tutorial_custom_fashion"])
    assert (custom.loop.name, custom.dataset.name, custom.trainer.epochs) == (
        "custom", "fashion_mnist", 10)
    assert custom.trainer.checkpoint_every == 2 and custom.strategy.name == "mirrored"
    assert list(custom.model.conv_filters) == [32, 64]
    assert custom.model.output_activation == "softmax"
    assert custom.dataset.batch_size_per_replica == 64 and custom.optimizer.name == "adam"
    for fast, tutorial in (("mnist_fast", fit), ("fashion_fast", custom)):  # time to accuracy
        cfg = compose_once([f"experiment={fast}"])
        assert cfg.model == tutorial.model and cfg.dataset.name == tutorial.dataset.name
        assert cfg.dataset.validation == "auto" and cfg.strategy.name == "default"
        assert cfg.trainer.test_every == 0 and not cfg.trainer.export
        assert (cfg.loop.name, cfg.loop.steps_per_loop) == ("custom", 50)
    # bfloat16 where the CPU computes it natively (section 26); the MNIST presets as chosen
    assert [compose_once([f"experiment={p}"]).precision for p in (
        "fashion_fast", "mnist_fast", "tutorial_keras_mnist_tuned")] == ["auto", "float32",
                                                                         "float32"]


PINNED = {"tutorial_keras_mnist": ["strategy", "dataset", "model", "optimizer", "schedule",
                                   "loop"]}
for _preset in ("tutorial_custom_fashion", "tutorial_keras_mnist_tuned", "mnist_fast",
                "fashion_fast"):
    PINNED[_preset] = PINNED["tutorial_keras_mnist"]


@pytest.mark.parametrize("preset,group", [(p, g) for p, groups in PINNED.items()
                                          for g in groups])
def test_a_preset_choice_can_be_overridden_group_by_group(preset, group):
    """The preset pins the group's option; another option on the command line replaces it
    (each option itself composes and validates: test_every_option_composes_and_validates)."""
    chosen = compose_once([f"experiment={preset}"])[group].name
    option, name = next((o, n) for o in _options(group)  # (each composed once per process)
                        if (n := compose_once([f"{group}={o}"])[group].name) != chosen)
    cfg = compose_once([f"experiment={preset}", f"{group}={option}",
                        *NEEDS.get((group, option), [])])
    validate(cfg)
    assert cfg[group].name == name != chosen


def test_wrong_type_is_rejected_by_the_schema():
    with pytest.raises((ConfigCompositionException, ValidationError)) as e:
        compose_once(["trainer.epochs=abc"])
    assert "trainer.epochs" in str(e.value) or "trainer.epochs" in str(e.value.__cause__)


def test_unknown_key_is_rejected():
    with pytest.raises(ConfigCompositionException):
        compose_once(["optimizer.lr=0.1"])


@pytest.mark.parametrize("override,key", [
    ("dataset.batch_size_per_replica=0", "dataset.batch_size_per_replica"),
    ("trainer.epochs=-1", "trainer.epochs"),
    ("optimizer.learning_rate=-0.1", "optimizer.learning_rate"),
    ("optimizer.lr_scaling=cubic", "optimizer.lr_scaling"),
    ("strategy.cpu_devices=0", "strategy.cpu_devices"),
    ("trainer.checkpoint_every=0", "trainer.checkpoint_every"),
    ("schedule.boundaries=[7,3]", "schedule.boundaries"),
    ("mode=serve", "mode"),
    ("seed=-5", "seed"),
    ("seed=99999999999999", "seed"),
    ("objective=nope", "objective"),
    ("loop.jit_compile=true strategy.cpu_devices=2", "loop.jit_compile"),
    # TF gives each CPU-only worker one replica (it was silently ignored)
    ("strategy=multi_worker_mirrored strategy.cpu_devices=2", "strategy.cpu_devices=2 does not"),
    ("precision=float8", "precision"),
    ("trainer.grad_accum_steps=0", "trainer.grad_accum_steps"),
    ("trainer.profile_steps=[5,2]", "trainer.profile_steps"),
    ("trainer.profile_steps=[5]", "trainer.profile_steps"),
    ("trainer.early_stopping.patience=0", "trainer.early_stopping.patience"),
    ("trainer.early_stopping.mode=up", "trainer.early_stopping.mode"),
    ("trainer.target.metric=val_accuracy", "trainer.target"),  # a metric needs a value
    ("trainer.throughput.windows=0", "trainer.throughput.windows"),
])
def test_impossible_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(compose_once(override.split()))


def test_evaluate_needs_ckpt_path():
    with pytest.raises(ConfigError, match="ckpt_path"):
        validate(compose_once(["mode=evaluate"]))


def test_cfg_job_imports_no_tensorflow():
    out, tensorflow = run_command("--cfg", "job")
    assert out.returncode == 0 and not tensorflow, out.stdout + out.stderr
    assert "batch_size_per_replica" in out.stdout


def test_help_lists_the_option_groups_and_no_internal_schema():
    out = subprocess.run([sys.executable, "run.py", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    groups = out.stdout.split("== Config ==")[0]
    assert "task: binary, classification, regression" in groups and "model: " in groups, out.stdout
    assert "schema" not in groups


def test_help_into_a_closed_pipe_ends_without_a_traceback():
    """`python run.py --help | head -1`: the reader gone before the help is written (here a
    pipe whose read end is closed from the start) ends the command quietly."""
    read, write = os.pipe()
    os.close(read)
    try:
        out = subprocess.run([sys.executable, "run.py", "--help"], cwd=ROOT, stdout=write,
                             stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write)
    assert out.returncode == 1 and out.stderr == "", out.stderr[-2000:]


@pytest.mark.parametrize("args,needle", [
    (["trainer.epochs=abc"], "trainer.epochs"),
    (["dataset.batch_size_per_replica=0"], "dataset.batch_size_per_replica"),
    (["loop=nope"], "keras_fit"),  # the unknown option's message lists the valid ones
    (["strategy=nope"], "mirrored"),
])
def test_cli_bad_input_is_one_clear_message(args, needle, tmp_path):
    """As `python run.py ARGS` refuses it, in this process (refusal_in_process: exit status 2
    and before distlab's TensorFlow side, for a refusal of distlab's); the command's own
    process, a composition and a validation error: test_config_refusals_and_directions.py's
    test_bad_values_are_one_line_before_tensorflow."""
    error = refusal_in_process(tmp_path / "run", *args)
    assert needle in error, error
    assert "Traceback" not in error and "\n" not in error, error


@pytest.mark.parametrize("args, needle", [
    # Hydra's own advice for a key it does not know is `+key=...`, which adds it unread
    (["+task.label_smothing=0.1"], "task.label_smothing is not a key of task (name: "
     "classification) and no interpolation uses it, so nothing would read it: did you mean "
     "task.label_smoothing?"),
    (["task=binary", "+task.top_k=3"], "task.top_k is not a key of task (name: binary)"),
    (["+trainer.target.metrc=val_accuracy"], "did you mean trainer.target.metric?"),
    (["+dataset.bogus=1"], "dataset.bogus is not a key of dataset (name: mnist)"),
    (["model=mlp", "+model.widht=3"], "model.widht is not a key of model (name: mlp)"),
    # a key of another group: that key, not a sibling with a close name (steps_per_epoch)
    (["+trainer.steps_per_execution=4"], "did you mean loop.steps_per_execution?"),
    (["+model.hidden_units=[8]"], "nothing would read it: it is a key of model=mlp; remove it"),
])
def test_a_key_added_where_nothing_reads_it_is_refused(args, needle, tmp_path):
    error = refusal_in_process(tmp_path / "run", *args)
    assert needle in error, error
    assert ("did you mean" in needle) == ("did you mean" in error), error  # siblings only


@pytest.mark.parametrize("args, needle", [
    (["trainer.steps_per_execution=4"],
     "trainer.steps_per_execution is not a key of trainer: did you mean "
     "loop.steps_per_execution?"),
    (["loop=custom", "loop.epochs=4"], "loop.epochs is not a key of loop: did you mean "
     "trainer.epochs?"),
    (["trainer.early_stopping.metrc=val_loss"], "did you mean trainer.early_stopping.metric?"),
    (["dataset.augment.flp=horizontal"], "did you mean dataset.augment.flip?"),
    # the first part no node has, not the whole key
    (["trainer.earlystop.metric=val_loss"], "trainer.earlystop is not a key of trainer: did "
     "you mean trainer.early_stopping?"),
    (["model.kwargs.alpha=0.5"], "model.kwargs is not a key of model: it is a key of "
     "model=keras_applications"),
    (["model=mlp", "model.widht=3"], "model.widht is not a key of model ("),
    # a key of the group's other option: that option
    (["model.hidden_units=[8]"], "model.hidden_units is not a key of model: it is a key of "
     "model=mlp ("),
    (["foo.bar=1"], "To append to your config use +foo.bar=1"),  # a top-level key of one's own
])
def test_an_unknown_key_of_distlabs_gets_the_key_it_likely_meant_not_hydras_plus(args, needle,
                                                                                  tmp_path):
    """Hydra's advice for a key its schema lacks is `+key=...`, which distlab then refuses as
    read by nothing: for distlab's own nodes, the line names the key meant instead."""
    error = refusal_in_process(tmp_path / "run", *args)
    assert needle in error, error
    assert ("To append" in needle) == ("To append" in error), error


def test_keys_of_ones_own_are_left_alone():
    """A top-level value to interpolate, a Keras application's constructor arguments
    (model.kwargs, a mapping), a callback's arguments: read by the user's code or Keras."""
    from distlab.config.checks import check_unknown_keys

    check_unknown_keys(compose_once([
        "+my_units=16", "model=mlp", "model.hidden_units=[${my_units}]",
        "+callbacks.csv._target_=keras.callbacks.CSVLogger", "+callbacks.csv.filename=h.csv"]))
    check_unknown_keys(compose_once(["model=keras_applications", "+model.kwargs.alpha=0.35"]))
    # a helper key of one's own inside a group, read by an interpolation (absolute, relative)
    check_unknown_keys(compose_once(["model=mlp", "+model.rate=0.2",
                                     "model.dropout=${model.rate}"]))
    check_unknown_keys(compose_once(["model=mlp", "+model.width=8",
                                     "model.hidden_units=[${..width},${..width}]"]))


def test_a_rerun_holds_to_what_trained_not_to_keys_nothing_read():
    """A run dir's config from an earlier distlab: a key it lacks is at its default (what it
    trained with), and a key no schema declares (added with + before they were refused, read
    by nothing) is no difference."""
    from omegaconf import OmegaConf

    from distlab.config import training_diff

    now = OmegaConf.to_container(compose_once(["model=mlp"]), resolve=True)
    started = OmegaConf.to_container(compose_once(["model=mlp"]), resolve=True)
    del started["trainer"]["grad_accum_steps"], started["deterministic"]
    started["task"]["topk"] = 3
    assert training_diff(started, now) == []
    now["trainer"]["grad_accum_steps"] = 2
    assert training_diff(started, now) == ["trainer.grad_accum_steps"]


def test_a_rerun_may_start_its_workers_another_way():
    """Local workers, then Ray actors at an address (docs/guides/distribution.md): the same
    training, so the rerun resumes; another worker count under a launcher is the cluster's
    (its checkpoint's) business, as with hand-written TF_CONFIG."""
    from omegaconf import OmegaConf

    from distlab.config import training_diff

    def composed(*overrides: str) -> dict:
        return OmegaConf.to_container(compose_once(["strategy=multi_worker_mirrored",
                                                    *overrides]), resolve=True)

    local = composed("strategy.workers=2")
    on_ray = composed("strategy.workers=2", "strategy.launcher=ray",
                      "strategy.ray.address=10.0.0.1:6379", "strategy.ray.placement=pack")
    assert training_diff(local, on_ray) == [] == training_diff(on_ray, local)
    assert training_diff(local, composed("strategy.workers=3")) == []
    assert training_diff(local, composed("strategy.workers=2", "seed=1")) == ["seed"]


def test_unknown_option_names_the_group(tmp_path):
    error = refusal_in_process(tmp_path / "run", "loop=nope")  # as the command's stderr
    assert "loop" in error and "custom" in error and "keras_fit" in error, error


def test_config_files_exist_for_design_groups():
    for group, needed in {"strategy": {"default", "one_device", "mirrored"},
                          "dataset": {"mnist", "fashion_mnist"},
                          "optimizer": {"adam", "sgd", "rmsprop"},
                          "schedule": {"constant", "step_decay", "cosine", "exponential"},
                          "loop": {"keras_fit", "custom"}}.items():
        assert needed <= set(_options(group)), group
    assert Path(ROOT / "conf" / "config.yaml").exists()


@pytest.mark.parametrize("project,preset", [("examples/tabular_project", "digits"),
                                            ("examples/text_project", "reviews"),
                                            ("examples/plugin_package/distlab_moons", "moons")])
def test_a_user_dataset_yaml_takes_common_keys_without_plus(project, preset):
    """A user dataset (its own schema, checked after its module is imported) lists
    /schema_dataset_common: every common key overrides plainly; a typo is still refused."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import ConfigCompositionException

    from distlab.config.store import register_configs

    register_configs()
    conf = ROOT / project / "conf"
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = hydra_compose("config", overrides=[
            f"hydra.searchpath=[file://{conf}]", f"dataset={preset}", "dataset.validation=null",
            "dataset.validation_seed=3", "dataset.cache=false"])
        assert (cfg.dataset.name, cfg.dataset.validation, cfg.dataset.validation_seed,
                cfg.dataset.cache) == (preset, None, 3, False)
        with pytest.raises(ConfigCompositionException, match="dataset.validatoin"):
            hydra_compose("config", overrides=[f"hydra.searchpath=[file://{conf}]",
                                               f"dataset={preset}", "dataset.validatoin=null"])


def test_the_suites_composition_shortcuts_compose_as_hydra_does(tmp_path, monkeypatch):
    """tests/composition.py (installed for the whole suite on the versions it checked): an
    option of every group, a preset, a user's search path, a YAML the test rewrites, a node
    the ConfigStore is given again or has replaced, choices by interpolation, a primary
    config without `_self_` and a package Hydra cannot import compose to the same configs,
    with the same warnings, without it and with it, again with other values (its kept
    defaults); a broken YAML fails alike, and the shared ConfigStore is left as it was."""
    import copy
    import dataclasses
    import warnings

    import composition
    from conftest import compose
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.config_store import ConfigStore

    assert composition.installed() == composition.CHECKED
    conf = tmp_path / "conf" / "dataset"
    conf.mkdir(parents=True)
    own = conf / "own.yaml"
    (tmp_path / "bare" / "db").mkdir(parents=True)
    (tmp_path / "bare" / "db" / "a.yaml").write_text("x: 1\n")
    (tmp_path / "bare" / "db" / "b.yaml").write_text("x: 2\n")
    (tmp_path / "bare" / "config.yaml").write_text("defaults:\n  - db: a\nseed: 1\n")
    (tmp_path / "bare" / "chosen.yaml").write_text("defaults:\n  - db: ${oc.env:PROBE_DB}\n"
                                                   "  - _self_\n")
    cases = [[f"{group}={_options(group)[-1]}", *NEEDS.get((group, _options(group)[-1]), [])]
             for group in GROUPS]
    cases += [["experiment=tutorial_custom_fashion", "trainer.epochs=3"],
              [f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "dataset=own"]]

    def bare(*overrides: str, name: str = "config") -> str:  # config.yaml: without _self_
        with initialize_config_dir(str(tmp_path / "bare"), version_base="1.3"):
            return OmegaConf.to_yaml(hydra_compose(name, overrides=list(overrides)))

    def composed() -> list[str]:
        texts = []
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            for buffer in (8, 16):  # the same file, rewritten: composed from what it says now
                own.write_text(f"defaults:\n  - mnist\n  - _self_\nshuffle_buffer: {buffer}\n")
                for values in ([], ["trainer.epochs=5", "~seed"]):  # then other values
                    texts += [OmegaConf.to_yaml(compose([*case, *values]))
                              for case in cases[-1 if texts else 0:]]
            store = ConfigStore.instance()
            for units in ([3], [5]):  # a node stored again: composed from what it holds now
                store.store(group="probe_units", name="some", node={"hidden_units": units})
                texts.append(OmegaConf.to_yaml(compose(["model=mlp", "+probe_units@model=some"])))
            node = store.repo["probe_units"]["some.yaml"]  # replaced without store()
            store.repo["probe_units"]["some.yaml"] = dataclasses.replace(
                node, node=OmegaConf.create({"hidden_units": [7]}))
            texts.append(OmegaConf.to_yaml(compose(["model=mlp", "+probe_units@model=some"])))
            del store.repo["probe_units"]
            for model in ("mlp", "mnist_cnn"):  # chosen by an interpolation, each time anew
                monkeypatch.setenv("PROBE_MODEL", model)
                texts.append(OmegaConf.to_yaml(compose(["model=${oc.env:PROBE_MODEL}"])))
            for db in ("a", "b"):  # chosen by an interpolation in a defaults list
                monkeypatch.setenv("PROBE_DB", db)
                texts.append(bare(name="chosen"))
            texts += [bare(), bare("seed=2"), OmegaConf.to_yaml(compose(
                ["hydra.searchpath=[pkg://no_such_package_of_configs]", "seed=3"]))]
            own.write_text("defaults:\n  - mnist\nshuffle_buffer: [\n")
            with pytest.raises(Exception) as broken:
                compose(cases[-1])
        return [*texts, f"{type(broken.value).__name__}: {broken.value}",
                "\n".join(f"{w.category.__name__}: {w.message}" for w in warned)]

    with composition.as_released():
        assert not composition.installed()
        released = composed()
    assert composition.installed() == composition.CHECKED
    store = copy.deepcopy(ConfigStore.instance().repo)  # (with what plug-ins registered)
    shortened = composed()
    assert shortened == released
    assert ConfigStore.instance().repo == store
    assert "shuffle_buffer: 8" in shortened[-15] and "shuffle_buffer: 16" in shortened[-13]
    assert "epochs: 5" in shortened[-13] and "\nseed:" not in shortened[-13]
    units = [t[t.index("hidden_units:"):].split("\n")[1] for t in shortened[-12:-9]]
    assert units == ["  - 3", "  - 5", "  - 7"]
    assert "name: mlp" in shortened[-9] and "name: cnn" in shortened[-8]
    assert "x: 1" in shortened[-7] and "x: 2" in shortened[-6]
    assert "seed: 1" in shortened[-5] and "seed: 2" in shortened[-4]
    assert "seed: 3" in shortened[-3]
    assert shortened[-1].count("is missing `_self_`") == 2, shortened[-1]
    assert "no_such_package_of_configs" in shortened[-1]
    assert str(own) in shortened[-2]
