"""The Optuna sweeper, ending a search whose every trial failed like any failed sweep."""

from __future__ import annotations

from typing import Any

from hydra.types import HydraContext, TaskFunction
from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper
from omegaconf import DictConfig

NO_COMPLETED_TRIAL = "No trials are completed yet"  # optuna's Study.best_trial


class DistlabOptunaSweeper(OptunaSweeper):
    """hydra-optuna-sweeper's OptunaSweeper, except that when no trial completed it writes
    the sweep summary (which lists the failed trials) and exits 1 with one line, instead of
    Optuna's `ValueError: No trials are completed yet` traceback."""

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        self._config = config
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        try:
            return super().sweep(arguments)
        except ValueError as e:
            if NO_COMPLETED_TRIAL not in str(e):
                raise
        from distlab.sweep import SweepSummary

        SweepSummary().on_multirun_end(self._config)  # every trial failed: this exits 1
        raise SystemExit(1)
