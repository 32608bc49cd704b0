"""One job: validate the config, take the run directory, decide what to do, run, report.

`run(cfg)` is what `run.py` (and every sweep job) calls. Nothing here imports
TensorFlow until the config is valid and the run directory is ours.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from distlab import plugins
from distlab.cluster import current_task
from distlab.config import effective, training_diff, validate
from distlab.errors import DistlabError
from distlab.preemption import Interrupted
from distlab.run_dir import RunDir, RunDirBusy

log = logging.getLogger("distlab")


def _output_dir() -> Path:
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else Path.cwd()


def _is_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def failed_results(cfg: DictConfig, error: str, started: float) -> dict[str, Any]:
    return {
        "status": "failed",
        "error": error,
        "mode": cfg.get("mode"),
        "loop": cfg.get("loop", {}).get("name"),
        "strategy": cfg.get("strategy", {}).get("name"),
        "dataset": cfg.get("dataset", {}).get("name"),
        "batch_size_per_replica": cfg.get("dataset", {}).get("batch_size_per_replica"),
        "wall_time_s": time.time() - started,
    }


def run(cfg: DictConfig, output_dir: str | Path | None = None) -> float | None:
    """Run one job; write its run directory; return the objective (`cfg.objective`).

    A user error (bad config, missing data, unusable checkpoint) is logged as one line and,
    in a single run, exits with status 2. In a multirun the job is recorded as failed in its
    results.json and the sweep goes on; the sweep callback reports it and fails the sweep.
    Under `strategy=multi_worker_mirrored` every worker follows the chief's decision.
    """
    started = time.time()
    run_dir = RunDir(output_dir or _output_dir())
    scratch = None
    try:
        validate(cfg)
        plugins.check(cfg)  # user code imported, every group's name resolved
        task = current_task(cfg.strategy)
        if not task.is_chief:  # only the chief writes the run dir; workers write to scratch
            scratch = Path(tempfile.mkdtemp(prefix=f"distlab-{task.type}{task.index}-"))
            run_dir = RunDir(scratch)
        run_dir.check_writable()
        run_dir.lock()  # one job per run directory (a dead holder's lock is released)
        config = OmegaConf.to_container(cfg, resolve=True)
        verdict, refusal, previous = "train", None, None
        if task.is_chief:
            refusal = rerun_refusal(run_dir, config, cfg.mode)
            previous = run_dir.read_results()
            verdict = ("refused" if refusal else
                       "completed" if _already_completed(previous, cfg) else "train")
        strategy = None
        if task.multi_worker:  # the cluster forms, then every worker takes the chief's verdict
            from distlab import multi_worker, runner

            strategy = runner.connect(cfg, run_dir.results_json if task.is_chief else None,
                                      failed_results(cfg, "", started))
            verdict = multi_worker.agree(strategy, verdict if task.is_chief else None)
        if verdict == "refused":
            run_dir.restore_hydra()  # leave the directory exactly as it was
            print(f"error: {refusal or 'the chief refused this run; see its output'}",
                  file=sys.stderr)  # not logged: run.log stays as it was
            return None if _is_multirun() else sys.exit(2)
        if verdict == "completed":
            log.info("%s already completed %s epoch(s); not retraining. results: %s",
                     run_dir.path, (previous or {}).get("epochs_completed", "its"),
                     json.dumps(previous or {}))
            return _objective(previous or {}, cfg)
        run_dir.mark_holder()
        if cfg.mode == "train":
            run_dir.record_start(config)
        from distlab.monitors import process_started
        from distlab.runner import execute  # imports TensorFlow

        # time_to_target_s counts from the process start in a single run (imports included,
        # as a whole-process benchmark does); in a sweep from the start of the job's own work,
        # after TensorFlow's import, which only a process's first job pays (so jobs compare)
        origin = None if _is_multirun() else process_started()
        results = execute(cfg, run_dir, strategy=strategy, task=task, origin=origin)
        if scratch is None:
            run_dir.write_results(results)
            log.info("results: %s", run_dir.results_json)
    except RunDirBusy as e:  # another job's directory: change nothing in it
        run_dir.restore_hydra()
        print(f"error: {e}", file=sys.stderr)
        return None if _is_multirun() else sys.exit(2)
    except Interrupted as e:  # results.json (status interrupted) and a checkpoint are written
        log.error(str(e))
        sys.exit(128 + e.signum)
    except Exception as e:  # noqa: BLE001 - every failure is reported the same way
        user_error = isinstance(e, DistlabError)
        message = str(e) if user_error else f"{type(e).__name__}: {e}"
        if not user_error:
            _traceback_to_log_file(e)
        log.error(message if user_error else message.splitlines()[0] + " (traceback in run.log)")
        run_dir.record_failure(failed_results(cfg, message, started))
        if _is_multirun():
            return None
        sys.exit(2 if user_error else 1)
    finally:
        run_dir.unlock()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return _objective(results, cfg)


def _objective(results: dict[str, Any], cfg: DictConfig) -> float | None:
    value = results.get(cfg.objective or results.get("objective") or "test_accuracy")
    return float(value) if value is not None else None


def _already_completed(previous: dict[str, Any] | None, cfg: DictConfig) -> bool:
    return bool(previous and cfg.mode == "train" and previous.get("mode") == "train"
                and previous.get("status") == "completed"
                and (previous.get("epochs_completed", 0) >= cfg.trainer.epochs
                     or bool(previous.get("stopped_early"))))


def rerun_refusal(run_dir: RunDir, config: dict[str, Any], mode: str = "train") -> str | None:
    """Why this run must not go into `run_dir` (which may hold an earlier run), or None.

    A training run whose earlier attempt has no checkpoint (it failed or was killed before
    its first one) may change the config: that attempt is moved to .distlab/attempts/<n>/.
    """
    started_with = run_dir.started_config()
    if started_with is None:
        return None
    if config.get("mode") == "evaluate":
        return (f"{run_dir.path} holds a training run; mode=evaluate would overwrite its "
                "results. Give the evaluation its own hydra.run.dir")
    changed = training_diff(started_with, config)
    if not changed:
        return None
    if mode == "train" and not run_dir.has_checkpoints():
        kept = run_dir.archive_attempt()  # nothing trained is on disk: start afresh
        log.info("%s held an attempt with another config and no checkpoint; it is kept in "
                 "%s and this run starts afresh", run_dir.path, kept)
        return None
    before, after = effective(started_with), effective(config)
    shown = ", ".join(f"{k} ({before.get(k, '<absent>')!r} -> {after.get(k, '<absent>')!r})"
                      for k in changed[:6])
    more = f" and {len(changed) - 6} more" if len(changed) > 6 else ""
    hint = ""
    if "schedule.decay_epochs" in changed and _get(started_with, "schedule.decay_epochs") is None \
            and _get(started_with, "schedule.name") == "cosine":
        decayed = before.get("schedule.decay_epochs")
        hint = (" (schedule=cosine with decay_epochs=null decays over trainer.epochs; "
                + (f"add schedule.decay_epochs={decayed} to train longer on the run's schedule, "
                   f"at its final learning rate, alpha={before.get('schedule.alpha')} x "
                   "learning_rate)" if before.get("schedule.alpha") else
                   "its learning rate has decayed to 0 (schedule.alpha=0), so more epochs would "
                   f"change nothing: train a new run with trainer.epochs="
                   f"{after.get('trainer.epochs')} in another hydra.run.dir)"))
    return (f"{run_dir.path} holds a run started with another config: {shown}{more}{hint}. "
            "Rerun with its values to resume it (trainer.epochs and reporting keys may "
            "differ), or choose a new hydra.run.dir")


def _get(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return "<absent>"
        node = node[part]
    return node


def _traceback_to_log_file(error: BaseException) -> None:
    """The full traceback goes to run.log only; the console gets one line."""
    text = "".join(traceback.format_exception(error))
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, text, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)

