"""distlab's Optuna sweeper (`hparams_search=optuna`): asynchronous ask/tell trials whose
study lives in the sweep directory, so that a search resumes, and whose jobs can be pruned.

- The search space is `hydra.sweeper.params` in Hydra's override grammar (`choice(...)`,
  `interval(...)`, `tag(log, interval(...))`, `range(...)`, a plain list; a single value is
  fixed), as hydra-optuna-sweeper read it.
- `direction: auto` takes the study's direction from the objective
  (`distlab.records.ranking`); a search whose jobs would report no objective is refused in
  one line before any trial.
- Trial N runs as job N (`hydra.sweep.dir/N`); with `repeats: R` as the R jobs N*R ..
  N*R+R-1 with seeds seed .. seed+R-1, its value their mean (pruning is then off). With
  `n_jobs > 1` (a process launcher: joblib, submitit) n_jobs threads each launch one trial at
  a time, so a new trial starts as soon as one ends. The basic launcher runs its trials one
  by one in this process.
- Each job gets its trial as `search.*` keys; the Controller reports the validation figure
  of the objective at each validated epoch and stops a trial the pruner prunes
  (results.json `status: pruned`); the sweeper then tells Optuna the trial is PRUNED.
- Resume: the study is stored (default: `optuna.journal` in the sweep dir). A rerun keeps
  its finished trials (counted toward n_trials), relaunches each trial left running (an
  interrupted job: same parameters, same job directory, so it resumes from its checkpoint)
  and asks for new ones up to n_trials. A failed trial stays failed.
- A trial whose job completed without a value for the objective is logged in one line and
  told to Optuna as failed; when no trial completed, the sweep summary is written and the
  search exits 1; after Ctrl-C or SIGTERM (`distlab.launch.sweep_signals`) no trial starts.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.distlab_sweepers.search_space import described, probes, search_space
from hydra_plugins.distlab_sweepers.sweep_records import claim_sweep_dir, record_arguments
from hydra_plugins.distlab_sweepers.trial_jobs import job_status, job_value

log = logging.getLogger(__name__)
AUTO = "auto"


# `hydra/sweeper=distlab_optuna` (what `hparams_search=optuna` selects), with its defaults.
# (A plain node: Hydra's plug-in scan runs this module without registering it, so a
# dataclass here could not resolve its annotations.)
SWEEPER_DEFAULTS = {
    "_target_": "hydra_plugins.distlab_sweepers.optuna.DistlabOptunaSweeper",
    "_recursive_": False,  # the sampler as its config: a resumed search re-seeds it
    "direction": AUTO,  # auto (from the objective), maximize or minimize
    "study_name": "distlab",
    "storage": None,  # null: optuna.journal in the sweep dir; or a journal file, or a URL
    "n_trials": 20,  # in all, the trials of earlier runs of this search included
    "n_jobs": 1,  # trials running at once (with a process launcher)
    "max_failure_rate": 1.0,  # stop starting trials when more of them failed
    "pruner": "none",  # none, median, successive_halving, hyperband
    "pruner_args": None,  # the pruner's keyword arguments, e.g. {n_startup_trials: 3}
    "repeats": 1,  # jobs per trial, seeds seed..seed+repeats-1; the trial's value: their mean
    "sampler": {"_target_": "optuna.samplers.TPESampler"},
    "params": None,  # {key: search space in Hydra's override grammar}
}
ConfigStore.instance().store(group="hydra/sweeper", name="distlab_optuna",
                             node=SWEEPER_DEFAULTS, provider="distlab")


class DistlabOptunaSweeper(Sweeper):
    """Optuna's ask/tell over Hydra jobs (see the module docstring)."""

    def __init__(self, sampler: Any = None, direction: str = AUTO,
                 storage: str | None = None, study_name: str = "distlab", n_trials: int = 20,
                 n_jobs: int = 1, max_failure_rate: float = 1.0, pruner: str = "none",
                 pruner_args: Any = None, params: Any = None, repeats: int = 1,
                 **_: Any) -> None:
        self.sampler_cfg, self.direction, self.storage = sampler, direction, storage
        self.study_name, self.n_trials, self.n_jobs = study_name, int(n_trials), int(n_jobs)
        self.max_failure_rate, self.pruner = float(max_failure_rate), str(pruner or "none")
        self.params, self.repeats = params, repeats
        self.pruner_args = {str(k): v for k, v in dict(pruner_args or {}).items()}
        self._lock = threading.Lock()

    # ---- set-up: the refusals before any trial
    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        from distlab.config.figures import check_search_objective
        from distlab.errors import ConfigError
        from distlab.launch.objective import task_metrics
        from distlab.records.ranking import direction, has_validation
        from distlab.search import build_pruner

        self._config, self._hydra_context = config, hydra_context
        job_cfg = OmegaConf.masked_copy(config, [k for k in config if k != "hydra"])
        higher = task_metrics(job_cfg)
        check_search_objective(job_cfg.get("objective"), str(job_cfg.task.get("name")),
                               list(higher), has_validation(job_cfg))
        self._job_cfg = job_cfg
        if str(self.direction) == AUTO:
            self.direction = direction(job_cfg, higher)
        if self.direction not in ("maximize", "minimize"):
            raise ConfigError(f"hydra.sweeper.direction={self.direction!r}: use auto, "
                              "maximize or minimize")
        if not 0.0 <= self.max_failure_rate <= 1.0:
            raise ConfigError("hydra.sweeper.max_failure_rate must be between 0 and 1")
        for key, value in (("n_trials", self.n_trials), ("n_jobs", self.n_jobs)):
            if value < 1:
                raise ConfigError(f"hydra.sweeper.{key}={value}: give 1 or more ("
                                  f"{'trials in all' if key == 'n_trials' else 'trials at once'})")
        build_pruner(self.pruner, self.pruner_args)  # a bad name or argument: one line now
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) \
                or self.repeats < 1:
            raise ConfigError(f"hydra.sweeper.repeats={self.repeats!r}: give the number of "
                              "seeds each trial runs (1 or more)")
        self._seed = int(job_cfg.get("seed") or 0)
        self._advice = _advice(job_cfg, higher)
        self._field = _objective_field(config)
        self._objective = str(job_cfg.get("objective") or "")
        if self.pruner != "none" and not self._objective.startswith("val_"):
            log.info("hydra.sweeper.pruner=%s: pruning is off, the objective %s is not a "
                     "validation figure", self.pruner, self._field)
            self.pruner = "none"
        if self.pruner != "none" and self.repeats > 1:
            log.info("hydra.sweeper.pruner=%s: pruning is off with hydra.sweeper.repeats=%d "
                     "(a trial's value is the mean over its seeds, one seed's learning curve "
                     "does not decide it)", self.pruner, self.repeats)
            self.pruner = "none"
        self.launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context, task_function=task_function)
        self._sweep_dir = str(config.hydra.sweep.dir)
        self._no_value = 0

    # ---- the search
    def sweep(self, arguments: list[str]) -> Any:
        import optuna

        from distlab.launch import sweep_signals
        from distlab.search import build_pruner, open_storage, storage_location

        record_arguments(self._config, arguments)
        space, fixed = search_space(self.params, arguments)
        if self.repeats > 1 and "seed" in space:
            from distlab.errors import ConfigError

            raise ConfigError("hydra.sweeper.repeats runs each trial with seeds seed.."
                              "seed+repeats-1: do not search over seed as well")
        if self.repeats > 1 and "seed" in fixed:
            self._seed = int(fixed.pop("seed"))
        self._space, self._fixed = space, fixed
        # (the command line's values are the job config's; the searched keys and the
        # sweeper's params are each trial's)
        per_trial = [*space, *map(str, dict(self.params or {}))]
        if not any(k.startswith(("objective", "trainer.target", "trainer.best_checkpoint",
                                 "trainer.early_stopping")) for k in per_trial):
            from distlab.config.checks import check_objective_needs

            check_objective_needs(self._job_cfg)  # (a field no trial could write)
        self._location = storage_location(self.storage, self._sweep_dir)
        # trials' job configs composed now, one per choice of each searched key: a key
        # Hydra cannot set (a misspelt searched key) or a choice it cannot (abc for a float)
        # is refused before the study records a trial that no job could run. (A key added
        # with `+` is the job's to check, once the user's code that may declare it is
        # loaded: not here)
        for values in probes(space):
            self._hydra_context.config_loader.load_sweep_config(self._config,
                                                                self._overrides(0, values))
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        claim_sweep_dir(self._sweep_dir, self.study_name, self._location)
        try:
            study = optuna.create_study(
                study_name=self.study_name, storage=open_storage(self._location),
                pruner=build_pruner(self.pruner, self.pruner_args), direction=self.direction,
                load_if_exists=True)
        except Exception as e:  # noqa: BLE001 - a damaged journal raises what it meets
            from distlab.errors import ConfigError

            raise ConfigError(f"hydra.sweeper.storage: the study in {self._location} cannot "
                              f"be read ({type(e).__name__}: {str(e).splitlines()[0][:160]}); "
                              "move it aside to start the search afresh, or use another "
                              "hydra.sweep.dir") from None
        # a resumed search's sampler continues afresh: seeded as at its start, it would
        # draw the first trials' parameters again
        sampler = _instantiate(self.sampler_cfg, resumed=len(study.get_trials(deepcopy=False)))
        if sampler is not None:
            study.sampler = sampler
        sampler = study.sampler
        if study.direction.name.lower() != self.direction:
            from distlab.errors import ConfigError

            raise ConfigError(f"the study {self.study_name!r} in {self._location} was "
                              f"started to {study.direction.name.lower()} its objective; "
                              f"this search would {self.direction} {self._field}: use "
                              "another hydra.sweep.dir (a sweep dir holds one study's jobs)")
        self._study = study
        self._keep(study, "repeats", self.repeats, "ran {} job(s) per trial; this search "
                   f"sets hydra.sweeper.repeats={self.repeats}")
        self._keep(study, "objective", self._field, "ranks its trials by {}; this search by "
                   f"objective={self._field}")
        trials = study.get_trials(deepcopy=False)
        self._keep_space(trials)
        running = [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
        # interrupted: relaunched; one without a value for each searched key (stopped while
        # asked, or the search has a key since) would train on defaults, one with a key the
        # search no longer has on a value it does not search: failed, asked anew
        unfit = [t.number for t in running if set(space) != set(t.params)]
        for number in unfit:
            study.tell(number, state=optuna.trial.TrialState.FAIL)
            held = set(trials[number].params)
            log.warning("trial %d: %s; failed, and a new trial is asked in its place", number,
                        "; ".join(filter(None, (
                            _listed("has no value for {} of this search's keys",
                                    set(space) - held),
                            _listed("has a value for {}, which this search does not search",
                                    held - set(space))))))
        self._pending = [t.number for t in running if t.number not in unfit]
        # new trials to ask for (a failed unfit one is replaced, within n_trials)
        self._planned = max(0, self.n_trials - (len(trials) - len(unfit)))
        trials = study.get_trials(deepcopy=False)  # (the unfit ones, failed)
        self._failures = sum(t.state == optuna.trial.TrialState.FAIL for t in trials)
        self._finished = sum(t.state.is_finished() for t in trials)
        self._stop = False
        log.info("Study name: %s", study.study_name)
        log.info("Storage: %s", self._location)
        log.info("Sampler: %s", type(sampler).__name__)
        log.info("Pruner: %s", self.pruner)
        log.info("Directions: %s", [self.direction])
        if trials:
            log.info("resuming the search: %d trial(s) finished, %d to relaunch, %d new",
                     self._finished, len(self._pending), self._planned)
        workers = self.n_jobs
        target = str(OmegaConf.select(self._config, "hydra.launcher._target_", default=""))
        if workers > 1 and target == sweep_signals.BASIC_LAUNCHER:
            log.warning("hydra.sweeper.n_jobs=%d with the basic launcher, which runs jobs "
                        "in this process: trials run one at a time (choose hydra/launcher="
                        "joblib or submitit_local to run them at once)", workers)
            workers = 1
        if workers <= 1:
            self._work()  # in the main thread: a job's signals end the search
        else:
            threads = [threading.Thread(target=self._work, name=f"distlab-trials-{i}",
                                        daemon=True) for i in range(workers)]
            for t in threads:
                t.start()
            sweep_signals.join(threads)  # a signal's handler runs meanwhile
            if getattr(self, "_error", None) is not None:
                raise self._error
        if sweep_signals.stopping():  # (the summary and the one line: sweep_signals.broken)
            raise sweep_signals.Stopped("the search was stopped by a signal")
        return self._finish(study)

    def _keep(self, study: Any, name: str, value: Any, differs: str) -> None:
        """Record `value` as the study's `name`; refuse a resumed study that recorded another
        (`differs` says how, `{}` standing for the recorded value)."""
        held = study.user_attrs.get(name, value)
        if held != value:
            from distlab.errors import ConfigError

            raise ConfigError(f"the study {self.study_name!r} in {self._location} "
                              f"{differs.format(held)}: keep it, or use another "
                              "hydra.sweep.dir")
        study.set_user_attr(name, value)

    def _keep_space(self, trials: list[Any]) -> None:
        """Refuse a resumed search whose search space Optuna cannot continue: a key searched
        over other choices, or over values of another kind, than its earlier trials'."""
        from optuna.distributions import check_distribution_compatibility

        for trial in trials:
            for key, held in trial.distributions.items():
                if key not in self._space:
                    continue
                try:
                    check_distribution_compatibility(held, self._space[key])
                except ValueError:
                    from distlab.errors import ConfigError

                    raise ConfigError(
                        f"the study {self.study_name!r} in {self._location} searched {key} "
                        f"over {described(held)}; this search over "
                        f"{described(self._space[key])}: keep it, or use another "
                        "hydra.sweep.dir") from None

    def _next(self) -> tuple[Any, list[str]] | None:
        """The next trial to launch (a relaunched one first) and its overrides; None: done."""
        from distlab.launch import sweep_signals

        with self._lock:
            if self._stop or sweep_signals.stopping():
                return None
            if self._pending:
                number = self._pending.pop(0)
                frozen = self._study.get_trials(deepcopy=False)[number]
                log.info("trial %d: relaunched with its parameters (its job resumes)", number)
                return number, self._jobs(number, frozen.params)
            if self._planned <= 0:
                return None
            self._planned -= 1
            trial = self._study.ask(self._space)
            return trial.number, self._jobs(trial.number, trial.params)

    def _jobs(self, number: int, params: dict[str, Any]) -> list[list[str]]:
        """The overrides of trial `number`'s jobs: one, or one per seed with repeats."""
        if self.repeats == 1:
            return [self._overrides(number, params)]
        return [[f"seed={self._seed + k}", *self._overrides(number, params)]
                for k in range(self.repeats)]

    def _overrides(self, number: int, params: dict[str, Any]) -> list[str]:
        pairs = {**{k: v for k, v in params.items()}, **self._fixed}
        return [*(f"{k}={v}" for k, v in pairs.items()),
                f"search.storage={self._location}", f"search.study={self.study_name}",
                f"search.trial={number}", f"search.pruner={self.pruner}",
                "search.pruner_args={" + ",".join(f"{k}:{v}" for k, v in
                                                  self.pruner_args.items()) + "}"]

    def _work(self) -> None:
        """Launch trials one at a time until none is left (one worker thread, or the main)."""
        try:
            while (nxt := self._next()) is not None:
                number, jobs = nxt
                rets = self.launcher.launch(jobs, initial_job_idx=number * self.repeats)
                self._tell(number, list(rets))
        except BaseException as e:  # noqa: BLE001 - ended in the main thread
            with self._lock:
                self._stop = True
                if threading.current_thread() is threading.main_thread():
                    raise
                self._error = e

    def _tell(self, number: int, rets: list[Any]) -> None:
        """Tell Optuna how trial `number`'s jobs ended (an interrupted one stays running):
        with repeats, the mean of the values its jobs gave."""
        from optuna.trial import TrialState

        from distlab.launch import sweep_signals

        ended = [job_status(ret) for ret in rets]
        statuses = [s if s in ("completed", "pruned") or not sweep_signals.stopping()
                    else "interrupted"  # stopped by the search's signal (or never started)
                    for s, _ in ended]
        values = [v for s, ret in zip(statuses, rets, strict=True)
                  if s == "completed" and (v := job_value(ret)) is not None]
        status, results = ended[0]
        status = ("interrupted" if "interrupted" in statuses else
                  "completed" if values else statuses[0])
        if len(rets) > 1 and values and len(values) < len(rets):
            log.warning("trial %d: %d of its %d seeds gave no %s; its value is the mean of "
                        "the other %d", number, len(rets) - len(values), len(rets),
                        self._field, len(values))
        with self._lock:
            if status == "interrupted":
                log.info("trial %d: interrupted; rerun the search to resume it", number)
                return
            if status == "pruned":
                pruned = results.get("pruned") or {}
                log.info("trial %d: pruned at epoch %s (%s %s)", number, pruned.get("epoch"),
                         pruned.get("metric"), pruned.get("value"))
                self._study.tell(number, state=TrialState.PRUNED, skip_if_finished=True)
            elif status == "completed" and values:
                self._study.tell(number, sum(values) / len(values), skip_if_finished=True)
            else:
                if status == "completed":
                    self._no_value += 1
                    log.warning("trial %d: its job completed, but results.json has no %s "
                                "(with a target: not reached); Optuna records the trial as "
                                "failed", number, self._field)
                else:
                    log.warning("trial %d: its job %s; Optuna records the trial as failed",
                                number, "failed" if status == "failed" else f"ended {status}")
                self._study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
                self._failures += 1
            self._finished += 1
            if self._failures and self._failures / self._finished > self.max_failure_rate:
                log.error("%d of %d finished trials failed (hydra.sweeper.max_failure_rate="
                          "%s): no more trials start", self._failures, self._finished,
                          self.max_failure_rate)
                self._stop = True

    def _finish(self, study: Any) -> Any:
        """optimization_results.yaml with the best trial; when none completed, the summary
        and exit 1 with one line saying why."""
        from optuna.trial import TrialState

        done = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
        if not done:
            from distlab.reporting.summary import SweepSummary

            if self._no_value:
                log.error("search failed: no trial gave a value for %s (%d job(s) completed "
                          "without one; %s)", self._field, self._no_value, self._advice)
            SweepSummary().on_multirun_end(self._config)  # failed jobs: this exits 1
            raise SystemExit(1)
        best = study.best_trial
        log.info("Best parameters: %s", best.params)
        log.info("Best value: %s", best.value)
        OmegaConf.save(OmegaConf.create({"name": "optuna", "best_params": best.params,
                                         "best_value": best.value, "best_trial": best.number,
                                         "storage": self._location,
                                         "study_name": study.study_name}),
                       Path(self._sweep_dir) / "optimization_results.yaml")
        return None


def _instantiate(sampler: Any, resumed: int = 0) -> Any:
    """The sampler (`{_target_: optuna.samplers.X, ...}`, which Hydra may already have
    built); None: Optuna's default. In a search resumed with `resumed` trials, a seeded
    sampler's seed is moved on by that count (still reproducible, not a repeat)."""
    if sampler is None or not isinstance(sampler, (dict, DictConfig)):
        return sampler
    from hydra.utils import instantiate

    cfg = OmegaConf.create(OmegaConf.to_container(sampler, resolve=True)
                           if isinstance(sampler, DictConfig) else dict(sampler))
    if resumed and cfg.get("seed") is not None:
        cfg.seed = (int(cfg.seed) + 1_000_003 * resumed) % 2**32
    return instantiate(cfg)


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


def _listed(text: str, keys: set[str]) -> str:
    """`text` with the sorted `keys` in its `{}`; empty without keys."""
    return text.format(", ".join(sorted(keys))) if keys else ""
