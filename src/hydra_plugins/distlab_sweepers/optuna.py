"""The Optuna sweeper, ranking by the objective's own direction and saying why a trial
gave Optuna no value."""

from __future__ import annotations

import logging
from typing import Any

from hydra.types import HydraContext, TaskFunction
from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)
NO_COMPLETED_TRIAL = "No trials are completed yet"  # optuna's Study.best_trial
AUTO = "auto"


class _NoValueNote(logging.Filter):
    """Drops hydra-optuna-sweeper's "Return value must be float-castable. Got 'None'"
    warning: the sweeper has already said, in one line, why the trial has no value."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Got 'None'" not in record.getMessage()


_NO_VALUE_NOTE = _NoValueNote()


class DistlabOptunaSweeper(OptunaSweeper):
    """hydra-optuna-sweeper's OptunaSweeper, except that:

    - `direction: auto` (distlab's default) takes the study's direction from the objective
      (`distlab.records.ranking`: accuracy up, losses, times and MAE down); a direction
      the user sets is kept;
    - a search whose jobs would report no objective (no `objective`, dataset.validation=null),
      or one they refuse, is refused in one line before any trial runs;
    - a trial whose job completed without a value for the objective (e.g. time_to_target_s
      when the target was not reached) is logged in one line and told to Optuna as failed,
      so the sampler never sees an invented value;
    - when no trial completed, it writes the sweep summary and exits 1 with one line saying
      why, instead of Optuna's `ValueError: No trials are completed yet` traceback;
    - after Ctrl-C or SIGTERM of a search whose trials run in processes of their own
      (`distlab.launch.sweep_signals`), it starts no more trials.
    """

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        from distlab.config.figures import check_search_objective
        from distlab.launch.objective import task_metrics
        from distlab.records.ranking import direction, has_validation

        self._config = config
        impl = self.sweeper
        job_cfg = OmegaConf.masked_copy(config, [k for k in config if k != "hydra"])
        higher = task_metrics(job_cfg)
        # the field the jobs return (none: no trial would give Optuna a value)
        check_search_objective(job_cfg.get("objective"), str(job_cfg.task.get("name")),
                               list(higher), has_validation(job_cfg))
        if str(getattr(impl.direction, "name", impl.direction)) == AUTO:
            impl.direction = direction(job_cfg, higher)
        self._advice = _advice(job_cfg, higher)
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self._field = _objective_field(config)
        self._no_value = 0
        launcher = impl.launcher
        launch = launcher.launch

        def launch_and_explain(job_overrides: Any, initial_job_idx: int) -> Any:
            from distlab.launch import sweep_signals

            if sweep_signals.stopping():  # Ctrl-C/SIGTERM of the search: no more trials
                raise sweep_signals.Stopped("the search was stopped by a signal")
            returns = launch(job_overrides, initial_job_idx=initial_job_idx)
            for num, ret in enumerate(returns, start=initial_job_idx):
                if ret.return_value is None and _job_completed(ret):
                    self._no_value += 1
                    log.warning("trial %d: its job completed, but results.json has no %s "
                                "(with a target: not reached); Optuna records the trial as "
                                "failed", num, self._field)
            return returns

        launcher.launch = launch_and_explain
        impl_log = logging.getLogger("hydra_plugins.hydra_optuna_sweeper._impl")
        if _NO_VALUE_NOTE not in impl_log.filters:
            impl_log.addFilter(_NO_VALUE_NOTE)

    def sweep(self, arguments: list[str]) -> Any:
        _record_arguments(self._config, arguments)
        try:
            return super().sweep(arguments)
        except ValueError as e:
            if NO_COMPLETED_TRIAL not in str(e):
                raise
        from distlab.reporting.summary import SweepSummary

        if self._no_value:
            log.error("search failed: no trial gave a value for %s (%d job(s) completed "
                      "without one; %s)", self._field, self._no_value, self._advice)
        SweepSummary().on_multirun_end(self._config)  # failed jobs: this exits 1
        raise SystemExit(1)


def _job_completed(ret: Any) -> bool:
    """Whether the job's results.json says it completed (a failed distlab job also returns
    None, and says so in its own results.json; a refused one's results.json is the earlier
    run's, and the sweep dir records the refusal)."""
    from pathlib import Path

    from distlab.launch import refusals
    from distlab.records.run_dir import RunDir

    try:
        run_dir = Path(str(ret.hydra_cfg.hydra.runtime.output_dir))
        if str(run_dir.resolve()) in refusals.read(str(ret.hydra_cfg.hydra.sweep.dir)):
            return False
        results = RunDir(run_dir).read_results()
    except Exception:  # noqa: BLE001 - no readable results: not a completed job
        return False
    return bool(results) and results.get("status") == "completed"


def _advice(job_cfg: DictConfig, higher: dict[str, bool]) -> str:
    """What to change when no trial gave a value: with a target, the way that reaches it."""
    from distlab.records.ranking import metric_direction

    target = job_cfg.trainer.target
    if target.metric is None:
        return "see the jobs' results.json for the missing field"
    way = metric_direction(target.metric, target.mode, higher)
    return (f"the target {target.metric} {'>=' if way == 'max' else '<='} {target.value} was "
            f"never reached: {'lower' if way == 'max' else 'raise'} trainer.target.value or "
            "train longer")


def _objective_field(config: DictConfig) -> str:
    """The results.json field the jobs return (as `distlab.launch.job` picks it)."""
    return str(config.get("objective") or "the objective (the task's first metric)")


def _record_arguments(config: DictConfig, arguments: list[str]) -> None:
    """The sweep's command-line overrides, in the sweep dir, for a tracker to tell the swept
    keys (`distlab.tracking.session.swept_keys`; Hydra's basic sweeper has multirun.yaml)."""
    from pathlib import Path

    from distlab.tracking.session import SWEEP_OVERRIDES

    path = Path(str(config.hydra.sweep.dir)) / SWEEP_OVERRIDES
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(OmegaConf.create({"overrides": list(arguments)}), path)
    except OSError as e:
        log.warning("could not record the sweep's overrides in %s (%s): tracker run names "
                    "will not put the swept keys first", path, e)
