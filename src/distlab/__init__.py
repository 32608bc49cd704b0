"""distlab: config-driven tf.distribute experiments.

`run(cfg)` is what `run.py` calls. Importing this package does not import TensorFlow,
so `python run.py --cfg job` and config validation stay fast.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from distlab.config import validate
from distlab.errors import DistlabError
from distlab.run_dir import RunDir

__all__ = ["run", "DistlabError"]
log = logging.getLogger("distlab")


def _output_dir() -> Path:
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else Path.cwd()


def _is_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _failed_results(cfg: DictConfig, error: str, started: float) -> dict[str, Any]:
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
    """
    started = time.time()
    run_dir = RunDir(output_dir or _output_dir())
    try:
        validate(cfg)
        run_dir.check_writable()
        from distlab.runner import execute  # imports TensorFlow

        results = execute(cfg, run_dir)
    except Exception as e:  # noqa: BLE001 - every failure is reported the same way
        user_error = isinstance(e, DistlabError)
        message = str(e) if user_error else f"{type(e).__name__}: {e}"
        if not user_error:
            _traceback_to_log_file(e)
        log.error(message if user_error else message.splitlines()[0] + " (traceback in run.log)")
        _keep_or_write_failed(run_dir, _failed_results(cfg, message, started))
        if _is_multirun():
            return None
        sys.exit(2 if user_error else 1)
    run_dir.write_results(results)
    log.info("results: %s", run_dir.results_json)
    value = results.get(cfg.objective)
    return float(value) if value is not None else None


def _traceback_to_log_file(error: BaseException) -> None:
    """The full traceback goes to run.log only; the console gets one line."""
    text = "".join(traceback.format_exception(error))
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, text, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def _keep_or_write_failed(run_dir: RunDir, failed: dict[str, Any]) -> None:
    """Record the failure, but never overwrite a completed run's results.json."""
    previous = run_dir.read_results()
    if previous and previous.get("status") == "completed":
        return
    try:
        run_dir.write_results(failed)
    except OSError:
        pass
