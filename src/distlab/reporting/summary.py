"""The Hydra callback that summarises a multirun (registered in conf/config.yaml).

When a sweep ends, `SweepSummary` reads every job's `.hydra/overrides.yaml` and
`results.json` and writes into the sweep dir:

    summary.csv   one row per job (job, overrides, status, batch sizes, effective learning
                  rate, the objective and its value, validation and test metrics, steady
                  examples/sec with its spread and per replica,
                  scaling efficiency, time to target, wall time, error), plus one column
                  per swept key
    summary_groups.csv  when jobs differ only in `seed` (repeats): one row per group, ranked
                  by the objective's mean: n, seeds and each figure's mean, standard
                  deviation and 95% confidence interval (`repeats`)
    summary.md    the same as Markdown tables, headed by the best configuration
    optuna_importance.csv, optuna_importance.png, optuna_history.png   for an Optuna search
                  whose study the sweep dir keeps (`search`): parameter importances and the
                  optimisation history; summary.md gets their table
    summary.png   the objective, examples/sec (error bars) and time to target against the
                  swept value(s)
    events.out.tfevents.*.hparams (and one in each <job>/logs/)   TensorBoard HParams,
                  so `tensorboard --logdir <sweep dir>` compares the jobs

With logger=mlflow (a tracker), the sweep's parent run then gets the summary files and ends.

If any job failed, it then logs one line and exits with status 1. Importing this module
imports neither TensorFlow nor pyplot: Hydra instantiates callbacks in single runs too.

The parts: `jobs` (discovery), `table` (summary.csv, summary.md), `plot` (its panels),
`hparams` (TensorBoard); their names stay importable from here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from distlab.launch import refusals, sweep_parent, sweep_signals
from distlab.records.ranking import maximizes
from distlab.reporting.hparams import HPARAMS_SUFFIX, write_hparams
from distlab.reporting.jobs import (
    Job,
    common_overrides,
    find_jobs,
    override_values,
    parse_value,
    swept_keys,
    tally,
)
from distlab.reporting.plot import MAX_PLOTTED_KEYS, Panel, panels, plot
from distlab.reporting.repeats import Group, group_repeats, has_repeats, rank
from distlab.reporting.search import SEARCH_FILES, Analysis, analyse, load_study
from distlab.reporting.table import (
    CLASSIFICATION,
    GROUPS_CSV,
    LEADING,
    OBJECTIVE,
    TARGET,
    THROUGHPUT,
    TRAILING,
    best_job,
    columns,
    figure_fields,
    has_target,
    markdown,
    metrics,
    repeat_fields,
    rows,
    scaling_efficiency,
    write_csv,
    write_group_csv,
)
from distlab.tracking import session as tracking

log = logging.getLogger(__name__)


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
        study_name = OmegaConf.select(config, "hydra.sweeper.study_name", default=None)
        # a search's jobs are its study's trials, a resumed one's not all launched again
        failed = self.summarise(sweep_dir, objective=str(config.get("objective") or ""),
                                maximize=_set_direction(config), study_name=study_name,
                                this_sweep=study_name is None)
        summaries = [sweep_dir / name for name in ("summary.csv", GROUPS_CSV, "summary.md",
                                                   "summary.png", *SEARCH_FILES)]
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
                  maximize: bool | None = None, study_name: str | None = None,
                  this_sweep: bool = False) -> list[Job]:
        """Write the summary files; return the failed jobs (a pruned one is not).
        `objective`: the results.json field to rank by (empty: the one the jobs report as
        theirs); `maximize`: which way (None: `_maximize`'s, for that objective);
        `study_name`: the Optuna study to analyse when the sweep dir keeps one (default: its
        only, or last, study); `this_sweep`: only the jobs this sweep invocation launched."""
        jobs = find_jobs(sweep_dir, this_sweep)
        if not jobs:
            log.warning("sweep summary: no job directories under %s", sweep_dir)
            return []
        swept = swept_keys(jobs)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        objective = objective or next((str(j.results["objective"]) for j in jobs
                                       if j.results.get("objective")), "")
        # else the task's first figure (jobs of an earlier distlab wrote no objective), or,
        # when no job has a figure either (every one failed early), none named
        named = bool(objective) or any(k.startswith(("val_", "test_"))
                                       for j in jobs for k in j.results)
        objective = objective or figure_fields(jobs)[0]
        if maximize is None:
            maximize = _maximize(jobs, objective)
        table = rows(jobs, swept, objective if named else "")
        write_csv(sweep_dir / "summary.csv", table, columns(jobs) + swept)
        written = ["summary.csv"]
        groups = repeats(jobs, table, objective, maximize)
        if groups:
            write_group_csv(sweep_dir / GROUPS_CSV, groups, swept, repeat_fields(jobs, objective))
            written.append(GROUPS_CSV)
        analysis = self.analyse_search(sweep_dir, study_name, objective)
        (sweep_dir / "summary.md").write_text(markdown(jobs, swept, sweep_dir, objective,
                                                       maximize, groups, analysis.lines,
                                                       named=named))
        written += ["summary.md", *analysis.written]
        extras = []
        if self.plot:
            extras.append(("summary.png", lambda: plot(sweep_dir / "summary.png", jobs, swept,
                                                       objective, groups)))
        if self.tensorboard:
            extras.append(("TensorBoard HParams", lambda: write_hparams(sweep_dir, jobs, swept)))
        for name, write in extras:
            try:  # a summary without its figure beats no summary
                write()
                written.append(name)
            except Exception as e:  # noqa: BLE001
                log.warning("sweep summary: could not write %s: %s: %s", name,
                            type(e).__name__, e)
        log.info("sweep summary (%s): %s in %s", tally(jobs), ", ".join(written), sweep_dir)
        return [j for j in jobs if j.failed and not j.pruned]


    def analyse_search(self, sweep_dir: Path, study_name: str | None = None,
                       objective: str = "Objective Value") -> Analysis:
        """An Optuna search's importances and history (`search`), when the sweep dir keeps
        its study; a failure or a missing requirement is one logged line."""
        try:
            study, why = load_study(sweep_dir, study_name)
            if study is None:
                if why:
                    log.info("sweep summary: %s", why)
                return Analysis(note=why)
            return analyse(study, sweep_dir, plots=self.plot, target_name=objective)
        except Exception as e:  # noqa: BLE001 - a summary without the analysis beats none
            log.warning("sweep summary: no search analysis: %s: %s", type(e).__name__, e)
            return Analysis(note=str(e))


def repeats(jobs: Sequence[Job], table: Sequence[dict[str, Any]], objective: str,
            maximize: bool) -> list[Group]:
    """The groups of jobs that differ only in seed, ranked by the objective's mean; empty
    when no configuration was repeated with another seed."""
    listed = [{**row, "overrides": job.overrides} for row, job in zip(table, jobs, strict=True)]
    groups = group_repeats(listed, repeat_fields(jobs, objective))
    return rank(groups, objective, maximize) if has_repeats(groups) else []


def _set_direction(config: DictConfig) -> bool | None:
    """Whether the Optuna sweeper's direction, if the user set one, maximizes (None: unset,
    or `auto`)."""
    direction = OmegaConf.select(config, "hydra.sweeper.direction", default=None)
    direction = getattr(direction, "name", direction)  # the sweeper's schema uses an Enum
    return direction == "maximize" if direction in ("maximize", "minimize") else None


def _maximize(jobs: Sequence[Job], objective: str) -> bool:
    """Whether to rank `objective` upwards: as the jobs report it (results.json's
    `objective_direction` for that objective), else by the field's own direction
    (`distlab.records.ranking`: accuracy up, MAE and times down; run dirs written before jobs
    reported a direction)."""
    reported = {j.results.get("objective_direction") for j in jobs
                if j.results.get("objective") == objective} - {None}
    if len(reported) == 1:
        return reported == {"maximize"}
    return maximizes(objective)


def _first_line(text: str, limit: int = 200) -> str:
    """An error's first line, cut at a word (with an ellipsis) when longer than `limit`."""
    line = text.strip().splitlines()[0] if text.strip() else "failed"
    return line if len(line) <= limit else line[:limit].rsplit(" ", 1)[0] + " \u2026"


__all__ = ["CLASSIFICATION", "HPARAMS_SUFFIX", "LEADING", "MAX_PLOTTED_KEYS", "OBJECTIVE",
           "TARGET", "THROUGHPUT", "TRAILING", "Job", "Panel", "SweepSummary", "best_job",
           "columns", "common_overrides", "figure_fields", "find_jobs", "has_target", "markdown",
           "metrics", "override_values", "panels", "parse_value", "plot", "rows",
           "scaling_efficiency", "swept_keys", "write_csv", "write_hparams"]
