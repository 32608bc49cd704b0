"""The Hydra callback that summarises a multirun (registered in conf/config.yaml).

When a sweep ends, `SweepSummary` reads every job's `.hydra/overrides.yaml` and
`results.json` and writes into the sweep dir:

    summary.csv   one row per job (job, overrides, status, batch sizes, effective learning
                  rate, the objective and its value, validation and test metrics, steady
                  examples/sec with its spread and per replica,
                  scaling efficiency, time to target, wall time, error), plus one column
                  per swept key
    summary.md    the same as a Markdown table
    summary.png   the objective, examples/sec (error bars) and time to target against the
                  swept value(s)
    events.out.tfevents.*.hparams (and one in each <job>/logs/)   TensorBoard HParams,
                  so `tensorboard --logdir <sweep dir>` compares the jobs

With logger=mlflow (a tracker), the sweep's parent run then gets the summary files and ends.

If any job failed, it then logs one line and exits with status 1. Importing this module
imports neither TensorFlow nor pyplot: Hydra instantiates callbacks in single runs too.
"""

from __future__ import annotations

import csv
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from distlab.launch import refusals, sweep_parent, sweep_signals
from distlab.launch.results import maximizes
from distlab.launch.run_dir import RunDir
from distlab.tracking import session as tracking

log = logging.getLogger(__name__)

LEADING = ["job", "overrides", "status", "batch_size_per_replica", "global_batch_size",
           "effective_batch_size", "num_replicas", "learning_rate"]
# steady-state examples/sec (warm-up left out) with its spread, per replica, and against
# the 1-replica job (scaling_efficiency, when the sweep varies the replica count)
THROUGHPUT = ["train_examples_per_sec", "train_examples_per_sec_std",
              "train_examples_per_sec_per_replica", "scaling_efficiency"]
TARGET = ["time_to_target_s", "epochs_to_target"]
# the field the sweep ranks by (its name) and each job's value of it
OBJECTIVE = ["objective", "objective_value"]
TRAILING = [*THROUGHPUT, *TARGET, "wall_time_s", "error"]
# the figure fields when no job reported any
CLASSIFICATION = ["val_accuracy", "val_loss", "test_accuracy", "test_loss"]


def figure_fields(jobs: Sequence[Job]) -> list[str]:
    """The task's val_* then test_* results.json fields (val_accuracy, val_loss, test_accuracy,
    test_loss for classification...), each split's primary metric first; val_* is what a
    sweep chooses on, test_* only reports."""
    found = list(dict.fromkeys(k for j in jobs for k in j.results
                               if k.startswith(("val_", "test_"))))
    if not found:
        return CLASSIFICATION
    out = []
    for split in ("val_", "test_"):
        mine = [k for k in found if k.startswith(split)]
        out += [k for k in mine if k != f"{split}loss"] + [k for k in mine
                                                           if k == f"{split}loss"]
    return out


def columns(jobs: Sequence[Job]) -> list[str]:
    return LEADING + OBJECTIVE + figure_fields(jobs) + TRAILING


def metrics(jobs: Sequence[Job]) -> list[str]:
    """Numeric per-job figures: the task's validation and test fields, throughput, time to
    target (when a job has one) and wall time."""
    return (figure_fields(jobs) + ["train_examples_per_sec"]
            + ["time_to_target_s"] * has_target(jobs) + ["wall_time_s"])


def has_target(jobs: Sequence[Job]) -> bool:
    return any("time_to_target_s" in j.results for j in jobs)


def scaling_efficiency(jobs: Sequence[Job], swept: Sequence[str]) -> dict[int, float]:
    """{job number: steady examples/sec / (replicas x the matching 1-replica job's)} when the
    sweep varies the replica count. The matching job has the same swept values apart from
    the strategy's keys (which set the replica count)."""
    done = [j for j in jobs if not j.failed and _finite(j.results.get("train_examples_per_sec"))]
    if len({j.results.get("num_replicas") for j in done}) < 2:
        return {}
    others = [k for k in swept if not k.startswith("strategy")]

    def key(job: Job) -> tuple:
        return tuple(job.override(k) for k in others)

    single = {key(j): j.results["train_examples_per_sec"] for j in done
              if j.results.get("num_replicas") == 1}
    return {j.num: j.results["train_examples_per_sec"] / (j.results["num_replicas"]
                                                          * single[key(j)])
            for j in done if key(j) in single and j.results.get("num_replicas")}
HPARAMS_SUFFIX = ".hparams"  # our event files; rewritten, never appended, by a re-run
MAX_PLOTTED_KEYS = 4


@dataclass
class Job:
    """One job of the sweep, as its run directory left it."""

    num: int
    path: Path
    overrides: list[str]
    results: dict[str, Any] = field(default_factory=dict)
    refused: bool = False  # this sweep refused it: its run dir holds another run

    @property
    def status(self) -> str:
        return str(self.results.get("status", "missing"))

    @property
    def failed(self) -> bool:
        return self.status != "completed"

    @property
    def error(self) -> str:
        if self.failed and not self.results:
            return "no results.json: the job did not finish (crashed, killed or still running)"
        return str(self.results.get("error") or "")

    def override(self, key: str) -> str | None:
        return override_values(self.overrides).get(key)


# --------------------------------------------------------------------------- reading


def find_jobs(sweep_dir: str | Path) -> list[Job]:
    """Every job dir under `sweep_dir` (any `hydra.sweep.subdir` layout), by job number. A
    job this sweep refused (`distlab.launch.refusals`) is a failed job with its reason and
    its own overrides, not the earlier run its directory holds."""
    jobs = []
    refused = refusals.read(sweep_dir)
    for hydra_yaml in Path(sweep_dir).glob("**/.hydra/hydra.yaml"):
        path = hydra_yaml.parent.parent
        if ".distlab" in path.relative_to(sweep_dir).parts:
            continue  # a run dir's own snapshot of .hydra/
        overrides_yaml = hydra_yaml.parent / "overrides.yaml"
        overrides = OmegaConf.load(overrides_yaml) if overrides_yaml.exists() else []
        job = Job(num=_job_num(hydra_yaml, path), path=path,
                  overrides=[str(o) for o in overrides],
                  results=RunDir(path).read_results() or {})
        if (refusal := refused.get(str(path.resolve()))) is not None:
            job.refused = True
            job.overrides = refusal["overrides"] or job.overrides
            job.results = {"status": "failed", "error": f"refused: {refusal['error']}"}
        jobs.append(job)
    return sorted(jobs, key=lambda j: (j.num, str(j.path)))


def _job_num(hydra_yaml: Path, path: Path) -> int:
    num = OmegaConf.select(OmegaConf.load(hydra_yaml), "hydra.job.num", default=None)
    if isinstance(num, int):
        return num
    return int(path.name) if path.name.isdigit() else -1


def override_values(overrides: Sequence[str]) -> dict[str, str]:
    """{"dataset.batch_size_per_replica": "32", ...} from `key=value` overrides."""
    values = {}
    for override in overrides:
        key, sep, value = override.partition("=")
        if sep:
            values[key.lstrip("+~")] = value
    return values


def swept_keys(jobs: Sequence[Job]) -> list[str]:
    """The override keys whose values differ between jobs, in command-line order."""
    keys: dict[str, None] = {}
    for job in jobs:
        keys.update(dict.fromkeys(override_values(job.overrides)))
    return [k for k in keys if len({job.override(k) for job in jobs}) > 1]


def common_overrides(jobs: Sequence[Job], swept: Sequence[str]) -> list[str]:
    """The overrides every job shares (the swept ones aside)."""
    if not jobs:
        return []
    return [o for o in jobs[0].overrides
            if override_values([o]) and next(iter(override_values([o]))) not in swept]


def parse_value(text: str | None) -> bool | int | float | str | None:
    """An override's value as Hydra would read it (int, float, bool, null or a string)."""
    if text is None or text == "null":
        return None
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip("'\"")


# --------------------------------------------------------------------------- tables


def rows(jobs: Sequence[Job], swept: Sequence[str], objective: str = "") -> list[dict[str, Any]]:
    """One summary row per job: `columns(jobs)`, then one column per swept key. `objective`:
    the field the sweep ranks by (empty: each job's own `objective`)."""
    table = []
    efficiency = scaling_efficiency(jobs, swept)
    for job in jobs:
        row: dict[str, Any] = {key: job.results.get(key) for key in columns(jobs)}
        field = objective or job.results.get("objective")
        value = job.results.get(field) if field else None
        row.update(job=job.num, overrides=" ".join(job.overrides), status=job.status,
                   error=job.error, scaling_efficiency=efficiency.get(job.num),
                   objective=field or None, objective_value=value if _finite(value) else None)
        row.update({key: job.override(key) for key in swept})
        table.append(row)
    return table


def write_csv(path: Path, table: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        for row in table:
            writer.writerow({k: "" if row.get(k) is None else row[k] for k in columns})


def best_job(jobs: Sequence[Job], objective: str, maximize: bool) -> Job | None:
    scored = [j for j in jobs if not j.failed and _finite(j.results.get(objective))]
    pick = max if maximize else min
    return pick(scored, key=lambda j: float(j.results[objective])) if scored else None


def markdown(jobs: Sequence[Job], swept: Sequence[str], sweep_dir: Path, objective: str,
             maximize: bool) -> str:
    """summary.md: a headline, the shared overrides and one table row per job."""
    failed = [j for j in jobs if j.failed]
    lines = [f"# Sweep {sweep_dir}", "",
             f"{len(jobs)} jobs: {len(jobs) - len(failed)} completed, {len(failed)} failed."]
    best = best_job(jobs, objective, maximize)
    lines.append(f"Objective: `{objective}` ({'max' if maximize else 'min'}imized), each "
                 "job's value in the column objective value.")
    if best is not None:
        lines.append(f"Best {objective} ({'max' if maximize else 'min'}): "
                     f"{_cell(best.results[objective])} in job {best.num} "
                     f"({' '.join(_swept_overrides(best, swept)) or 'no swept override'}).")
    common = common_overrides(jobs, swept)
    if common:
        lines.append("Common overrides: " + " ".join(f"`{o}`" for o in common))
    lines.append("examples/sec is the steady state (each process's warm-up left out; "
                 "trainer.throughput), ± its standard deviation across epochs or step windows.")
    fields = figure_fields(jobs)
    efficiency = scaling_efficiency(jobs, swept)
    target = has_target(jobs)
    headers = ["job", "overrides", "status", "batch/replica", "global batch",
               "effective batch", "replicas", "learning rate (effective)", "objective value",
               *(f.replace("_", " ") for f in fields), "examples/sec", "per replica",
               *(["scaling efficiency"] if efficiency else []),
               *(["time to target (s)", "epochs to target"] if target else []),
               "wall time (s)", "error"]
    lines += ["", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for job in jobs:
        r = job.results
        rate, std = r.get("train_examples_per_sec"), r.get("train_examples_per_sec_std")
        cells = [job.num, " ".join(_swept_overrides(job, swept)), job.status,
                 r.get("batch_size_per_replica"), r.get("global_batch_size"),
                 r.get("effective_batch_size"), r.get("num_replicas"), r.get("learning_rate"),
                 r.get(objective), *(r.get(f) for f in fields),
                 f"{_cell(rate)} ± {_cell(std)}" if _finite(std) else rate,
                 r.get("train_examples_per_sec_per_replica"),
                 *([efficiency.get(job.num)] if efficiency else []),
                 *([r.get("time_to_target_s"), r.get("epochs_to_target")] if target else []),
                 r.get("wall_time_s"), job.error]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _swept_overrides(job: Job, swept: Sequence[str]) -> list[str]:
    values = override_values(job.overrides)
    return [f"{k}={values[k]}" for k in swept if k in values] if swept else job.overrides


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


# --------------------------------------------------------------------------- plot


def plot(path: Path, jobs: Sequence[Job], swept: Sequence[str], objective: str = "") -> None:
    """summary.png: one row per swept key (or the job number), the objective (else the task's
    primary validation metric), steady examples/sec with error bars (its spread) and, when jobs
    have a target, time to target against it. Uses matplotlib's object API (no pyplot, no
    GUI backend)."""
    score = objective or figure_fields(jobs)[0]
    plotted = [(score, score.replace("_", " ")),
               ("train_examples_per_sec", "examples/sec (steady, ± std)")]
    if has_target(jobs):
        plotted.append(("time_to_target_s", "time to target (s)"))
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    keys = list(swept[:MAX_PLOTTED_KEYS]) or ["job"]
    done = [j for j in jobs if not j.failed]
    fig = Figure(figsize=(5 * len(plotted), 3.4 * len(keys)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(keys), len(plotted), squeeze=False)
    for row, key in zip(axes, keys, strict=True):
        xs = [j.num if key == "job" else parse_value(j.override(key)) for j in done]
        numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
        categories = [] if numeric else sorted({str(x) for x in xs})
        positions = xs if numeric else [categories.index(str(x)) for x in xs]
        for ax, (metric, label) in zip(row, plotted, strict=True):
            points = sorted([(x, j.results[metric], j.results.get(f"{metric}_std"))
                             for x, j in zip(positions, done, strict=True)
                             if _finite(j.results.get(metric))], key=lambda p: p[:2])
            errors = [e if _finite(e) else 0.0 for _, _, e in points]
            ax.errorbar([x for x, _, _ in points], [y for _, y, _ in points],
                        yerr=errors if any(errors) else None,
                        fmt="o-" if len(keys) == 1 else "o", color="tab:blue", capsize=4)
            for x, y, _ in points:
                ax.annotate(f"{y:.3g}", (x, y), textcoords="offset points", xytext=(0, 6),
                            ha="center", fontsize=8)
            ticks = sorted(set(xs)) if numeric else []
            if ticks and ticks[0] > 0 and ticks[-1] / ticks[0] >= 8:  # batch sizes, rates
                ax.set_xscale("log")
                ax.minorticks_off()
            if numeric and len(ticks) <= 8:
                ax.set_xticks(ticks, [f"{x:.3g}" for x in ticks])
            elif not numeric:
                ax.set_xticks(range(len(categories)), categories)
            ax.set_xlabel(key)
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
    failed = len(jobs) - len(done)
    fig.suptitle(f"{path.parent}: {len(jobs)} jobs"
                 + (f" ({failed} failed, not shown)" if failed else ""))
    fig.savefig(path, dpi=100)


# --------------------------------------------------------------------------- TensorBoard


def write_hparams(sweep_dir: Path, jobs: Sequence[Job], swept: Sequence[str]) -> None:
    """TensorBoard HParams: the experiment at the sweep dir, one session per job in
    <job>/logs/ (beside the loops' train/ and validation/ runs), with the job's hparams
    (swept overrides, effective batch sizes and learning rate, status) and final metrics.

    Written with tensorboard's own protos and event writer: no TensorFlow import.
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
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    logdir.mkdir(parents=True, exist_ok=True)
    for old in logdir.glob(f"events.out.tfevents.*{HPARAMS_SUFFIX}"):
        old.unlink()
    writer = EventFileWriter(str(logdir), filename_suffix=HPARAMS_SUFFIX)
    for summary in summaries:
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=0, summary=summary))
    writer.close()


# --------------------------------------------------------------------------- callback


class SweepSummary(Callback):
    """Hydra callback: summarise the multirun into its sweep dir; fail it if a job failed.

    `fail_on_error`: exit with status 1 when a job failed; `plot`: summary.png;
    `tensorboard`: the HParams event files.
    """

    def __init__(self, fail_on_error: bool = True, plot: bool = True,
                 tensorboard: bool = True) -> None:
        self.fail_on_error = fail_on_error
        self.plot = plot
        self.tensorboard = tensorboard

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        refusals.start_sweep()  # the jobs it refuses are recorded under its own id
        sweep_parent.mark_sweep_process()  # its job processes stop if it dies
        # Ctrl-C/SIGTERM (or a dead job process) of a process launcher's sweep: its
        # running jobs checkpoint, then this ends it
        sweep_signals.coordinate(config, on_end=lambda: self.on_multirun_end(config))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.core.utils import configure_log

        # An in-process launcher leaves the last job's logging (and its run.log) in place.
        configure_log(config.hydra.hydra_logging, config.hydra.verbose)
        sweep_dir = Path(str(config.hydra.sweep.dir))
        failed = self.summarise(sweep_dir, objective=str(config.get("objective") or ""),
                                maximize=_maximize(config, find_jobs(sweep_dir)))
        summaries = [sweep_dir / name for name in ("summary.csv", "summary.md", "summary.png")]
        ending = sweep_signals.end()  # stopped by a signal, or a job's process died
        tracking.finish_sweep(config, sweep_dir, len(failed),
                              [path for path in summaries if path.exists()],
                              refused=[(j.path, " ".join(j.overrides), j.error)
                                       for j in failed if j.refused],
                              interrupted=ending is not None and ending.signum is not None)
        if ending is not None:
            log.error("%s; see %s", ending.message, sweep_dir / "summary.md")
            raise SystemExit(ending.status)
        if failed and self.fail_on_error:
            log.error("sweep failed: %d job(s) failed (%s); see %s", len(failed),
                      ", ".join(f"job {j.num}: {_first_line(j.error)}" for j in failed),
                      sweep_dir / "summary.md")
            raise SystemExit(1)

    def summarise(self, sweep_dir: Path, objective: str = "",
                  maximize: bool = True) -> list[Job]:
        """Write the summary files; return the failed jobs. `objective`: the results.json
        field to rank by (empty: the one the jobs report as theirs)."""
        jobs = find_jobs(sweep_dir)
        if not jobs:
            log.warning("sweep summary: no job directories under %s", sweep_dir)
            return []
        swept = swept_keys(jobs)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        objective = objective or next((str(j.results["objective"]) for j in jobs
                                       if j.results.get("objective")), figure_fields(jobs)[0])
        write_csv(sweep_dir / "summary.csv", rows(jobs, swept, objective),
                  columns(jobs) + swept)
        (sweep_dir / "summary.md").write_text(markdown(jobs, swept, sweep_dir, objective,
                                                       maximize))
        written = ["summary.csv", "summary.md"]
        extras = []
        if self.plot:
            extras.append(("summary.png", lambda: plot(sweep_dir / "summary.png", jobs, swept,
                                                       objective)))
        if self.tensorboard:
            extras.append(("TensorBoard HParams", lambda: write_hparams(sweep_dir, jobs, swept)))
        for name, write in extras:
            try:  # a summary without its figure beats no summary
                write()
                written.append(name)
            except Exception as e:  # noqa: BLE001
                log.warning("sweep summary: could not write %s: %s: %s", name,
                            type(e).__name__, e)
        failed = [j for j in jobs if j.failed]
        log.info("sweep summary (%d jobs, %d failed): %s in %s", len(jobs), len(failed),
                 ", ".join(written), sweep_dir)
        return failed


def _maximize(config: DictConfig, jobs: Sequence[Job] = ()) -> bool:
    """The Optuna sweeper's direction if the user set one; else the direction the jobs report
    for their objective (`distlab.launch.results`: accuracy up, MAE and times down); else maximise
    by the field's name (run dirs written before jobs reported a direction)."""
    direction = OmegaConf.select(config, "hydra.sweeper.direction", default=None)
    direction = getattr(direction, "name", direction)  # the sweeper's schema uses an Enum
    if direction in ("maximize", "minimize"):
        return direction == "maximize"
    reported = {j.results.get("objective_direction") for j in jobs} - {None}
    if len(reported) == 1:
        return reported == {"maximize"}
    return maximizes(str(config.get("objective") or ""), {}, None)  # by its name alone


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:200] if text.strip() else "failed"
