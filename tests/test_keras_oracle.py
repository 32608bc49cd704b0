"""The reference oracle: distlab's built-in loops (`loop=keras_fit`, `loop=custom`) on one
replica train exactly as a plain Keras script does: the same architecture built with plain
`keras` from the same initial weights, `model.compile` + `model.fit` on the same batches,
the optimizer, schedule, clipping, accumulation, regularisation, precision and loss written
from their documented meaning with Keras' own classes. Each step's loss and the final weights
agree to 1e-6 over 20 steps, in every precision (see TOLERANCE).

Nothing of distlab is on the reference's training path: distlab gives it only the initial
weights and the batches its run trained on (read from the run's own data layer, so the
pipeline is not re-implemented; a run whose batches were not reproducible would fail).

The cases are drawn from the config, not listed by hand: every option of the `optimizer`
and `schedule` groups that Hydra lists (every built-in registry name must have one), every
`optimizer.lr_scaling` of its rule, warmup, logits or softmax outputs, accumulation and
each loop, one step or 3 per call, under a 1-replica MirroredStrategy and under no strategy
(several steps per call are compared per block: each block's mean loss). To keep the suite fast
they are combined, not crossed: case i takes value i of each choice (cycling), so every
value runs at least once and the runs are as many as the longest choice has values. The
training options whose code differs per loop (`model.l2`, `optimizer.clipnorm`,
`trainer.grad_accum_steps`, on 1 and 2 replicas, and `precision=mixed_float16`'s loss
scaling) run in both loops (the suite runs a part of the cases: tests/tiers.py). The
reference reads each key of an option's node through `Reads`, and a key it did not read
fails the case: a new option or key the oracle cannot express fails loudly (the fast test
names it without training), naming what to add here.
Planted faults (regularisation dropped, clipping per replica, a schedule one step late)
show that the comparison catches what it exists for.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from conftest import ROOT, compose, tiny_dataset

STEPS_PER_EPOCH, EPOCHS = 5, 4  # 20 steps: a schedule's epochs change within the run
BATCH = 32  # the global batch (the tiny train split has 512 rows)
COMMON = ("model=mlp", "model.hidden_units=[16]", "dataset.validation=null",
          "trainer.validate_every=0", f"trainer.epochs={EPOCHS}",
          f"trainer.steps_per_epoch={STEPS_PER_EPOCH}", "deterministic=true")
# max |difference| of final weights and of per-step losses (those relative to the loss where
# it is above 1), per precision. Both sides run
# the same kernels on the same shapes in one process, so in every precision the weights
# agree to float32 rounding (measured: 0 to 7.5e-9) and the losses to the float32 mean
# against distlab's float64 sums (measured: 3e-7 at most, mixed_float16 and mixed_bfloat16
# included). A 16-bit policy could turn a float32 rounding difference into one 16-bit step
# (float16 eps 9.8e-4, bfloat16 7.8e-3) where the two sides ran different ops; none does
# here, so each precision is held to 1e-6: widen one only with a measurement that says why
TOLERANCE = {"float32": 1e-6, "mixed_float16": 1e-6, "mixed_bfloat16": 1e-6}


# ------------------------------------------------------------------- drawing the cases
@functools.cache
def group_options(group: str) -> tuple[str, ...]:
    """The options of `group` as Hydra lists them (conf/ and every search-path entry)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return tuple(sorted(GlobalHydra.instance().config_loader().get_group_options(group)))


def rule_choices(schema: type, key: str) -> list[str]:
    """The values a `one_of` rule of `schema.key` allows (parsed from its message)."""
    from dataclasses import fields

    rule = next(f.metadata["rule"] for f in fields(schema) if f.name == key)
    found = re.fullmatch(r"must be one of (.+)", rule[1])
    assert found, f"{schema.__name__}.{key}: not a one_of rule ({rule[1]!r}); update the oracle"
    return found.group(1).split(", ")


LOOPS = ("keras_fit", "custom")


@dataclass
class Case:
    """A distlab run to check: its overrides (on top of COMMON), replicas and loop."""

    overrides: tuple[str, ...]
    loop: str
    replicas: int = 1
    precision: str = "float32"
    strategy: str = "mirrored"  # mirrored over `replicas` CPU devices, or default (1 replica)

    @property
    def reference_key(self) -> tuple[str, ...]:
        """What the plain Keras reference depends on (not the loop nor the replicas)."""
        return self.overrides


def drawn_options() -> dict[str, list[str]]:
    """Each choice of the options' cases and its values, drawn from the config: every option
    of the optimizer and schedule groups, every optimizer.lr_scaling, warmup or not, the
    task's loss on logits or on probabilities (model.output_activation), with label
    smoothing or not, accumulation or not, and the loop (its steps per call and the
    strategy: see option_cases)."""
    from distlab.config.schema import OptimizerConfig

    return {
        "optimizer": [f"optimizer={o}" for o in group_options("optimizer")],
        "schedule": [f"schedule={s}" for s in group_options("schedule")],
        "lr_scaling": [f"optimizer.lr_scaling={v}"
                       for v in rule_choices(OptimizerConfig, "lr_scaling")],
        "warmup": ["schedule.warmup_epochs=0", "schedule.warmup_epochs=1.4"],
        # accumulation with each optimizer's own state (Adam's bias correction: updates)
        "accumulation": ["trainer.grad_accum_steps=1", "trainer.grad_accum_steps=4"],
        "outputs": ["model.output_activation=null", "model.output_activation=softmax"],
        "label_smoothing": ["task.label_smoothing=0", "task.label_smoothing=0.1"],
        "loop": [f"loop={loop}" for loop in LOOPS],
    }


def option_cases() -> dict[str, Case]:
    """Every drawn value in at least one case (value i of each choice in case i, cycling):
    as many cases as the longest choice has values, so a new option adds no run until its
    group outgrows the others, and is drawn all the same."""
    choices = drawn_options()
    cases = {}
    for i in range(max(len(values) for values in choices.values())):
        picked = [values[i % len(values)] for values in choices.values()]
        *overrides, loop = picked
        loop = loop.partition("=")[2]
        # no strategy (strategy=default or auto on one device) in every other pair of cases,
        # so that each loop runs under both; and each loop with blocks of 3 steps per call
        # in one of its cases (an epoch of 5 steps: a block of 3, then a shorter one of 2)
        strategy = "default" if i // len(LOOPS) % 2 else "mirrored"
        steps = 3 if i % 4 in (1, 2) else 1
        per_call = "steps_per_execution" if loop == "keras_fit" else "steps_per_loop"
        overrides.append(f"loop.{per_call}={steps}")
        cases["-".join([*(v.rpartition("=")[2] for v in picked), strategy, f"{steps}x"])] = Case(
            tuple(overrides), loop, strategy=strategy)
    return cases


# the training options, where each loop has code of its own (the step's loss, gradients and
# update): in both loops; on 2 replicas too, where clipping and accumulation are distlab's
# (label smoothing too: the drawn cases pair each two-valued choice with the same loop)
TRAINING = ("model.l2=0.01", "optimizer=sgd", "optimizer.learning_rate=0.1",
            "optimizer.clipnorm=0.05", "trainer.grad_accum_steps=4", "schedule=step_decay",
            "schedule.boundaries=[2]", "schedule.factors=[1,0.3]", "task.label_smoothing=0.2")


def training_cases() -> dict[str, Case]:
    from distlab.config.schema import POLICIES

    cases = {f"l2-clipnorm-accum-{r}x-{loop}": Case(TRAINING, loop, replicas=r)
             for r in (1, 2) for loop in LOOPS}
    # precision: mixed_float16's loss scaling is each loop's own code, mixed_bfloat16 has none
    for i, precision in enumerate(p for p in POLICIES if p != "float32"):
        loops = LOOPS if precision == "mixed_float16" else LOOPS[i % 2:i % 2 + 1]
        for loop in loops:
            cases[f"{precision}-{loop}"] = Case(
                (f"precision={precision}", "model.l2=0.001", "optimizer=sgd",
                 "optimizer.learning_rate=0.1", "schedule=constant"), loop, precision=precision)
    return cases


# the dataset each option of the task group trains on here (tiny_data_dir's; breast_cancer is
# written by the `task_data` fixture); classification: the default, mnist
TASK_DATA = {
    "classification": (),
    "regression": ("dataset.name=tiny_regression", "dataset.features.input=measurements",
                   "dataset.features.label=target", "dataset.preprocess.rescale=null"),
    "binary": ("dataset.name=breast_cancer", "dataset.features.input=features",
               "dataset.features.label=label", "dataset.preprocess.rescale=null"),
}


def task_cases() -> dict[str, Case]:
    """Every other option of the task group (its loss), the loops alternating."""
    tasks = [t for t in group_options("task") if t != "classification"]
    smoothed = {"binary": ("task.label_smoothing=0.1",)}  # (0: Keras skips the smoothing)
    return {f"task-{t}-{LOOPS[i % 2]}": Case(
        (f"task={t}", *TASK_DATA.get(t, ()), *smoothed.get(t, ()), "optimizer=sgd",
         "optimizer.learning_rate=0.05", "schedule=constant"), LOOPS[i % 2])
        for i, t in enumerate(tasks)}


CASES = {**option_cases(), **training_cases(), **task_cases()}


def test_every_option_is_drawn_and_has_a_plain_keras_reference():
    """Every built-in optimizer, schedule and task is an option the cases draw, and the
    reference expresses every option's every key (no training: the fast tier)."""
    from distlab.registry import OPTIMIZERS, SCHEDULES

    drawn = drawn_options()
    for group, registry in (("optimizer", OPTIMIZERS), ("schedule", SCHEDULES)):
        names = set()
        for option in drawn[group]:
            cfg = compose([*COMMON, option])
            names.add(cfg[group].name)
            node = Reads(cfg[group], group)
            if group == "optimizer":
                reference_learning_rate(node, BATCH)
                reference_optimizer(node, 1e-3, 1)
            else:
                reference_schedule(node, 1e-3, STEPS_PER_EPOCH, EPOCHS)
            node.check_all_read()
        builtin = {n for n in registry.names() if registry.is_builtin(n)}
        assert builtin <= names, (f"{group} {sorted(builtin - names)}: built in, but no "
                                  f"conf/{group} option names it, so the oracle cannot draw it")
    assert all(any(option in c.overrides or option == f"loop={c.loop}" for c in CASES.values())
               for values in drawn.values() for option in values)
    from distlab.registry import TASKS

    names = set()
    for task in group_options("task"):
        assert task in TASK_DATA, (f"task={task}: the oracle has no dataset for it; add one to "
                                   "TASK_DATA in this file")
        node = Reads(compose([*COMMON, f"task={task}"]).task, "task")
        names.add(node._values["name"])
        reference_loss(node, None)
        node.check_all_read()
    assert {n for n in TASKS.names() if TASKS.is_builtin(n)} <= names


# ------------------------------------------------------------------- the plain Keras side
class Reads:
    """A config node's keys, each read recorded: `check_all_read()` fails the test on a key
    the reference left out."""

    def __init__(self, node: Any, where: str) -> None:
        from omegaconf import OmegaConf

        self._values = OmegaConf.to_container(node, resolve=True)
        self._where, self._read = where, {"name"}

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):
            raise AttributeError(key)
        self._read.add(key)
        return self._values[key]

    def not_trained_on(self, *keys: str) -> None:
        """`keys` (those the node has) change no update: read, so to speak."""
        self._read.update(keys)

    def check_all_read(self) -> None:
        unread = sorted(set(self._values) - self._read)
        if unread:
            keys = ", ".join(f"{self._where}.{k}" for k in unread)
            pytest.fail(f"the oracle does not express {keys} "
                        f"({self._where}={self._values['name']}): add it to the plain Keras "
                        "reference in this file")


def reference_learning_rate(opt: Reads, effective_batch: int) -> float:
    """optimizer.learning_rate scaled by the effective batch (global batch x accumulation)
    over base_batch_size: linear, its square root, or none."""
    ratio = effective_batch / opt.base_batch_size
    return opt.learning_rate * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[
        opt.lr_scaling]


def reference_schedule(sched: Reads, lr: float, steps_per_epoch: int, epochs: int):
    """The `schedule` option as Keras' own schedules, epochs counted in steps (batches)."""
    import keras

    schedules = keras.optimizers.schedules
    name = sched._values["name"]
    schedule = None
    if name == "constant":
        pass
    elif name == "step_decay":  # factors[i] from the first step of epoch boundaries[i-1]
        schedule = schedules.PiecewiseConstantDecay(
            [b * steps_per_epoch - 1 for b in sched.boundaries], [lr * f for f in sched.factors])
    elif name == "cosine":
        decay_epochs = sched.decay_epochs if sched.decay_epochs is not None else epochs
        schedule = schedules.CosineDecay(lr, round(decay_epochs * steps_per_epoch),
                                         alpha=sched.alpha)
    elif name == "exponential":
        schedule = schedules.ExponentialDecay(lr, round(sched.decay_epochs * steps_per_epoch),
                                              sched.decay_rate, staircase=sched.staircase)
    else:
        pytest.fail(f"the oracle has no plain Keras reference for schedule={name}: add one to "
                    "reference_schedule in this file")
    warmup = round(sched.warmup_epochs * steps_per_epoch)
    if warmup:  # x (step + 1) / warmup_steps over the first warmup_steps steps
        return _Warmup(schedule or (lambda step: lr), warmup)
    return lr if schedule is None else schedule


def _warmup_class():
    import keras
    import tensorflow as tf

    class Warmup(keras.optimizers.schedules.LearningRateSchedule):
        def __init__(self, schedule, steps: int) -> None:
            self.schedule, self.steps = schedule, steps

        def __call__(self, step):
            step = tf.cast(step, tf.float32)
            return tf.minimum(1.0, (step + 1.0) / self.steps) * tf.cast(self.schedule(step),
                                                                        tf.float32)

    return Warmup


def _Warmup(schedule, steps):  # noqa: N802 - a class made on first use (keras imported late)
    return _warmup_class()(schedule, steps)


def reference_optimizer(opt: Reads, learning_rate, grad_accum_steps: int):
    """The `optimizer` option as Keras' own optimizer (clipnorm, accumulation: Keras')."""
    import keras

    extra: dict[str, Any] = {}
    if opt.clipnorm is not None:
        extra["clipnorm"] = opt.clipnorm
    if grad_accum_steps > 1:
        extra["gradient_accumulation_steps"] = grad_accum_steps
    name = opt._values["name"]
    if name == "adam":
        return keras.optimizers.Adam(learning_rate, beta_1=opt.beta_1, beta_2=opt.beta_2,
                                     epsilon=opt.epsilon, amsgrad=opt.amsgrad, **extra)
    if name == "sgd":
        return keras.optimizers.SGD(learning_rate, momentum=opt.momentum,
                                    nesterov=opt.nesterov, **extra)
    if name == "rmsprop":
        return keras.optimizers.RMSprop(learning_rate, rho=opt.rho, momentum=opt.momentum,
                                        epsilon=opt.epsilon, **extra)
    pytest.fail(f"the oracle has no plain Keras reference for optimizer={name}: add one to "
                "reference_optimizer in this file")


def reference_model(model: Reads, input_shape: tuple[int, ...], outputs: int):
    """model=mlp as its documentation says: Flatten, Dense-activation per hidden_units entry,
    Dense (float32), `l2` on every kernel."""
    import keras

    assert model._values["name"] == "mlp", "the oracle's model is model=mlp"
    if model.batch_norm or model.dropout:
        pytest.fail("the oracle's reference model has no batch_norm or dropout")
    reg = keras.regularizers.L2(model.l2) if model.l2 else None
    layers = [keras.Input(input_shape), keras.layers.Flatten()]
    layers += [keras.layers.Dense(units, activation=model.activation, kernel_regularizer=reg)
               for units in model.hidden_units]
    layers.append(keras.layers.Dense(outputs, activation=model.output_activation,
                                     kernel_regularizer=reg, dtype="float32"))
    return keras.Sequential(layers)


def reference_loss(task: Reads, output_activation: str | None):
    """The task's loss as a Keras loss, and the same as a metric (each step's data loss):
    sparse categorical (with label_smoothing: categorical on one-hot labels, smoothed), mean
    squared or binary cross-entropy (smoothed towards 0.5); from_logits null: as the model
    outputs (logits unless its last activation is softmax or sigmoid)."""
    import keras

    name = task._values["name"]
    from_logits = task.from_logits if name != "regression" else None
    task.not_trained_on("metrics", "top_k")  # what is scored
    if from_logits is None:
        from_logits = output_activation is None
    if name == "classification" and task.label_smoothing:  # on one-hot labels (keras_reference)
        return (keras.losses.CategoricalCrossentropy(from_logits=from_logits,
                                                     label_smoothing=task.label_smoothing),
                keras.metrics.CategoricalCrossentropy(name="data_loss", from_logits=from_logits,
                                                      label_smoothing=task.label_smoothing))
    if name == "classification":
        return (keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits),
                keras.metrics.SparseCategoricalCrossentropy(name="data_loss",
                                                            from_logits=from_logits))
    if name == "regression":
        assert task.label_smoothing == 0  # the schema refuses any other value
        return keras.losses.MeanSquaredError(), keras.metrics.MeanSquaredError(name="data_loss")
    if name == "binary":
        smoothing = task.label_smoothing
        return (keras.losses.BinaryCrossentropy(from_logits=from_logits, label_smoothing=smoothing),
                keras.metrics.BinaryCrossentropy(name="data_loss", from_logits=from_logits,
                                                 label_smoothing=smoothing))
    pytest.fail(f"the oracle has no plain Keras loss for task={name}: add one to "
                "reference_loss in this file")


def keras_reference(cfg, initial: list[np.ndarray], batches: list[tuple[np.ndarray, np.ndarray]]
                    ) -> tuple[list[float], list[np.ndarray]]:
    """Plain Keras: compile + fit on `batches` from `initial`; (loss per step, weights)."""
    import keras
    import tensorflow as tf

    keras.backend.clear_session()
    keras.mixed_precision.set_dtype_policy(cfg.precision)
    try:
        opt, sched, spec, task = (Reads(cfg.optimizer, "optimizer"),
                                  Reads(cfg.schedule, "schedule"), Reads(cfg.model, "model"),
                                  Reads(cfg.task, "task"))
        accumulate = cfg.trainer.grad_accum_steps
        lr = reference_learning_rate(opt, BATCH * accumulate)
        optimizer = reference_optimizer(
            opt, reference_schedule(sched, lr, STEPS_PER_EPOCH, EPOCHS), accumulate)
        # its outputs: as many as the distlab model's (the dataset's classes or values)
        model = reference_model(spec, batches[0][0].shape[1:], initial[-1].shape[0])
        loss, data_loss = reference_loss(task, spec.output_activation)
        for node in (opt, sched, spec, task):
            node.check_all_read()
        model.set_weights(initial)
        model.compile(optimizer=optimizer, loss=loss, metrics=[data_loss])
        losses: list[float] = []

        class PerStep(keras.callbacks.Callback):  # each step's own loss, not the running mean
            def on_train_batch_begin(self, batch, logs=None):
                self.model.reset_metrics()

            def on_train_batch_end(self, batch, logs=None):
                losses.append(float(logs["data_loss"]))

        x = np.stack([b[0] for b in batches])
        y = np.stack([b[1] for b in batches])
        if y.ndim == 2 and initial[-1].shape[0] == 1:  # one output unit: labels [batch, 1]
            y = y[..., None].astype(np.float32)
        if isinstance(loss, keras.losses.CategoricalCrossentropy):  # labels one-hot
            y = np.eye(initial[-1].shape[0], dtype=np.float32)[y]
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)), epochs=1, verbose=0,
                  callbacks=[PerStep()])
        return losses, model.get_weights()
    finally:
        keras.mixed_precision.set_dtype_policy("float32")


# ------------------------------------------------------------------- the distlab side
@dataclass
class Probe:
    """What a distlab run trained: its experiment, initial weights, and per block of steps
    (one step, or loop.steps_per_execution / steps_per_loop) its summed loss and examples."""

    exp: Any = None
    initial: list = field(default_factory=list)
    blocks: list = field(default_factory=list)

    def block_losses(self, step_losses: list[float]) -> tuple[np.ndarray, np.ndarray]:
        """(distlab's mean loss of each block, the mean of `step_losses` over the same
        steps: every batch is full, so a block's mean is the mean of its steps' means)."""
        sizes = [round(count / BATCH) for _, count in self.blocks]
        assert sum(sizes) == len(step_losses) == EPOCHS * STEPS_PER_EPOCH, sizes
        ends = np.cumsum(sizes)
        return (np.array([loss / count for loss, count in self.blocks]),
                np.array([np.mean(step_losses[e - n:e]) for n, e in zip(sizes, ends,
                                                                         strict=True)]))


@pytest.fixture
def probe(monkeypatch) -> Probe:
    from distlab.training.controller import Controller

    seen = Probe()
    train, block_sums = Controller.train, Controller._block_sums

    def recorded_train(self, *args, **kwargs):
        seen.exp, seen.initial = self.exp, self.exp.model.get_weights()
        return train(self, *args, **kwargs)

    def recorded_block(self, block):
        sums = block_sums(self, block)
        seen.blocks.append((sums.loss, sums.count))
        return sums

    monkeypatch.setattr(Controller, "train", recorded_train)
    monkeypatch.setattr(Controller, "_block_sums", recorded_block)
    return seen


def trained_batches(exp) -> list[tuple[np.ndarray, np.ndarray]]:
    """The global batches the run trained on, from its own data layer (seeded: the same)."""
    return list(exp.data.train_epochs(0, EPOCHS).as_numpy_iterator())


_references: dict[tuple[str, ...], tuple[list[float], list[np.ndarray]]] = {}


def run_and_compare(c: Case, run_inprocess, probe: Probe) -> tuple[float, float]:
    """Run `c` in distlab, and its plain Keras reference on the batches the run trained on
    (once per reference_key); (largest per-step loss difference, largest weight
    difference)."""
    strategy = (("strategy=default",) if c.strategy == "default" else
                ("strategy=mirrored", f"strategy.cpu_devices={c.replicas}"))
    results = run_inprocess(*COMMON, *strategy, f"loop={c.loop}",
                            f"dataset.batch_size_per_replica={BATCH // c.replicas}",
                            *c.overrides)
    assert results["num_replicas"] == c.replicas and results["global_batch_size"] == BATCH
    final = probe.exp.model.get_weights()
    if c.reference_key not in _references:
        batches = trained_batches(probe.exp)
        assert len(batches) == EPOCHS * STEPS_PER_EPOCH
        _references[c.reference_key] = keras_reference(probe.exp.cfg, probe.initial, batches)
    losses, weights = _references[c.reference_key]
    assert len(final) == len(weights)
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(final, probe.initial, strict=True))
    assert moved > 10 * TOLERANCE[c.precision], "the run did not train: nothing is compared"
    # losses: relative to a loss above 1 (regression's: one float32 mean's rounding is relative)
    distlab_losses, keras_losses = probe.block_losses(losses)
    return (float(np.max(np.abs(distlab_losses - keras_losses)
                         / np.maximum(1.0, np.abs(keras_losses)))),
            max(float(np.max(np.abs(a - b))) for a, b in zip(final, weights, strict=True)))


@pytest.fixture
def task_data(request, tiny_data_dir) -> None:
    """tiny_data_dir with breast_cancer too, for a case of task=binary."""
    if "breast_cancer" in " ".join(CASES[request.node.callspec.params["case"]].overrides):
        from test_binary_metrics import write_breast_cancer

        tiny_dataset(tiny_data_dir, "breast_cancer", write_breast_cancer)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_one_replica_trains_as_plain_keras_fit(case, task_data, run_inprocess, probe):
    """distlab's run against plain Keras on the same batches: each step's loss and the final
    weights agree to the precision's tolerance."""
    c = CASES[case]
    loss_diff, weight_diff = run_and_compare(c, run_inprocess, probe)
    print(f"{case}: losses {loss_diff:.2g}, weights {weight_diff:.2g}")  # shown with -s
    tolerance = TOLERANCE[c.precision]
    assert loss_diff < tolerance and weight_diff < tolerance, (
        f"{case}: per-step losses differ from plain Keras by up to {loss_diff:.3g}, final "
        f"weights by {weight_diff:.3g} (tolerance {tolerance:g})")


def _step_decay_case() -> str:
    return next(k for k, c in CASES.items() if "schedule=step_decay" in c.overrides
                and c.precision == "float32")


def _drop_regularisation(monkeypatch) -> None:
    import tensorflow as tf

    from distlab.training.loops.base import Loop

    def compute_loss(self, labels, predictions, weights):  # a loop that forgets model.losses
        per_example_loss = self.loss_fn(labels, predictions)
        loss = tf.nn.compute_average_loss(per_example_loss, sample_weight=weights)
        return self.exp.optimizer.scale_loss(loss), per_example_loss

    monkeypatch.setattr(Loop, "compute_loss", compute_loss)


def _clip_per_replica(monkeypatch) -> None:
    from distlab.keras_patches import accumulation

    monkeypatch.setattr(accumulation, "clip_globally", lambda optimizer, distributed: optimizer)


def _schedule_one_step_late(monkeypatch) -> None:
    from distlab.components.schedules import EpochStepDecay

    call = EpochStepDecay.__call__
    monkeypatch.setattr(EpochStepDecay, "__call__", lambda self, step: call(self, step - 1))


FAULTS = {  # a fault planted in distlab: the case it shows in, and how it is planted
    "regularisation-dropped": (lambda: Case(TRAINING, "custom"), _drop_regularisation),
    "clipping-per-replica": (lambda: Case(tuple(o for o in TRAINING if "grad_accum" not in o),
                                          "keras_fit", replicas=2), _clip_per_replica),
    "schedule-off-by-one": (lambda: CASES[_step_decay_case()], _schedule_one_step_late),
}


@pytest.mark.slow
@pytest.mark.parametrize("fault", list(FAULTS))
def test_the_oracle_catches_planted_faults(fault, run_inprocess, probe, monkeypatch):
    """The faults this oracle exists for, planted in distlab, each fail it by far more than
    its tolerance."""
    case, plant = FAULTS[fault]
    c = case()
    plant(monkeypatch)
    loss_diff, weight_diff = run_and_compare(c, run_inprocess, probe)
    print(f"{fault}: losses {loss_diff:.2g}, weights {weight_diff:.2g}")  # shown with -s
    assert max(loss_diff, weight_diff) > 100 * TOLERANCE[c.precision], (loss_diff, weight_diff)
