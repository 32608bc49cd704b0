"""The job's side of a search's pruning: at each validated epoch the Controller reports the
objective's validation figure to the job's Optuna trial (`distlab.search.job_trial`) and
asks whether to stop. Only validation figures are reported (never test ones); the last
epoch is reported but never pruned (nothing would be saved). Across workers the chief
reports and decides, and every worker takes its decision.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import tensorflow as tf

from distlab.training.experiment import Experiment

log = logging.getLogger("distlab")


class Pruning:
    """Reports to the trial of `search.*`; `check` says when the pruner prunes it."""

    def __init__(self, exp: Experiment) -> None:
        search, self.exp = exp.cfg.search, exp
        self.metric = str(exp.cfg.objective or "")
        self.prunes = str(search.pruner or "none") != "none"
        self.trial: Any = None
        if exp.worker.is_chief:
            from distlab.search import job_trial

            self.trial = job_trial(str(search.storage), str(search.study), int(search.trial),
                                   search.pruner, search.pruner_args)

    @staticmethod
    def build(exp: Experiment) -> Pruning | None:
        """None outside a search, or when the objective is no validation figure."""
        search = exp.cfg.get("search")
        if (search is None or search.trial is None or exp.cfg.mode != "train"
                or not str(exp.cfg.objective or "").startswith("val_")
                or exp.data.validation is None):
            return None
        return Pruning(exp)

    def check(self, epoch: int, figures: dict[str, Any], last: bool) -> float | None:
        """After epoch `epoch` (1-based) whose figures hold the validation ones: report the
        objective; its value when the trial is pruned now, else None."""
        value = figures.get(self.metric)
        prune = False
        if self.trial is not None and value is not None and math.isfinite(value):
            self.trial.report(float(value), epoch)
            prune = self.prunes and not last and self.trial.should_prune()
        if self.exp.worker.multi_worker:
            from distlab.distribute.multi_worker import from_chief

            prune = bool(int(from_chief(self.exp.strategy,
                                        [tf.constant(int(prune), tf.int64)])[0]))
        if prune:
            log.info("trial %s pruned at epoch %d: %s %.4f (the pruner stops it)",
                     self.exp.cfg.search.trial, epoch, self.metric, value)
            return float(value) if value is not None else float("nan")
        return None
