"""The checks that step probes and compare them: `determinism` (the same command twice),
`replicas` (1, 2 and 3 replicas) and `loops` (the run's loop against the reference)."""

from __future__ import annotations

import numpy as np

from distlab.verification.probe import max_abs_diff, not_finite, relative_diffs, scale
from distlab.verification.report import FAILED, PASSED, WARNING, Row
from distlab.verification.session import Session

# how far two runs that should train alike may be apart: per-step losses (relative) and
# weights after the steps (absolute, relative to the largest weight), by precision
LOSS_RTOL = {"float32": 1e-5, "mixed_float16": 1e-2, "mixed_bfloat16": 5e-2}
WEIGHT_TOL = {"float32": 1e-5, "mixed_float16": 1e-2, "mixed_bfloat16": 5e-2}


def _tolerances(session: Session) -> tuple[float, float]:
    precision = session.run_config.precision
    return LOSS_RTOL.get(precision, 1e-5), WEIGHT_TOL.get(precision, 1e-5)


def diverged(check: str, summary: str, where: str, figures: dict) -> Row:
    """A failed row for a run whose loss is not finite: it diverged, so nothing else can be
    compared (not a sign of non-determinism)."""
    return Row(check, FAILED, summary, figures=figures,
               differs=f"the loss is not finite ({where}): the run diverged",
               cause="the training itself diverges: a learning rate too high for the "
               "optimizer, a loss or layer that overflows (log of 0, exp of a large value), "
               "or non-finite inputs (the data check finds those)")


def _first_difference(a: list[float], b: list[float]) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"step {i + 1}: loss {x:.8g} against {y:.8g}"
    return "none"


# ---- determinism
def determinism(session: Session) -> Row:
    steps = session.options.steps
    first = session.trained()
    losses_a, weights_a = first.losses, first.end
    second = session.probe("determinism")
    losses_b, weights_b = second.train(steps), second.weights()
    diff, where = max_abs_diff(weights_a, weights_b)
    summary = f"the run twice with deterministic=true: {steps} per-step losses and the weights"
    figures = {"losses": losses_a, "losses_again": losses_b, "weights_max_abs_diff": diff}
    if where_not_finite := not_finite(first_run=losses_a, second_run=losses_b):
        return diverged("determinism", summary, where_not_finite, figures)
    if losses_a == losses_b and diff == 0.0:
        return Row("determinism", PASSED, summary + " identical", figures=figures)
    differs = (f"per-step losses differ ({_first_difference(losses_a, losses_b)}); weights "
               f"differ by up to {diff:.3g} (in {where})")
    return Row("determinism", FAILED, summary, differs=differs,
               cause=_nondeterminism_cause(session, first, second), figures=figures)


def _nondeterminism_cause(session: Session, first, second) -> str:
    """The data builder when the two runs' training rows come in another order, else the
    model's or loop's ops."""
    from distlab.data.fingerprint import row_hashes

    a, b = (row_hashes(p.exp.data.splits.train) for p in (first, second))
    name = session.run_config.dataset.name
    if len(a) != len(b) or np.any(a != b):
        what = ("other rows" if set(a.tolist()) != set(b.tolist()) else
                "the same rows in another order")
        return (f"the dataset builder (dataset.name={name!r}) gives {what} each time it is "
                "called: a shuffle or sample with an unseeded generator (np.random.default_rng()"
                ", random.shuffle, tf.random without a seed); seed it, or leave shuffling to "
                "distlab (dataset.shuffle_buffer)")
    return ("the data is the same, so an op of the model or loop is not deterministic: a "
            "random op or layer without a seed, a tf.random.Generator from a fresh seed, or "
            "Python state (time, hash()) in the model or loop")


# ---- replicas
def replicas(session: Session) -> Row:
    steps, batch = session.options.steps, session.options.batch
    loss_rtol, weight_tol = _tolerances(session)
    probes = {1: session.probe("replicas-1", replicas=1, batch=2 * batch),
              2: session.probe("replicas-2", replicas=2, batch=batch),
              3: session.probe("replicas-3", replicas=3, batch=batch)}
    figures = {f"eval_{r}_replicas": p.evaluate() for r, p in probes.items()}
    base = figures["eval_1_replicas"]
    rows = min(session.options.rows, probes[1].exp.data.num_test)
    problems, cause = [], None
    for r in (2, 3):
        got = figures[f"eval_{r}_replicas"]
        for k in base:
            d = relative_diffs([base[k]], [got[k]])
            if d > loss_rtol:
                problems.append(f"the initial model's test {k} on {rows} test rows "
                                f"is {base[k]:.6g} on 1 replica and {got[k]:.6g} on {r} "
                                f"(relative {d:.2g})")
                cause = cause or _evaluation_cause(session, probes[1], k)
    one, two = probes[1], probes[2]
    quieted = [_without_randomness(p) for p in (one, two)][0]
    losses_1, losses_2 = one.train(steps), two.train(steps)
    weights_1, weights_2 = one.weights(), two.weights()
    loss_diff = relative_diffs(losses_1, losses_2)
    weight_diff, where = max_abs_diff(weights_1, weights_2)
    tolerance = weight_tol * scale(weights_1)
    figures.update(losses_1x2b=losses_1, losses_2xb=losses_2, weights_max_abs_diff=weight_diff)
    if where_not_finite := not_finite(the_1_replica_run=losses_1, the_2_replica_run=losses_2):
        problems.append(f"the loss is not finite ({where_not_finite}): the run diverged")
        cause = cause or diverged("replicas", "", where_not_finite, {}).cause
    elif loss_diff > loss_rtol or weight_diff > tolerance:
        problems.append(f"{steps} steps of 1 x {2 * batch} and 2 x {batch} examples: losses "
                        f"differ by up to {loss_diff:.2g} (relative, tolerance {loss_rtol:g}), "
                        f"weights by {weight_diff:.3g} in {where} (tolerance {tolerance:.2g})")
        cause = cause or _training_cause(one)
    summary = (f"initial model's test figures on 1, 2, 3 replicas; {steps} steps of 1 x "
               f"{2 * batch} against 2 x {batch} (losses to {loss_rtol:g} relative, weights to "
               f"{weight_tol:g} x the largest)")
    if quieted:
        summary += (f"; random layers off for the steps ({', '.join(quieted)}: each replica "
                    "draws its own random numbers)")
        figures["random_layers_off"] = quieted
    if not problems:
        return Row("replicas", PASSED, summary, figures=figures)
    return Row("replicas", FAILED, summary, differs="; ".join(problems), cause=cause,
               figures=figures)


def _without_randomness(probe) -> list[str]:
    """Turn off the model's random training-time layers (Dropout and its kin, GaussianNoise)
    before its training steps are traced: under several replicas each replica draws its own
    random numbers, so only the rest of training can match step for step. Their names."""
    import keras

    names = []
    for layer in probe.exp.model._flatten_layers():
        if isinstance(layer, keras.layers.GaussianNoise) and layer.stddev:
            layer.stddev = 0.0
        elif "Dropout" in type(layer).__name__ and getattr(layer, "rate", 0):
            layer.rate = 0.0
        else:
            continue
        names.append(layer.name)
    return names


def _evaluation_cause(session: Session, probe, figure: str) -> str:
    name = figure.removeprefix("test_")
    if name != "loss":
        metric = next((m for m in probe.exp.task.metrics if m.name == name), None)
        if metric is not None and metric.stateful:
            return (f"task metric {name!r} ({type(metric.per_example).__name__}): its state is "
                    "not a sum over rows (a mean, or the last batch's value), and distlab adds "
                    "the replicas' states: keep totals and counts in its variables (assign_add) "
                    "and divide in result()")
        return (f"task metric {name!r} is not a per-example value (it averages or ranks a "
                "whole batch): make it per example, or a stateful keras.metrics.Metric")
    return ("the model's outputs depend on the other rows of the batch at inference (a layer "
            "that normalises or pools over the batch)")


def _training_cause(probe) -> str:
    import keras

    layers = [layer for layer in probe.exp.model._flatten_layers()
              if isinstance(layer, keras.layers.BatchNormalization)
              and not getattr(layer, "synchronized", False)]
    if layers:
        return (f"BatchNormalization ({layers[0].name}) normalises over each replica's rows, "
                "which differ from the global batch: model.sync_batch_norm=true (or a "
                "synchronized=True layer) if the figures must not depend on the replica count")
    return ("a layer that depends on the batch, or a loss divided by the replica's batch "
            "instead of the global batch (a loop's own loss: use self.compute_loss, or "
            "tf.nn.compute_average_loss with the row weights)")


# ---- loops
def loops(session: Session) -> Row:
    cfg = session.run_config
    name, steps = cfg.loop.name, session.options.steps
    builtin = name in ("keras_fit", "custom")
    reference = {"keras_fit": "custom", "custom": "keras_fit"}.get(name, "custom")
    switch = [f"loop={reference}"] if builtin else ["loop.name=custom"]
    loss_rtol, weight_tol = _tolerances(session)
    run = session.trained()
    start, losses, weights = run.start, run.losses, run.end
    ref = session.probe("loops-reference", *switch)
    ref_losses = ref.train(steps)
    ref_weights = ref.weights()
    loss_diff = relative_diffs(losses, ref_losses)
    weight_diff, where = max_abs_diff(weights, ref_weights)
    tolerance = weight_tol * scale(weights)
    figures = {"losses": losses, "reference_losses": ref_losses,
               "weights_max_abs_diff": weight_diff}
    summary = (f"loop={name} against loop={reference}: {steps} per-step losses and the "
               f"weights after them")
    if where_not_finite := not_finite(the_run=losses, the_reference=ref_losses):
        return diverged("loops", summary, where_not_finite, figures)
    if loss_diff <= loss_rtol and weight_diff <= tolerance:
        return Row("loops", PASSED, summary + " agree", figures=figures)
    differs = (f"per-step losses differ by up to {loss_diff:.2g} (relative, tolerance "
               f"{loss_rtol:g}); weights by {weight_diff:.3g} in {where} (tolerance "
               f"{tolerance:.2g})")
    if builtin:
        return Row("loops", FAILED, summary, differs=differs, figures=figures,
                   cause="the model's own train_step (loop=keras_fit runs it, loop=custom does "
                   "not) or a layer that behaves otherwise under model.fit")
    quantities = _loop_quantities(session, run, start, weights, ref_weights, weight_tol,
                                  figures)
    return Row("loops", WARNING, summary, differs=f"{differs}; {quantities}",
               cause=f"loop.name={name!r} trains otherwise than loop=custom (perhaps on "
               "purpose): check the quantities named", figures=figures)


def _loop_quantities(session: Session, run, start, weights, ref_weights, weight_tol,
                     figures) -> str:
    """What the user's loop does otherwise: leaves out model.losses (it trains as the
    reference without them), and the scale of its updates against the reference's."""
    said = []
    if run.exp.model.losses:
        bare = session.probe("loops-without-model-losses", "loop.name=custom",
                             loop=without_model_losses())
        bare.train(session.options.steps)
        diff, _ = max_abs_diff(weights, bare.weights())
        figures["weights_max_abs_diff_without_model_losses"] = diff
        if diff <= weight_tol * scale(weights):
            said.append(f"the loss leaves out model.losses ({len(run.exp.model.losses)} "
                        "regularisation term(s)): it trains exactly as loop=custom without "
                        "them (use self.compute_loss)")
    moved = np.sqrt(sum(float(np.sum((weights[k] - start[k]) ** 2)) for k in start))
    ref_moved = np.sqrt(sum(float(np.sum((ref_weights[k] - start[k]) ** 2)) for k in start))
    ratio = moved / ref_moved if ref_moved else float("inf")
    figures["update_scale"] = ratio
    if abs(ratio - 1) > 0.01:
        said.append(f"its updates move the weights {ratio:.3g} x as far as loop=custom's "
                    "(gradient scale: a loss divided by the replica count twice, or summed)")
    return "; ".join(said) or "the loss and update scale look alike: another difference"


def without_model_losses():
    """loop=custom, its loss without the model's own losses (model.losses)."""
    import tensorflow as tf

    from distlab.training.loops import base
    from distlab.training.loops.custom import CustomLoop

    class WithoutModelLosses(CustomLoop):
        def compute_loss(self, labels, predictions, weights):
            base._steps.loss_computed = True
            per_example_loss = self.loss_fn(labels, predictions)
            loss = tf.nn.compute_average_loss(per_example_loss, sample_weight=weights)
            return self.exp.optimizer.scale_loss(loss), per_example_loss

    return WithoutModelLosses
