"""TensorBoard HParams for a sweep: the experiment at the sweep dir and one session per job,
written with tensorboard's own protos and record writer (no TensorFlow)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from distlab.records.results import finite as _finite
from distlab.records.run_dir import RunDir
from distlab.reporting.jobs import Job, parse_value
from distlab.reporting.table import figure_fields, metrics

HPARAMS_SUFFIX = ".hparams"  # our event files; rewritten, never appended, by a re-run


def write_hparams(sweep_dir: Path, jobs: Sequence[Job], swept: Sequence[str]) -> None:
    """TensorBoard HParams: the experiment at the sweep dir, one session per job in
    <job>/logs/ (beside the loops' train/ and validation/ runs), with the job's hparams
    (swept overrides, effective batch sizes and learning rate, status) and final metrics.

    Written with tensorboard's own protos and record writer: no TensorFlow import.
    """
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.hparams import summary_v2 as hp

    def hparams_of(job: Job) -> dict[str, Any]:
        values: dict[str, Any] = {k: parse_value(job.override(k)) for k in swept}
        values.update({k: job.results.get(k) for k in
                       ("batch_size_per_replica", "global_batch_size", "num_replicas")})
        values["effective_learning_rate"] = job.results.get("learning_rate")
        values["status"] = job.status
        return {k: v for k, v in values.items() if isinstance(v, (bool, int, float, str))}

    sessions = [(job, hparams_of(job)) for job in jobs]
    names = list(dict.fromkeys(k for _, values in sessions for k in values))
    fields = metrics(jobs)
    primary = figure_fields(jobs)[0].split("_", 1)[1]
    shown = [hp.Metric(m) for m in fields]
    shown += [hp.Metric(f"epoch_{primary}", group="validation",
                        display_name=f"validation {primary} (per epoch)"),
              hp.Metric("epoch_loss", group="train", display_name="train loss (per epoch)")]
    hparams = [hp.HParam(n, _domain(hp, [v[n] for _, v in sessions if n in v])) for n in names]
    config = hp.hparams_config_pb(hparams=hparams, metrics=shown)
    _write_events(sweep_dir, [config], event_pb2)
    for job, values in sessions:
        summaries = [hp.hparams_pb(values, trial_id=f"job {job.num}")]
        summaries += [summary_pb2.Summary(value=[summary_pb2.Summary.Value(
            tag=m, simple_value=float(job.results[m]))])
            for m in fields if _finite(job.results.get(m))]
        _write_events(RunDir(job.path).logs, summaries, event_pb2)


def _domain(hp: Any, values: Sequence[Any]) -> Any:
    """A Discrete domain for strings and bools, a RealInterval for numbers, else none."""
    kinds = {type(v) for v in values}
    if kinds <= {str} or kinds <= {bool}:
        return hp.Discrete(sorted(set(values)))
    if kinds <= {int, float}:
        return hp.RealInterval(float(min(values)), float(max(values)))
    return None


def _write_events(logdir: Path, summaries: Sequence[Any], event_pb2: Any) -> None:
    """One event file of `summaries` in `logdir` (an earlier one of ours replaced), written
    with tensorboard's record writer on a plain file: its EventFileWriter would import
    TensorFlow (tf.io.gfile), tens of seconds in a sweep whose jobs were already complete."""
    from tensorboard.summary.writer.record_writer import RecordWriter

    logdir.mkdir(parents=True, exist_ok=True)
    for old in logdir.glob(f"events.out.tfevents.*{HPARAMS_SUFFIX}"):
        old.unlink()
    now = time.time()
    name = (f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}.{os.getpid()}.0"
            f"{HPARAMS_SUFFIX}")
    with open(logdir / name, "wb") as f:
        writer = RecordWriter(f)
        writer.write(event_pb2.Event(wall_time=now,
                                     file_version="brain.Event:2").SerializeToString())
        for summary in summaries:
            writer.write(event_pb2.Event(wall_time=time.time(), step=0,
                                         summary=summary).SerializeToString())
