"""`distlab verify`: checks an experiment's invariants on a brief version of its own run.

`verify(overrides)` composes the run's config as `distlab OVERRIDES` does, then runs each
check (`verify.checks`) on a few steps with small batches, into a scratch directory, and
returns a `Report`: one row per check, each a verdict, what was compared, and on a failure
what differs, by how much and the most likely cause in the user's code. Who owns what:

- `options`: verify's own settings (`verify.checks=[data,export]`, `verify.steps`, ...) and
  the overrides that make a run brief;
- `session`: the composed run, the scratch directory, the probes a check asks for;
- `probe`: an experiment built as a run builds it and stepped by hand (losses, weights,
  test figures);
- `data_checks` (`data`), `training_checks` (`determinism`, `replicas`, `loops`),
  `resume` (`resume`: a real SIGTERM and rerun), `export_check` (`export`), `workers`
  (`workers`, opt-in: 2 local worker processes against 1 process with 2 replicas);
- `report`: the rows, the table and `verify.json`; `command`: the `distlab verify` command.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from distlab.errors import DistlabError, described
from distlab.verification.options import Options, scratch_dir, split_overrides
from distlab.verification.report import FAILED, Report, Row

log = logging.getLogger("distlab")


def _checks() -> dict[str, Callable]:
    from distlab.verification import (
        data_checks,
        export_check,
        resume,
        training_checks,
        workers,
    )

    return {"data": data_checks.check, "determinism": training_checks.determinism,
            "replicas": training_checks.replicas, "loops": training_checks.loops,
            "resume": resume.check, "export": export_check.check, "workers": workers.check}


def verify(overrides: Sequence[str] = (), config_dir: str | Path | None = None, *,
           config_path: str | Path | None = None,
           on_row: Callable[[Row], None] | None = None,
           on_start: Callable[[Path], None] | None = None) -> Report:
    """Verify the run `distlab [--config-dir CONFIG_DIR] OVERRIDES` would make (`verify.*`
    overrides are verify's own settings); the Report (also written to verify.json in a fresh
    scratch directory: `report.json_path`, None when refused). `on_row`: called with each row
    as it is found; `on_start`: with the scratch directory, once the config is accepted. Never
    exits; Ctrl-C (KeyboardInterrupt) is raised, with no verify.json."""
    started = time.time()
    given = [str(o) for o in overrides]
    from distlab.config.store import config_dirs_problem

    if problem := config_dirs_problem(config_dir, config_path):  # as distlab.train's
        return Report([], None, given, error=problem)
    try:
        run_overrides, options = split_overrides(given)
    except DistlabError as e:
        return Report([], None, given, error=str(e))
    report = Report([], None, run_overrides)
    try:
        session = _session(run_overrides, options, config_dir, config_path)
    except DistlabError as e:
        report.error = str(e)
        report.seconds = time.time() - started
        return report
    report.scratch_dir = session.scratch
    if on_start is not None:
        on_start(session.scratch)
    checks = _checks()
    tensorflow = logging.getLogger("tensorflow")
    tensorflow.addFilter(_no_retracing_notes)
    try:
        for name in options.checks:
            row = _run_check(name, checks.get(name), session)
            report.rows.append(row)
            if on_row is not None:
                on_row(row)
    finally:
        tensorflow.removeFilter(_no_retracing_notes)
    report.seconds = time.time() - started
    report.write()
    return report


def _session(overrides: list[str], options: Options, config_dir, config_path):
    from distlab.config import register_configs
    from distlab.verification.session import Session, configure_devices

    register_configs()
    session = Session(overrides, options, None, config_dir, config_path)
    session.run_config  # noqa: B018 - composed and validated now: a bad override is one line
    # (before TensorFlow is imported), then the devices, before any TensorFlow op
    if not configure_devices() and "replicas" in options.checks:
        raise DistlabError("verify's replicas check needs 3 CPU devices, and TensorFlow "
                           "already runs in this process with fewer: run `distlab verify` "
                           "from the command line, or leave the check out "
                           "(verify.checks=[...])")
    # the data found (a dataset name, its data_dir): else one line, as a run refuses it,
    # not the same failure in every check's row
    try:
        session.test_rows()
    except DistlabError:
        raise
    except Exception as e:  # noqa: BLE001 - a user's data source failed: one line too
        raise DistlabError(f"dataset.name={session.run_config.dataset.name}: reading its "
                           f"test split failed: {described(e)}") from None
    session.scratch = scratch_dir(options).resolve()
    return session


def _no_retracing_notes(record: logging.LogRecord) -> bool:
    """TensorFlow's note that a function was traced again: verify builds each model several
    times on purpose."""
    return "triggered tf.function retracing" not in record.getMessage()


def _run_check(name: str, check: Callable | None, session) -> Row:
    from distlab.training import runner

    started = time.time()
    try:
        runner.quiet_libraries()
        row = check(session)
    except DistlabError as e:
        row = Row(name, FAILED, "could not run", differs=str(e),
                  cause="the experiment itself fails (the line above names what)")
    except Exception as e:  # noqa: BLE001 - a user's code failed inside the check
        log.debug("verify %s", name, exc_info=True)
        row = Row(name, FAILED, "could not run", differs=described(e),
                  cause="the experiment's code raised this while the check ran it")
    row.seconds = time.time() - started
    return row


__all__ = ["verify", "Report", "Row"]
