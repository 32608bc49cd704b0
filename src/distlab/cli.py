"""The `distlab` command: compose the config with Hydra, run it, return the objective.

`distlab ARGS` reads the configs installed with the package (`pkg://distlab.conf`);
`python run.py ARGS` in a checkout calls `main` with the checkout's `conf/` directory.
`distlab verify ARGS` checks the run ARGS make (`distlab.verification`).
Importing this module does not import TensorFlow, so `--cfg job` and `--help` stay fast.
"""

from __future__ import annotations

import atexit
import gc
import io
import logging
import os
import sys
import threading
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TF's C++ INFO/WARNING start-up chatter

import hydra  # noqa: E402
from hydra.errors import HydraException  # noqa: E402
from omegaconf import DictConfig  # noqa: E402
from omegaconf.errors import OmegaConfBaseException  # noqa: E402

from distlab.config import register_configs  # noqa: E402
from distlab.config.checks import composition_problem  # noqa: E402
from distlab.config.store import PACKAGE_CONFIG_PATH, config_dir_problem  # noqa: E402
from distlab.errors import DistlabError  # noqa: E402
from distlab.records.run_dir import (  # noqa: E402
    RunDir,
    check_output_dir_args,
    refused_output_dir_args,
)

log = logging.getLogger("distlab")


def hydra_job(cfg: DictConfig) -> float | None:
    """One Hydra job (sweep jobs included): run the composed config, return its objective.

    The only place a job ends the process: a single run exits with the job's status when it
    did not complete; in a sweep a failed job is recorded and the sweep goes on, and a
    signal (SIGTERM, Ctrl-C) ends the sweep (under joblib or submitit_local, in the sweep's
    own process: `distlab.launch.sweep_signals`)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from distlab.launch import workers

    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    if multirun:  # first: a job this sweep launched is in its summary, whatever it does
        from distlab.launch import refusals

        refusals.record_launched(hydra_cfg.sweep.dir, Path(hydra_cfg.runtime.output_dir))
    if workers.launches(cfg):  # strategy.workers=N: start them (no TensorFlow here)
        if multirun:
            sys.exit(f"error: strategy.workers={cfg.strategy.workers} starts the workers of "
                     "a single run, not of a sweep's jobs (-m): run each setting as a run "
                     "of its own, or start the workers yourself with TF_CONFIG or srun")
        status = workers.launch(cfg, hydra_cfg.runtime.output_dir)
        if status:
            sys.exit(status)
        return None
    from distlab.launch.job import process_started, run

    if not multirun:
        results = run(cfg, hydra_cfg.runtime.output_dir, origin=process_started())
        if results.exit_code:
            sys.exit(results.exit_code)
        return results.objective
    from distlab.launch import sweep_parent, sweep_signals

    # a job process of its own (joblib, submitit_local) stops if the sweep dies, and when
    # the sweep's process asks it to (Ctrl-C or SIGTERM of the sweep)
    sweep_parent.stop_when_orphaned()
    output_dir = hydra_cfg.runtime.output_dir
    results = sweep_signals.run_job(
        lambda: run(cfg, output_dir, multirun=True, sweep_dir=hydra_cfg.sweep.dir),
        hydra_cfg.job.num, output_dir)
    if results is None:  # the sweep is stopping
        log.info("job %s not started: the sweep is stopping", hydra_cfg.job.num)
        RunDir(output_dir).record_not_started()
        sweep_parent.exit_if_orphaned(0)
        return None
    sweep_parent.exit_if_orphaned(results.exit_code)
    # a signal ends an in-process sweep here; a coordinated one ends in the sweep's process
    if results.interrupted and not sweep_signals.coordinated():
        sys.exit(results.exit_code)
    if results.interrupted:
        sweep_signals.job_interrupted(results.exit_code - 128)
    return results.objective


def end_process_now() -> None:
    """End a process whose runs are complete without the interpreter's teardown (TensorFlow's
    objects: 1.3-2.4 s, docs/BENCHMARKS.md section 19). First unreachable objects are
    collected (a summary writer a callback left open flushes as it is deleted), the exit
    handlers run in the interpreter's order (threading's, then atexit's: launchers' pools,
    logging, MLflow), output and every open Python file (one a callback kept in a module
    global) are flushed; exit status 0. Not in a worker of a cluster (its coordination
    service shuts down with the interpreter), nor while another thread that the interpreter
    would wait for still runs, nor without TensorFlow (nothing to gain)."""
    if ("tensorflow" not in sys.modules or "TF_CONFIG" in os.environ
            or "SLURM_PROCID" in os.environ
            or any(t is not threading.main_thread() and not t.daemon and t.is_alive()
                   for t in threading.enumerate())):
        return
    gc.collect()
    # the interpreter's order: threading's exit callbacks first (they shut process pools
    # down: joblib's loky workers, concurrent.futures), then the atexit handlers (among
    # them multiprocessing's, which joins the pools' processes: without the first, loky's
    # idle workers kept a joblib sweep's process alive 300 s). threading._shutdown is what
    # CPython's own exit calls (private, unchanged in 3.10-3.12; tests/test_process_exit.py)
    threading._shutdown()
    atexit._run_exitfuncs()
    logging.shutdown()
    # type(obj), not isinstance: isinstance also asks obj.__class__, which a proxy answers
    # by loading what it stands for (tfds' lazy builders: imports and a warning each)
    for stream in [sys.stdout, sys.stderr,
                   *(obj for obj in gc.get_objects() if issubclass(type(obj), io.IOBase))]:
        try:
            if not stream.closed and stream.writable():
                stream.flush()
        except (OSError, ValueError, AttributeError):  # a broken pipe, a detached buffer
            pass
    os._exit(0)


def check_config_dir_args(argv: list[str]) -> str | None:
    """Why a `--config-dir`/`-cd` on the command line is not a directory, or None. Hydra
    takes a relative one from the current directory (os.path.abspath), as checked here."""
    for i, arg in enumerate(argv):
        if arg in ("--config-dir", "-cd") and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--config-dir="):
            value = arg.partition("=")[2]
        else:
            continue
        if problem := config_dir_problem(value):
            return problem
    return None


def main(config_path: str = PACKAGE_CONFIG_PATH) -> None:
    """Parse the command line (Hydra overrides and flags), compose `config`, run the job(s).

    `config_path`: the primary config directory, as an absolute path or a `pkg://` package.
    A run dir named on the command line that cannot be created is one error line, exit 1.
    """
    if problem := check_config_dir_args(sys.argv[1:]):  # (`distlab verify` takes it too)
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    if sys.argv[1:2] == ["verify"]:  # `distlab verify OVERRIDES`: distlab.verification
        from distlab.verification.command import main as verify

        sys.exit(verify(sys.argv[2:], None if config_path == PACKAGE_CONFIG_PATH
                        else config_path))
    register_configs()
    if problem := refused_output_dir_args(sys.argv[1:]):
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    if problem := check_output_dir_args(sys.argv[1:]):
        sys.exit(f"error: {problem}")
    app = hydra.main(version_base="1.3", config_path=config_path, config_name="config")(hydra_job)
    if os.environ.get("HYDRA_FULL_ERROR") == "1":  # the user asked for Hydra's traceback
        return app()
    # Hydra prints a composition error over several lines with a HYDRA_FULL_ERROR hint; with
    # the variable set it raises instead, and the error becomes one line here
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        app()
        end_process_now()
    except (HydraException, OmegaConfBaseException) as e:
        print(f"error: {composition_problem(e)}", file=sys.stderr)
        sys.exit(2)
    except BrokenPipeError:  # `python run.py --help | head`: the reader has gone
        devnull = os.open(os.devnull, os.O_WRONLY)  # (the exit's flush would fail again)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)  # as Python's own exit on EPIPE
    except DistlabError as e:  # a sweep refused before any job (a sweeper's setup)
        from distlab.launch import sweep_signals

        sweep_signals.end()
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except Exception as e:  # a process launcher's error (a job's process died): one line
        from distlab.launch import sweep_signals

        status = sweep_signals.broken(e)
        if status is not None:
            sys.exit(status)
        if isinstance(e, OSError) and e.filename:  # Hydra's own writes (the run or sweep
            # dir, .hydra/, the log file) where check_output_dir_args could not tell (root
            # on a filesystem that refuses)
            print(f"error: cannot write {e.filename} ({e.strerror or e}): choose a folder you "
                  "can write with hydra.run.dir=... (hydra.sweep.dir=... with -m)",
                  file=sys.stderr)
            sys.exit(1)
        raise
    finally:
        os.environ.pop("HYDRA_FULL_ERROR", None)
