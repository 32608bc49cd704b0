"""The `resume` check: a run sent SIGTERM in the middle of its first epoch, then rerun with
the same command, ends where the same run uninterrupted ends (its weights, optimizer state,
history and test figures). Both are real jobs (`launch.job.run`) in the scratch directory;
the signal is a real SIGTERM to this process, sent by a Keras callback after a chosen step."""

from __future__ import annotations

import csv
import logging
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import keras
import numpy as np

from distlab.errors import hydra_value
from distlab.verification.report import FAILED, PASSED, Row
from distlab.verification.session import Session


class SigtermOnce(keras.callbacks.Callback):
    """Send this process SIGTERM after step `step` (0-based) of the first epoch, once: the
    `marker` file says it was sent (the rerun, which resumes after it, sends none). With
    blocks of several steps per call (loop.steps_per_loop, steps_per_execution) the hook runs
    after each block's last step: the signal follows the block that holds `step`."""

    def __init__(self, step: int, marker: str) -> None:
        super().__init__()
        self.step, self.marker = step, Path(marker)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if batch >= self.step and not self.marker.exists():
            self.marker.write_text("sent")
            os.kill(os.getpid(), signal.SIGTERM)


def _blocks_up_to(session: Session, steps: int) -> list[str]:
    """`loop.steps_per_loop` / `loop.steps_per_execution` set to `steps` where the run's loop
    has the key at a larger value."""
    loop = session.run_config.loop
    return [f"loop.{key}={steps}" for key in ("steps_per_loop", "steps_per_execution")
            if isinstance(loop.get(key), int) and loop.get(key) > steps]


def check(session: Session) -> Row:
    from distlab.launch.job import run

    steps = session.options.steps
    at = steps // 2  # after this many steps of the first epoch (mid-epoch)
    whole_dir, cut_dir = session.where("resume-whole"), session.where("resume-stopped")
    # blocks of steps per call no longer than the cut, so that it falls mid-epoch (the loops
    # train alike in blocks of any length: the `loops` check)
    shortened = _blocks_up_to(session, at)
    extra = [*_brief_evaluation(session), *shortened]
    batch = 4 * session.options.batch  # (what it is does not matter here: fewer steps)
    cfg = session.brief_config(*extra, batch=batch)
    marker = cut_dir.parent / f"{cut_dir.name}.sigterm"
    stopped_cfg = session.brief_config(
        *extra, "+callbacks.verify_sigterm._target_=distlab.verification.resume.SigtermOnce",
        f"+callbacks.verify_sigterm.step={at - 1}", f"+callbacks.verify_sigterm.marker={marker}",
        batch=batch)
    whole = interruptible(run(cfg, whole_dir))
    with _quiet_expected_stop():
        first = interruptible(run(stopped_cfg, cut_dir))
    blocks = f", blocks of {at} steps per call" if shortened else ""
    summary = (f"SIGTERM after step {at} of epoch 1 ({steps} steps an epoch, 2 epochs{blocks}), "
               "rerun: "
               "weights, optimizer state, history and test figures against the run "
               "uninterrupted")
    if not whole.ok:
        return Row("resume", FAILED, summary, differs=f"the uninterrupted run failed: "
                   f"{whole.error}", cause="the run itself fails (see the run's run.log in "
                   f"{whole_dir})")
    if first.exit_code != 128 + signal.SIGTERM:
        return Row("resume", FAILED, summary,
                   differs=f"the run sent SIGTERM ended with status {first.exit_code} "
                   f"({first.error or 'completed'}), not stopped at a checkpoint",
                   cause="a loop or callback that ignores the stop request")
    resumed = interruptible(run(stopped_cfg, cut_dir))
    if not resumed.ok:
        return Row("resume", FAILED, summary, differs=f"the rerun failed: {resumed.error}",
                   cause="the checkpoint does not restore (a loop's state() item)")
    problems = _compare(whole.fields, resumed.fields, whole_dir, cut_dir)
    figures = {"stopped": first.error, "whole": str(whole_dir), "resumed": str(cut_dir)}
    if not problems:
        return Row("resume", PASSED, summary + ": identical", figures=figures)
    return Row("resume", FAILED, summary, differs="; ".join(problems), figures=figures,
               cause="state the checkpoint does not hold (a loop's or metric's variable, a "
               "Python counter, an iterator outside distlab's stream), or a data builder "
               "whose rows change between calls")


@contextmanager
def _quiet_expected_stop() -> Iterator[None]:
    """Without the stopped job's "stopped by signal 15 ..." error line: the SIGTERM is the
    check's own (the row keeps the line: figures["stopped"])."""
    expected = f"stopped by signal {int(signal.SIGTERM)} "

    def keep(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(expected)

    logger = logging.getLogger("distlab")
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def interruptible(results):
    """A job's results, or KeyboardInterrupt when it was stopped by SIGINT (Ctrl-C: the job
    heard it first and stopped at a checkpoint; verify stops too, with no verdict)."""
    if results.exit_code == 128 + signal.SIGINT:
        raise KeyboardInterrupt
    return results


def _brief_evaluation(session: Session) -> list[str]:
    """Score verify.rows test rows, where the test split is a plain split name with more."""
    test, rows = session.run_config.dataset.test_split, session.options.rows
    if not test.isidentifier() or session.test_rows() <= rows:
        return []
    return [f"dataset.test_split={hydra_value(f'{test}[:{rows}]')}"]


def _compare(whole: dict, resumed: dict, whole_dir: Path, cut_dir: Path) -> list[str]:
    import tensorflow as tf

    problems = []
    a = tf.train.load_checkpoint(whole["checkpoint"])
    b = tf.train.load_checkpoint(resumed["checkpoint"])
    keys = [k for k in a.get_variable_to_shape_map()  # model, optimizer, epoch sums, ...
            if not k.startswith(("save_counter", "_CHECKPOINTABLE_OBJECT_GRAPH"))]
    worst, where = 0.0, None
    for key in sorted(keys):
        try:
            x, y = np.asarray(a.get_tensor(key)), np.asarray(b.get_tensor(key))
        except Exception:  # noqa: BLE001 - missing in the resumed checkpoint
            return [f"the resumed checkpoint lacks {key}"]
        if x.dtype.kind in "fiu" and x.size:
            x, y = x.astype(np.float64), y.astype(np.float64)
            both_nan = np.isnan(x) & np.isnan(y)  # (an unset best value is NaN in both)
            diffs = np.where(both_nan, 0.0, np.abs(x - y))
            diff = float(np.max(np.nan_to_num(diffs, nan=np.inf)))
            if diff > worst:
                worst, where = diff, key
    if worst:
        problems.append(f"final checkpoint differs by up to {worst:.3g} (in {where})")
    rows = [_history(d) for d in (whole_dir, cut_dir)]
    if rows[0] != rows[1]:
        problems.append(f"history losses {rows[1]} against {rows[0]}")
    for key in sorted(k for k in whole if k.startswith("test_")):
        if whole[key] != resumed.get(key):
            problems.append(f"{key} {resumed.get(key)} against {whole[key]}")
    return problems


def _history(run_dir: Path) -> list[str]:
    with open(run_dir / "history.csv", newline="") as f:
        return [row.get("loss", "") for row in csv.DictReader(f)]
