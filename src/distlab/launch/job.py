"""One job: validate the config, take the run directory, decide what to do, run, report.

`run(cfg, output_dir)` runs one composed config and returns its `Results`; it never exits
the interpreter and reads no Hydra global, so a notebook or another program can call it (or
`distlab.train`) many times. The `distlab` command (`distlab.cli`) turns the Results into an
exit status. Nothing here imports TensorFlow until the config is valid and the run
directory is ours.

`api.train` composes the config and calls `run`; `rerun` holds the rerun rules.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from distlab import plugins
from distlab.components import precision
from distlab.config import validate
from distlab.distribute.cluster import current_worker
from distlab.distribute.preemption import (
    DONE,
    FINISH,
    SETUP,
    Interrupted,
    Signalled,
    StopRequest,
    stop_on_signals,
)
from distlab.errors import (
    ConfigError,
    DistlabError,
    LostWorker,
    UserCodeError,
    described,
)
from distlab.errors import message as error_message
from distlab.launch import refusals, workers
from distlab.launch.rerun import already_completed, rerun_refusal, stages_missing
from distlab.records.fields import is_field
from distlab.records.results import assemble, failed_results, objective_value
from distlab.records.run_dir import RunDir, RunDirBusy
from distlab.tracking import session as tracking

log = logging.getLogger("distlab")
USER_ERROR, INTERNAL_ERROR, LOST_WORKER = 2, 1, 3  # exit statuses of the `distlab` command
_IMPORTED = time.time()


@dataclass
class Results:
    """What one job did: its run directory, its results.json fields (empty when it was
    refused before writing any), the objective returned to sweepers, and the exit status the
    `distlab` command ends with: 0 (done, or already done), 2 (a user error or a refused run
    directory: `error` says why), 1 (an unexpected error; the traceback is in run.log), 3 (a
    multi-worker run lost a worker; rerun every worker to resume) or 128+N (stopped by
    signal N; rerun to resume)."""

    run_dir: Path
    fields: dict[str, Any] = field(default_factory=dict)
    objective: float | None = None
    exit_code: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def interrupted(self) -> bool:
        return self.exit_code >= 128

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]


@contextmanager
def _log_to(path: Path) -> Iterator[None]:
    """distlab's log lines (INFO and up) also into `path`, for a job run outside Hydra (whose
    own run.log holds TensorFlow's and Hydra's lines too)."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - "
                                           "%(message)s"))
    level = log.level
    log.addHandler(handler)
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        handler.close()


def run(cfg: DictConfig, output_dir: str | Path | None = None,
        multirun: bool = False, log_file: bool = False,
        sweep_dir: str | Path | None = None, origin: float | None = None) -> Results:
    """Run one job into `output_dir` (default: the current directory) and return its Results.

    A user error (bad config, missing data, unusable checkpoint) is logged as one line and
    recorded as failed in results.json (exit_code 2); so is an unexpected one (exit_code 1,
    its traceback in run.log). `origin`: the zero of the job's clocks, `wall_time_s` and
    `time_to_target_s` (the `distlab` command passes its process start, so a single run's
    figures include the imports, as a whole-process benchmark does); default, and always in
    a sweep (`multirun`): the start of the job's own work, after TensorFlow's import, which
    only a process's first job pays (so jobs compare). `log_file`: the chief also writes
    distlab's log lines to the run dir's run.log once the directory is its own (Hydra does
    this for the command). `sweep_dir`: a sweep job's sweep directory (its tracker's parent
    run). Under
    `strategy=multi_worker_mirrored` every worker follows the chief's decision; only the
    chief tracks (logger=mlflow...).
    """
    started = time.time()
    origin = None if multirun else origin
    run_dir = RunDir(output_dir or Path.cwd())
    out = run_dir.path
    scratch = None
    logging_to, signals = ExitStack(), ExitStack()
    session, outcome = None, None  # the chief's tracker run, and what it is told at the end
    stop, results, owned = StopRequest(), None, False
    completing = None  # a completed run rerun for a missing stage: its record stays if cut short
    try:
        _check_interpolations(cfg)
        validate(cfg)
        if workers.launches(cfg):  # the `distlab` command starts them (cli.hydra_job)
            raise DistlabError(
                f"strategy.workers={cfg.strategy.workers} is started by the distlab command "
                "(distlab ... or python run.py ...), which starts the workers itself; here, "
                "give each worker its TF_CONFIG, or unset strategy.workers")
        plugins.check(cfg)  # user code imported, every group's name resolved
        tracker = tracking.build(cfg)  # one that cannot run (MLflow missing) is refused here
        worker = current_worker(cfg.strategy)
        # from here to the end a signal ends the job in order (across workers SIGTERM is
        # TensorFlow's preemption handler's while training)
        stop = signals.enter_context(stop_on_signals(sigterm=not worker.multi_worker))
        if not worker.is_chief:  # only the chief writes the run dir; workers write to scratch
            scratch = Path(tempfile.mkdtemp(prefix=f"distlab-{worker.type}{worker.index}-"))
            run_dir = RunDir(scratch)
        run_dir.check_writable()
        run_dir.lock()  # one job per run directory (a dead holder's lock is released)
        # auto: this machine's policy, the one recorded and compared (logged once it trains)
        asked_auto, chose = cfg.precision == "auto", precision.resolve(cfg)
        config = OmegaConf.to_container(cfg, resolve=True)
        verdict, refusal, previous = "train", None, None
        if worker.is_chief:
            refusal = rerun_refusal(run_dir, config, cfg.mode, in_sweep=sweep_dir is not None)
            if refusal and asked_auto and "precision (" in refusal:
                refusal += (f" (precision=auto chose {cfg.precision} here: give the run's "
                            "precision to resume it on this machine)")
            previous = run_dir.read_results()
            completing = None if refusal else stages_missing(previous, cfg, run_dir)
            verdict = ("refused" if refusal else "train" if completing
                       else "completed" if already_completed(previous, cfg) else "train")
            if completing:
                log.info("%s completed without %s: its stages after training run again "
                         "(nothing is trained)", run_dir.path, completing)
        strategy = None
        if worker.multi_worker:  # the cluster forms, then every worker takes the chief's verdict
            from distlab.distribute import multi_worker
            from distlab.training import runner

            strategy = runner.connect(cfg, run_dir.results_json if worker.is_chief else None,
                                      failed_results(cfg, "", origin or started))
            # before anything is built or trained: the same experiment on every worker
            try:
                multi_worker.same_config(worker, config, run_dir.path,
                                         cfg.strategy.connect_timeout_s)
            except DistlabError as e:
                if not (asked_auto and "precision (" in str(e)):
                    raise
                raise DistlabError(
                    f"{e}; precision=auto chose per machine, and these machines' devices "
                    f"differ (this one: {chose.removeprefix('precision=auto: ')}): give every "
                    "worker precision=float32 or mixed_bfloat16") from None
            verdict = multi_worker.agree(strategy, verdict if worker.is_chief else None)
        if verdict == "refused":
            if sweep_dir is not None and worker.is_chief:  # a failed job of the sweep
                refusals.record(sweep_dir, run_dir.path, refusal or "refused")
            run_dir.restore_hydra()  # leave the directory exactly as it was
            error = refusal or "the chief refused this run; see its output"
            print(f"error: {error}", file=sys.stderr)  # not logged: run.log stays as it was
            return Results(out, exit_code=USER_ERROR, error=error)
        if verdict == "completed":
            log.info("%s already completed %s epoch(s); not retraining. results: %s",
                     run_dir.path, (previous or {}).get("epochs_completed", "its"),
                     json.dumps(previous or {}))
            if scratch is None and tracking.tracks(tracker):  # a tracker added since, say
                tracking.Session(tracker, run_dir, config, sweep_dir).catch_up(previous or {})
            return Results(out, previous or {}, objective_value(previous or {}, cfg.objective))
        run_dir.mark_holder()
        run_dir.not_started_mark.unlink(missing_ok=True)  # (a stopped sweep's, now started)
        owned = True
        stop.begin(SETUP)  # (the stage since the handlers; from here the run dir is ours)
        if log_file and scratch is None:
            logging_to.enter_context(_log_to(run_dir.path / "run.log"))
        if chose:
            log.info(chose)
        if cfg.mode == "train":
            run_dir.record_start(config)
        if scratch is None and tracking.tracks(tracker):
            session = run_dir.tracker = tracking.Session(tracker, run_dir, config, sweep_dir)
            session.start()
        from distlab.training.runner import execute  # imports TensorFlow

        results = execute(cfg, run_dir, strategy=strategy, worker=worker, origin=origin,
                          stop=stop)
        stop.begin(FINISH)
        if scratch is None:
            run_dir.write_results(results)
            log.info("results: %s", run_dir.results_json)
        outcome = results
        if session is not None:
            session.finish(results)
            session = run_dir.tracker = None
        stop.begin(DONE, polled=True)  # a signal from now on is only noted
        return Results(out, results, objective_value(results, cfg.objective))
    except RunDirBusy as e:  # another job's directory: change nothing in it
        if sweep_dir is not None and scratch is None:  # a failed job of the sweep
            refusals.record(sweep_dir, run_dir.path, str(e))
        run_dir.restore_hydra()
        print(f"error: {e}", file=sys.stderr)
        return Results(out, exit_code=USER_ERROR, error=str(e))
    except (Interrupted, Signalled) as e:  # a signal: what the job finished is kept
        stopped = stop.as_interrupted(e)
        log.error(str(stopped))
        outcome = None if completing else _interrupted_results(
            stopped, results, run_dir.read_results() if owned else None, cfg, origin or started)
        if owned and scratch is None and outcome is not None:
            run_dir.write_results(outcome)
        return Results(out, outcome or {}, exit_code=128 + stopped.signum, error=str(stopped))
    except Exception as e:  # noqa: BLE001 - every failure is reported the same way
        user_error = isinstance(e, DistlabError)
        # a DistlabError is one line (when TensorFlow traced the code it came from, without
        # the traced frames); anything else: its type and first line, the traceback in run.log
        message = error_message(e) if user_error else f"{type(e).__name__}: {e}"
        if isinstance(e, UserCodeError) and e.__cause__ is not None:  # the user's traceback
            logged = _traceback_to_log_file(e.__cause__)
            log.error(message + (f" (traceback in {logged})" if logged else ""))
        elif user_error:
            log.error(message)
        else:
            logged = _traceback_to_log_file(e)
            log.error(described(e) + (f" (traceback in {logged})" if logged else ""))
        failed = failed_results(cfg, message, origin or started)
        if getattr(e, "results", None):  # the figures measured before a late stage failed
            failed = assemble({**failed, **e.results, **{k: failed[k] for k in (
                "status", "error", "wall_time_s")}})
        outcome = failed
        run_dir.record_failure(failed)
        status = (LOST_WORKER if isinstance(e, LostWorker) else
                  USER_ERROR if user_error else INTERNAL_ERROR)
        return Results(out, failed, exit_code=status, error=message)
    finally:
        if session is not None:
            session.finish(outcome or {"status": "failed", "error": "the job did not finish"})
            run_dir.tracker = None
        logging_to.close()
        signals.close()
        run_dir.unlock()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _interrupted_results(stopped: Interrupted, results: dict[str, Any] | None,
                         previous: dict[str, Any] | None, cfg: DictConfig, started: float
                         ) -> dict[str, Any] | None:
    """results.json of a job a signal stopped: the runner's record of what it finished; or
    the completed results (the finish was cut short); or, stopped before anything was
    measured, the previous attempt's record marked interrupted (None: a completed run's stays
    as it is), else the config's fields."""
    if stopped.results is not None:
        return stopped.results
    mark = {"status": "interrupted", "interrupted_stage": stopped.stage}
    if results is not None:
        return {**results, **mark}
    if previous is not None:
        if previous.get("status") == "completed":
            return None
        # (a field an older distlab wrote and this one no longer has is left out)
        return {**{k: v for k, v in previous.items() if k != "error" and is_field(k)}, **mark}
    return {**{k: v for k, v in failed_results(cfg, "", started).items() if k != "error"},
            **mark}


def _check_interpolations(cfg: DictConfig) -> None:
    """Every `${...}` resolves, or one line naming the key (`${hydra:...}` has no value when
    distlab.train is called from Python: Hydra's runtime is the command's)."""
    from omegaconf.errors import InterpolationResolutionError

    try:
        OmegaConf.to_container(cfg, resolve=True)
    except InterpolationResolutionError as e:
        hint = (" (from Python, distlab.train has no Hydra runtime: give a plain value)"
                if "HydraConfig was not set" in str(e) else "")
        raise ConfigError(f"{e.full_key} cannot be resolved: {str(e).splitlines()[0]}"
                          f"{hint}") from None


def process_started() -> float:
    """Unix time at which this process started (Linux /proc), else when distlab loaded."""
    try:
        fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22, starttime, in clock ticks after boot
        boot = next(int(line.split()[1]) for line in open("/proc/stat")
                    if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED


def _traceback_to_log_file(error: BaseException) -> str | None:
    """The full traceback goes to the job's log file only (run.log; the console gets one
    line); the file's name, or None when there is none yet (the job failed before it was
    opened)."""
    text = "".join(traceback.format_exception(error))
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, text, None, None)
    files = [h for h in (*logging.getLogger().handlers, *log.handlers)
             if isinstance(h, logging.FileHandler) and h.baseFilename != os.devnull]
    for handler in files:
        handler.handle(record)
    return Path(files[0].baseFilename).name if files else None
