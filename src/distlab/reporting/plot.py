"""summary.png: a list of panels (the objective, throughput with its spread, time to target),
each drawn against every swept key."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distlab.records.results import finite as _finite
from distlab.reporting.jobs import Job, parse_value
from distlab.reporting.table import figure_fields, has_target

MAX_PLOTTED_KEYS = 4


@dataclass(frozen=True)
class Panel:
    """One column of summary.png: a results.json `field` against each swept key, with error
    bars from `spread` (a field holding its standard deviation) when given."""

    field: str
    label: str
    spread: str | None = None


def panels(jobs: Sequence[Job], objective: str = "") -> list[Panel]:
    """The objective (else the task's primary validation metric), steady examples/sec with
    its spread and, when jobs have a target, time to target. A new panel is one entry."""
    score = objective or figure_fields(jobs)[0]
    shown = [Panel(score, score.replace("_", " ")),
             Panel("train_examples_per_sec", "examples/sec (steady, ± std)",
                   "train_examples_per_sec_std")]
    if has_target(jobs):
        shown.append(Panel("time_to_target_s", "time to target (s)"))
    return shown


def plot(path: Path, jobs: Sequence[Job], swept: Sequence[str], objective: str = "") -> None:
    """summary.png: one row per swept key (or the job number), one column per panel
    (`panels`). Uses matplotlib's object API (no pyplot, no GUI backend)."""
    shown = panels(jobs, objective)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    keys = list(swept[:MAX_PLOTTED_KEYS]) or ["job"]
    done = [j for j in jobs if not j.failed]
    fig = Figure(figsize=(5 * len(shown), 3.4 * len(keys)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(keys), len(shown), squeeze=False)
    for row, key in zip(axes, keys, strict=True):
        xs = [j.num if key == "job" else parse_value(j.override(key)) for j in done]
        for ax, panel in zip(row, shown, strict=True):
            _draw(ax, panel, key, xs, done, len(keys) == 1)
    failed = len(jobs) - len(done)
    fig.suptitle(f"{path.parent}: {len(jobs)} jobs"
                 + (f" ({failed} failed, not shown)" if failed else ""))
    fig.savefig(path, dpi=100)


def _draw(ax: Any, panel: Panel, key: str, xs: list[Any], done: Sequence[Job],
          lines: bool) -> None:
    """One panel against one swept key (`xs`: each completed job's value of it)."""
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
    categories = [] if numeric else sorted({str(x) for x in xs})
    positions = xs if numeric else [categories.index(str(x)) for x in xs]
    points = sorted([(x, j.results[panel.field],
                      j.results.get(panel.spread) if panel.spread else None)
                     for x, j in zip(positions, done, strict=True)
                     if _finite(j.results.get(panel.field))], key=lambda p: p[:2])
    errors = [e if _finite(e) else 0.0 for _, _, e in points]
    ax.errorbar([x for x, _, _ in points], [y for _, y, _ in points],
                yerr=errors if any(errors) else None,
                fmt="o-" if lines else "o", color="tab:blue", capsize=4)
    for x, y, _ in points:
        ax.annotate(f"{y:.3g}", (x, y), textcoords="offset points", xytext=(0, 6),
                    ha="center", fontsize=8)
    ticks = sorted(set(xs)) if numeric else []
    if ticks and ticks[0] > 0 and ticks[-1] / ticks[0] >= 8:  # batch sizes, rates
        ax.set_xscale("log")
        ax.minorticks_off()
    if numeric and len(ticks) <= 8:
        ax.set_xticks(ticks, [f"{x:.3g}" for x in ticks])
    elif not numeric:
        ax.set_xticks(range(len(categories)), categories)
    ax.set_xlabel(key)
    ax.set_ylabel(panel.label)
    ax.grid(alpha=0.3)
