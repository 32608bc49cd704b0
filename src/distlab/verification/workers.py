"""The `workers` check (opt-in: `verify.workers=true`): the brief run as 2 local workers
(two processes of the `distlab` command, `strategy=multi_worker_mirrored`, each with its
TF_CONFIG on 127.0.0.1) against the same training in this process with 2 replicas
(`launch.job.run`, as the resume check runs its real jobs): the chief's test figures,
history losses and final checkpoint must agree within the replicas check's tolerances.
Every worker process is killed (SIGKILL) when it outlives WORKER_TIMEOUT."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np

from distlab.distribute.local_workers import LocalWorkers
from distlab.verification.report import FAILED, PASSED, Row
from distlab.verification.resume import _brief_evaluation, interruptible
from distlab.verification.session import Session
from distlab.verification.training_checks import _tolerances

WORKER_TIMEOUT = 600.0  # seconds a worker process may run before it is killed
WORKERS = 2


def check(session: Session) -> Row:
    from distlab.launch.job import run

    loss_rtol, weight_tol = _tolerances(session)
    where = session.where("workers")
    extra = _brief_evaluation(session)
    batch = 4 * session.options.batch  # the resume check's real jobs' settings
    summary = (f"2 local workers (strategy=multi_worker_mirrored, {session.options.steps} "
               "steps an epoch, 2 epochs) against 1 process with 2 replicas: the chief's test "
               f"figures and history losses (to {loss_rtol:g} relative) and final checkpoint "
               f"(to {weight_tol:g} x the largest weight)")
    one = interruptible(run(session.brief_config(*extra, replicas=WORKERS, batch=batch),
                            where / "one-process"))
    if not one.ok:
        return Row("workers", FAILED, summary, differs=f"the 1-process run failed: {one.error}",
                   cause=f"the run itself fails (see its run.log in {where / 'one-process'})")
    failure = _run_workers(session, where, [*extra, *_brief(session, batch)])
    if failure:
        return Row("workers", FAILED, summary, differs=failure,
                   cause="a worker could not run the experiment: code or data one process "
                   "cannot reach (a path relative to another directory, a module not on "
                   "PYTHONPATH), or the cluster did not form (ports, a firewall)")
    chief = json.loads((where / "W0" / "results.json").read_text())
    figures = {"chief": str(where / "W0"), "one_process": str(where / "one-process"),
               "test_loss_workers": chief.get("test_loss"),
               "test_loss_one_process": one.fields.get("test_loss")}
    problems, weights_differ = _compare(one.fields, chief, where, loss_rtol, weight_tol)
    if not problems:
        return Row("workers", PASSED, summary + ": equal", figures=figures)
    return Row("workers", FAILED, summary, differs="; ".join(problems), figures=figures,
               cause=_cause(weights_differ))


def _brief(session: Session, batch: int) -> list[str]:
    """The overrides of the brief run (as `brief_config` composes it), on 2 workers."""
    from distlab.verification.options import brief

    buffer = session.run_config.dataset.shuffle_buffer
    return [*brief(session.options, batch, buffer), *session.without_validation(),
            "strategy.name=multi_worker_mirrored", "strategy.cpu_devices=null"]


def _command(session: Session) -> list[str]:
    """The `distlab` command as this process runs it (its configs and `--config-dir`)."""
    from distlab.config.store import PACKAGE_CONFIG_PATH

    config_path = str(session.config_path or PACKAGE_CONFIG_PATH)
    command = [sys.executable, "-c", "import sys; from distlab.cli import main; "
               f"sys.argv[0] = 'distlab'; main(config_path={config_path!r})"]
    if session.config_dir is not None:
        command += ["--config-dir", str(Path(session.config_dir).expanduser().resolve())]
    return command


def _run_workers(session: Session, where: Path, extra: list[str]) -> str | None:
    """Run the 2 workers to their end (run dirs where/W0, where/W1); None, or why a worker
    failed (one line, with its last log lines)."""
    commands = [[*_command(session), *session.brief_overrides, *extra,
                 f"hydra.run.dir={where / f'W{index}'}"] for index in range(WORKERS)]
    workers = LocalWorkers.start(commands, [where / f"worker{i}.log" for i in range(WORKERS)])
    failure = workers.wait(timeout=WORKER_TIMEOUT, grace_s=0)
    return None if failure is None else failure.line(workers.cluster)


def _compare(one: dict, chief: dict, where: Path, loss_rtol: float, weight_tol: float
             ) -> tuple[list[str], bool]:
    """What differs between the 1-process run and the chief, and whether the weights do."""
    from distlab.verification.probe import relative_diffs

    problems = []
    for key in sorted(k for k in one if k.startswith("test_")):
        a, b = one[key], chief.get(key)
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            if b is None or relative_diffs([a], [b]) > loss_rtol:
                problems.append(f"{key} {b} on 2 workers against {a} in 1 process")
    losses = [_history(where / d) for d in ("one-process", "W0")]
    d = relative_diffs(*losses)
    if d > loss_rtol:
        problems.append(f"history losses {losses[1]} on 2 workers against {losses[0]} "
                        f"(relative {d:.2g})")
    weights = _checkpoint_diff(one.get("checkpoint"), chief.get("checkpoint"), weight_tol)
    if weights:
        problems.append(weights)
    return problems, bool(weights) or d > loss_rtol


def _history(run_dir: Path) -> list[float]:
    with open(run_dir / "history.csv", newline="") as f:
        return [float(row["loss"]) for row in csv.DictReader(f) if row.get("loss")]


def _checkpoint_diff(one: str | None, chief: str | None, tol: float) -> str | None:
    """Where the final checkpoints differ beyond `tol` x the largest weight, or None."""
    import tensorflow as tf

    if not one or not chief:
        return f"a final checkpoint is missing (1 process: {one}, the chief: {chief})"
    a, b = tf.train.load_checkpoint(one), tf.train.load_checkpoint(chief)
    theirs = b.get_variable_to_shape_map()
    keys = sorted(k for k in a.get_variable_to_shape_map()
                  if not k.startswith(("save_counter", "_CHECKPOINTABLE_OBJECT_GRAPH")))
    if missing := [k for k in keys if k not in theirs]:
        return f"the chief's checkpoint lacks {missing[0]} (and {len(missing) - 1} more)"
    values = {k: np.asarray(a.get_tensor(k)) for k in keys}
    numeric = [k for k in keys if values[k].dtype.kind == "f" and values[k].size]
    scale = max([1.0, *(float(np.max(np.abs(values[k]))) for k in numeric)])
    worst, where = 0.0, None
    for k in numeric:
        x, y = values[k].astype(np.float64), np.asarray(b.get_tensor(k), np.float64)
        diffs = np.where(np.isnan(x) & np.isnan(y), 0.0, np.abs(x - y))  # (an unset best: NaN)
        diff = float(np.max(diffs))
        if not diff <= worst:  # (NaN in one only included)
            worst, where = diff, k
    if worst > tol * scale or np.isnan(worst):
        return (f"final checkpoint differs by up to {worst:.3g} in {where} (tolerance "
                f"{tol * scale:.2g})")
    return None


def _cause(weights_differ: bool) -> str:
    if not weights_differ:  # trained alike, scored otherwise: the evaluation's own state
        return ("a metric or callback with per-worker state: a metric whose state is not a "
                "sum the workers can add (a mean, a max), or a callback that counts or scores "
                "on its own worker")
    return ("the workers did not train on what one process does: a data builder that is not "
            "the same on every worker (an unseeded shuffle or sample, rows read per process), "
            "a loop or callback with per-worker state (a Python counter, a variable made "
            "outside the strategy's scope), or a loss scaled by the worker's batch")
