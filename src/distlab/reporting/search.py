"""An Optuna search's analysis, as files in its sweep dir (no server): the parameters'
importances (Optuna's PED-ANOVA evaluator) as optuna_importance.csv and a plot, the
optimisation history plot, and the lines summary.md shows of them.

`analyse(study, sweep_dir)` takes an `optuna.Study`; `load_study(sweep_dir)` loads the one
the sweeper keeps there (`STUDY_FILES`: a journal file or an SQLite database), or says in one
line why there is none. Optuna is imported only when a study file exists.
"""

from __future__ import annotations

import csv
import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("distlab")

STUDY_FILES = ("optuna.journal", "optuna.db")  # where the sweeper keeps its study
IMPORTANCE_CSV = "optuna_importance.csv"
IMPORTANCE_PNG = "optuna_importance.png"
HISTORY_PNG = "optuna_history.png"
SEARCH_FILES = (IMPORTANCE_CSV, IMPORTANCE_PNG, HISTORY_PNG)
MIN_OPTUNA = (3, 6)  # PedAnovaImportanceEvaluator


@dataclass
class Analysis:
    """What was written (file names), the lines for summary.md, and a note on what was not."""

    written: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    note: str = ""


def study_file(sweep_dir: Path) -> Path | None:
    """The study's storage file in `sweep_dir`, if any."""
    return next((sweep_dir / n for n in STUDY_FILES if (sweep_dir / n).exists()), None)


def load_study(sweep_dir: Path, study_name: str | None = None) -> tuple[Any | None, str]:
    """(the study kept in `sweep_dir`, "") or (None, why not: one line, "" when the sweep
    has no study file, i.e. it was no search)."""
    path = study_file(sweep_dir)
    if path is None:
        return None, ""
    try:
        import optuna
    except ImportError:
        return None, f"{path.name} found but optuna is not installed: no search analysis"
    if _version(optuna.__version__) < MIN_OPTUNA:
        return None, (f"optuna {optuna.__version__} is too old for the search analysis "
                      f"(needs {'.'.join(map(str, MIN_OPTUNA))} or newer)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = _storage(optuna, path)
    names = optuna.study.get_all_study_names(storage)
    if not names:
        return None, f"{path} holds no study"
    name = study_name if study_name in names else names[-1]
    return optuna.load_study(study_name=name, storage=storage), ""


def _storage(optuna: Any, path: Path) -> Any:
    if path.suffix == ".db":
        return f"sqlite:///{path}"
    journal = optuna.storages.journal
    backend = (journal.JournalFileBackend(str(path)) if hasattr(journal, "JournalFileBackend")
               else optuna.storages.JournalFileStorage(str(path)))  # optuna < 4
    return optuna.storages.JournalStorage(backend)


def analyse(study: Any, sweep_dir: Path, plots: bool = True,
            target_name: str = "Objective Value") -> Analysis:
    """Write the importances (table and plot) and the history plot of `study` into
    `sweep_dir` (`target_name`: what the plots call the trials' value); return them with
    summary.md's lines. A study with too few finished trials, or with several objectives,
    gets a note instead of the importances."""
    import optuna

    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    states = [t.state.name.lower() for t in study.get_trials(deepcopy=False)]
    counts = ", ".join(f"{states.count(s)} {s}" for s in dict.fromkeys(states))
    out = Analysis(lines=[f"## Search (Optuna study `{study.study_name}`)", "",
                          f"{len(states)} trials: {counts or 'none'}."])
    if len(study.directions) > 1:
        out.note = "a multi-objective study: no importances or history plot"
        out.lines.append(out.note + ".")
        return out
    if done:
        best = study.best_trial
        shown = " ".join(f"{k}={v}" for k, v in best.params.items())
        out.lines.append(f"Best trial: #{best.number}, value {best.value:.4g} ({shown}).")
    importances = _importances(optuna, study, done)
    if isinstance(importances, str):
        out.note = importances
        out.lines.append(f"Parameter importances: none ({importances}).")
    else:
        _write_csv(sweep_dir / IMPORTANCE_CSV, importances)
        out.written.append(IMPORTANCE_CSV)
        out.lines += ["", "Parameter importances (Optuna's PED-ANOVA on the completed "
                      "trials; they sum to 1):", "", "| parameter | importance |", "|---|---|"]
        out.lines += [f"| {k} | {v:.3f} |" for k, v in importances.items()]
    if plots and done:  # (a history of no completed trial: Optuna warns and draws nothing)
        out.written += _plots(optuna, study, sweep_dir, target_name,
                              draw_importance=not isinstance(importances, str))
    if out.written:
        out.lines += ["", "Files: " + ", ".join(f"`{n}`" for n in out.written) + "."]
    return out


def _importances(optuna: Any, study: Any, done: list[Any]) -> dict[str, float] | str:
    """{parameter: importance}, most important first, or why there are none."""
    if len(done) < 2:
        return f"{len(done)} completed trial(s); importances need at least 2"
    varied = {k for t in done for k in t.params
              if len({repr(u.params.get(k)) for u in done}) > 1}
    if not varied:
        return "no parameter varies between the completed trials"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = optuna.importance.get_param_importances(
                study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    except Exception as e:  # noqa: BLE001 - too few trials for the evaluator, say
        return f"{type(e).__name__}: {e}".splitlines()[0]
    return {k: float(v) for k, v in found.items()}


def _plots(optuna: Any, study: Any, sweep_dir: Path, target_name: str,
           draw_importance: bool) -> list[str]:
    """Optuna's matplotlib plots, saved and closed, the global style left as it was."""
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as charts

    drawn = [(HISTORY_PNG, lambda s: charts.plot_optimization_history(
        s, target_name=target_name))]
    if draw_importance:
        drawn.append((IMPORTANCE_PNG, lambda s: charts.plot_param_importances(
            s, evaluator=optuna.importance.PedAnovaImportanceEvaluator(),
            target_name=target_name)))
    written = []
    for name, draw in drawn:
        with plt.rc_context(), warnings.catch_warnings():  # (optuna sets the ggplot style)
            warnings.simplefilter("ignore")
            figure = None
            try:
                figure = draw(study).get_figure()
                figure.set_size_inches(8, 4.5)
                figure.savefig(sweep_dir / name, dpi=100, bbox_inches="tight")
                written.append(name)
            except Exception as e:  # noqa: BLE001 - a summary without the plot beats none
                log.warning("sweep summary: could not draw %s: %s: %s", name,
                            type(e).__name__, e)
            finally:
                if figure is not None:
                    plt.close(figure)
    return written


def _write_csv(path: Path, importances: dict[str, float]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["parameter", "importance"])
        writer.writerows(importances.items())


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)
