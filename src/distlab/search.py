"""A search's Optuna study as both sides see it: the sweeper (which asks, launches and
tells) and each job (which reports its validation figure per epoch and asks whether to stop).

The sweeper passes a job its trial as config keys (`search.storage`, `search.study`,
`search.trial`, `search.pruner`); the job opens the same storage. The default storage is
Optuna's journal file in the sweep directory (`JOURNAL`): an append-only log that several
processes (a process launcher's jobs, the sweep's own threads) write under a lock that also
works on NFS, where SQLite's file locking does not. A storage with `://` is a database URL.
Imports Optuna only when called; no TensorFlow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from distlab.errors import ConfigError

JOURNAL = "optuna.journal"  # the study's file in the sweep dir (storage: null)
PRUNERS = ("none", "median", "successive_halving", "hyperband")


SQLITE = "sqlite:///"


def storage_location(storage: str | None, sweep_dir: str | Path) -> str:
    """What `hydra.sweeper.storage` names: a database URL as given, else a journal file (by
    default the sweep dir's `optuna.journal`), as an absolute path (jobs may run elsewhere).
    A relative path, a journal's or an SQLite file's (`sqlite:///optuna.db`), is in the
    sweep dir: two sweep dirs never share a study by accident."""
    text = str(storage or "")
    if text.startswith(SQLITE) and not Path(text[len(SQLITE):]).expanduser().is_absolute():
        return SQLITE + str((Path(sweep_dir) / text[len(SQLITE):]).resolve())
    if "://" in text:
        return text
    path = Path(text or JOURNAL).expanduser()
    return str((path if path.is_absolute() else Path(sweep_dir) / path).resolve())


def open_storage(location: str) -> Any:
    """The Optuna storage at `location` (`storage_location`'s answer)."""
    import optuna

    if "://" in location:
        return optuna.storages.RDBStorage(location)
    from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

    Path(location).parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.JournalStorage(
        JournalFileBackend(location, lock_obj=JournalFileSymlinkLock(location)))


def build_pruner(name: str | None, args: Any = None) -> Any:
    """Optuna's pruner for `hydra.sweeper.pruner`, with `hydra.sweeper.pruner_args` (its
    keyword arguments, e.g. {n_startup_trials: 3}; none: Optuna's defaults)."""
    import optuna

    pruners = {"none": optuna.pruners.NopPruner, "median": optuna.pruners.MedianPruner,
               "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
               "hyperband": optuna.pruners.HyperbandPruner}
    key = str(name or "none").lower()
    if key not in pruners:
        raise ConfigError(f"hydra.sweeper.pruner={name!r} is not a pruner: use one of "
                          f"{', '.join(PRUNERS)}")
    try:
        return pruners[key](**dict(args or {}))
    except TypeError as e:
        raise ConfigError(f"hydra.sweeper.pruner_args={dict(args or {})}: not arguments of "
                          f"the {key} pruner ({e})") from None


def job_trial(storage: str, study: str, number: int, pruner: str | None,
              pruner_args: Any = None) -> Any:
    """The job's own trial (an `optuna.Trial` it reports to), with the search's pruner."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    loaded = optuna.load_study(study_name=study, storage=open_storage(storage),
                               pruner=build_pruner(pruner, pruner_args))
    trial_id = loaded._storage.get_trial_id_from_study_id_trial_number(loaded._study_id, number)
    return optuna.trial.Trial(loaded, trial_id)
