"""`validate(cfg)`: the value rules of the schema's fields, then the rules that relate several
keys, each refusal one line naming the key (a ConfigError). Never imports TensorFlow."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from distlab.config.figures import check_objective, check_task_metrics, check_watched
from distlab.config.schema import GROUP_SCHEMAS, INT_LIMIT, SEED, Config, Rule
from distlab.errors import ConfigError, DistlabError, composition_error
from distlab.records.metrics import BUILTIN_METRICS, builtin_task_metrics
from distlab.records.run_dir import pattern_problem

JIT_ON_LOGICAL_CPUS = (
    "loop.jit_compile=true cannot run on several logical CPU devices (strategy.cpu_devices>1): "
    "XLA compiles for the one physical CPU and cannot reach the other replicas' variables. "
    "Use jit_compile with one CPU replica (strategy=default or strategy.cpu_devices=1) or "
    "on GPUs, or set loop.jit_compile=false")


def check(key: str, value: Any, rule: Rule) -> None:
    """Raise ConfigError("<key>=<value> is invalid: <why>") unless `value` follows `rule`."""
    ok, why = rule
    try:
        valid = ok(value)
    except (TypeError, AttributeError):  # a value of another kind (a list for a split name)
        valid, why = False, f"{why} (got a {_kind(value)})"
    if not valid:
        raise ConfigError(f"{key}={_show(value)} is invalid: {why}")


def _rules(schema: type = Config, prefix: str = "") -> dict[str, Rule | None]:
    """Dotted key -> rule (None: any value) of every field of `schema` and of the dataclasses
    under it, in the composed config's order. A group's keys come from each of its options'
    schemas: a key they share (model.l2) must have the same rule in each."""
    rules: dict[str, Rule | None] = {}
    for f in dataclasses.fields(schema):
        key = prefix + f.name
        nested = [f.default_factory] if dataclasses.is_dataclass(f.default_factory) else []
        if not prefix and f.name in GROUP_SCHEMAS:
            nested = list(GROUP_SCHEMAS[f.name].values())
        found = [{key: f.metadata.get("rule")}] if not nested else []
        found += [_rules(node, f"{key}.") for node in nested]  # trainer.target, model, ...
        for more in found:
            for k, rule in more.items():
                if rules.setdefault(k, rule) is not rule:
                    raise TypeError(f"{k}: the schemas of its options give it different rules")
    return rules


RULES: dict[str, Rule] = {key: rule for key, rule in _rules().items() if rule is not None}


def check_objective_needs(cfg: DictConfig) -> None:
    """Refuse, in one line, an objective whose field the run cannot write: best_value
    without checkpoints/best, epochs_to_target or time_to_target_s without trainer.target."""
    objective = cfg.get("objective")
    best = cfg.trainer.best_checkpoint
    # (with dataset.validation=null the examples watch a training figure, as they must)
    watched = "val_" if OmegaConf.select(cfg, "dataset.validation", default="auto") else ""
    to_target = ("trainer.target", cfg.trainer.target.metric,
                 f"trainer.target.metric={watched}accuracy trainer.target.value=0.9")
    needs = {"best_value": ("checkpoints/best", best.metric or cfg.trainer.early_stopping.metric,
                            f"trainer.best_checkpoint.metric={watched}loss"),
             "epochs_to_target": to_target, "time_to_target_s": to_target}
    if objective in needs and needs[objective][1] is None:
        what, _, example = needs[objective]
        raise ConfigError(f"objective={objective} needs {what}, and none is configured: set "
                          f"it (e.g. {example}) or choose another objective")


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError naming the first impossible value. Never imports TensorFlow."""
    _check_int_range(cfg)
    for key, rule in RULES.items():
        value = OmegaConf.select(cfg, key, default=None)
        if value is not None and _distlab_option(cfg, key):
            check(key, value, rule)
    boundaries = OmegaConf.select(cfg, "schedule.boundaries", default=None)
    factors = OmegaConf.select(cfg, "schedule.factors", default=None)
    if boundaries is not None and factors is not None and len(factors) != len(boundaries) + 1:
        raise ConfigError(
            f"schedule.factors has {len(factors)} entries but schedule.boundaries has "
            f"{len(boundaries)}: give one factor more than boundaries"
        )
    # the runner refuses it again once the strategy's replicas are known (a user's strategy
    # over several logical CPUs, or a strategy passed in)
    preprocess = OmegaConf.select(cfg, "dataset.preprocess", default=None)
    if preprocess is not None and preprocess.get("standardize"):
        given = [k for k in ("mean", "std") if preprocess.get(k) is not None]
        if given:
            raise ConfigError(
                f"dataset.preprocess.standardize=true computes the mean and std from the "
                f"training split: unset dataset.preprocess.{given[0]} (or set standardize "
                "to false)")
    cpu_devices = OmegaConf.select(cfg, "strategy.cpu_devices") or 1
    if cpu_devices > 1 and OmegaConf.select(cfg, "strategy.name") == "multi_worker_mirrored":
        raise ConfigError(
            f"strategy.cpu_devices={cpu_devices} does not apply to "
            "strategy=multi_worker_mirrored: without GPUs TensorFlow's "
            "MultiWorkerMirroredStrategy gives each worker one replica, on its CPU. Start one "
            "worker per replica, or use strategy=mirrored strategy.cpu_devices="
            f"{cpu_devices} on one machine")
    _check_workers(cfg)
    if cfg.loop.jit_compile and cpu_devices > 1:
        raise ConfigError(JIT_ON_LOGICAL_CPUS)
    target = cfg.trainer.target
    if (target.metric is None) != (target.value is None):
        raise ConfigError("trainer.target needs both metric and value (e.g. "
                          "trainer.target.metric=val_accuracy trainer.target.value=0.99), or "
                          "neither")
    best = cfg.trainer.best_checkpoint
    if best.test and best.metric is None and cfg.trainer.early_stopping.metric is None:
        raise ConfigError("trainer.best_checkpoint.test=true scores checkpoints/best, which "
                          "exists only with trainer.best_checkpoint.metric (or "
                          "trainer.early_stopping.metric) set, e.g. "
                          "trainer.best_checkpoint.metric=val_loss")
    check_objective_needs(cfg)
    if cfg.mode == "evaluate" and not cfg.ckpt_path:
        raise ConfigError("mode=evaluate needs ckpt_path=<run dir or checkpoint prefix>")
    if cfg.mode == "train" and cfg.ckpt_path:
        raise ConfigError(f"ckpt_path={cfg.ckpt_path} is read by mode=evaluate only: a "
                          "training run resumes from its own run dir's checkpoints/ (rerun "
                          "into that dir); remove ckpt_path, or add mode=evaluate")
    for key in ("ckpt_path", "dataset.cache_dir"):
        path = OmegaConf.select(cfg, key, default=None)
        if problem := pattern_problem(path):
            raise ConfigError(f"{key}={path} {problem}")
    data_dir = OmegaConf.select(cfg, "dataset.data_dir", default=None)
    if pattern_problem(data_dir):
        raise ConfigError(f"dataset.data_dir={data_dir} has one of [ ] * ? in its path, which "
                          "tfds reads as a file pattern when it looks for the prepared "
                          "dataset: choose (or link) a path without them")
    if data_dir is not None and not str(data_dir).strip():
        raise ConfigError("dataset.data_dir is empty, which would be the current directory: "
                          "give a directory, or null for the default (dataset.data_dir=null)")
    # a user dataset's node gets its registered schema (and these defaults) after this check
    validation = OmegaConf.select(cfg, "dataset.validation", default="auto")
    test_split = OmegaConf.select(cfg, "dataset.test_split", default="test")
    if validation is not None and str(validation).strip() == test_split:
        raise ConfigError(f"dataset.validation={validation!r} is the test split, which only "
                          "reports and never chooses: use auto, a fraction of the train split "
                          "(0.1), another split, or null (with trainer.test_every=1 for a "
                          "per-epoch test pass)")
    for name, entry in (cfg.get("callbacks") or {}).items():
        check_callback_entry(f"callbacks.{name}", entry)
    _check_task_and_outputs(cfg)
    check_task_metrics(cfg.task)
    metrics = builtin_task_metrics(cfg.task)  # a user task's are checked once it is built
    if metrics is not None:
        check_watched(cfg.trainer, list(metrics), validation is not None)
        check_objective(cfg.objective, cfg.task.name, list(metrics), validation is not None)


def _check_workers(cfg: DictConfig) -> None:
    """strategy.workers / strategy.launcher belong to strategy=multi_worker_mirrored."""
    workers = OmegaConf.select(cfg, "strategy.workers", default=None)
    launcher = OmegaConf.select(cfg, "strategy.launcher", default="local")
    multi = OmegaConf.select(cfg, "strategy.name") == "multi_worker_mirrored"
    if workers is not None and not multi:
        raise ConfigError(f"strategy.workers={workers} starts the workers of a multi-worker "
                          "run: use it with strategy=multi_worker_mirrored")
    if launcher != "local" and workers is None:
        raise ConfigError(f"strategy.launcher={launcher} starts strategy.workers workers: set "
                          "strategy.workers=N (and strategy=multi_worker_mirrored)")


def check_callback_entry(key: str, entry: Any) -> None:
    """A `callbacks:` entry is a registered name, or a node with `_target_` or `name`."""
    if isinstance(entry, str) or (
            isinstance(entry, DictConfig) and ("_target_" in entry) != ("name" in entry)):
        return
    raise ConfigError(
        f"{key} must be {{_target_: package.Class, <its arguments>}} (a "
        "keras.callbacks.Callback), or a registered callback's name, e.g. "
        f"+{key}._target_=keras.callbacks.CSVLogger +{key}.filename=epochs.csv")


def _check_task_and_outputs(cfg: DictConfig) -> None:
    """Label smoothing under task=regression (no classes to smooth); a model output activation
    the task cannot use (softmax over task=binary's one unit is always 1; sigmoid scores for
    task=classification are not a distribution)."""
    task = cfg.task.get("name")
    if task == "regression" and cfg.task.get("label_smoothing"):
        raise ConfigError(f"task.label_smoothing={cfg.task.label_smoothing} does not apply to "
                          "task=regression (no classes to smooth): use task=classification or "
                          "task=binary, or set task.label_smoothing=0")
    activation = OmegaConf.select(cfg, "model.output_activation", default=None)
    if not _distlab_option(cfg, "model.output_activation"):
        return
    wrong = {"binary": "softmax", "classification": "sigmoid"}
    if activation is not None and wrong.get(task) == activation:
        fits = "sigmoid or null (a logit)" if task == "binary" else "softmax or null (logits)"
        raise ConfigError(f"model.output_activation={activation} does not fit task={task}: "
                          f"use model.output_activation={fits}")


def check_metric_names(cfg: DictConfig) -> None:
    """Refuse, in one line, a task.metrics name that is neither distlab's, nor registered (by
    user code: run after it is imported), nor an import path. A user task's names are its
    own: checked when it is built."""
    from distlab.registry import METRICS, TASKS, is_import_path

    task = cfg.get("task")
    if task is None or not TASKS.is_builtin(str(task.get("name"))):
        return
    for i, name in enumerate(task.get("metrics") or []):
        if name in METRICS:
            continue
        if not is_import_path(str(name)):
            own = [n for n, (_, tasks) in BUILTIN_METRICS.items() if task.name in tasks]
            mine = [n for n in METRICS.names() if n not in BUILTIN_METRICS]
            raise ConfigError(
                f"task.metrics[{i}]={name!r} is not a known metric; task={task.name}'s: "
                f"{', '.join(own)}" + (f"; registered: {', '.join(mine)}" if mine else "")
                + "; or a package.module:callable import path")
        try:
            METRICS.check(str(name))
        except DistlabError as e:  # its key is the task's list entry, not a group's name
            raise ConfigError(str(e).replace(f"metric.name={name!r}",
                                             f"task.metrics[{i}]={name!r}")) from None


def _check_int_range(cfg: DictConfig) -> None:
    """Integers beyond int32 overflow TensorFlow's counters: refuse them by key (a seed's
    range is its rule's, [0, 2**32))."""
    for key, value in flatten(OmegaConf.to_container(cfg, resolve=True)).items():
        if (key.startswith(("hydra.", "callbacks.")) or RULES.get(key) is SEED
                or not _distlab_option(cfg, key)):
            continue
        values = value if isinstance(value, list) else [value]
        if any(isinstance(v, int) and not isinstance(v, bool) and abs(v) >= INT_LIMIT
               for v in values):
            raise ConfigError(f"{key}={_show(value)} is out of range: integer settings must "
                              f"be below 2**31 ({INT_LIMIT})")


def schema_nodes(config: dict[str, Any], builtin=None) -> dict[str, tuple[type, str]]:
    """{node: (its schema, how a message names it)} for the nodes of a config (a plain
    container) that one of distlab's schemas declares whole: `trainer`, `search`, and each
    group whose option is distlab's (`builtin(group, name)`; None: whose name has a schema of
    its own, so not `dataset`, whose schema every dataset, a user's too, extends)."""
    nodes = {f.name: (f.default_factory, f.name) for f in dataclasses.fields(Config)
             if dataclasses.is_dataclass(f.default_factory)}
    for group, options in GROUP_SCHEMAS.items():
        node = config.get(group)
        name = node.get("name") if isinstance(node, dict) else None
        schema = options.get("") if builtin is not None else None
        schema = schema or options.get(str(name))
        if schema is not None and (builtin is None or builtin(group, name)):
            nodes[group] = (schema, f"{group} (name: {name})")
    return nodes


def undeclared(config: dict[str, Any], builtin=None) -> dict[str, tuple[str, set[str]]]:
    """{dotted key: (the node's name for a message, the keys its schema declares)} for each
    key of `schema_nodes` that no schema declares and no interpolation of the config reads
    (`${model.width}`, `${..width}`: a value of the user's own, used by a declared key)."""
    referenced = {path.lstrip(".") for path in re.findall(r"\$\{([^}:]+)\}", str(config))}
    found = {}
    for group, (schema, option) in schema_nodes(config, builtin).items():
        node = config.get(group)
        if not isinstance(node, dict):
            continue
        known = {*_rules(schema, f"{group}."), f"{group}.name"}
        for key in flatten(node, f"{group}."):
            parts = key.split(".")
            if any(".".join(parts[:i]) in known for i in range(2, len(parts) + 1)) \
                    or any(k.startswith(f"{key}.") for k in known) \
                    or any(key == r or key.endswith(f".{r}") for r in referenced):
                continue
            found[key] = (option, known)
    return found


def check_unknown_keys(cfg: DictConfig) -> None:
    """Refuse, in one line, a key under one of distlab's own nodes that its schema does not
    declare and nothing interpolates (added with Hydra's `+`, which Hydra itself suggests for
    a key it does not know, e.g. a misspelt one): nothing would read it. Run once user code is
    loaded: a user option's node is its own (its registered schema checks it). A top-level key
    of the user's own is left alone."""
    from distlab.registry import REGISTRIES

    def builtin(group: str, name: Any) -> bool:
        return group not in REGISTRIES or REGISTRIES[group].is_builtin(str(name))

    for key, (option, known) in undeclared(OmegaConf.to_container(cfg, resolve=False),
                                           builtin).items():
        parent = key.rpartition(".")[0]
        hint = _meant(key, [k.rpartition(".")[2] for k in known
                            if k.rpartition(".")[0] == parent])
        raise ConfigError(f"{key} is not a key of {option} and no interpolation uses it, so "
                          f"nothing would read it: {hint}{_after(hint)}remove it "
                          "(`python run.py --cfg job` shows every key there is)")


def _declared_elsewhere(key: str) -> list[str]:
    """The keys of distlab's schemas with `key`'s last name under another node
    (`trainer.steps_per_execution`: `loop.steps_per_execution`), for a key put in the wrong
    group; none when more than two nodes have it (`name`: every group's)."""
    parent, _, last = key.rpartition(".")
    found = sorted(k for k in _rules() if k.rpartition(".")[2] == last
                   and k.rpartition(".")[0] != parent)
    return found if len(found) <= 2 else []


def _options_declaring(key: str) -> list[str]:
    """The group options whose schema declares `key` (`model.hidden_units`: `model=mlp`),
    for a key of another option than the one chosen."""
    group, _, rest = key.partition(".")
    return [f"{group}={name}" for name, schema in GROUP_SCHEMAS.get(group, {}).items()
            if name and rest in _rules(schema)]


def _meant(key: str, siblings: list[str]) -> str:
    """What a message suggests for `key`, which its node does not declare: the same key in
    another group, the option that has it, or the closest of `siblings` (its node's keys)."""
    import difflib

    parent, _, last = key.rpartition(".")
    if elsewhere := _declared_elsewhere(key):
        return f"did you mean {' or '.join(elsewhere)}?"
    if options := _options_declaring(key):
        return f"it is a key of {' and of '.join(options)}"
    close = difflib.get_close_matches(last, siblings, n=1)
    return f"did you mean {parent}.{close[0]}?" if close else ""


def _after(hint: str) -> str:
    return "" if not hint else " " if hint.endswith("?") else "; "


def _nodes(schema: type) -> set[type]:
    """The dataclasses under `schema` (trainer, trainer.early_stopping, ...)."""
    found = set()
    for f in dataclasses.fields(schema):
        if dataclasses.is_dataclass(f.default_factory):
            found |= {f.default_factory, *_nodes(f.default_factory)}
    return found


def _node_schemas() -> set[type]:
    """The schemas of distlab's nodes, nested ones included (not the top level's: a key there
    is the user's own)."""
    found = _nodes(Config)
    for options in GROUP_SCHEMAS.values():
        for schema in options.values():
            found |= {schema, *_nodes(schema)}
    return found


def composition_problem(error: BaseException) -> str:
    """A Hydra composition error as one line (`errors.composition_error`). An override of a
    key that the schema of one of distlab's nodes lacks gets, in place of Hydra's advice to
    add it with `+` (which `check_unknown_keys` would then refuse), what it most likely meant
    (`_meant`: the same key in another group, the option that has it, a close name)."""
    line = composition_error(error)
    cause = error.__cause__
    schema, key = getattr(cause, "object_type", None), getattr(cause, "full_key", None)
    if not (isinstance(cause, OmegaConfBaseException) and isinstance(key, str) and "." in key
            and line.startswith("Could not override") and schema in _node_schemas()):
        return line
    hint = _meant(key, [f.name for f in dataclasses.fields(schema)])
    return (f"{key} is not a key of {key.rpartition('.')[0]}{': ' if hint else ''}{hint} "
            "(`python run.py --cfg job` shows every key)")


def _distlab_option(cfg: DictConfig, key: str) -> bool:
    """Whether `key` belongs to one of distlab's own options (a user's component may use the
    same key names with other meanings; its registered schema checks it instead)."""
    from distlab.registry import REGISTRIES

    group = key.split(".", 1)[0]
    if group not in REGISTRIES or group == "dataset":  # every dataset has distlab's keys
        return True
    name = OmegaConf.select(cfg, f"{group}.name", default=None)
    return name is None or REGISTRIES[group].is_builtin(str(name))


def _kind(value: Any) -> str:
    """What a value is, in YAML's words where it is a config node (a list, a mapping)."""
    if isinstance(value, ListConfig):
        return "list"
    return "mapping" if isinstance(value, DictConfig) else type(value).__name__


def _show(value: Any) -> str:
    if OmegaConf.is_config(value):
        return str(OmegaConf.to_container(value))
    return repr(value) if isinstance(value, str) else str(value)


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """A container of nested dicts as {dotted key: value}."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def swept_objective(overrides: list[str]) -> str | None:
    """Why a sweep's overrides that sweep `objective` (several values) cannot run, or None:
    a sweep ranks its jobs, and a search chooses, by one objective."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for text in overrides:
        try:
            [override] = parser.parse_overrides([text])
        except Exception:  # noqa: BLE001 - not an override (a flag's value), or malformed:
            continue  # Hydra reports that itself
        if override.key_or_group == "objective" and override.is_sweep_override():
            return (
                f"{text} sweeps the objective, but a sweep ranks its jobs (and a search "
                "chooses) by one objective: give it one value (e.g. objective=val_loss) and "
                "run a sweep per objective; each job's results.json and the summary report "
                "every metric anyway")
    return None
