"""The sweep's table: its columns, one row per job (summary.csv) and the Markdown page
(summary.md) with the best job by the objective."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from distlab.records.results import finite as _finite
from distlab.reporting.jobs import Job, common_overrides, override_values, tally
from distlab.reporting.repeats import SEED, Group, Interval

LEADING = ["job", "overrides", "status", "batch_size_per_replica", "global_batch_size",
           "effective_batch_size", "num_replicas", "learning_rate"]
# steady-state examples/sec (warm-up left out) with its spread, per replica, and against
# the 1-replica job (scaling_efficiency, when the sweep varies the replica count)
THROUGHPUT = ["train_examples_per_sec", "train_examples_per_sec_std",
              "train_examples_per_sec_per_replica", "scaling_efficiency"]
TARGET = ["time_to_target_s", "epochs_to_target"]
# the field the sweep ranks by (its name) and each job's value of it
OBJECTIVE = ["objective", "objective_value"]
TRAILING = [*THROUGHPUT, *TARGET, "wall_time_s", "error"]
# the figure fields when no job reported any
CLASSIFICATION = ["val_accuracy", "val_loss", "test_accuracy", "test_loss"]


def figure_fields(jobs: Sequence[Job]) -> list[str]:
    """The task's val_* then test_* results.json fields (val_accuracy, val_loss, test_accuracy,
    test_loss for classification...), each split's primary metric first; val_* is what a
    sweep chooses on, test_* only reports."""
    found = list(dict.fromkeys(k for j in jobs for k in j.results
                               if k.startswith(("val_", "test_"))))
    if not found:
        return CLASSIFICATION
    out = []
    for split in ("val_", "test_"):
        mine = [k for k in found if k.startswith(split)]
        out += [k for k in mine if k != f"{split}loss"] + [k for k in mine
                                                           if k == f"{split}loss"]
    return out


def columns(jobs: Sequence[Job]) -> list[str]:
    return LEADING + OBJECTIVE + figure_fields(jobs) + TRAILING


def metrics(jobs: Sequence[Job]) -> list[str]:
    """Numeric per-job figures: the task's validation and test fields, throughput, time to
    target (when a job has one) and wall time."""
    return (figure_fields(jobs) + ["train_examples_per_sec"]
            + ["time_to_target_s"] * has_target(jobs) + ["wall_time_s"])


def has_target(jobs: Sequence[Job]) -> bool:
    return any("time_to_target_s" in j.results for j in jobs)


def scaling_efficiency(jobs: Sequence[Job], swept: Sequence[str]) -> dict[int, float]:
    """{job number: steady examples/sec / (replicas x the matching 1-replica job's)} when the
    sweep varies the replica count. The matching job has the same swept values apart from
    the strategy's keys (which set the replica count)."""
    done = [j for j in jobs if not j.failed and _finite(j.results.get("train_examples_per_sec"))]
    if len({j.results.get("num_replicas") for j in done}) < 2:
        return {}
    others = [k for k in swept if not k.startswith("strategy")]

    def key(job: Job) -> tuple:
        return tuple(job.override(k) for k in others)

    single = {key(j): j.results["train_examples_per_sec"] for j in done
              if j.results.get("num_replicas") == 1}
    return {j.num: j.results["train_examples_per_sec"] / (j.results["num_replicas"]
                                                          * single[key(j)])
            for j in done if key(j) in single and j.results.get("num_replicas")}


def rows(jobs: Sequence[Job], swept: Sequence[str], objective: str = "") -> list[dict[str, Any]]:
    """One summary row per job: `columns(jobs)`, then one column per swept key. `objective`:
    the field the sweep ranks by (empty: each job's own `objective`)."""
    table = []
    efficiency = scaling_efficiency(jobs, swept)
    for job in jobs:
        row: dict[str, Any] = {key: job.results.get(key) for key in columns(jobs)}
        field = objective or job.results.get("objective")
        # a failed job is not ranked: no objective value (its wall_time_s is its failure's)
        value = job.results.get(field) if field and job.status != "failed" else None
        row.update(job=job.num, overrides=" ".join(job.overrides), status=job.status,
                   error=job.error, scaling_efficiency=efficiency.get(job.num),
                   objective=field or None, objective_value=value if _finite(value) else None)
        row.update({key: job.override(key) for key in swept})
        table.append(row)
    return table


def write_csv(path: Path, table: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        for row in table:
            writer.writerow({k: "" if row.get(k) is None else row[k] for k in columns})


GROUPS_CSV = "summary_groups.csv"
STATS = ("mean", "std", "ci_low", "ci_high")


def write_group_csv(path: Path, groups: Sequence[Group], swept: Sequence[str],
                    fields: Sequence[str]) -> None:
    """summary_groups.csv: one row per group of repeats (ranked): rank, n, seeds, each swept
    key but seed, then <field>_mean, _std, _ci_low, _ci_high for each of `fields`."""
    keys = [k for k in swept if k != SEED]
    table = []
    for place, group in enumerate(groups, 1):
        row: dict[str, Any] = {"rank": place, "n": group.n, "seeds": " ".join(group.seeds),
                               "configuration": group.label(keys)}
        row.update({k: group.config.get(k) for k in keys})
        for name in fields:
            stat = group.stats.get(name)
            if stat is not None:
                row.update(zip((f"{name}_{s}" for s in STATS),
                               (stat.mean, stat.std, stat.low, stat.high), strict=True))
        table.append(row)
    write_csv(path, table, ["rank", "configuration", "n", "seeds", *keys,
                            *(f"{name}_{s}" for name in fields for s in STATS)])


def best_job(jobs: Sequence[Job], objective: str, maximize: bool) -> Job | None:
    scored = [j for j in jobs if not j.failed and _finite(j.results.get(objective))]
    pick = max if maximize else min
    return pick(scored, key=lambda j: float(j.results[objective])) if scored else None


# the per-job settings the table shows only when they differ between jobs
SETTINGS = [("batch_size_per_replica", "batch/replica"), ("global_batch_size", "global batch"),
            ("effective_batch_size", "effective batch"), ("num_replicas", "replicas"),
            ("learning_rate", "learning rate (effective)")]


def markdown(jobs: Sequence[Job], swept: Sequence[str], sweep_dir: Path, objective: str,
             maximize: bool, groups: Sequence[Group] = (), sections: Sequence[str] = (),
             named: bool = True) -> str:
    """summary.md: a headline naming the best configuration (on the objective: a validation
    figure), the shared overrides and settings, the repeats' table when jobs differ only in
    seed (`groups`, ranked), more `sections` (lines: a search's analysis), then one row per
    job showing only what differs between jobs. `named`: whether the objective is the
    sweep's or a job's (else no job reported one, and the line says so)."""
    way = "maximized" if maximize else "minimized"
    lines = [f"# Sweep {sweep_dir}", "", f"{tally(list(jobs))}.",
             f"Objective: `{objective}` ({way}), each job's value in the column objective "
             "value." if named else
             "Objective: none, no job got as far as reporting its objective."]
    best = _best_line(jobs, swept, objective, maximize, groups)
    if best:
        lines.append(best)
    common = common_overrides(jobs, swept)
    if common:
        lines.append("Common overrides: " + " ".join(f"`{o}`" for o in common))
    shown, same = _settings(jobs)
    if same:
        lines.append("Same in every job: " + ", ".join(f"{label} {_cell(value)}"
                                                       for label, value in same) + ".")
    lines.append("examples/sec is the steady state (each process's warm-up left out; "
                 "trainer.throughput), ± its standard deviation across epochs or step windows.")
    fields = figure_fields(jobs)
    if groups:
        lines += ["", *repeats_markdown(groups, swept, objective,
                                        repeat_fields(jobs, objective))]
    if sections:
        lines += ["", *sections]
    if groups or sections:
        lines += ["", "## Jobs"]
    efficiency = scaling_efficiency(jobs, swept)
    target = has_target(jobs)
    headers = ["job", "overrides", "status", *(label for _, label in shown), "objective value",
               *(f.replace("_", " ") for f in fields), "examples/sec", "per replica",
               *(["scaling efficiency"] if efficiency else []),
               *(["time to target (s)", "epochs to target"] if target else []),
               "wall time (s)", "error"]
    lines += ["", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for job in jobs:
        r = job.results
        rate, std = r.get("train_examples_per_sec"), r.get("train_examples_per_sec_std")
        cells = [job.num, " ".join(_swept_overrides(job, swept)), job.status,
                 *(r.get(key) for key, _ in shown),
                 r.get(objective), *(r.get(f) for f in fields),
                 f"{_cell(rate)} ± {_cell(std)}" if _finite(std) else rate,
                 r.get("train_examples_per_sec_per_replica"),
                 *([efficiency.get(job.num)] if efficiency else []),
                 *([r.get("time_to_target_s"), r.get("epochs_to_target")] if target else []),
                 r.get("wall_time_s"), job.error]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def repeat_fields(jobs: Sequence[Job], objective: str) -> list[str]:
    """The figures a group of repeats reports: the objective, the validation and test fields,
    steady examples/sec and (when jobs have a target) time to target."""
    return list(dict.fromkeys([objective, *figure_fields(jobs), "train_examples_per_sec",
                               *(["time_to_target_s"] if has_target(jobs) else [])]))


def repeats_markdown(groups: Sequence[Group], swept: Sequence[str], objective: str,
                     fields: Sequence[str]) -> list[str]:
    """The repeats' section: one row per group (ranked), each figure as mean ± std
    [95% confidence interval]."""
    keys = [k for k in swept if k != SEED]
    names = {"train_examples_per_sec": "examples/sec", "time_to_target_s": "time to target (s)"}
    headers = ["rank", "configuration", "n", "seeds",
               *(names.get(f, f.replace("_", " ")) for f in fields)]
    lines = ["## Repeats",
             "",
             f"Jobs that differ only in `{SEED}`, ranked by the mean of `{objective}`: each "
             "figure as mean ± standard deviation [95% confidence interval of the mean, "
             "Student's t with n-1 degrees of freedom] over the n completed jobs.",
             "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for place, group in enumerate(groups, 1):
        cells = [place, group.label(keys) or "(no other override)", group.n,
                 " ".join(group.seeds), *(_stat(group.stats.get(f)) for f in fields)]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    if any(len(set(g.seeds)) < len(g.seeds) for g in groups):
        lines += ["", "A seed listed twice ran twice in its configuration: it counts once "
                  "(the same experiment again, not another draw of it)."]
    return lines


def _best_line(jobs: Sequence[Job], swept: Sequence[str], objective: str, maximize: bool,
               groups: Sequence[Group]) -> str:
    way = "maximized" if maximize else "minimized"
    if groups:
        top = groups[0]
        stat = top.stats.get(objective)
        if stat is None:
            return ""
        keys = [k for k in swept if k != SEED]
        return (f"Best configuration (chosen on the mean `{objective}` over its seeds, {way}): "
                f"`{top.label(keys) or 'no other override'}` ({objective} {_stat(stat)}, "
                f"n={stat.n}).")
    best = best_job(jobs, objective, maximize)
    if best is None:
        return ""
    return (f"Best configuration (chosen on `{objective}`, {way}): "
            f"`{' '.join(_swept_overrides(best, swept)) or 'no swept override'}` "
            f"(job {best.num}: {objective} {_cell(best.results[objective])}).")


def _settings(jobs: Sequence[Job]) -> tuple[list[tuple[str, str]], list[tuple[str, Any]]]:
    """(the settings that differ between jobs, (label, value) of those every job shares)."""
    shown, same = [], []
    for key, label in SETTINGS:
        reported = [j.results.get(key) for j in jobs]
        values = {_cell(v) for v in reported if v is not None}
        if len(values) == 1 and len(jobs) > 1 and None not in reported:  # (a failed job's)
            same.append((label, reported[0]))
        elif values:
            shown.append((key, label))
    return shown, same


def _stat(stat: Interval | None) -> str:
    if stat is None:
        return ""
    if stat.std is None:
        return _cell(stat.mean)
    return f"{_cell(stat.mean)} ± {_cell(stat.std)} [{_cell(stat.low)}, {_cell(stat.high)}]"


def _swept_overrides(job: Job, swept: Sequence[str]) -> list[str]:
    values = override_values(job.overrides)
    return [f"{k}={values[k]}" for k in swept if k in values] if swept else job.overrides


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value).replace("|", "\\|").replace("\n", " ")
