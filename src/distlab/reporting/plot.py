"""summary.png: a list of panels (the objective, throughput with its spread, time to target),
each drawn against every swept key; with repeats, each configuration's mean with its 95%
confidence interval."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distlab.records.results import finite as _finite
from distlab.reporting.jobs import Job, parse_value
from distlab.reporting.repeats import SEED, Group
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


def plot(path: Path, jobs: Sequence[Job], swept: Sequence[str], objective: str = "",
         groups: Sequence[Group] = ()) -> None:
    """summary.png: one row per swept key (or the job number), one column per panel
    (`panels`). With repeats (`groups`: jobs that differ only in seed), one point per group
    at its mean, its error bar the 95% confidence interval, against each swept key but seed.
    Uses matplotlib's object API (no pyplot, no GUI backend)."""
    shown = panels(jobs, objective)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if groups:
        keys = [k for k in swept if k != SEED][:MAX_PLOTTED_KEYS] or ["group"]
    else:
        keys = list(swept[:MAX_PLOTTED_KEYS]) or ["job"]
    done = [j for j in jobs if not j.failed]
    fig = Figure(figsize=(5 * len(shown), 3.4 * len(keys)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(keys), len(shown), squeeze=False)
    for row, key in zip(axes, keys, strict=True):
        for ax, panel in zip(row, shown, strict=True):
            points = (_group_points(panel, key, groups) if groups
                      else _job_points(panel, key, done))
            label = (panel.label.replace("± std", "mean, 95% CI") if groups and panel.spread
                     else f"{panel.label} (mean, 95% CI)" if groups else panel.label)
            _draw(ax, label, key, points, len(keys) == 1)
    failed = len(jobs) - len(done)
    title = f"{path.parent}: {len(jobs)} jobs"
    if groups:
        title += f", {len(groups)} configurations x seeds"
    fig.suptitle(title + (f" ({failed} failed, not shown)" if failed else ""))
    fig.savefig(path, dpi=100)


Point = tuple[Any, float, float | None]  # x, y, error bar's half-height


def _job_points(panel: Panel, key: str, done: Sequence[Job]) -> list[Point]:
    """Each completed job's value of the panel's field (its spread the error bar)."""
    return [(j.num if key == "job" else parse_value(j.override(key)), j.results[panel.field],
             j.results.get(panel.spread) if panel.spread else None)
            for j in done if _finite(j.results.get(panel.field))]


def _group_points(panel: Panel, key: str, groups: Sequence[Group]) -> list[Point]:
    """Each group's mean of the panel's field, its 95% confidence interval the error bar."""
    points = []
    for place, group in enumerate(groups, 1):
        stat = group.stats.get(panel.field)
        if stat is not None:
            x = place if key == "group" else parse_value(group.config.get(key))
            points.append((x, stat.mean, stat.half_width))
    return points


def _draw(ax: Any, label: str, key: str, raw: list[Point], lines: bool) -> None:
    """One panel against one swept key."""
    xs = [x for x, _, _ in raw]
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
    categories = [] if numeric else sorted({str(x) for x in xs})
    points = sorted([(x if numeric else categories.index(str(x)), y, e) for x, y, e in raw],
                    key=lambda p: p[:2])
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
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
